"""Layer 4, what the algorithms learn from: replay buffers (transitions, stacked frames, trajectories)."""
