"""The recorder: what a job measures and reports, per member.

It keeps the population's health (who diverged, when, why and where), accumulates each update's
statistics on the device, runs the instruments' explosion checks, paces the step loop with its log
steps, runs the evaluations at their log steps, and writes each member's ``metrics.jsonl``, W&B run
and ``summary.json``. An algorithm hands it its deterministic policy once (``evaluate_with``) and
calls it after each update (``record_update``, ``locate_divergence``, ``record_instruments``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlexp.config.schema import Config
from rlexp.config.state import PerMember
from rlexp.diagnostics.instruments import Explosions, InstrumentHistory, Stats, resolve
from rlexp.envs.gym import PopulationEnv
from rlexp.envs.normalize import ObsNormalizer, RewardScaler
from rlexp.nn.nets import PopMLP
from rlexp.optim.pipeline import CAUSES, Health, UpdateStats
from rlexp.run.evaluation import Evaluation, Evaluator, Policy
from rlexp.run.jobs import set_runs_aside
from rlexp.run.loggers import ConsoleProgress, MemberLog, WandbRuns

Located = tuple[str, str, str]  # (cause, where, detail) of a member's divergence
Locate = Callable[[int, str], Located]  # (member, cause as the pipeline saw it) -> where it was born


def _never() -> bool:
    return False


class Recorder:
    """Per-member health, statistics, instruments and output files of one job's population."""

    def __init__(
        self,
        cfg: Config,
        env: PopulationEnv,
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
        gamma = cfg.algo.gamma if gamma is None else gamma
        if isinstance(gamma, np.ndarray):  # [P] float32 of the float64 1 - gamma, as the scalar path rounds it
            self._q_denominator: float | torch.Tensor = torch.tensor(
                np.maximum(1.0 - gamma[:, 0], 1e-12), dtype=torch.float32, device=device
            )
        else:
            self._q_denominator = max(1.0 - gamma, 1e-12)
        self.env = env
        self.evaluator = evaluator
        self._policy: Policy | None = None  # the algorithm's deterministic policy (evaluate_with)
        self._evaluation: Evaluation | None = None  # this log step's evaluation, for its record
        self._evaluated = np.zeros(len(seeds), dtype=bool)  # [P] the members it counted
        self.eval_returns: list[float | None] = [None] * len(seeds)  # each member's latest evaluation
        self.seeds = seeds
        self.members = len(seeds)
        self.obs_norm, self.reward_norm = obs_norm, reward_norm  # their state goes into normalization.json
        self.device = device
        self.health = Health(self.members, device)
        # per-update statistics, summed (means) or maxed on the device, read once per log step
        self._sums: torch.Tensor | None = None
        self._maxs: torch.Tensor | None = None
        self._sum_keys: list[str] = []
        self._max_keys: list[str] = []
        self._updates = 0
        self._updates_total = 0
        self._notes: dict[str, float] = {}
        # instruments: the latest record ([P] tensors), each member's recent finite records (host)
        self._instruments: Stats = {}
        self.histories = [InstrumentHistory() for _ in range(self.members)]
        self.counts: dict[str, torch.Tensor] = {}  # cumulative per-member counts [P] (interventions), host
        self.explosions = Explosions(self.members, cfg.divergence.patience, device)
        self.divergence: dict[int, dict[str, Any]] = {}  # member -> {cause, where, detail}
        self._injected = False
        self._inject_obs = cfg.debug.inject.what == "obs"  # checked every env step: one bool
        self._inject_rows = [cfg.debug.inject.member]  # the members poisoned (a pack: that member of each cell)
        self.logs: list[MemberLog] = []
        self.wandb: WandbRuns | None = None  # the members' W&B runs, opening in the background
        self.packed_wandb: list[WandbRuns] = []  # a pack's: one per cell (open_pack)
        self.local = list(range(self.members))  # [P] member k's index in its job (its seed_<k> dir)
        self._wandb_unclosed: list[tuple[int, bool]] = []  # (member, failed): summary written, W&B run still open
        self._stopped = False  # close() was called with an error: the job stops
        self.stop_requested: Callable[[], bool] = _never  # a Ctrl-C asks the job to stop (the runner's)
        self.member_done: list[bool] = [False] * self.members
        self.member_summaries: list[dict[str, Any] | None] = [None] * self.members
        self.progress: ConsoleProgress | None = None
        self.start_time = self._last_log_time = time.perf_counter()
        self._last_log_step = 0  # the env step (per member) of the latest log record
        self.first_step_at: str | None = None  # ISO 8601 UTC time of the first env step
        self.checkpoint: Callable[[int], None] | None = None  # writes a checkpoint at an env step (checkpoint.every)
        self.window: Any = None  # multi-agent: rlexp.diagnostics.collapse.ActionWindow, read at each log step
        self.collapses: dict[int, dict[str, Any]] = {}  # member -> the agent that collapsed, when, what moved first
        # population-based training (rlexp.run.pbt): its rounds at log steps, its metrics, W&B config and summary
        self.population: Any = None

    # ------------------------------------------------------------ for algorithms
    def steps(self) -> Iterator[int]:
        """Env steps per member after each vector step (E at a time); logs between steps, and writes a
        checkpoint at the first log step at or after each multiple of ``checkpoint.every`` and at the last.

        Starts after the latest log step (0, or the checkpoint's a continued job starts from); ends
        early when every member has diverged.
        """
        per_step = self.env.num_envs
        log_every = self.cfg.logger.log_every
        crash_at = self.cfg.debug.crash_at_step
        every = self.cfg.checkpoint.every
        step = self._last_log_step
        self.first_step_at = datetime.now(timezone.utc).isoformat()
        while step < self.cfg.total_steps:
            if self.stop_requested():  # a Ctrl-C, acted on between two env steps
                raise KeyboardInterrupt
            step += per_step
            if 0 <= crash_at <= step:  # tests of failure isolation
                raise RuntimeError(f"debug.crash_at_step={crash_at}: a forced crash at env step {step}")
            yield step
            if step // log_every > (step - per_step) // log_every or step >= self.cfg.total_steps:
                previous = self._last_log_step
                evaluated = self._policy is not None and self.evaluator.due(step, previous)
                if evaluated:
                    self._evaluate()
                extra = {}
                if self.population is not None:  # a PBT round (between two env steps) ranks this evaluation
                    mask = self._evaluated if evaluated else None
                    extra = self.population.log_step(step, previous, mask, self.eval_returns)
                self._log(step, extra)
                last = step >= self.cfg.total_steps or all(self.member_done)
                if self.checkpoint is not None and (last or step // every > previous // every):
                    self.checkpoint(step)
                if all(self.member_done):
                    return

    def evaluate_with(self, policy: Policy) -> None:
        """The algorithm's deterministic policy, which evaluation plays (eval.every, eval.episodes):
        normalized observations [P, N, obs] (host) -> actions [P, N] or [P, N, A] (host)."""
        self._policy = policy

    def note(self, **scalars: float) -> None:
        """Remember the latest value of scalars (epsilon, lr) for the next log record: a float for
        every member, or a [P] / [P, 1] array of one per member."""
        self._notes.update(scalars)

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
        if isinstance(updates, UpdateStats):
            updates = {"": updates}
        means: dict[str, torch.Tensor] = {}
        maxes: dict[str, torch.Tensor] = {}
        for prefix, update in updates.items():
            means.update(
                {
                    f"{prefix}loss": update.loss,
                    f"{prefix}grad_norm": update.grad_norm_pre_clip,
                    f"{prefix}grad_norm_post_clip": update.grad_norm_post_clip,
                }
            )
            maxes[f"{prefix}grad_norm_max"] = update.grad_norm_pre_clip
        means.update(stats)
        maxes.update({k: v for k, v in stats.items() if k.endswith("_max")})
        mean_values = torch.stack(list(means.values()))  # [K, P]
        max_values = torch.stack(list(maxes.values()))
        if self._sums is None or self._updates == 0:
            self._sum_keys, self._max_keys = list(means), list(maxes)
            self._sums, self._maxs = mean_values.clone(), max_values.clone()
        else:
            self._sums += mean_values
            self._maxs = torch.maximum(self._maxs, max_values)
        self._updates += 1

    def locate_divergence(self, update: UpdateStats, locate: Locate) -> None:
        """For each member the pipeline ``update`` just marked diverged, record where its divergence was
        born: ``locate(member, cause)`` -> (cause, where, detail); the located cause may refine the
        pipeline's (a non-finite loss whose origin is a non-finite parameter is nonfinite_param)."""
        if update.newly_diverged is not None:
            for member, cause in self._newly_diverged(update.newly_diverged):
                self._set_divergence(member, *locate(member, cause))

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
        self._instruments = record
        scale = torch.as_tensor(reward_scale, dtype=torch.float32, device=self.device)  # [P]
        q_bound = self.cfg.divergence.q_bound_factor * scale / self._q_denominator  # [P]
        self._check_explosions(record, step, grad_norm, q_abs_max, q_bound, output_layer)
        every = self.cfg.diagnostics.histogram_every
        if histograms is not None and every > 0 and update % every == 0:
            self._log_histograms(step, histograms)

    def check_observations(self, obs: np.ndarray, step: int) -> None:
        """Mark members whose observations [P, E, obs] are non-finite (debug.inject.what=obs poisons one)."""
        if self._inject_obs and self._inject_now("obs", step):
            obs[self._inject_rows] = np.nan
        if np.isfinite(obs).all():  # the common case, in one pass
            return
        finite = np.isfinite(obs.reshape(self.members, -1)).all(1)
        if not finite.all():
            ok = torch.from_numpy(finite).to(self.health.alive.device)
            newly = self.health.mark(ok, CAUSES.index("nonfinite_obs"), step)
            for member, _ in self._newly_diverged(newly):
                bad = int((~np.isfinite(obs[member])).sum())
                self._set_divergence(member, "nonfinite_obs", "env.obs", f"{bad} non-finite observation values")

    def inject_param(self, net: PopMLP, step: int) -> None:
        """debug.inject.what=param: poison the member's first weight at the first update at/after the step."""
        if self._inject_now("param", step):
            with torch.no_grad():
                for member in self._inject_rows:
                    net.layers[0].weight[member].view(-1)[0] = float("nan")

    def inject_grad(self, grads: list[torch.Tensor], step: int) -> None:
        """debug.inject.what=grad (a pipeline's after_backward hook): poison the member's first gradient."""
        if self._inject_now("grad", step):
            for member in self._inject_rows:
                grads[0][member].view(-1)[0] = float("nan")

    # ------------------------------------------------------------ divergence
    def _inject_now(self, what: str, step: int) -> bool:
        inject = self.cfg.debug.inject
        if self._injected or inject.what != what or step < inject.step:
            return False
        self._injected = True
        return True

    def _newly_diverged(self, newly: torch.Tensor) -> list[tuple[int, str]]:
        """(member, cause) for each member in the [P] mask ``newly`` (one host read)."""
        if not bool(newly.any()):
            return []
        causes = self.health.cause.tolist()
        return [(k, CAUSES[causes[k]]) for k in newly.nonzero().flatten().tolist()]

    def _set_divergence(self, member: int, cause: str, where: str, detail: str) -> None:
        self.divergence[member] = {"cause": cause, "where": where, "detail": detail}

    def _check_explosions(
        self,
        record: Stats,
        step: int,
        grad_norm: torch.Tensor,
        q_abs_max: torch.Tensor,
        q_bound: torch.Tensor,
        output_layer: str,
    ) -> None:
        div = self.cfg.divergence
        if div.name == "off":
            return
        value, gradient = self.explosions.check(q_abs_max, q_bound, grad_norm, div.grad_norm_bound)
        cause = torch.where(value, CAUSES.index("value_explosion"), CAUSES.index("grad_explosion"))
        newly = self.health.mark(~(value | gradient), cause, step)
        for member, cause_name in self._newly_diverged(newly):
            if cause_name == "value_explosion":
                detail = (
                    f"|Q| {q_abs_max[member].item():.4g} > bound {float(q_bound[member]):.4g} on "
                    f"{div.patience} consecutive records"
                )
                self._set_divergence(member, cause_name, f"{output_layer}.output", detail)
            else:
                layers = {k.split("/", 1)[1]: v[member].item() for k, v in record.items() if k.startswith("grad_norm/")}
                worst = max(layers, key=layers.get) if layers else "gradient"
                detail = (
                    f"gradient norm {grad_norm[member].item():.4g} > bound {div.grad_norm_bound:.4g} on "
                    f"{div.patience} consecutive records; largest in {worst}"
                )
                self._set_divergence(member, cause_name, worst, detail)

    def _log_histograms(self, step: int, histograms: Callable[[], dict[str, torch.Tensor]]) -> None:
        """W&B histograms of [P, ...] tensors (gradients, activations), per live member."""
        logs = [(k, log) for k, log in enumerate(self.logs) if log.logs_to_wandb and not self.member_done[k]]
        if not logs:
            return
        import wandb

        with torch.no_grad():
            values = {name: t.detach().float().cpu().numpy() for name, t in histograms().items() if t is not None}
        for k, log in logs:
            log.log_wandb({f"hist/{name}": wandb.Histogram(v[k].ravel()) for name, v in values.items()}, step)

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """What the job continues from, gathered from the recorder's pieces: health, explosion counts,
        each member's instrument history, the latest instrument record ([P] each, computed: a
        checkpoint follows the log record that resolved them), divergence records, members' ends and
        latest evaluations, the notes and the counters."""
        return {
            "health": self.health.state_dict(),
            "explosions": self.explosions.state_dict(),
            "histories": PerMember([history.state_dict() for history in self.histories]),
            "instruments": dict(self._instruments),
            "divergence": PerMember([self.divergence.get(k) for k in range(self.members)]),
            "member_done": PerMember(self.member_done),
            "member_summaries": PerMember(self.member_summaries),
            "eval_returns": PerMember(self.eval_returns),
            "notes": dict(self._notes),  # a float, or a [P] / [P, 1] array, each
            "counters": {
                "updates_total": self._updates_total,
                "injected": self._injected,
                "last_log_step": self._last_log_step,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``'s values (before the members' logs open)."""
        self.health.load_state_dict(state["health"])
        self.explosions.load_state_dict(state["explosions"])
        for history, saved in zip(self.histories, state["histories"]):
            history.load_state_dict(saved)
        self._instruments = {name: value.to(self.device) for name, value in state["instruments"].items()}
        self.divergence = {k: d for k, d in enumerate(state["divergence"]) if d is not None}
        self.member_done = list(state["member_done"])
        self.member_summaries = list(state["member_summaries"])
        self.eval_returns = list(state["eval_returns"])
        self._notes = {
            name: value.numpy().copy() if isinstance(value, torch.Tensor) else value
            for name, value in state["notes"].items()
        }
        counters = state["counters"]
        self._updates_total = counters["updates_total"]
        self._injected = counters["injected"]
        self._last_log_step = counters["last_log_step"]

    # ------------------------------------------------------------ evaluation
    def _evaluate(self) -> None:
        """Evaluate the members still alive (a diverged member is frozen: its latest evaluation stands)."""
        self._evaluated = self.health.alive.cpu().numpy() & ~np.array(self.member_done)
        self._evaluation = self.evaluator.run(self._policy, self._evaluated)
        returns = self._evaluation.returns
        for k in np.flatnonzero(self._evaluated):
            self.eval_returns[k] = float(returns[k].mean())

    def _eval_metrics(self, k: int) -> dict[str, float]:
        """Member k's eval/ metrics of this log step's evaluation (none when it was not evaluated)."""
        if self._evaluation is None or not self._evaluated[k]:
            return {}
        returns, lengths = self._evaluation.returns[k], self._evaluation.lengths[k]
        return {
            "eval/return": float(returns.mean()),
            "eval/return_std": float(returns.std()),
            "eval/length": float(lengths.mean()),
        }

    # ------------------------------------------------------------ output files
    def open(
        self, out_dir: Path, cell: str, tags: list[str], config: dict[str, Any], continued_from: int | None = None
    ) -> None:
        """Start the clocks and the console progress, then open each member's logs under ``out_dir``
        (``continued_from``: the checkpoint's step a continued job starts from; its logs go on, and a
        member finished before it keeps its files as they are)."""
        self.start_time = self._last_log_time = time.perf_counter()
        self.progress = ConsoleProgress(self.cfg.total_steps, self.cfg.logger.progress, cell)
        if continued_from is not None:
            config = {**config, "continued_from": continued_from}
        self.wandb = WandbRuns(self.cfg.logger, out_dir, cell, tags, config)
        for member, seed in enumerate(self.seeds):  # one by one: close() finds every log opened so far
            run_dir = out_dir / f"seed_{member}"
            run_dir.mkdir(parents=True, exist_ok=True)
            if continued_from is None:
                self.logs.append(MemberLog(run_dir, self.wandb.open(run_dir, seed, member)))
            elif self.member_done[member]:  # finished before the checkpoint: its files and run stay as they are
                self.logs.append(MemberLog(run_dir, None, append=True))
            else:  # a new run of the member that first gets what metrics.jsonl kept; the interrupted one aside
                if self.wandb.mode != "disabled":
                    set_runs_aside(out_dir, run_dir.name)
                self.logs.append(MemberLog(run_dir, self.wandb.open(run_dir, seed, member), append=True))
                self.logs[-1].resend()
        self.wandb.opened_all()

    def open_pack(self, cells: list[tuple[Path, str, list[str], dict[str, Any], int]]) -> None:
        """``open`` for a pack of cells trained as one population (``rlexp.run.pack``): ``cells`` in member
        order, each (its job dir, its cell name: the W&B group, tags, config, its member count); member j
        of a cell writes ``<job dir>/seed_<j>`` and its own W&B run, exactly as the cell's own job would."""
        self.start_time = self._last_log_time = time.perf_counter()
        self.progress = ConsoleProgress(self.cfg.total_steps, self.cfg.logger.progress, f"pack of {len(cells)} cells")
        member = 0
        for out_dir, cell, tags, config, size in cells:
            runs = WandbRuns(self.cfg.logger, out_dir, cell, tags, config)
            self.packed_wandb.append(runs)
            for j in range(size):
                run_dir = out_dir / f"seed_{j}"
                self.local[member] = j
                self.logs.append(MemberLog(run_dir, runs.open(run_dir, self.seeds[member], j)))
                member += 1
            runs.opened_all()
        self._inject_rows = [k for k in range(self.members) if self.local[k] == self.cfg.debug.inject.member]

    def _log(self, step: int, extra: dict[int, dict[str, Any]] | None = None) -> None:
        """Write each running member's record of log step ``step``; ``extra``: member -> metrics of a
        PBT round (its W&B config follows)."""
        extra = extra or {}
        now = time.perf_counter()
        elapsed = now - self._last_log_time
        sps = (step - self._last_log_step) / max(elapsed, 1e-9)
        self._last_log_time, self._last_log_step = now, step
        train: dict[str, list[float]] = {}
        if self._updates > 0:
            sums = (self._sums / self._updates).tolist()
            maxs = self._maxs.tolist()
            train = {f"train/{k}": v for k, v in zip(self._sum_keys, sums)}
            train.update({f"train/{k}": v for k, v in zip(self._max_keys, maxs)})
            self._updates_total += self._updates
            self._updates = 0
        diverged_at = self.health.diverged_at.tolist()
        causes = self.health.cause.tolist()
        episodes = self.env.take_episodes()
        agent_returns = self.env.agent_returns() if hasattr(self.env, "agent_returns") else None
        window, collapsed = self.window.take(step) if self.window is not None else ({}, {})
        instruments: dict[str, list[float]] = {}
        if self._instruments:
            self._instruments = resolve(self._instruments)  # the deferred ones of the one record written
            names = list(self._instruments)
            rows = torch.stack([self._instruments[n] for n in names]).tolist()  # one host read
            instruments = dict(zip(names, rows))
        counts = {name: values.tolist() for name, values in self.counts.items()}
        for k, log in enumerate(self.logs):
            if self.member_done[k]:
                continue
            metrics: dict[str, Any] = {"perf/steps_per_s": sps, "train/updates": self._updates_total}
            for name, value in self._notes.items():  # a float, or an array of one per member
                metrics[f"train/{name}"] = float(value.reshape(-1)[k]) if isinstance(value, np.ndarray) else value
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
            metrics.update(self._eval_metrics(k))
            metrics.update({name: values[k] for name, values in counts.items()})
            record = {name: values[k] for name, values in instruments.items()}
            metrics.update(record)
            if k in extra:
                metrics.update(extra[k])
                log.update_wandb_config(self.population.wandb_config(k))
            log.log(step, metrics)
            if k in collapsed:
                self.collapses[k] = {**collapsed[k], "first_moved": self.histories[k].first_moved()}
            if diverged_at[k] >= 0:
                self._finish_member(k, step, "diverged", diverged_at[k], CAUSES[causes[k]])
            else:
                self.histories[k].add(step, record)
        self._evaluation = None
        alive = self.members - sum(self.member_done)
        best = [np.mean(r) for r in self.env.last_returns if r]
        info = f"{sps:.0f} steps/s"
        if best:
            info = f"alive {alive}/{self.members}  return {np.mean(best):.1f}  {info}"
        self.progress.update(step, info)

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
            "member": self.local[k],
            "steps": step,
            "final_return": float(np.mean(returns)) if returns else None,
            "eval_return": self.eval_returns[k],
            "episodes": int(self.env.episode_count[k]),
            "wall_s": round(time.perf_counter() - self.start_time, 3),
            "diverged_at_step": None,
            "divergence": None,
        }
        if diverged_at is not None:
            summary["diverged_at_step"] = diverged_at
            located = self.divergence.get(k, {"cause": cause, "where": None, "detail": None})
            summary["divergence"] = {
                **located,
                "last_finite": self.histories[k].last(),
                "first_moved": self.histories[k].first_moved(),
            }
        if k in self.collapses:
            summary["collapse"] = self.collapses[k]
        if self.population is not None:
            summary["pbt"] = self.population.summary(k)
        if error is not None:
            summary["error"] = error
        self.member_summaries[k] = summary
        self.member_done[k] = True
        normalization = {"obs": self.obs_norm.state(k), "reward": self.reward_norm.state(k)}
        if any(normalization.values()):
            (self.logs[k].dir / "normalization.json").write_text(json.dumps(normalization) + "\n")
        if close_wandb:
            self.logs[k].finish(summary, failed=status == "crashed")
        else:
            self.logs[k].write_summary(summary)
            self._wandb_unclosed.append((k, status == "crashed"))

    def close(self, error: str | None) -> list[dict[str, Any]]:
        """Close the progress display and write the summary of every member still running (crashed
        when ``error``, else ok, at the latest log step); returns the members' summaries. Their W&B
        runs stay open until ``close_wandb``: summaries first, so an interruption cannot lose them."""
        self._stopped = error is not None
        try:
            if self.progress is not None:
                self.progress.close()
            self.evaluator.close()
        finally:
            for k in range(len(self.logs)):
                if not self.member_done[k]:
                    status = "crashed" if error else "ok"
                    self._finish_member(k, self._last_log_step, status, error=error, close_wandb=False)
        return [s for s in self.member_summaries if s is not None]

    def close_wandb(self) -> None:
        """End the W&B side after ``close``: stop the thread that opens runs (a job that stopped
        never opens the runs still queued), then end every member's run still open."""
        for runs in [self.wandb] if self.wandb is not None else self.packed_wandb:
            runs.stop(cancel=self._stopped)
        unclosed, self._wandb_unclosed = self._wandb_unclosed, []
        for k, failed in unclosed:
            try:
                self.logs[k].close_wandb(self.member_summaries[k], failed)
            except Exception as err:  # one run's trouble never leaves the others open
                print(f"W&B run of {self.logs[k].dir} did not close ({type(err).__name__}: {err})", file=sys.stderr)
