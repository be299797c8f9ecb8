"""Population-based training: a member's copy and new lr are exact, and no other member notices them.

The run-time changes are tested on a small population of stacked tensors against a twin that never
changes (bitwise) and against a direct torch.optim.Adam step; then a real DQN population with one PBT
round against the same population without a round: every member that was not copied writes the same
records, bit for bit, and the lineage reaches metrics.jsonl, summary.json, the W&B run and the report.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from test_cli import _items, compose_config, read_jsonl, wandb_run_dir

from rlexp.compose.validate import validate
from rlexp.config.schema import AdamConfig, ClippingConfig, ConfigError, RegularizationConfig
from rlexp.envs.normalize import RunningMeanStd
from rlexp.optim.pipeline import GradientPipeline, Health
from rlexp.report.html import render_html
from rlexp.report.main import build_report
from rlexp.run.pack import Cell, run_pack
from rlexp.run.pbt import copy_member, initial_configs, with_value
from rlexp.run.runner import run_population
from rlexp.run.wandb_files import read_records
from rlexp.train import prepare

P = 4


class Pop(torch.nn.Module):
    """Two [P, ...] parameters and a [P, ...] buffer: a population network's rows."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(torch.randn(P, 5, 3, generator=g))
        self.b = torch.nn.Parameter(torch.randn(P, 3, generator=g))
        self.register_buffer("running", torch.randn(P, 3, generator=g))


def population(lrs: list[float]) -> tuple[Pop, Pop, GradientPipeline, RunningMeanStd]:
    """A network, its target copy, its pipeline (Adam, one lr per member) and normalizer statistics."""
    net = Pop(0)
    target = copy.deepcopy(net).requires_grad_(False)
    configs = [AdamConfig(name="adam", lr=lr) for lr in lrs]
    regs = RegularizationConfig()
    pipeline = GradientPipeline(
        list(net.parameters()), configs, ClippingConfig(name="none"), regs, [net.w], Health(P, torch.device("cpu"))
    )
    stats = RunningMeanStd(P, 2)
    stats.update(np.random.default_rng(0).normal(size=(P, 6, 2)))
    return net, target, pipeline, stats


def train(net: Pop, pipeline: GradientPipeline, steps: int, start: int = 0) -> None:
    x = torch.linspace(-1, 1, 5 * 7).view(1, 7, 5).expand(P, 7, 5)
    for t in range(start, start + steps):
        out = (x @ net.w + net.b.unsqueeze(1)).tanh()  # [P, 7, 3]
        loss = (out - 0.1 * t).square().mean((1, 2)) * torch.arange(1.0, P + 1)  # [P]
        pipeline.step(loss, t)


