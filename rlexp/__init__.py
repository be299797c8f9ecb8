"""rlexp: a lab for deep-RL training stability."""

__version__ = "0.1.0"
