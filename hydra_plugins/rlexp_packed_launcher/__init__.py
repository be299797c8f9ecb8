"""rlexp's packing launcher for Hydra (``hydra/launcher=rlexp_packed``)."""