def rows(net: Pop, target: Pop, pipeline: GradientPipeline, stats: RunningMeanStd, k: int) -> list[torch.Tensor]:
    """Everything member k's training state holds."""
    (a, _, optimizer) = next(r for r in pipeline.optimizers if r[0] <= k < r[1])
    state = [t[k - a] for t, _ in optimizer.state()]
    normal = [torch.from_numpy(np.asarray(v[k])) for v in (stats.mean, stats.var, stats.count)]
    return [net.w[k], net.b[k], net.running[k], target.w[k], target.b[k], *state, *normal]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_copy_and_new_lr_are_exact_and_leave_every_other_member_bitwise_unchanged():
    lrs = [1e-3, 2e-3, 3e-3, 4e-3]
    changed, twin = population(lrs), population(lrs)
    for net, target, pipeline, _ in (changed, twin):
        train(net, pipeline, 5)
        target.load_state_dict(net.state_dict())
        train(net, pipeline, 3, start=5)  # the target lags: its rows differ from the online ones
    net, target, pipeline, stats = changed
    j, k = 1, 3
    assert not same(rows(*changed, j), rows(*changed, k))
    copy_member(j, k, [net, target], [pipeline], [stats])
    assert same(rows(*changed, k), rows(*changed, j))
    for m in (0, 1, 2):
        assert same(rows(*changed, m), rows(*twin, m)), m

    # member k explores: its lr changes, its state rows move into a run of their own
    new_lr = 2e-3 * 1.25
    pipeline.set_optimizers([AdamConfig(name="adam", lr=lr) for lr in (*lrs[:3], new_lr)])
    assert same(rows(*changed, k), rows(*changed, j))
    (a, _, optimizer) = next(r for r in pipeline.optimizers if r[0] <= k < r[1])
    before = pipeline._padded[k : k + 1].clone()
    moments = [t[k - a : k - a + 1].clone() for t, _ in optimizer.state()]
    count = optimizer.steps[0].clone()
    train(net, pipeline, 1, start=8)
    train(twin[0], twin[2], 1, start=8)
    for m in (0, 1, 2):
        assert same(rows(*changed, m), rows(*twin, m)), m
    # one step of member k against torch.optim.Adam (fused) with the new lr, from the same state
    p = torch.nn.Parameter(before)
    p.grad = pipeline._padded.grad[k : k + 1].clone()
    reference = torch.optim.Adam([p], lr=new_lr, fused=True)
    reference.state[p] = {"step": count, "exp_avg": moments[0], "exp_avg_sq": moments[1]}
    reference.step()
    assert torch.equal(pipeline._padded[k : k + 1], p.detach())


def test_initial_draws_are_pbts_own_and_in_range():
    cfg = compose_config(["algo=dqn", "num_seeds=16", "pbt.interval=1000", "eval.every=1000"])
    typed = OmegaConf.to_object(cfg)
    members = initial_configs(typed, 16)
    lrs = [m.optimizer.lr for m in members]
    fractions = [m.algo.exploration_fraction for m in members]
    assert len(set(lrs)) == 16 and all(1e-4 <= v <= 1e-2 for v in lrs)
    assert all(0.05 <= v <= 0.5 for v in fractions)
    assert [m.optimizer.lr for m in initial_configs(typed, 16)] == lrs  # from the seed alone
    assert with_value(typed, "optimizer.lr", 0.5).optimizer.lr == 0.5 and typed.optimizer.lr != 0.5


DQN = ["algo=dqn", "env=cartpole", "num_seeds=4", "total_steps=1200", "algo.learning_starts=200"]
DQN += ["algo.target_update_period=16", "logger.log_every=300", "eval.every=300", "eval.episodes=2"]
TD3 = ["algo=td3", "env=pendulum", "num_seeds=4", "total_steps=600", "network.hidden=[16,16]"]
TD3 += ["algo.learning_starts=100", "algo.batch_size=32", "logger.log_every=150", "eval.every=150"]
TD3 += ["eval.episodes=1", "env.max_episode_steps=50", "pbt.hyperparameters=[optimizer.lr]"]
CLOCKS = ("perf/steps_per_s",)


def records(job_dir, k: int) -> list[dict]:
    return [
        {n: v for n, v in r.items() if n not in CLOCKS and not n.startswith("pbt/")}
        for r in read_jsonl(job_dir / f"seed_{k}" / "metrics.jsonl")
    ]


