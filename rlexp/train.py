"""Entry point: ``python -m rlexp.train [group=option ...] [-m]``.

One job trains a population of ``num_seeds`` members; ``-m`` sweeps with Hydra's launcher.
"""

from __future__ import annotations

import gc
import sys

if __name__ == "__main__":
    gc.disable()  # the imports below make ~200k objects (torch, hydra) that all live on: no collections meanwhile

from pathlib import Path
from typing import Any, Dict

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from rlexp.config import ConfigError
from rlexp.registry import register
from rlexp.trainer import run_job

register()  # here, not under __main__: launcher workers import this module to run a job

if __name__ == "__main__":
    gc.freeze()  # keep the collector off the imported objects from now on
    gc.enable()


def job_identity() -> tuple[Path, str, Dict[str, str]]:
    """The job's output dir, its config cell (overrides minus seeds etc.) and its group choices."""
    hc = HydraConfig.get()
    cell = hc.job.override_dirname or "default"
    choices = {k: str(v) for k, v in hc.runtime.choices.items() if not k.startswith(("hydra", "schema"))}
    return Path(hc.runtime.output_dir), cell, choices


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> Dict[str, Any]:
    out_dir, cell, choices = job_identity()
    try:
        return run_job(cfg, out_dir, cell, choices)
    except ConfigError as err:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # this job fails; the sweep runs the others and exits non-zero at the end
        print(err, file=sys.stderr)  # a single run: the one line, no traceback
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
