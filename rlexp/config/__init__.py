"""Layer 0, the configuration: the schemas (one dataclass per config group), a grid cell's name, per-member
values. Imports nothing of rlexp."""
