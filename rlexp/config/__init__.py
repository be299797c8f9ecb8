"""Layer 0, the configuration: the schemas (one dataclass per config group), a grid cell's name, per-member
values, the protocol of a part with state (``state.py``). Imports nothing of rlexp."""
