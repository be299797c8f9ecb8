"""Layer 6, a job: the run context an algorithm sees, the recorder, evaluation, checkpoints, PBT, job dirs, loggers
and W&B files, the job runner and packs."""
