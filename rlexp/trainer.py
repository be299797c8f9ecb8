"""The trainer: everything algorithms share, and the job's output contract.

It owns the device, the population's seeds, environments and random streams, member health,
network and gradient-pipeline construction, the step loop with logging and progress, and the
output files (``summary.json``, ``seed_<k>/summary.json``, ``seed_<k>/metrics.jsonl``, W&B runs).
An algorithm (``rlexp.algos``) receives the trainer and reads top to bottom.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from rlexp.algos import ALGOS
from rlexp.build import resolve_device, validate
from rlexp.config import Config, ConfigError
from rlexp.envs import PopulationEnv
from rlexp.diagnostics import Explosions, InstrumentHistory
from rlexp.grad import CAUSES, GradientPipeline, Health, UpdateStats
from rlexp.jobs import job_summary, record_crash, start_job, write_json
from rlexp.loggers import ConsoleProgress, MemberLog, open_member_logs, print_summary
from rlexp.nets import PopMLP, weight_parameters
from rlexp.normalize import ObsNormalizer, RewardScaler
from rlexp.registry import SCHEMAS
from rlexp.streams import MemberStreams, member_generator


def network_groups(cfg: Config, role: Optional[str]) -> Tuple[Any, Any, Any, Any]:
    """(activation, init, normalization, network) configs for a network: the shared groups, with
    the actor's or critic's overrides (an overriding option takes its default parameters)."""
    groups = {"activation": cfg.activation, "init": cfg.init, "normalization": cfg.normalization}
    network = cfg.network
    if role is not None:
        override = getattr(cfg, role)
        for group, shared in groups.items():
            name = getattr(override, group)
            if name is not None and name != shared.name:
                groups[group] = SCHEMAS[group][name](name=name)
        if override.last_layer_gain is not None:
            groups["init"] = dataclasses.replace(groups["init"], last_layer_gain=override.last_layer_gain)
        if override.hidden is not None:
            network = dataclasses.replace(network, hidden=list(override.hidden))
        if override.linear_last_hidden is not None:
            network = dataclasses.replace(network, linear_last_hidden=override.linear_last_hidden)
    return groups["activation"], groups["init"], groups["normalization"], network


def population_threads(members: int) -> int:
    """``threads=-1``: torch threads for a population of ``members`` — one per 8 members (a smaller
    population's matmuls are too small to split), at most the cores this process may use."""
    return max(1, min(len(os.sched_getaffinity(0)), members // 8))


class Trainer:
    """Runs one job: a population of ``num_seeds`` members trained together."""

    def __init__(self, cfg: DictConfig, out_dir: Path, cell: str = "default", choices: Optional[Dict[str, str]] = None):
        self.config = OmegaConf.to_container(cfg, resolve=True)  # plain dict, for logs and summaries
        self.cfg: Config = OmegaConf.to_object(cfg)  # dataclasses: fast attribute access in the loop
        cfg = self.cfg
        self.out_dir = out_dir
        self.cell = cell
        self.choices = choices or {}
        self.device = resolve_device(cfg.device)
        threads = population_threads(cfg.num_seeds) if cfg.threads == -1 else cfg.threads
        if threads > 0:
            torch.set_num_threads(threads)
        self.seeds: List[int] = [cfg.seed + k for k in range(cfg.num_seeds)]
        self.members = len(self.seeds)
        torch.manual_seed(cfg.seed)
        self.env = PopulationEnv(cfg.env, self.seeds)
        self.streams = MemberStreams(self.seeds)
        self.obs_norm = ObsNormalizer(cfg.obs_norm, self.members, self.env.obs_dim)
        self.reward_norm = RewardScaler(cfg.reward_norm, self.members, self.env.num_envs, cfg.algo.gamma)
        self.health = Health(self.members, self.device)
        self._nets_made = 0
        # per-update statistics, summed (means) or maxed on the device, read once per log step
        self._sums: Optional[torch.Tensor] = None
        self._maxs: Optional[torch.Tensor] = None
        self._sum_keys: List[str] = []
        self._max_keys: List[str] = []
        self._updates = 0
        self._updates_total = 0
        self._notes: Dict[str, float] = {}
        self.logs: List[MemberLog] = []
        self.member_done: List[bool] = [False] * self.members
        self.member_summaries: List[Optional[Dict[str, Any]]] = [None] * self.members
        # instruments: the latest record ([P] tensors), each member's recent finite records (host)
        self._instruments: Dict[str, torch.Tensor] = {}
        self.histories = [InstrumentHistory() for _ in range(self.members)]
        self.explosions = Explosions(self.members, cfg.divergence.patience, self.device)
        self.divergence: Dict[int, Dict[str, Any]] = {}  # member -> {cause, where, detail}
        self._injected = False
        self._inject_obs = cfg.debug.inject.what == "obs"
        self.first_step_time: Optional[float] = None

    # ------------------------------------------------------------ for algorithms
    def make_net(self, n_in: int, n_out: int, role: Optional[str] = None, extra_in: int = 0) -> PopMLP:
        """A population MLP from the config groups; each member's weights from its own generator.

        ``role`` "actor" or "critic" applies that network's overrides (``actor.activation=...``);
        a critic takes ``extra_in`` action inputs at layer ``critic.action_layer``.
        """
        purpose = 10 + self._nets_made  # a distinct stream per network built
        self._nets_made += 1
        generators = [member_generator(s, purpose) for s in self.seeds]
        activation, init, normalization, network = network_groups(self.cfg, role)
        extra_at = self.cfg.critic.action_layer if role == "critic" else 0
        net = PopMLP(self.members, n_in, n_out, network, activation, normalization, init, generators,
                     extra_in=extra_in, extra_at=extra_at)
        return net.to(self.device)

    def make_pipeline(self, net: torch.nn.Module) -> GradientPipeline:
        """The gradient pipeline (the configured optimizer, clipping, penalties, divergence checks)
        for one network (or a ModuleList of networks trained by one loss, such as TD3's twin
        critics); ``pipeline.optimizer`` is its optimizer."""
        params = [p for p in net.parameters() if p.requires_grad]
        pipeline = GradientPipeline(params, self.cfg.optimizer, self.cfg.clipping, self.cfg.regularization,
                                    weight_parameters(net), self.health)
        if self.cfg.debug.inject.what == "grad":
            pipeline.after_backward = self._inject_grad
        return pipeline

    # ------------------------------------------------------------ fault injection, divergence
    def _inject_now(self, what: str, step: int) -> bool:
        inject = self.cfg.debug.inject
        if self._injected or inject.what != what or step < inject.step:
            return False
        self._injected = True
        return True

    def _inject_grad(self, grads: List[torch.Tensor], step: int) -> None:
        if self._inject_now("grad", step):
            grads[0][self.cfg.debug.inject.member].view(-1)[0] = float("nan")

    def inject_param(self, net: PopMLP, step: int) -> None:
        """debug.inject.what=param: poison the member's first weight at the first update at/after the step."""
        if self._inject_now("param", step):
            with torch.no_grad():
                net.layers[0].weight[self.cfg.debug.inject.member].view(-1)[0] = float("nan")

    def check_observations(self, obs: np.ndarray, step: int) -> None:
        """Mark members whose observations [P, E, obs] are non-finite (debug.inject.what=obs poisons one)."""
        if self._inject_obs and self._inject_now("obs", step):
            obs[self.cfg.debug.inject.member] = np.nan
        if np.isfinite(obs).all():  # the common case, in one pass
            return
        finite = np.isfinite(obs.reshape(self.members, -1)).all(1)
        if not finite.all():
            newly = self.health.mark(torch.from_numpy(finite).to(self.device), CAUSES.index("nonfinite_obs"), step)
            for member, _ in self.newly_diverged(newly):
                bad = int((~np.isfinite(obs[member])).sum())
                self.set_divergence(member, "nonfinite_obs", "env.obs", f"{bad} non-finite observation values")

    def newly_diverged(self, newly: torch.Tensor) -> List[tuple[int, str]]:
        """(member, cause) for each member in the [P] mask ``newly`` (one host read)."""
        if not bool(newly.any()):
            return []
        causes = self.health.cause.tolist()
        return [(k, CAUSES[causes[k]]) for k in newly.nonzero().flatten().tolist()]

    def newly_diverged_in(self, update: UpdateStats) -> List[tuple[int, str]]:
        """(member, cause) for each member a pipeline update just marked diverged."""
        return [] if update.newly_diverged is None else self.newly_diverged(update.newly_diverged)

    def set_divergence(self, member: int, cause: str, where: str, detail: str) -> None:
        """Record where a member's divergence was born (the cause as located, which may refine the
        pipeline's: a non-finite loss whose origin is a non-finite parameter is nonfinite_param)."""
        self.divergence[member] = {"cause": cause, "where": where, "detail": detail}

    def record_instruments(self, record: Dict[str, torch.Tensor], step: int, grad_norm: torch.Tensor,
                           q_abs_max: torch.Tensor, q_bound: torch.Tensor, output_layer: str) -> None:
        """Keep the latest instrument record and run the explosion checks (divergence=on)."""
        self._instruments = record
        div = self.cfg.divergence
        if div.name == "off":
            return
        value, gradient = self.explosions.check(q_abs_max, q_bound, grad_norm, div.grad_norm_bound)
        cause = torch.where(value, CAUSES.index("value_explosion"), CAUSES.index("grad_explosion"))
        newly = self.health.mark(~(value | gradient), cause, step)
        for member, cause_name in self.newly_diverged(newly):
            if cause_name == "value_explosion":
                detail = (f"|Q| {q_abs_max[member].item():.4g} > bound {float(q_bound[member]):.4g} on "
                          f"{div.patience} consecutive records")
                self.set_divergence(member, cause_name, f"{output_layer}.output", detail)
            else:
                layers = {k.split("/", 1)[1]: v[member].item() for k, v in record.items() if k.startswith("grad_norm/")}
                worst = max(layers, key=layers.get) if layers else "gradient"
                detail = (f"gradient norm {grad_norm[member].item():.4g} > bound {div.grad_norm_bound:.4g} on "
                          f"{div.patience} consecutive records; largest in {worst}")
                self.set_divergence(member, cause_name, worst, detail)

    def log_histograms(self, step: int, tensors: Dict[str, torch.Tensor]) -> None:
        """W&B histograms of [P, ...] tensors (gradients, activations), per live member."""
        logs = [(k, log) for k, log in enumerate(self.logs) if log.logs_to_wandb and not self.member_done[k]]
        if not logs:
            return
        import wandb

        values = {name: t.detach().float().cpu().numpy() for name, t in tensors.items() if t is not None}
        for k, log in logs:
            log.log_wandb({f"hist/{name}": wandb.Histogram(v[k].ravel()) for name, v in values.items()}, step)

    def note(self, **scalars: float) -> None:
        """Remember the latest value of job-wide scalars (epsilon, ...) for the next log record."""
        self._notes.update(scalars)

    def record_update(self, updates: UpdateStats | Dict[str, UpdateStats], stats: Dict[str, torch.Tensor]) -> None:
        """Accumulate one update's per-member statistics (all [P]) without leaving the device.

        ``updates``: one pipeline's results, or several keyed by a name prefix ({"actor_": ...,
        "critic_": ...} gives train/actor_loss, train/critic_grad_norm, ...).
        """
        if isinstance(updates, UpdateStats):
            updates = {"": updates}
        means: Dict[str, torch.Tensor] = {}
        maxes: Dict[str, torch.Tensor] = {}
        for prefix, update in updates.items():
            means.update({f"{prefix}loss": update.loss, f"{prefix}grad_norm": update.grad_norm_pre_clip,
                          f"{prefix}grad_norm_post_clip": update.grad_norm_post_clip})
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

    def steps(self) -> Iterator[int]:
        """Env steps per member after each vector step (E at a time); logs between steps.

        Ends early when every member has diverged.
        """
        per_step = self.env.num_envs
        log_every = self.cfg.logger.log_every
        crash_at = self.cfg.debug.crash_at_step
        step = 0
        self.first_step_time = time.time()
        while step < self.cfg.total_steps:
            step += per_step
            if 0 <= crash_at <= step:  # tests of failure isolation
                raise RuntimeError(f"debug.crash_at_step={crash_at}: a forced crash at env step {step}")
            yield step
            if step // log_every > (step - per_step) // log_every or step >= self.cfg.total_steps:
                self._log(step)
                if all(self.member_done):
                    return

    # ------------------------------------------------------------ logging
    def _log(self, step: int) -> None:
        now = time.perf_counter()
        elapsed = now - self._last_log_time
        sps = (step - self._last_log_step) / max(elapsed, 1e-9)
        self._last_log_time, self._last_log_step = now, step
        train: Dict[str, List[float]] = {}
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
        instruments: Dict[str, List[float]] = {}
        if self._instruments:
            names = list(self._instruments)
            rows = torch.stack([self._instruments[n] for n in names]).tolist()  # one host read
            instruments = dict(zip(names, rows))
        for k, log in enumerate(self.logs):
            if self.member_done[k]:
                continue
            metrics: Dict[str, Any] = {"perf/steps_per_s": sps, "train/updates": self._updates_total}
            metrics.update({f"train/{n}": v for n, v in self._notes.items()})
            metrics.update({name: values[k] for name, values in train.items()})
            if episodes[k]:
                metrics["episode/return"] = float(np.mean([r for r, _ in episodes[k]]))
                metrics["episode/length"] = float(np.mean([n for _, n in episodes[k]]))
            if self.env.last_returns[k]:
                metrics["episode/return_last10"] = float(np.mean(self.env.last_returns[k]))
            metrics["episode/count"] = int(self.env.episode_count[k])
            record = {name: values[k] for name, values in instruments.items()}
            metrics.update(record)
            log.log(step, metrics)
            if diverged_at[k] >= 0:
                self._finish_member(k, step, "diverged", diverged_at[k], CAUSES[causes[k]])
            else:
                self.histories[k].add(step, record)
        alive = self.members - sum(self.member_done)
        best = [np.mean(r) for r in self.env.last_returns if r]
        info = f"alive {alive}/{self.members}  return {np.mean(best):.1f}  {sps:.0f} steps/s" if best else f"{sps:.0f} steps/s"
        self.progress.update(step, info)

    def _member_summary(self, k: int, step: int, status: str) -> Dict[str, Any]:
        returns = self.env.last_returns[k]
        return {
            "status": status,
            "seed": self.seeds[k],
            "member": k,
            "steps": step,
            "final_return": float(np.mean(returns)) if returns else None,
            "episodes": int(self.env.episode_count[k]),
            "wall_s": round(time.perf_counter() - self.start_time, 3),
            "diverged_at_step": None,
            "divergence": None,
        }

    def _finish_member(self, k: int, step: int, status: str, diverged_at: Optional[int] = None,
                       cause: Optional[str] = None, error: Optional[str] = None) -> None:
        summary = self._member_summary(k, step, status)
        if diverged_at is not None:
            summary["diverged_at_step"] = diverged_at
            located = self.divergence.get(k, {"cause": cause, "where": None, "detail": None})
            summary["divergence"] = {**located, "last_finite": self.histories[k].last(),
                                     "first_moved": self.histories[k].first_moved()}
        if error is not None:
            summary["error"] = error
        self.member_summaries[k] = summary
        self.member_done[k] = True
        normalization = {"obs": self.obs_norm.state(k), "reward": self.reward_norm.state(k)}
        if any(normalization.values()):
            (self.logs[k].dir / "normalization.json").write_text(json.dumps(normalization) + "\n")
        self.logs[k].finish(summary, failed=status == "crashed")

    # ------------------------------------------------------------ the job
    def fit(self) -> Dict[str, Any]:
        """Train, write the output contract, print the summary; returns the job summary."""
        cfg = self.cfg
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.start_time = self._last_log_time = time.perf_counter()
        self._last_log_step = 0
        config = self.config
        tags = [f"{g}:{o}" for g, o in sorted(self.choices.items())]
        self.progress = ConsoleProgress(cfg.total_steps, cfg.logger.progress, self.cell)
        error: Optional[str] = None
        try:
            self.logs = open_member_logs(cfg.logger, self.out_dir, self.seeds, self.cell, tags, config)
            gc.freeze()  # the objects made so far (torch, hydra, ...) live on: keep the collector off them
            ALGOS[cfg.algo.name].train(self)
        except BaseException as exc:
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            (self.out_dir / "error.txt").write_text(traceback.format_exc())
            raise
        finally:
            self.progress.close()
            self.env.close()
            steps = self._last_log_step
            for k in range(len(self.logs)):
                if not self.member_done[k]:
                    self._finish_member(k, steps, "crashed" if error else "ok", error=error)
            job = self._write_job_summary(config, error)
            print_summary(self.progress.console, f"{self.cell}: {cfg.algo.name} on {cfg.env.id}",
                          [s for s in self.member_summaries if s is not None])
        return job

    def _write_job_summary(self, config: Dict[str, Any], error: Optional[str]) -> Dict[str, Any]:
        members = [s for s in self.member_summaries if s is not None]
        job = job_summary(config, self.cell, self.choices, members, time.perf_counter() - self.start_time, error)
        job["first_step_time"] = self.first_step_time  # unix time of the first env step (start-up benchmarks)
        job["threads"] = torch.get_num_threads()  # the torch threads the job ran with
        write_json(self.out_dir / "summary.json", job)
        return job


def run_job(cfg: DictConfig, out_dir: Path, cell: str = "default", choices: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Run one job in ``out_dir`` and return its summary: skip it when it is finished and
    ``resume`` is set, refuse (ConfigError) when it is finished and ``resume`` is not; validate the
    config (ConfigError on a bad value), then train. A job that raises leaves a crashed summary."""
    config = OmegaConf.to_container(cfg, resolve=True)
    recorded = start_job(out_dir, config, cfg.resume)
    if recorded is not None:
        return recorded
    start = time.perf_counter()
    try:
        validate(cfg)
        trainer = Trainer(cfg, out_dir, cell, choices)
    except ConfigError:
        raise  # bad input: refused before any work, nothing recorded
    except BaseException as exc:
        record_crash(out_dir, config, cell, choices or {}, exc, time.perf_counter() - start)
        raise
    return trainer.fit()
