"""``StudySweeper``: hydra-optuna-sweeper's ``OptunaSweeperImpl`` with rlexp's trial reports (see
``optuna_sweeper``). Imported only when the sweeper is used (it needs optuna)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from hydra_plugins.hydra_optuna_sweeper._impl import OptunaSweeperImpl
from omegaconf import DictConfig, OmegaConf
from optuna.trial import Trial, TrialState

from .optuna_sweeper import failure_line, trial_outcome

log = logging.getLogger(__name__)


class StudySweeper(OptunaSweeperImpl):
    def __init__(self, objective: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.objective = objective
        self.batch: list[Trial] = []  # the trials of the batch being launched
        self.crashed: list[str] = []  # a line per trial whose job crashed or was refused

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.launcher = TrialReports(self.launcher, self)

    def sweep(self, arguments: list[str]) -> None:
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)  # the storage may live there
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        done = self._trials_so_far()
        seed = self.config.hydra.sweeper.sampler.get("seed")
        if done and seed is not None:  # resumed: not the first invocation's random draws again
            self.sampler = instantiate(self.config.hydra.sweeper.sampler, seed=seed + done)
        if done:
            log.info(f"Resuming study {self.study_name}: {done} trials so far; this run adds {self.n_trials}")
        try:
            super().sweep(arguments)
        except ValueError:  # at its end the shipped sweeper asks for the best trial: none when every one failed
            if not self.batch or self.batch[0].study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
                raise
            log.warning(f"No trial of study {self.study_name} completed: each failed (see its user attributes)")
        if self.crashed:
            raise CompactHydraException(
                f"optuna: {len(self.crashed)} trials crashed or were refused ({'; '.join(self.crashed[:3])}); "
                "the study keeps them as failed, with their error"
            )

    def _trials_so_far(self) -> int:
        """The number of trials the study already holds (0 for a new study or an in-memory storage)."""
        if self.storage is None or self.study_name is None:
            return 0
        summaries = optuna.get_all_study_summaries(storage=self.storage)
        return next((s.n_trials for s in summaries if s.study_name == self.study_name), 0)

    def _configure_trials(self, trials: list[Trial], *args: Any) -> Sequence[Sequence[str]]:
        """The batch's overrides, as the shipped sweeper makes them; job k is trial k (``hydra.job.num``)."""
        self.batch = list(trials)
        self.job_idx = trials[0].number  # consecutive: one process asks the study for the whole batch
        return super()._configure_trials(trials, *args)

    def report(self, trial: Trial, ret: JobReturn) -> None:
        """Record job ``ret`` on its running ``trial`` (user attributes) and turn its summary into the
        trial's value, or into the line that fails it."""
        job_dir = OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir")
        trial.set_user_attr("job_dir", job_dir)
        if ret.status != JobStatus.COMPLETED:  # crashed or refused: the sweeper fails it with the error
            error = "failed"
            try:
                _ = ret.return_value  # raises the job's error
            except Exception as err:
                error = str(err)
            crashed = (Path(job_dir) / "summary.json").is_file()  # a refused job writes nothing
            trial.set_user_attr("status", "crashed" if crashed else "refused")
            trial.set_user_attr("error", error)
            self.crashed.append(f"trial {trial.number}: {error}")
            return
        value, attrs = trial_outcome(ret.return_value, self.objective)
        for key, item in attrs.items():
            trial.set_user_attr(key, item)
        # a number is the trial's value; the line (no number) makes the sweeper fail the trial, a result
        ret.return_value = value if value is not None else failure_line(attrs)


class TrialReports(Launcher):
    """The launcher the sweeper calls: the configured launcher, then each job reported to its trial."""

    def __init__(self, launcher: Launcher, sweeper: StudySweeper) -> None:
        self.launcher, self.sweeper = launcher, sweeper

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.launcher.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        returns = self.launcher.launch(job_overrides, initial_job_idx)
        for trial, ret in zip(self.sweeper.batch, returns):
            self.sweeper.report(trial, ret)
        return returns
