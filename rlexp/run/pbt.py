"""Population-based training (Jaderberg et al. 2017) inside one population (``pbt.*``, docs/pbt.md).

The population's members are PBT's population. Each member starts with hyperparameters of its own,
drawn from ``pbt.<name>`` ranges by PBT's generator (from ``seed``, a purpose of its own: training's
streams are untouched). Every ``pbt.interval`` env steps (at the log step that evaluates), the members
alive are ranked by the mean of their latest ``pbt.window`` evaluations since their last copy; each
member of the bottom ``pbt.fraction`` copies a member of the top fraction drawn uniformly (exploit)
and takes that member's hyperparameters times a factor of ``pbt.factors`` each (explore).

Exploit copies member j's whole training state into member k: the rows of every network the
algorithm hands over (parameters, buffers, target networks), of each pipeline's optimizer state
(moments; the step counts are equal in every run) and L2-init anchor, and of the observation and
reward normalizers' statistics. What belongs to the member's own experience stays its own: its
replay buffer, environments, random streams, running discounted returns of reward scaling, the
interventions' draw streams and counts, its divergence records. A diverged member is frozen and
finished: it is neither ranked nor copied.

Explore changes the member's config (``member_cfgs``, so ``ctx.member_values`` follows) and the
algorithm's per-member values: ``optimizer.lr`` through ``GradientPipeline.set_optimizers``, an
algorithm's key through the [P, 1] array it handed over (DQN: its ε schedule's fraction). DQN varies
``optimizer.lr`` and ``algo.exploration_fraction``, TD3 and DDPG ``optimizer.lr`` (both networks').
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rlexp.config.schema import Config, ConfigError, PBTConfig, require
from rlexp.envs.normalize import RunningMeanStd
from rlexp.optim.pipeline import GradientPipeline, Health

PURPOSE = 300  # PBT's generator: np.random.default_rng([seed, PURPOSE])


@dataclass(frozen=True)
class Hyperparameter:
    """A key PBT may vary: its short name (metrics ``pbt/<name>``, ``pbt.<name>`` its initial range),
    whether its range is sampled log-uniformly, and the largest value its domain allows."""

    name: str
    log: bool
    high: float = float("inf")


HYPERPARAMETERS: dict[str, Hyperparameter] = {
    "optimizer.lr": Hyperparameter("lr", log=True),
    "algo.exploration_fraction": Hyperparameter("exploration_fraction", log=False, high=1.0),
}


def check_pbt(cfg: Any, varies: tuple[str, ...]) -> None:
    """Refuse PBT numbers out of range, and, with ``pbt.interval`` > 0, a key the algorithm cannot vary
    per member (``varies``: its ``AlgoSpec.pbt_keys``) and settings a round needs."""
    pbt = cfg.pbt
    require(pbt.interval >= 0, "pbt.interval", pbt.interval, "an integer >= 0 (env steps between rounds; 0 = off)")
    require(0 < pbt.fraction <= 0.5, "pbt.fraction", pbt.fraction, "a value in (0, 0.5]: the bottom share that copies")
    require(pbt.window >= 1, "pbt.window", pbt.window, "an integer >= 1 (evaluations)")
    factors = list(pbt.factors)
    require(
        len(factors) >= 1 and all(f > 0 for f in factors),
        "pbt.factors",
        factors,
        "a list of factors > 0 (e.g. [0.8, 1.25])",
    )
    for key, hyper in HYPERPARAMETERS.items():
        low_high = list(pbt[hyper.name])
        require(
            len(low_high) == 2 and 0 < low_high[0] <= low_high[1] <= hyper.high,
            f"pbt.{hyper.name}",
            low_high,
            f"[low, high] with 0 < low <= high{' <= 1' if hyper.high == 1 else ''} ({key}'s initial range)",
        )
    if pbt.interval == 0:
        return
    if not varies:
        raise ConfigError(
            "pbt.interval",
            f"{pbt.interval}: algo={cfg.algo.name} has no population-based training",
            "use algo=dqn, td3 or ddpg, or pbt.interval=0",
        )
    for key in pbt.hyperparameters:
        if key not in varies:
            raise ConfigError(
                "pbt.hyperparameters",
                f"{key!r} cannot vary per member under PBT with algo={cfg.algo.name}",
                f"use some of: {', '.join(varies)}",
            )
    require(cfg.num_seeds >= 2, "num_seeds", cfg.num_seeds, "an integer >= 2 with pbt.interval > 0 (the population)")
    every = cfg.eval.every
    require(
        cfg.eval.episodes >= 1 and every > 0 and pbt.interval % every == 0,
        "eval.every",
        every,
        f"a divisor of pbt.interval={pbt.interval} (> 0, with eval.episodes >= 1): rounds rank evaluations",
    )
    require(
        cfg.checkpoint.every == 0,
        "checkpoint.every",
        cfg.checkpoint.every,
        "0 with pbt.interval > 0 (a PBT population is not checkpointed)",
    )


def with_value(cfg: Any, key: str, value: Any) -> Any:
    """A copy of the (dataclass) config ``cfg`` with the dotted ``key`` set to ``value``."""
    head, _, rest = key.partition(".")
    inner = with_value(getattr(cfg, head), rest, value) if rest else value
    return dataclasses.replace(cfg, **{head: inner})


def initial_configs(cfg: Config, members: int) -> list[Config]:
    """Each member's config: ``cfg`` with each key of ``pbt.hyperparameters`` drawn from its range
    (log-uniform or uniform) by PBT's generator; member k's value is the k-th draw."""
    rng = np.random.default_rng([cfg.seed, PURPOSE])
    configs = [cfg] * members
    for key in cfg.pbt.hyperparameters:
        hyper = HYPERPARAMETERS[key]
        low, high = getattr(cfg.pbt, hyper.name)
        if hyper.log:
            draws = np.exp(rng.uniform(np.log(low), np.log(high), members))
        else:
            draws = rng.uniform(low, high, members)
        configs = [with_value(c, key, float(v)) for c, v in zip(configs, draws)]
    return configs


@torch.no_grad()
def copy_member(
    j: int, k: int, modules: list[nn.Module], pipelines: list[GradientPipeline], statistics: list[RunningMeanStd]
) -> None:
    """Copy member j's training state into member k: every [P, ...] parameter and buffer of ``modules``
    (online and target networks) and their instruments' theta_0, each pipeline's optimizer state rows
    (moments; the step counts are equal in every run) and L2-init anchor, each normalizer's statistics.
    Every other member's rows are untouched."""
    for module in modules:
        for t in (*module.parameters(), *module.buffers()):
            if t.dim() >= 1:
                t[k] = t[j]
        # weight_change's theta_0 (rlexp.diagnostics.instruments.keep_initial)
        initial = getattr(module, "initial", None)
        if initial is not None:
            initial.flat[k], initial.norms[k] = initial.flat[j], initial.norms[j]
    for pipeline in pipelines:
        (a, _, held), (b, _, mine) = (next(r for r in pipeline.optimizers if r[0] <= m < r[1]) for m in (j, k))
        for (source, _), (target, _) in zip(held.state(), mine.state()):
            target[k - b] = source[j - a]
        for anchor in pipeline.initial:  # l2_init's w_0
            anchor[k] = anchor[j]
    for stats in statistics:
        stats.mean[k], stats.var[k], stats.count[k] = stats.mean[j], stats.var[j], stats.count[j]


