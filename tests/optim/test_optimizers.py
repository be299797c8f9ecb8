"""Stacked optimizers (rlexp/optim/optimizers.py): one over P members equals one torch optimizer per
member, bit for bit their torch.optim twins (lr changes, RMSprop's averages decaying to subnormals), the
sqrt guard, RMSpropTF as TF1's update."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from rlexp.config.schema import (
    AdamConfig,
    RMSpropConfig,
    RMSpropTFConfig,
    SGDConfig,
)
from rlexp.optim.optimizers import _sqrt, fast_kernels_run, make_optimizer

pytestmark = pytest.mark.compat  # bit for bit torch.optim's: the smoke subset run on the oldest and newest torch


def structured(cls, **kw):
    """A config node as Hydra hands it to the code (a structured DictConfig)."""
    return OmegaConf.structured(cls(**kw))


# ---------------------------------------------------------------- optimizers
OPT_CASES = {
    "adam": (
        AdamConfig(name="adam", lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.01),
        lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01),
    ),
    "adamw": (
        AdamConfig(name="adamw", lr=0.01, weight_decay=0.1),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1),
    ),
    "rmsprop": (
        RMSpropConfig(name="rmsprop", lr=0.01, alpha=0.9, eps=1e-6),
        lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.9, eps=1e-6),
    ),
    "rmsprop-centered-momentum": (
        RMSpropConfig(name="rmsprop", lr=0.01, alpha=0.95, eps=1e-6, momentum=0.9, centered=True, weight_decay=0.01),
        lambda ps: torch.optim.RMSprop(
            ps, lr=0.01, alpha=0.95, eps=1e-6, momentum=0.9, centered=True, weight_decay=0.01
        ),
    ),
    "sgd": (SGDConfig(name="sgd", lr=0.05), lambda ps: torch.optim.SGD(ps, lr=0.05)),
    "sgd-nesterov": (
        SGDConfig(name="sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.001),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.001),
    ),
}


@pytest.mark.parametrize("case", list(OPT_CASES))
def test_stacked_optimizer_equals_one_torch_optimizer_per_member(case):
    cfg, ref_factory = OPT_CASES[case]
    P = 3
    gen = torch.Generator().manual_seed(0)
    stacked = [
        torch.nn.Parameter(torch.randn(P, 4, 5, generator=gen)),
        torch.nn.Parameter(torch.randn(P, 4, generator=gen)),
    ]
    start = [s.detach().clone() for s in stacked]
    members = [[torch.nn.Parameter(s[p].detach().clone()) for s in stacked] for p in range(P)]
    opt = make_optimizer(stacked, structured(type(cfg), **vars(cfg)))
    refs = [ref_factory(m) for m in members]
    for _ in range(3):
        grads = [torch.randn(s.shape, generator=gen) for s in stacked]
        for s, g in zip(stacked, grads):
            s.grad = g.clone()
        opt.step()
        for p in range(P):
            for m, g in zip(members[p], grads):
                m.grad = g[p].clone()
            refs[p].step()
    for i, s in enumerate(stacked):
        assert not torch.allclose(s, start[i])
        for p in range(P):
            torch.testing.assert_close(s[p], members[p][i])


# the torch.optim implementation each optimizer reproduces: (config, factory of the torch optimizer)
TORCH_TWINS = {
    "adam": (
        AdamConfig(name="adam", lr=0.01, weight_decay=0.01),
        lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01, fused=True),
    ),
    "adamw": (
        AdamConfig(name="adamw", lr=0.01, weight_decay=0.01),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.01, fused=True),
    ),
    "rmsprop": (
        RMSpropConfig(name="rmsprop", lr=0.01, alpha=0.9, eps=1e-6),
        lambda ps: torch.optim.RMSprop(ps, lr=0.01, alpha=0.9, eps=1e-6, foreach=True),
    ),
    "rmsprop-centered-momentum": (
        RMSpropConfig(name="rmsprop", lr=0.01, alpha=0.95, eps=1e-6, momentum=0.9, centered=True, weight_decay=0.01),
        lambda ps: torch.optim.RMSprop(
            ps, lr=0.01, alpha=0.95, eps=1e-6, momentum=0.9, centered=True, weight_decay=0.01, foreach=True
        ),
    ),
    "sgd": (SGDConfig(name="sgd", lr=0.05), lambda ps: torch.optim.SGD(ps, lr=0.05, fused=True)),
    "sgd-momentum": (
        SGDConfig(name="sgd", lr=0.05, momentum=0.9, weight_decay=0.001),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.001, fused=True),
    ),
    "sgd-nesterov": (
        SGDConfig(name="sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.001),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.001, fused=True),
    ),
}


@pytest.mark.parametrize("case", list(TORCH_TWINS))
def test_optimizer_is_bitwise_its_torch_twin_and_follows_lr_changes(case):
    cfg, twin = TORCH_TWINS[case]
    if not fast_kernels_run(cfg.name, "cpu"):  # rlexp then takes torch.optim's own (tests/nn/test_capabilities.py)
        pytest.skip(f"torch {torch.__version__} has no CPU kernel for {cfg.name}'s fast form")
    gen = torch.Generator().manual_seed(1)
    ours = [
        torch.nn.Parameter(torch.randn(3, 4, 5, generator=gen)),
        torch.nn.Parameter(torch.randn(3, 4, generator=gen)),
    ]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    start = ours[0].detach().clone()
    opt = make_optimizer(ours, structured(type(cfg), **vars(cfg)))
    ref = twin(theirs)
    for i in range(4):
        for a, b in zip(ours, theirs):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        if i == 2:  # a schedule changes the learning rate between steps
            opt.param_groups[0]["lr"] = ref.param_groups[0]["lr"] = 0.002
        opt.step()
        ref.step()
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert not torch.equal(ours[0], start)  # the steps moved the parameters
    for i, b in enumerate(theirs):  # and the state: same names (exp_avg, square_avg, grad_avg, momentum_buffer, ...)
        for key, value in ref.state[b].items():
            if key != "step":
                assert torch.equal(getattr(opt, key)[i], value), key


@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_stays_bitwise_torch_as_its_averages_decay_to_subnormals_and_zero(centered):
    """Units whose gradient stops: their running averages decay through the subnormal numbers to 0,
    where the square root is lifted to the smallest normal one (``_sqrt``); the steps stay torch's."""
    cfg = RMSpropConfig(name="rmsprop", lr=0.01, alpha=0.5, eps=1e-8, momentum=0.9, centered=centered)
    gen = torch.Generator().manual_seed(2)
    ours = [torch.nn.Parameter(torch.randn(2, 64, generator=gen))]
    theirs = [torch.nn.Parameter(ours[0].detach().clone())]
    opt = make_optimizer(ours, structured(RMSpropConfig, **vars(cfg)))
    ref = torch.optim.RMSprop(theirs, lr=0.01, alpha=0.5, eps=1e-8, momentum=0.9, centered=centered, foreach=True)
    tiny, seen_subnormal, seen_zero = torch.finfo(torch.float32).tiny, False, False
    for step in range(200):
        grad = torch.randn(2, 64, generator=gen)
        grad[:, 32:] = 0.0 if step >= 5 else grad[:, 32:]  # half the units stop learning
        grad[:, :8] = 0.25  # a constant gradient: centered, v - mean^2 rounds near 0
        ours[0].grad, theirs[0].grad = grad.clone(), grad.clone()
        opt.step()
        ref.step()
        v = opt.square_avg[0]
        seen_subnormal |= bool(((v > 0) & (v < tiny)).any())
        seen_zero |= bool((v[:, 32:] == 0).all())
        assert torch.equal(ours[0], theirs[0]), step
    assert seen_subnormal and seen_zero  # the averages went through both


