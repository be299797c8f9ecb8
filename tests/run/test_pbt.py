"""Population-based training's pieces (rlexp/run/pbt.py): a member's copy and new lr are exact and no
other member notices them (against a twin that never changes, bitwise, and a direct torch.optim.Adam
step); the initial draws; settings refused with the key. Its jobs are in tests/jobs/test_pbt_jobs.py."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from composing import compose_config
from omegaconf import OmegaConf

from rlexp.compose.validate import validate
from rlexp.config.schema import AdamConfig, ClippingConfig, ConfigError, RegularizationConfig
from rlexp.envs.normalize import RunningMeanStd
from rlexp.optim.optimizers import fast_kernels_run
from rlexp.optim.pipeline import GradientPipeline, Health
from rlexp.run.pbt import copy_member, initial_configs, with_value

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
    # one step of member k against torch.optim.Adam (fused, where torch has the CPU kernel) with the new lr, from
    # the same state
    p = torch.nn.Parameter(before)
    p.grad = pipeline._padded.grad[k : k + 1].clone()
    fused = fast_kernels_run("adam", "cpu")
    reference = torch.optim.Adam([p], lr=new_lr, **({"fused": True} if fused else {"foreach": False}))
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