def one_round(tmp_path, base: list[str], interval: int, mode: str = "disabled") -> tuple:
    """A population with one PBT round at env step ``interval`` and its twin without one (its first round
    would come after the end); every member that was not copied writes the same records in both, the
    copied one the same up to the round's record (the round follows it), then its parent's state.
    Returns (the PBT job dir, member summaries, the copied member, its copy)."""
    pbt_dir, twin_dir = tmp_path / "pbt", tmp_path / "twin"
    base = [*base, "pbt.fraction=0.25", "logger.progress=off"]
    run_population(compose_config([*base, f"pbt.interval={interval}", f"logger.mode={mode}"]), pbt_dir, prepare)
    run_population(compose_config([*base, f"pbt.interval={10 * interval}", "logger.mode=disabled"]), twin_dir, prepare)
    summaries = [json.loads((pbt_dir / f"seed_{k}" / "summary.json").read_text()) for k in range(P)]
    copied = [k for k, s in enumerate(summaries) if s["pbt"]["lineage"]]
    assert len(copied) == 1  # int(0.25 * 4) members copy
    k = copied[0]
    (event,) = summaries[k]["pbt"]["lineage"]
    assert event["round"] == 1 and event["step"] == interval and event["parent"] != k
    parent = summaries[event["parent"]]["pbt"]
    assert summaries[k]["pbt"]["hyperparameters"] == event["new"]
    for key, value in event["new"].items():  # the parent's value times a factor
        ratio = value / parent["hyperparameters"][key]
        assert any(abs(ratio - f) < 1e-12 for f in (0.8, 1.25)) or value == 1.0, (key, ratio)
    at = next(i for i, r in enumerate(records(pbt_dir, k)) if r["step"] == interval) + 1
    for m in range(P):
        mine, twin = records(pbt_dir, m), records(twin_dir, m)
        if m == k:
            assert mine[:at] == twin[:at] and mine[at:] != twin[at:]
        else:
            assert mine == twin, m
    return pbt_dir, summaries, k, event


def test_a_dqn_round_changes_only_the_copied_member_and_logs_its_lineage(tmp_path):
    pbt_dir, summaries, k, event = one_round(tmp_path, DQN, 600, mode="offline")
    # metrics.jsonl: every member's values at the round; the copied member's parent and old values
    rounds = {m: [r for r in read_jsonl(pbt_dir / f"seed_{m}" / "metrics.jsonl") if "pbt/round" in r] for m in range(P)}
    assert all(len(r) == 1 and r[0]["step"] == 600 for r in rounds.values())
    (row,) = rounds[k]
    assert row["pbt/parent"] == event["parent"] and row["pbt/lr"] == event["new"]["optimizer.lr"]
    assert row["pbt/old/exploration_fraction"] == event["old"]["algo.exploration_fraction"]
    # the W&B run's config follows the round (an update made while the run opens waits for it: the latest wins)
    (log,) = sorted(wandb_run_dir(pbt_dir / f"seed_{k}").glob("run-*.wandb"))
    updates = [_items(r.config.update) for r in read_records(log) if r.WhichOneof("record_type") == "config"]
    member = [u["pbt_member"] for u in updates if "pbt_member" in u]
    assert member and member[-1]["parent"] == event["parent"] and member[-1]["lr"] == event["new"]["optimizer.lr"]
    # the report's lineage table
    html = render_html(build_report(pbt_dir, draw=False, reps=50))
    assert "Population-based training" in html and f"{event['old']['optimizer.lr']:.3g}" in html


@pytest.mark.slow
def test_a_td3_round_changes_only_the_copied_member(tmp_path):
    one_round(tmp_path, TD3, 300)


def test_pbt_settings_are_refused_with_the_key():
    cases = {
        "pbt.fraction": ["pbt.fraction=0.6"],
        "pbt.factors": ["pbt.factors=[0.8,0.0]"],
        "pbt.interval": ["pbt.interval=-1"],
        "pbt.hyperparameters": ["num_seeds=2", "pbt.interval=1000", "pbt.hyperparameters=[algo.gamma]"],
        "eval.every": ["num_seeds=2", "pbt.interval=1000", "eval.every=300"],
    }
    for key, overrides in cases.items():
        with pytest.raises(ConfigError) as err:
            validate(compose_config(overrides))
        assert err.value.key == key, (key, str(err.value))


def test_a_pbt_job_is_never_packed(tmp_path):
    cfg = compose_config(["num_seeds=2", "pbt.interval=1000", "eval.every=1000", "logger.mode=disabled"])
    (result,) = run_pack([Cell(cfg, tmp_path / "0")], prepare)
    assert isinstance(result, ConfigError) and result.key == "pbt.interval", result