def test_sqrt_lifts_only_what_eps_absorbs():
    """Zero and subnormal averages are lifted to the smallest normal number when eps absorbs its square
    root; sqrt(v) + eps stays torch's bit for bit, NaN, infinity and a negative average included."""
    tiny = torch.finfo(torch.float32).tiny
    v = torch.tensor([-0.0, 0.0, 1e-40, 1e-45, tiny, 2.0, math.inf])
    negative = torch.tensor([0.0, 1e-40, -1e-30, 2.0])  # centered, rounded below 0: torch's NaN
    for values in (v, negative, torch.cat([v, torch.tensor([math.nan])])):
        for eps in (1e-8, 1e-11, 1e-13, 0.0):  # 1e-13, 0: too small to absorb sqrt(tiny)
            got, want = _sqrt([values], eps)[0] + eps, values.sqrt() + eps
            assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)), (values, eps)
            assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(_sqrt([v], 1e-8)[0][:4], torch.full((4,), tiny).sqrt())  # lifted: -0, 0 and subnormals
    assert torch.equal(_sqrt([v], 1e-13)[0][:4], v[:4].sqrt())  # too small an eps: torch's own
    assert torch.equal(_sqrt([negative], 1e-8)[0][:2], negative[:2].sqrt())  # a negative: torch's own
    # ... in another tensor than a NaN too (one tensor holds several members)
    assert _sqrt([torch.tensor([math.nan]), negative], 1e-8)[1].isnan().any()


