"""Layer 3, the worlds: population environments (gymnasium families, fast CartPoles, multi-agent), observation
and reward normalizers, per-member random streams."""
