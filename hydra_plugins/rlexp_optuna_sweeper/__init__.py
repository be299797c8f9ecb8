"""rlexp's Optuna sweeper: hydra-optuna-sweeper's, reporting rlexp's jobs to their trials (``optuna_sweeper``)."""
