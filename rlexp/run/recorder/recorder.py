"""The recorder: what a job measures and reports, per member, composed of parts with one job each.

- ``Schedule`` (schedule.py): the step loop, its log steps and their events, checkpoints at log steps;
- ``UpdateMetrics`` (metrics.py): each update's statistics, notes and the latest instrument record;
- ``DivergenceTracker`` (divergence.py): health, explosions, where divergences were born;
- ``FaultInjector`` (faults.py): ``debug.inject.*`` and ``debug.crash_at_step``;
- ``Evaluations`` (evaluations.py): the policy's evaluations at log steps;
- ``Outputs`` (outputs.py): metrics.jsonl, W&B runs, summaries, the console progress.

The recorder is the face an algorithm calls (``steps``, ``evaluate_with``, ``note``, ``diagnose``,
``record_update``, ``locate_divergence``, ``record_instruments``, ``check_observations``,
``inject_param``, ``inject_grad``); at each log step it gathers the parts' figures into each member's
record (``_record``) and finishes the members that diverged. Its state is its parts' state dicts, one
nested dict each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from rlexp.config.schema import Config
from rlexp.diagnostics.instruments import Stats
from rlexp.envs.gym import PopulationEnv
from rlexp.envs.normalize import ObsNormalizer, RewardScaler
from rlexp.envs.shift import ShiftedEnv
from rlexp.nn.nets import PopMLP
from rlexp.optim.pipeline import CAUSES, Health, UpdateStats
from rlexp.run.evaluation import Evaluator, Policy
from rlexp.run.loggers import MemberLog
from rlexp.run.recorder.divergence import DivergenceTracker, Locate
from rlexp.run.recorder.evaluations import Evaluations
from rlexp.run.recorder.faults import FaultInjector
from rlexp.run.recorder.metrics import UpdateMetrics
from rlexp.run.recorder.outputs import Job, Outputs
from rlexp.run.recorder.schedule import LogStep, Schedule


class Recorder:
    """Per-member health, statistics, instruments and output files of one population."""

    def __init__(
        self,
        cfg: Config,
        env: PopulationEnv | ShiftedEnv,
        seeds: list[int],
        device: torch.device,
        obs_norm: ObsNormalizer,
        reward_norm: RewardScaler,
        evaluator: Evaluator,
        gamma: float | np.ndarray | None = None,
    ) -> None:
        """``gamma``: the discount of divergence's value bound, one per member ([P, 1]) when the
        members differ (default ``cfg.algo.gamma``)."""
        self.cfg = cfg
        self.env = env
        self.seeds = seeds
        self.members = len(seeds)
        self.device = device
        self.obs_norm, self.reward_norm = obs_norm, reward_norm  # their state goes into normalization.json
        self.evaluator = evaluator
        self.schedule = Schedule(cfg.total_steps, env.num_envs, cfg.logger.log_every, cfg.checkpoint.every)
        self.metrics = UpdateMetrics(device)
        gamma = cfg.algo.gamma if gamma is None else gamma
        self.divergence = DivergenceTracker(cfg.divergence, self.members, device, gamma)
        self.faults = FaultInjector(cfg.debug, self.members)
        self.evaluations = Evaluations(evaluator, self.members)
        self.outputs = Outputs(cfg.logger, cfg.total_steps, seeds)
        self.window: Any = None  # multi-agent: rlexp.diagnostics.collapse.ActionWindow, read at each log step
        self.population: Any = None  # population-based training (rlexp.run.pbt): its rounds at log steps
        self.resumed: dict[str, Any] | None = None  # how a job continued from a checkpoint (RunContext notes it)
        if self.faults.crash_at >= 0:  # debug.crash_at_step
            self.schedule.before_step.append(self.faults.crash)
        self.schedule.at_log_step += [self._evaluate, self._pbt_round, self._record]
        self.schedule.finished = lambda: all(self.outputs.done)

    # ------------------------------------------------------------ the parts' state others read
    @property
    def health(self) -> Health:
        """The population's health ([P] alive, diverged_at, cause), which the pipelines mark."""
        return self.divergence.health

    @property
    def counts(self) -> dict[str, torch.Tensor]:
        """Cumulative per-member counts [P] logged at each log step (the interventions')."""
        return self.metrics.counts

    @counts.setter
    def counts(self, counts: dict[str, torch.Tensor]) -> None:
        self.metrics.counts = counts

    @property
    def checkpoint(self) -> Callable[[int], None] | None:
        """Writes a checkpoint at an env step (``checkpoint.every``), at the schedule's log steps."""
        return self.schedule.checkpoint

    @checkpoint.setter
    def checkpoint(self, write: Callable[[int], None] | None) -> None:
        self.schedule.checkpoint = write

    @property
    def logs(self) -> list[MemberLog]:
        return self.outputs.logs

    @property
    def member_done(self) -> list[bool]:
        return self.outputs.done

    @property
    def member_summaries(self) -> list[dict[str, Any] | None]:
        return self.outputs.summaries

    @property
    def progress(self) -> Any:
        return self.outputs.progress

    @property
    def start_time(self) -> float:
        return self.outputs.start_time

    @property
    def first_step_at(self) -> str | None:
        """ISO 8601 UTC time of the first env step."""
        return self.schedule.first_step_at

    # ------------------------------------------------------------ for algorithms
    def steps(self) -> Iterator[int]:
        """Env steps per member after each vector step (E at a time); logs between steps, and writes a
        checkpoint at the first log step at or after each multiple of ``checkpoint.every`` and at the last.

        Starts after the latest log step (0, or the checkpoint's a continued job starts from); ends
        early when every member has finished.
        """
        yield from self.schedule.steps()

    def evaluate_with(self, policy: Policy) -> None:
        """The algorithm's deterministic policy, which evaluation plays (eval.every, eval.episodes):
        normalized observations [P, N, obs] (host) -> actions [P, N] or [P, N, A] (host)."""
        self.evaluations.policy = policy

    def note(self, **scalars: float) -> None:
        """Remember the latest value of scalars (epsilon, lr) for the next log record: a float for
        every member, or a [P] / [P, 1] array of one per member."""
        self.metrics.note(**scalars)

    def diagnose(self, update: int) -> bool:
        """Whether update number ``update`` (0-based) takes an instrument record (diagnostics.every)."""
        every = self.cfg.diagnostics.every
        return every > 0 and update % every == 0

    def record_update(self, updates: UpdateStats | dict[str, UpdateStats], stats: dict[str, torch.Tensor]) -> None:
        """Accumulate one update's per-member statistics (all [P]) without leaving the device.

        ``updates``: one pipeline's results, or several keyed by a name prefix ({"actor_": ...,
        "critic_": ...} gives train/actor_loss, train/critic_grad_norm, ...). ``stats`` ending in
        ``_max`` are maxed over the log interval as well as averaged.
        """
        self.metrics.add(updates, stats)

    def locate_divergence(self, update: UpdateStats, locate: Locate) -> None:
        """For each member the pipeline ``update`` just marked diverged, record where its divergence was
        born: ``locate(member, cause)`` -> (cause, where, detail); the located cause may refine the
        pipeline's (a non-finite loss whose origin is a non-finite parameter is nonfinite_param)."""
        self.divergence.locate(update, locate)

    def record_instruments(
        self,
        record: Stats,
        step: int,
        grad_norm: torch.Tensor,
        q_abs_max: torch.Tensor,
        reward_scale: torch.Tensor | np.ndarray,
        output_layer: str,
        update: int,
        histograms: Callable[[], dict[str, torch.Tensor]] | None = None,
    ) -> None:
        """Keep the latest instrument record ([P] each; deferred ones are computed if it is written,
        at the next log step) and run the explosion checks (divergence=on).

        ``q_abs_max`` [P] is the largest |value| the output layer ``output_layer`` gave; its bound is
        ``divergence.q_bound_factor * reward_scale / (1 - gamma)`` with ``reward_scale`` [P] the
        largest |reward| per member. ``grad_norm`` [P] is the largest gradient norm. ``histograms``
        gives [P, ...] tensors for W&B every ``diagnostics.histogram_every`` updates (``update``: the
        algorithm's count).
        """
        self.metrics.instruments = record
        self.divergence.check_explosions(record, step, grad_norm, q_abs_max, reward_scale, output_layer)
        every = self.cfg.diagnostics.histogram_every
        if histograms is not None and every > 0 and update % every == 0:
            self.outputs.histograms(step, histograms)

    def check_observations(self, obs: np.ndarray, step: int) -> None:
        """Mark members whose observations [P, E, obs] are non-finite (debug.inject.what=obs poisons one)."""
        if self.faults.poisons_obs:
            self.faults.poison_obs(obs, step)
        self.divergence.check_observations(obs, step)

    def inject_param(self, net: PopMLP, step: int) -> None:
        """debug.inject.what=param: poison the member's first weight at the first update at/after the step."""
        self.faults.poison_param(net, step)

    def inject_grad(self, grads: list[torch.Tensor], step: int) -> None:
        """debug.inject.what=grad (a pipeline's after_backward hook): poison the member's first gradient."""
        self.faults.poison_grad(grads, step)

    # ------------------------------------------------------------ the events of a log step, in order
    def _evaluate(self, log: LogStep) -> None:
        """Evaluate the members still running and alive (a diverged member is frozen: its latest
        evaluation stands) when the log step is an evaluation's."""
        if self.evaluations.due(log.step, log.previous):
            live = self.health.alive.cpu().numpy() & ~np.array(self.outputs.done)
            log.evaluated = self.evaluations.run(live)

    def _pbt_round(self, log: LogStep) -> None:
        """A PBT round (between two env steps) ranks this log step's evaluation."""
        if self.population is not None:
            returns = self.evaluations.returns
            log.extra = self.population.log_step(log.step, log.previous, log.evaluated, returns)

    def _record(self, log: LogStep) -> None:
        """Write each running member's record of the log step and finish the members that diverged;
        a PBT round's metrics come with the member's new W&B config."""
        step = log.step
        sps = self.outputs.steps_per_s(step, log.previous)
        train = self.metrics.take()
        diverged_at = self.health.diverged_at.tolist()
        causes = self.health.cause.tolist()
        episodes = self.env.take_episodes()
        agent_returns = self.env.agent_returns() if hasattr(self.env, "agent_returns") else None
        window, collapsed = self.window.take(step) if self.window is not None else ({}, {})
        instruments = self.metrics.take_instruments()
        counts = {name: values.tolist() for name, values in self.metrics.counts.items()}
        shift = self.env.shift.metrics() if isinstance(self.env, ShiftedEnv) else {}  # env.shift: the current task
        for k in self.outputs.running():
            metrics: dict[str, Any] = {"perf/steps_per_s": sps, "train/updates": self.metrics.updates_total}
            metrics.update(self.metrics.noted(k))
            metrics.update({name: values[k] for name, values in train.items()})
            if episodes[k]:
                metrics["episode/return"] = float(np.mean([r for r, _ in episodes[k]]))
                metrics["episode/length"] = float(np.mean([n for _, n in episodes[k]]))
            if self.env.last_returns[k]:
                metrics["episode/return_last10"] = float(np.mean(self.env.last_returns[k]))
            metrics["episode/count"] = int(self.env.episode_count[k])
            if agent_returns and agent_returns[k]:  # multi-agent: each agent's own return
                for i, value in enumerate(np.mean(agent_returns[k], 0)):
                    metrics[f"episode/return_agent{i}"] = float(value)
            metrics.update({name: float(values[k]) for name, values in window.items()})
            metrics.update(self.evaluations.metrics(k))
            metrics.update({name: values[k] for name, values in counts.items()})
            metrics.update(shift)
            record = {name: values[k] for name, values in instruments.items()}
            metrics.update(record)
            if k in log.extra:
                metrics.update(log.extra[k])
                self.outputs.update_wandb_config(k, self.population.wandb_config(k))
            self.outputs.write(k, step, metrics)
            if k in collapsed:
                self.divergence.collapsed(k, collapsed[k])
            if diverged_at[k] >= 0:
                self._finish_member(k, step, "diverged", diverged_at[k], CAUSES[causes[k]])
            else:
                self.divergence.histories[k].add(step, record)
        self.evaluations.recorded()
        alive = self.members - sum(self.outputs.done)
        best = [np.mean(r) for r in self.env.last_returns if r]
        info = f"{sps:.0f} steps/s"
        if best:
            info = f"alive {alive}/{self.members}  return {np.mean(best):.1f}  {info}"
        self.outputs.progress_line(step, info)

    def _finish_member(
        self,
        k: int,
        step: int,
        status: str,
        diverged_at: int | None = None,
        cause: str | None = None,
        error: str | None = None,
        close_wandb: bool = True,
    ) -> None:
        """Member k's summary.json (and normalization.json); its W&B run ended too, unless not
        ``close_wandb`` (``close_wandb()`` ends it later)."""
        returns = self.env.last_returns[k]
        summary: dict[str, Any] = {
            "status": status,
            "seed": self.seeds[k],
            "member": self.outputs.local[k],
            "steps": step,
            "final_return": float(np.mean(returns)) if returns else None,
            "eval_return": self.evaluations.returns[k],
            "episodes": int(self.env.episode_count[k]),
            "wall_s": round(self.outputs.wall_s(), 3),
            "diverged_at_step": None,
            "divergence": None,
            "resumed": self.resumed,
        }
        if diverged_at is not None:
            summary["diverged_at_step"] = diverged_at
            summary["divergence"] = self.divergence.summary(k, cause)
        if k in self.divergence.collapses:
            summary["collapse"] = self.divergence.collapses[k]
        if self.population is not None:
            summary["pbt"] = self.population.summary(k)
        if error is not None:
            summary["error"] = error
        normalization = {"obs": self.obs_norm.state(k), "reward": self.reward_norm.state(k)}
        self.outputs.finish(k, summary, normalization, close_wandb)

    # ------------------------------------------------------------ the lifecycle's
    def open(self, jobs: list[Job], continued_from: int | None = None) -> None:
        """Open the members' outputs, job by job in member order (``Outputs.open``); fault injection
        then poisons member ``debug.inject.member`` of each job."""
        self.outputs.open(jobs, continued_from)
        self.faults.rows = self.faults.rows_of(self.outputs.local)

    def close(self, error: str | None) -> list[dict[str, Any]]:
        """Close the progress display and write the summary of every member still running (crashed
        when ``error``, else ok, at the latest log step); returns the members' summaries. Their W&B
        runs stay open until ``close_wandb``: summaries first, so an interruption cannot lose them."""
        try:
            self.outputs.close(error)
            self.evaluations.close()
        finally:
            for k in self.outputs.running():
                status = "crashed" if error else "ok"
                self._finish_member(k, self.schedule.last_log_step, status, error=error, close_wandb=False)
        return [s for s in self.outputs.summaries if s is not None]

    def close_wandb(self) -> None:
        """End the W&B side after ``close``: a job that stopped never opens the runs still queued."""
        self.outputs.close_wandb()

    # ------------------------------------------------------------ state
    def parts(self) -> dict[str, Any]:
        """The parts with state, by the name of their entry in ``state_dict``."""
        return {
            "schedule": self.schedule,
            "metrics": self.metrics,
            "divergence": self.divergence,
            "faults": self.faults,
            "evaluations": self.evaluations,
            "outputs": self.outputs,
        }

    def state_dict(self) -> dict[str, Any]:
        """What the job continues from: each part's state dict, under its name."""
        return {name: part.state_dict() for name, part in self.parts().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``'s values (before the members' outputs open)."""
        for name, part in self.parts().items():
            part.load_state_dict(state[name])
