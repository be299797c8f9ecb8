"""An rlexp plugin: an environment (``envs``), and an activation, a normalization and an instrument (``plugin``)."""
