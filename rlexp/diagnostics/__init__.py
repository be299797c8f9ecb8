"""Layer 5, the instruments: observers on the one forward, divergence location, action collapse, and the
interventions against loss of plasticity."""