def _value(cfg: Config, key: str) -> float:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return float(cfg)


class PopulationBasedTraining:
    """PBT's rounds over an algorithm's state; the recorder calls ``log_step`` at each log step (it
    logs the returned metrics, updates the members' W&B configs and adds ``summary(k)`` to a member's
    summary)."""

    def __init__(
        self,
        cfg: Config,
        member_cfgs: list[Config],
        objects: dict[str, Any],
        statistics: list[RunningMeanStd],
        values: dict[str, np.ndarray],
        health: Health,
    ) -> None:
        """``member_cfgs``: the context's list, changed in place; ``objects``: the algorithm's networks,
        pipelines and other parts (those it hands the checkpoints); ``statistics``: the normalizers'
        running statistics; ``values``: key -> the algorithm's [P, 1] array of a varied algo key."""
        self.cfg: PBTConfig = cfg.pbt
        self.total_steps = cfg.total_steps
        self.member_cfgs = member_cfgs
        self.keys = list(self.cfg.hyperparameters)
        missing = [k for k in self.keys if k != "optimizer.lr" and values.get(k) is None]
        if missing:
            raise ValueError(f"PBT varies {missing} but the algorithm handed no per-member array of them")
        self.modules = [m for m in objects.values() if isinstance(m, nn.Module)]
        self.pipelines = [p for p in objects.values() if isinstance(p, GradientPipeline)]
        self.statistics = statistics
        self.values = values
        self.health = health
        self.rng = np.random.default_rng([cfg.seed, PURPOSE, 1])  # the rounds' draws
        members = len(member_cfgs)
        self.scores: list[list[float]] = [[] for _ in range(members)]  # evaluations since the last copy
        self.rounds = 0
        self.lineage: list[list[dict[str, Any]]] = [[] for _ in range(members)]  # each member's copies

    def hyperparameters(self, k: int) -> dict[str, float]:
        """Member k's current values of the varied keys."""
        return {key: _value(self.member_cfgs[k], key) for key in self.keys}

    # ------------------------------------------------------------ the recorder's hooks
    def log_step(
        self, step: int, previous: int, evaluated: np.ndarray | None, returns: list[float | None]
    ) -> dict[int, dict[str, Any]]:
        """At log step ``step`` (``previous``: the one before): note the members ``evaluated`` ([P] bool,
        or None) with their ``returns``; at a round's step, run it and return each ranked member's
        metrics for this step's record (``pbt/round``, ``pbt/<name>``; a copied member also
        ``pbt/parent`` and ``pbt/old/<name>``)."""
        if evaluated is not None:
            for k in np.flatnonzero(evaluated):
                self.scores[k].append(float(returns[k]))
        if step >= self.total_steps or step // self.cfg.interval <= previous // self.cfg.interval:
            return {}
        alive = self.health.alive.tolist()
        ranked = [k for k in range(len(self.scores)) if alive[k] and self.scores[k]]
        if len(ranked) < 2:
            return {}
        self.rounds += 1
        window = self.cfg.window
        ranked.sort(key=lambda k: (-float(np.mean(self.scores[k][-window:])), k))  # best first; ties by index
        n = max(1, int(self.cfg.fraction * len(ranked)))
        top, bottom = ranked[:n], ranked[-n:]
        records = {k: {"pbt/round": self.rounds} for k in ranked}
        for k in bottom:
            j = top[int(self.rng.integers(n))]
            old = self.hyperparameters(k)
            copy_member(j, k, self.modules, self.pipelines, self.statistics)  # exploit
            new = {}
            for key, value in self.hyperparameters(j).items():
                factor = float(self.rng.choice(self.cfg.factors))
                new[key] = min(value * factor, HYPERPARAMETERS[key].high)
            self.explore(k, new)
            self.scores[k] = []
            self.lineage[k].append({"round": self.rounds, "step": step, "parent": j, "old": old, "new": new})
            records[k]["pbt/parent"] = j
            records[k].update({f"pbt/old/{HYPERPARAMETERS[key].name}": v for key, v in old.items()})
        if "optimizer.lr" in self.keys:
            for pipeline in self.pipelines:
                pipeline.set_optimizers([c.optimizer for c in self.member_cfgs])
        for k, record in records.items():
            record.update({f"pbt/{HYPERPARAMETERS[key].name}": v for key, v in self.hyperparameters(k).items()})
        return records

    def wandb_config(self, k: int) -> dict[str, Any]:
        """Member k's W&B config at the start (round 0) and at a round: ``pbt_member`` {round, parent (of
        its last copy, or None), its values}."""
        last = self.lineage[k][-1] if self.lineage[k] else None
        values = {HYPERPARAMETERS[key].name: v for key, v in self.hyperparameters(k).items()}
        return {"pbt_member": {"round": self.rounds, "parent": last["parent"] if last else None, **values}}

    def summary(self, k: int) -> dict[str, Any]:
        """Member k's ``pbt`` entry of summary.json: its final values and its copies."""
        return {"hyperparameters": self.hyperparameters(k), "rounds": self.rounds, "lineage": self.lineage[k]}

    def explore(self, k: int, new: dict[str, float]) -> None:
        """Set member k's values of the varied keys (the optimizers follow once the round's copies are done)."""
        for key, value in new.items():
            self.member_cfgs[k] = with_value(self.member_cfgs[k], key, value)
            if key in self.values:
                self.values[key][k] = value
