"""A Hydra launcher that trains a multirun's jobs packed: cells sharing ``rlexp.run.pack.pack_key`` (network
shape, algorithm, environment, budget, ...) as one population of at most ``max_members`` members, each
pack one task of a backend (``backends.py``: joblib's local workers, a submitit job, a Ray task).

The launcher composes every job's config (``composer.SweepComposer``: Hydra's composition once per
structure), plans the packs from what each config says (``rlexp.run.pack.plan``) and hands each pack's
jobs to the backend. Where a pack runs, each of its jobs is set up by Hydra's own ``run_job`` (its output
dir, its ``.hydra`` record, the callbacks) with a task that only takes note of the job
(``rlexp.train.job_identity``: its dir, cell and choices); the pack then trains and writes every job dir
as the job would alone (``rlexp.run.pack.run_pack``). A cell whose pack crashed, or whose task the backend
lost, is a failed job (the multirun exits non-zero once every pack has run); a refused cell too.
"""

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.rlexp_packed_launcher.backends import Backend, Failure, backend
from hydra_plugins.rlexp_packed_launcher.composer import JobSpec, Overrides, SweepComposer, job_config

CellResult = tuple[dict[str, Any] | None, str | None]  # a cell's (job summary, None) or (None, why it failed)


@dataclass
class PackTask:
    """What a pack's worker needs: its jobs, the structures their configs are made from, Hydra's state."""

    jobs: list[JobSpec]
    structures: dict[int, DictConfig]
    whole: dict[int, DictConfig]  # by job num: the configs of jobs Hydra composed whole (JobSpec.structure None)
    hydra_context: HydraContext
    singleton_state: dict[Any, Any]


@dataclass
class Planned:
    """A job as the launcher plans it: its spec, dir, pack entry and whether it is finished (resume)."""

    spec: JobSpec
    out_dir: Path
    entry: Any  # rlexp.run.pack.PackEntry
    finished: bool


class PackedLauncher(Launcher):
    def __init__(self, **conf: Any) -> None:
        """``conf``: the launcher's config (``config.PackedLauncherConf``: backend, n_jobs, max_members,
        dry_run, submitit, ray)."""
        self.conf = OmegaConf.create(conf)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.backend: Backend | None = None

    @staticmethod
    def check_settings(conf: DictConfig, sweep_dir: Path) -> Backend:
        """The backend ``conf`` (the launcher's config) names, its settings checked: a ConfigError naming
        the key, the value and the fix, before anything is written (``rlexp.cli.check_command_line``
        calls it before Hydra starts)."""
        from rlexp.config.schema import ConfigError

        if conf.max_members < 1:
            raise ConfigError("hydra.launcher.max_members", f"{conf.max_members} is below 1", "give a value >= 1")
        return backend(conf, sweep_dir)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Check the launcher's settings (one line, exit code 2), and compose every job's config through
        ``SweepComposer`` from now on (Hydra's sweeper checks each with it)."""
        from rlexp.config.schema import ConfigError

        try:
            self.backend = self.check_settings(self.conf, Path(str(config.hydra.sweep.dir)))
        except ConfigError as err:
            print(err, file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        self.config, self.hydra_context = config, hydra_context
        self.composer = SweepComposer(hydra_context.config_loader)
        hydra_context.config_loader.load_sweep_config = self.composer.check  # type: ignore[method-assign]

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None and self.backend is not None
        loader = self.hydra_context.config_loader
        vars(loader).pop("load_sweep_config", None)  # Hydra's own in the tasks' pickled context
        try:
            return self._launch(job_overrides, initial_job_idx)
        finally:
            loader.load_sweep_config = self.composer.check  # type: ignore[method-assign]  # the next batch's check

    def _launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
        from rlexp.run.pack import plan

        assert self.config is not None and self.backend is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        jobs = [self._plan(list(o), initial_job_idx + i) for i, o in enumerate(job_overrides)]
        todo = [job for job in jobs if not job.finished]
        packs = [[todo[i] for i in pack] for pack in plan([job.entry for job in todo], self.conf.max_members)]
        print(
            f"rlexp_packed: {len(todo)} jobs in {len(packs)} packs "
            f"(max_members={self.conf.max_members}, backend={self.conf.backend})",
            flush=True,
        )
        if self.conf.dry_run:
            self._end_dry_run(packs, len(jobs) - len(todo))
        outcome: dict[int, CellResult] = {}
        finished = [job for job in jobs if job.finished]
        if finished:  # resume: their recorded summaries, each cell's "is finished" line
            outcome.update(zip((j.spec.num for j in finished), train_pack(self._task(finished))))
        results = self.backend.run(train_pack, [self._task(pack) for pack in packs])
        for pack, result in zip(packs, results):
            if isinstance(result, Failure):
                print(f"rlexp_packed: a pack of {len(pack)} cells failed: {result.reason}", file=sys.stderr, flush=True)
                result = [(None, result.reason)] * len(pack)
            outcome.update(zip((job.spec.num for job in pack), result))
            if not self.backend.console:
                for job, (summary, error) in zip(pack, result):
                    print(_cell_line(job, summary, error), flush=True)
        return [self._job_return(job, *outcome[job.spec.num]) for job in jobs]

    def _plan(self, overrides: list[str], num: int) -> Planned:
        """Compose job ``num``'s config and read what planning needs of it; the config is not kept."""
        from rlexp.algos import ALGOS
        from rlexp.run.jobs import is_finished
        from rlexp.run.pack import pack_entry

        assert self.config is not None
        spec = self.composer.spec(self.config, overrides, num)
        config = self.composer.config(self.config, spec, fresh=False)
        out_dir = _output_dir(config)
        finished = bool(config.resume) and is_finished(out_dir)
        return Planned(spec, out_dir, pack_entry(config, ALGOS[config.algo.name].member_keys), finished)

    def _task(self, jobs: list[Planned]) -> PackTask:
        assert self.hydra_context is not None and self.config is not None
        used = {job.spec.structure for job in jobs if job.spec.structure is not None}
        structures = {i: self.composer.structures[i] for i in used}
        alone = [job.spec for job in jobs if job.spec.structure is None]
        whole = {spec.num: self.composer.config(self.config, spec) for spec in alone}
        return PackTask([job.spec for job in jobs], structures, whole, self.hydra_context, Singleton.get_state())

    def _end_dry_run(self, packs: list[list[Planned]], finished: int) -> None:
        """Print the plan, one line per pack (its members and its jobs), and what was written; exit 0."""
        from rlexp.cli import SweepSummary

        assert self.config is not None
        for k, pack in enumerate(packs, 1):
            members = sum(job.entry.members for job in pack)
            nums = ", ".join(str(job.spec.num) for job in pack)
            print(f"pack {k}: {members} members, {len(pack)} cells: jobs {nums}")
        skipped = f"; {finished} finished jobs skipped (resume)" if finished else ""
        print(
            f"dry run: nothing trained, no job dir made{skipped}; written: {self.config.hydra.sweep.dir}/multirun.yaml",
            flush=True,
        )
        SweepSummary.pending = None  # no table of jobs that never ran
        raise SystemExit(0)

    def _job_return(self, job: Planned, summary: dict[str, Any] | None, error: str | None) -> JobReturn:
        assert self.config is not None
        ret = JobReturn(overrides=list(job.spec.overrides), working_dir=os.getcwd())
        ret.hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(job.out_dir)}}})
        ret.task_name = str(self.config.hydra.job.name)
        if error is None and summary is not None and summary["status"] != "crashed":
            ret.status, ret.return_value = JobStatus.COMPLETED, summary
        else:
            ret.status, ret.return_value = JobStatus.FAILED, RuntimeError(error or (summary or {}).get("error"))
        return ret


