"""Layer 2, the gradient pipeline: compute -> process (clipping) -> apply (the stacked optimizers), per-member
health."""