def tf1_rmsprop(p0, grads, lr, decay, momentum, epsilon, weight_decay=0.0):
    """tf.compat.v1.train.RMSPropOptimizer (non-centered), written out."""
    p = p0.clone()
    ms = torch.ones_like(p)  # TF initializes the rms slot with ones
    mom = torch.zeros_like(p)
    for g in grads:
        g = g + weight_decay * p
        ms = ms + (g * g - ms) * (1.0 - decay)
        mom = momentum * mom + lr * g / torch.sqrt(ms + epsilon)
        p = p - mom
    return p


@pytest.mark.parametrize(
    "momentum,weight_decay,eps", [(0.0, 0.0, 1e-6), (0.9, 0.0, 1e-6), (0.9, 0.01, 1e-6), (0.0, 0.0, 0.5)]
)
def test_rmsprop_tf_matches_the_tf1_update(momentum, weight_decay, eps):
    lr, decay = 1e-4, 0.99
    gen = torch.Generator().manual_seed(0)
    p0 = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64)
    grads = [torch.randn(2, 3, 4, generator=gen, dtype=torch.float64) * 3 for _ in range(5)]
    param = torch.nn.Parameter(p0.clone())
    opt = make_optimizer(
        [param],
        structured(
            RMSpropTFConfig,
            name="rmsprop_tf",
            lr=lr,
            decay=decay,
            momentum=momentum,
            epsilon=eps,
            weight_decay=weight_decay,
        ),
    )
    for g in grads:
        param.grad = g.clone()
        opt.step()
    # compare the displacement (tiny next to p0) so the tolerance applies to the update itself
    torch.testing.assert_close(param.detach() - p0, tf1_rmsprop(p0, grads, lr, decay, momentum, eps, weight_decay) - p0)
    if momentum:  # momentum matters
        assert not torch.allclose(param.detach(), tf1_rmsprop(p0, grads, lr, decay, 0.0, eps, weight_decay))


def test_rmsprop_tf_differs_from_torch_rmsprop():
    lr, decay, eps = 1e-4, 0.99, 1e-6
    gen = torch.Generator().manual_seed(1)
    p0 = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    g = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    tf_p = torch.nn.Parameter(p0.clone())
    th_p = torch.nn.Parameter(p0.clone())
    tf_opt = make_optimizer([tf_p], RMSpropTFConfig(name="rmsprop_tf", lr=lr, decay=decay, momentum=0.0, epsilon=eps))
    th_opt = torch.optim.RMSprop([th_p], lr=lr, alpha=decay, eps=eps)
    tf_p.grad, th_p.grad = g.clone(), g.clone()
    tf_opt.step()
    th_opt.step()
    # first step: TF's ms starts at 1 (step ~ lr * g), torch's square average at 0 (step ~ lr * 10 * sign(g))
    torch.testing.assert_close(p0 - tf_p.detach(), lr * g / torch.sqrt(1.0 + (g * g - 1.0) * (1 - decay) + eps))
    torch.testing.assert_close(p0 - th_p.detach(), lr * g / (torch.sqrt((1 - decay) * g * g) + eps))
    tf_step, th_step = p0 - tf_p.detach(), p0 - th_p.detach()
    assert not torch.allclose(tf_step, th_step, rtol=0.5, atol=0.0)
    assert th_step.abs().mean() > 3 * tf_step.abs().mean()
