"""A Hydra launcher that trains a multirun's jobs packed: cells sharing ``rlexp.run.pack.pack_key`` (network
shape, algorithm, environment, budget, ...) as one population of at most ``max_members`` members, the
packs in joblib's local worker processes (``n_jobs``).

Each job is first set up by Hydra's own ``run_job`` (its output dir, its ``.hydra`` record, the callbacks)
with a task that only takes note of the job (``rlexp.train.job_identity``: its dir, cell and choices); the
packs then train and write every job dir as the job would alone (``rlexp.run.pack.run_pack``). A cell whose
pack crashed is a failed job (the multirun exits non-zero once every pack has run); a refused cell too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict


class PackedLauncher(Launcher):
    def __init__(self, n_jobs: int = -1, max_members: int = 96) -> None:
        self.n_jobs, self.max_members = n_jobs, max_members
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context
        self._compose = _keep_checked_configs(hydra_context)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from joblib import Parallel, delayed

        from rlexp.algos import ALGOS
        from rlexp.config.schema import ConfigError
        from rlexp.run.jobs import is_finished, release_dir
        from rlexp.run.pack import Cell, plan_packs
        from rlexp.train import job_identity, name_sweep

        if self.max_members < 1:  # one line, exit code 2, before any job dir is made
            print(ConfigError("hydra.launcher.max_members", f"{self.max_members} is below 1", "give a value >= 1"))
            raise SystemExit(2)
        assert self.config is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)

        cells: list[Cell] = []
        returns: list[JobReturn] = []
        noted: list[tuple[Path, str, dict[str, str]]] = []

        def note(task_cfg: DictConfig) -> None:
            name_sweep(task_cfg)
            out_dir, cell, choices = job_identity()
            release_dir(out_dir)  # held while Hydra recorded the job; its pack's worker holds it next
            noted.append((out_dir, cell, choices))

        for idx, overrides in enumerate(job_overrides):
            sweep_config = self._compose(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{initial_job_idx + idx}"
                sweep_config.hydra.job.num = initial_job_idx + idx
            ret = run_job(
                hydra_context=self.hydra_context,
                task_function=note,
                config=sweep_config,
                job_dir_key="hydra.sweep.dir",
                job_subdir_key="hydra.sweep.subdir",
            )
            returns.append(ret)
            out_dir, cell, choices = noted[-1]
            cells.append(Cell(ret.cfg, out_dir, cell, choices))
        HydraConfig.instance().set_config(self.config)

        # resume: finished cells are skipped here (their recorded summaries), the rest packed anew
        finished = [c for c in cells if c.cfg.resume and is_finished(c.out_dir)]
        todo = [c for c in cells if not any(c is f for f in finished)]
        packs = plan_packs(todo, lambda algo: ALGOS[algo].member_keys, self.max_members)
        print(f"rlexp_packed: {len(todo)} jobs in {len(packs)} packs (max_members={self.max_members})", flush=True)
        results = Parallel(n_jobs=self.n_jobs, backend="loky")(
            delayed(_train_pack)(pack, Singleton.get_state()) for pack in packs
        )
        if finished:
            packs, results = [*packs, finished], [*results, _train_pack(finished, Singleton.get_state())]
        outcome = {id(cell): result for pack, result in zip(packs, results) for cell, result in zip(pack, result)}
        for ret, cell in zip(returns, cells):
            summary, error = outcome[id(cell)]
            if error is None and summary["status"] != "crashed":
                ret.status, ret.return_value = JobStatus.COMPLETED, summary
            else:
                ret.status, ret.return_value = JobStatus.FAILED, RuntimeError(error or summary["error"])
        return returns


def _keep_checked_configs(hydra_context: HydraContext) -> Callable[[DictConfig, list[str]], DictConfig]:
    """Before launching, Hydra's sweeper composes every job's config to check it
    (``Sweeper.validate_batch_is_legal``), in case the launcher composes in another process. This
    launcher composes in the same process right after: the loader is wrapped to keep each config it
    composes, and the returned function hands a kept config over (once) instead of composing it again
    (~0.15 s per job: half of a 192-job grid's start-up); it composes when none is kept."""
    loader = hydra_context.config_loader
    compose = loader.load_sweep_config
    kept: dict[tuple[int, tuple[str, ...]], DictConfig] = {}

    def checked(master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        kept[(id(master_config), tuple(sweep_overrides))] = config = compose(master_config, sweep_overrides)
        return config

    def composed(master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        config = kept.pop((id(master_config), tuple(sweep_overrides)), None)
        return config if config is not None else compose(master_config, sweep_overrides)

    loader.load_sweep_config = checked  # type: ignore[method-assign]
    return composed


def _train_pack(cells: list[Any], singleton_state: dict[Any, Any]) -> list[tuple[dict[str, Any] | None, str | None]]:
    """In a worker: train one pack; each cell's (job summary, None), or (None, the line that refused it)."""
    setup_globals()
    Singleton.set_state(singleton_state)
    from rlexp.run.jobs import worker_job
    from rlexp.run.pack import run_pack
    from rlexp.train import prepare

    try:
        with worker_job():  # a SIGTERM stops the pack and every later one in this worker
            results = run_pack(cells, prepare)
    except Exception as exc:  # the pack could not even start: every cell fails with the reason
        print(f"rlexp_packed: a pack of {len(cells)} cells failed: {exc}", file=sys.stderr, flush=True)
        return [(None, str(exc)) for _ in cells]
    return [(r, None) if isinstance(r, dict) else (None, str(r)) for r in results]