def _output_dir(config: DictConfig) -> Path:
    """The job's dir as Hydra's ``run_job`` makes it: ``hydra.sweep.dir``/``hydra.sweep.subdir``, absolute."""
    raw = str(OmegaConf.to_container(config.hydra.sweep, resolve=False))
    if "hydra:" in raw:  # the ${hydra:...} resolver reads the job's Hydra config, as in run_job
        HydraConfig.instance().set_config(config)
    return Path(os.path.abspath(os.path.join(str(config.hydra.sweep.dir), str(config.hydra.sweep.subdir))))


def _cell_line(job: Planned, summary: dict[str, Any] | None, error: str | None) -> str:
    """The console line of a cell whose pack ran elsewhere (a submitit job, a Ray task)."""
    from rlexp.run.pack import Cell, cell_line

    if summary is not None and "counts" in summary:
        return cell_line(Cell(OmegaConf.create(), job.out_dir, str(summary.get("cell"))), summary)
    return f"{job.out_dir}: {' '.join(job.spec.overrides)}: failed ({error})"


def train_pack(task: PackTask) -> list[CellResult]:
    """Where a pack runs: set up each job with Hydra's ``run_job`` (its ``.hydra`` record), then train the
    pack; each cell's (job summary, None), or (None, the line that refused it or failed the pack)."""
    setup_globals()
    Singleton.set_state(task.singleton_state)
    from rlexp.run.jobs import release_dir, worker_job
    from rlexp.run.pack import Cell, run_pack
    from rlexp.train import job_identity, name_sweep, prepare

    noted: list[tuple[Path, str, dict[str, str]]] = []

    def note(task_cfg: DictConfig) -> None:
        name_sweep(task_cfg)
        out_dir, cell, choices = job_identity()
        release_dir(out_dir)  # held while Hydra recorded the job; run_pack holds it next
        noted.append((out_dir, cell, choices))

    parse = Overrides()
    try:
        with worker_job():  # a SIGTERM stops the pack and every later one in this worker
            cells = []
            for spec in task.jobs:
                if spec.structure is None:
                    config = task.whole[spec.num]
                else:
                    config = job_config(task.structures[spec.structure], spec, parse)
                config.hydra.job.id = f"{config.hydra.job.name}_{spec.num}"
                config.hydra.job.num = spec.num
                ret = run_job(
                    hydra_context=task.hydra_context,
                    task_function=note,
                    config=config,
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                )
                cells.append(Cell(ret.cfg, *noted[-1]))
            results = run_pack(cells, prepare)
    except Exception as exc:  # the pack could not even start: every cell fails with the reason
        print(f"rlexp_packed: a pack of {len(task.jobs)} cells failed: {exc}", file=sys.stderr, flush=True)
        return [(None, str(exc)) for _ in task.jobs]
    return [(r, None) if isinstance(r, dict) else (None, str(r)) for r in results]
