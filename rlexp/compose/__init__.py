"""Layer 8, every registry gathered: Hydra's schemas and resolvers (``register``), a whole config's validation
and resources, the configuration reference. Above the algorithms, whose specs it reads."""
