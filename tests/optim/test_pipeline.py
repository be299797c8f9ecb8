"""The gradient pipeline (rlexp/optim/pipeline.py): per-member norms and each clipping rule against its
formula, a step against a direct clip and SGD update, non-finite losses, gradients and parameters
freezing their member alone, regularization's penalty gradient."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from rlexp.config.schema import (
    ActivationConfig,
    AdamConfig,
    AGCConfig,
    ClippingConfig,
    GainInitConfig,
    InitConfig,
    LayerNormConfig,
    NetworkConfig,
    NormClipConfig,
    RegularizationConfig,
    SGDConfig,
    ValueClipConfig,
)
from rlexp.nn.init import init_linear
from rlexp.nn.nets import (
    PopLinear,
    PopMLP,
    weight_parameters,
)
from rlexp.optim.pipeline import CAUSES, CLIPPERS, GradientPipeline, Health, member_norms

CPU = torch.device("cpu")


# ---------------------------------------------------------------- helpers
def gens(*seeds: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def structured(cls, **kw):
    """A config node as Hydra hands it to the code (a structured DictConfig)."""
    return OmegaConf.structured(cls(**kw))


# ---------------------------------------------------------------- clipping
def rand_params_grads(P=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(P, 4, 5, generator=g), torch.randn(P, 4, generator=g), torch.randn(P, 3, 4, generator=g)]
    grads = [torch.randn(p.shape, generator=g) for p in params]
    return params, grads


def test_member_norms_is_the_joint_l2_norm_per_member():
    _, grads = rand_params_grads()
    norms = member_norms(grads)
    expected = torch.stack([torch.sqrt(sum((t[p] ** 2).sum() for t in grads)) for p in range(3)])
    assert norms.shape == (3,)
    torch.testing.assert_close(norms, expected, check_dtype=False)
    assert norms.dtype == torch.float64  # so finite float32 gradients never overflow it


def test_global_norm_clip_equals_clip_grad_norm_per_member():
    params, grads = rand_params_grads()
    scales = torch.tensor([0.05, 1.0, 20.0])  # member 0 under the limit, members 1 and 2 over it
    grads = [g * scales.view(-1, *([1] * (g.dim() - 1))) for g in grads]
    max_norm = 2.0
    pre = member_norms(grads)
    assert pre[0] < max_norm < pre[1] < pre[2]
    refs = []
    for p in range(3):
        slices = [torch.nn.Parameter(t[p].clone()) for t in params]
        for s, g in zip(slices, grads):
            s.grad = g[p].clone()
        torch.nn.utils.clip_grad_norm_(slices, max_norm)
        refs.append([s.grad for s in slices])
    clipped = [g.clone() for g in grads]
    CLIPPERS["global_norm"](params, clipped, structured(NormClipConfig, name="global_norm", max_norm=max_norm))
    for t in range(len(grads)):
        for p in range(3):
            torch.testing.assert_close(clipped[t][p], refs[p][t])
            scale = min(1.0, max_norm / (pre[p].item() + 1e-6))
            torch.testing.assert_close(clipped[t][p], grads[t][p] * scale)
    torch.testing.assert_close(
        member_norms(clipped)[1:], torch.full((2,), max_norm), rtol=1e-5, atol=1e-5, check_dtype=False
    )
    assert torch.equal(clipped[0][0], grads[0][0])  # scale exactly 1 under the limit


def test_per_tensor_clip_is_tf_clip_by_norm_per_member():
    params, grads = rand_params_grads()
    max_norm = 2.5
    clipped = [g.clone() for g in grads]
    CLIPPERS["per_tensor"](params, clipped, NormClipConfig(name="per_tensor", max_norm=max_norm))
    n_clipped = 0
    for t, g in enumerate(grads):
        for p in range(3):
            norm = torch.sqrt((g[p] ** 2).sum())
            expected = g[p] * max_norm / torch.maximum(norm, torch.tensor(max_norm))
            torch.testing.assert_close(clipped[t][p], expected)
            n_clipped += int(norm > max_norm)
    assert 0 < n_clipped < 9  # both branches are exercised


def test_value_clip_clamps_every_element():
    params, grads = rand_params_grads()
    clipped = [g.clone() for g in grads]
    CLIPPERS["value"](params, clipped, structured(ValueClipConfig, name="value", clip_value=0.5))
    for g, c in zip(grads, clipped):
        expected = torch.where(g > 0.5, torch.full_like(g, 0.5), torch.where(g < -0.5, torch.full_like(g, -0.5), g))
        assert torch.equal(c, expected)
    assert any((g.abs() > 0.5).any() for g in grads)


def test_agc_matches_unitwise_formula():
    P, out, n_in = 2, 6, 5
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(P, out, n_in, generator=gen)
    w[1, 2] = 0.0  # a zero unit: the eps floor applies
    b = torch.randn(P, out, generator=gen)
    b[0] = 0.0  # a zero bias vector (eps floor)
    unit_scale = torch.logspace(-4, 0, out).view(1, out, 1)
    gw = torch.randn(P, out, n_in, generator=gen) * unit_scale
    gb = torch.randn(P, out, generator=gen) * torch.tensor([0.001, 1.0]).view(P, 1)
    cf, eps = 0.01, 1e-3
    clipped = [gw.clone(), gb.clone()]
    CLIPPERS["agc"]([w, b], clipped, structured(AGCConfig, name="agc", clip_factor=cf, eps=eps))

    exp_w = gw.clone()
    n_clip = 0
    for p in range(P):
        for i in range(out):
            limit = cf * max(torch.sqrt((w[p, i] ** 2).sum()).item(), eps)
            gn = torch.sqrt((gw[p, i] ** 2).sum()).item()
            if gn > limit:
                exp_w[p, i] = gw[p, i] * limit / gn
                n_clip += 1
    exp_b = gb.clone()
    for p in range(P):  # vectors: one unit, the whole vector
        limit = cf * max(torch.sqrt((b[p] ** 2).sum()).item(), eps)
        gn = torch.sqrt((gb[p] ** 2).sum()).item()
        if gn > limit:
            exp_b[p] = gb[p] * limit / gn
    assert 0 < n_clip < P * out  # some units clipped, some not
    torch.testing.assert_close(clipped[0], exp_w)
    torch.testing.assert_close(clipped[1], exp_b)
    assert not torch.equal(clipped[1], gb)
    # zero weights: the limit is clip_factor * eps, not 0
    torch.testing.assert_close(clipped[0][1, 2].norm(), torch.tensor(cf * eps), rtol=1e-4, atol=0.0)
    torch.testing.assert_close(clipped[1][0].norm(), torch.tensor(cf * eps), rtol=1e-4, atol=0.0)


CLIP_CFGS = {
    "none": ClippingConfig(name="none"),
    "global_norm": NormClipConfig(name="global_norm", max_norm=1.0),
    "per_tensor": NormClipConfig(name="per_tensor", max_norm=1.0),
    "value": ValueClipConfig(name="value", clip_value=0.5),
    "agc": AGCConfig(name="agc", clip_factor=0.01, eps=1e-3),
}


@pytest.mark.parametrize("name", list(CLIP_CFGS))
def test_clipping_is_per_member(name):
    assert set(CLIPPERS) == set(CLIP_CFGS)
    params, grads = rand_params_grads(P=2)
    grads = [g * 0.3 for g in grads]
    huge = [g.clone() for g in grads]
    for h in huge:
        h[0] *= 1e6  # member 0 only
    a, b = [g.clone() for g in grads], [h.clone() for h in huge]
    CLIPPERS[name](params, a, CLIP_CFGS[name])
    CLIPPERS[name](params, b, CLIP_CFGS[name])
    for x, y in zip(a, b):
        assert torch.equal(x[1], y[1])
    if name != "none":  # member 0's huge gradient was clipped
        assert all(not torch.equal(y[0], h[0]) for y, h in zip(b, huge))


# ---------------------------------------------------------------- gradient pipeline
def make_layer(P=2, n_in=3, n_out=2, seed=0) -> PopLinear:
    layer = PopLinear(P, n_in, n_out)
    init_linear(layer.weight, layer.bias, InitConfig(name="default", bias=None), 1.0, gens(*range(seed, seed + P)))
    return layer


def data(P=2, B=5, n_in=3, n_out=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(P, B, n_in, generator=g), torch.randn(P, B, n_out, generator=g)


def mse_per_member(layer, x, y):
    return (layer(x) - y).square().mean(dim=(1, 2))


def test_pipeline_step_matches_direct_clip_and_sgd_update():
    layer = make_layer()
    x, y = data()
    y[1] *= 50.0  # member 1's gradient is over the clip limit, member 0's is not
    params = [layer.weight, layer.bias]
    w0, b0 = layer.weight.detach().clone(), layer.bias.detach().clone()
    health = Health(2, CPU)
    pipe = GradientPipeline(
        params,
        SGDConfig(name="sgd", lr=0.1),
        structured(NormClipConfig, name="global_norm", max_norm=3.0),
        RegularizationConfig(),
        weight_parameters(layer),
        health,
    )
    stats = pipe.step(mse_per_member(layer, x, y), env_step=3)

    for p in range(2):
        w = w0[p].clone().requires_grad_()
        b = b0[p].clone().requires_grad_()
        loss = (F.linear(x[p], w, b) - y[p]).square().mean()
        loss.backward()
        norm = torch.sqrt((w.grad**2).sum() + (b.grad**2).sum())
        scale = min(1.0, 3.0 / (norm.item() + 1e-6))
        torch.testing.assert_close(stats.loss[p], loss.detach())
        torch.testing.assert_close(stats.grad_norm_pre_clip[p], norm, check_dtype=False)
        torch.testing.assert_close(stats.grad_norm_post_clip[p], norm * scale, check_dtype=False)
        torch.testing.assert_close(layer.weight[p], w0[p] - 0.1 * scale * w.grad)
        torch.testing.assert_close(layer.bias[p], b0[p] - 0.1 * scale * b.grad)
    assert stats.grad_norm_pre_clip[0] < 3.0 < stats.grad_norm_pre_clip[1]
    assert torch.equal(health.alive, torch.tensor([True, True]))
    assert torch.equal(health.diverged_at, torch.tensor([-1, -1]))
    assert torch.equal(health.cause, torch.tensor([0, 0]))


def test_pipeline_nonfinite_loss_freezes_only_that_member():
    x, y = data()
    runs = {}
    for bad in (False, True):
        layer = make_layer()
        params = [layer.weight, layer.bias]
        health = Health(2, CPU)
        pipe = GradientPipeline(
            params,
            AdamConfig(name="adam", lr=0.01),
            ClippingConfig(name="none"),
            RegularizationConfig(),
            [layer.weight],
            health,
        )
        before = [p.detach().clone() for p in params]
        loss = mse_per_member(layer, x, y)
        if bad:
            loss = loss * torch.tensor([float("nan"), 1.0])
        stats = pipe.step(loss, env_step=7)
        runs[bad] = (layer, params, health, pipe, before, stats)

    layer, params, health, pipe, before, stats = runs[True]
    good_params = runs[False][1]
    for p, old, ref in zip(params, before, good_params):
        assert torch.equal(p[0], old[0])  # member 0 frozen bitwise
        assert not torch.equal(p[1], old[1])  # member 1 updated ...
        assert torch.equal(p[1], ref[1])  # ... exactly as if member 0 were fine
    # member 1's update is plain Adam's first step on its own slice
    ref_layer = make_layer()
    w = ref_layer.weight[1].detach().clone().requires_grad_()
    b = ref_layer.bias[1].detach().clone().requires_grad_()
    opt = torch.optim.Adam([w, b], lr=0.01)
    (F.linear(x[1], w, b) - y[1]).square().mean().backward()
    opt.step()
    torch.testing.assert_close(layer.weight[1], w.detach())
    torch.testing.assert_close(layer.bias[1], b.detach())
    assert torch.equal(health.alive, torch.tensor([False, True]))
    assert torch.equal(health.diverged_at, torch.tensor([7, -1]))
    assert health.cause[0].item() == CAUSES.index("nonfinite_loss")
    assert health.cause[1].item() == CAUSES.index("none")
    assert torch.isnan(stats.loss[0]) and torch.isfinite(stats.loss[1])

    # later updates with finite losses: the diverged member stays frozen, its record unchanged
    frozen = [p.detach().clone() for p in params]
    pipe.step(mse_per_member(layer, x, y), env_step=9)
    for p, old in zip(params, frozen):
        assert torch.equal(p[0], old[0])
        assert not torch.equal(p[1], old[1])
    assert torch.equal(health.diverged_at, torch.tensor([7, -1]))
    assert health.cause[0].item() == CAUSES.index("nonfinite_loss")
    assert torch.equal(health.alive, torch.tensor([False, True]))


def test_pipeline_nonfinite_gradient_with_finite_loss():
    layer = make_layer()
    x, y = data()
    params = [layer.weight, layer.bias]
    health = Health(2, CPU)
    pipe = GradientPipeline(
        params,
        SGDConfig(name="sgd", lr=0.1),
        NormClipConfig(name="global_norm", max_norm=1.0),
        RegularizationConfig(),
        [layer.weight],
        health,
    )
    before = [p.detach().clone() for p in params]
    out = layer(x)
    base = (out - y).square().mean(dim=(1, 2))
    # sqrt(z - z.detach()) is 0 in value but has an infinite derivative: member 0's gradient only
    spike = torch.sqrt(out[0] - out[0].detach()).sum()
    loss = base + torch.stack([spike, torch.zeros(())])
    stats = pipe.step(loss, env_step=11)
    assert torch.isfinite(stats.loss).all()
    assert not torch.isfinite(stats.grad_norm_pre_clip[0]) and torch.isfinite(stats.grad_norm_pre_clip[1])
    for p, old in zip(params, before):
        assert torch.equal(p[0], old[0])
        assert not torch.equal(p[1], old[1])
    assert torch.equal(health.alive, torch.tensor([False, True]))
    assert torch.equal(health.diverged_at, torch.tensor([11, -1]))
    assert health.cause[0].item() == CAUSES.index("nonfinite_grad")


def overflow_step():
    """One SGD step (lr 1) whose update overflows member 0's parameter: 3e38 - (-3e38) = inf."""
    w = torch.nn.Parameter(torch.tensor([[3e38], [1.0]]))  # [P=2, 1]
    health = Health(2, CPU)
    pipe = GradientPipeline(
        [w], SGDConfig(name="sgd", lr=1.0), ClippingConfig(name="none"), RegularizationConfig(), [w], health
    )
    k = torch.tensor([[-3e38], [0.5]])
    stats = pipe.step((k * (w - w.detach())).sum(1), env_step=4)  # loss 0, gradient k (finite)
    return w, health, pipe, stats


def test_pipeline_nonfinite_parameter_after_step_marks_only_that_member():
    w, health, pipe, stats = overflow_step()
    assert torch.isfinite(stats.loss).all() and torch.isfinite(stats.grad_norm_pre_clip).all()
    assert w[1].item() == 1.0 - 0.5  # member 1: plain SGD
    assert torch.equal(health.alive, torch.tensor([False, True]))
    assert torch.equal(health.diverged_at, torch.tensor([4, -1]))
    assert health.cause[0].item() == CAUSES.index("nonfinite_param")
    assert health.cause[1].item() == CAUSES.index("none")
    # the diverged member stays frozen afterwards, member 1 goes on
    frozen = w.detach().clone()
    pipe.step((torch.tensor([[1.0], [1.0]]) * w).sum(1), env_step=5)
    assert torch.equal(w[0], frozen[0])
    assert w[1].item() == 0.5 - 1.0
    assert torch.equal(health.diverged_at, torch.tensor([4, -1]))


def test_pipeline_huge_finite_gradient_is_not_a_nonfinite_gradient():
    # 1e20 squared overflows float32, but every element is finite: the member must update, not diverge
    w = torch.nn.Parameter(torch.zeros(2, 4))
    scale = torch.tensor([[1e20] * 4, [1.0] * 4])
    health = Health(2, torch.device("cpu"))
    pipe = GradientPipeline(
        [w], SGDConfig(name="sgd", lr=1e-30), ClippingConfig(name="none"), RegularizationConfig(), [w], health
    )
    stats = pipe.step((scale * w).sum(1), 1)
    assert bool(health.alive.all())
    expected = math.sqrt(4 * 1e40)  # the member's gradient norm, written out in float64
    assert stats.grad_norm_pre_clip[0].item() == pytest.approx(expected, rel=1e-6)
    torch.testing.assert_close(w.detach(), -1e-30 * scale)


def test_pipeline_finite_parameters_whose_sum_overflows_are_not_diverged():
    # the CPU fast check sums the parameters in float32; 2 x 3e38 overflows that sum although every
    # element is finite: the exact check must then keep both members alive and updated
    w = torch.nn.Parameter(torch.tensor([[3e38, 3e38], [1.0, 2.0]]))  # [P=2, 2]
    health = Health(2, CPU)
    pipe = GradientPipeline(
        [w], SGDConfig(name="sgd", lr=1.0), ClippingConfig(name="none"), RegularizationConfig(), [w], health
    )
    stats = pipe.step((w - w.detach()).sum(1), env_step=3)  # loss 0, gradient 1 for every element
    assert stats.newly_diverged is not None and not bool(stats.newly_diverged.any())  # the exact check ran
    assert bool(health.alive.all())
    expected = torch.tensor([[3e38, 3e38], [1.0, 2.0]]) - 1.0  # the SGD step, in float32
    assert torch.equal(w.detach(), expected)


def test_pipeline_nonfinite_parameter_after_step_is_restored():
    w, health, _, _ = overflow_step()
    # member 0 diverged on this step: like a non-finite loss or gradient, it keeps its pre-step parameters
    assert torch.equal(w.detach(), torch.tensor([[3e38], [0.5]]))


def test_pipeline_huge_gradient_in_member0_does_not_change_member1():
    x, y = data()
    results = []
    for factor in (1.0, 1e6):
        layer = make_layer()
        params = [layer.weight, layer.bias]
        pipe = GradientPipeline(
            params,
            AdamConfig(name="adam", lr=0.01),
            NormClipConfig(name="global_norm", max_norm=0.5),
            RegularizationConfig(),
            [layer.weight],
            Health(2, CPU),
        )
        stats = []
        for step in range(3):
            loss = mse_per_member(layer, x, y) * torch.tensor([factor, 1.0])
            stats.append(pipe.step(loss, env_step=step))
        results.append(([p.detach().clone() for p in params], stats))
    (pa, sa), (pb, sb) = results
    for a, b in zip(pa, pb):
        assert torch.equal(a[1], b[1])
    for a, b in zip(sa, sb):
        assert torch.equal(a.grad_norm_pre_clip[1], b.grad_norm_pre_clip[1])
        assert torch.equal(a.grad_norm_post_clip[1], b.grad_norm_post_clip[1])
    torch.testing.assert_close(
        sb[0].grad_norm_post_clip[0], torch.tensor(0.5), check_dtype=False
    )  # clipped to max_norm


@pytest.mark.parametrize("weights_only", [True, False])
def test_regularization_adds_the_written_out_penalty_gradient(weights_only):
    l1, l2, lr = 0.01, 0.05, 0.1
    net = PopMLP(
        2,
        3,
        2,
        NetworkConfig(name="mlp", hidden=[4]),
        ActivationConfig(name="tanh"),
        LayerNormConfig(name="layer"),
        GainInitConfig(name="he", bias=0.1),
        gens(0, 1),
    )
    ref = copy.deepcopy(net)
    x, y = data()
    params = list(net.parameters())
    weights = weight_parameters(net)
    assert len(weights) == 2
    pipe = GradientPipeline(
        params,
        SGDConfig(name="sgd", lr=lr),
        ClippingConfig(name="none"),
        RegularizationConfig(l1=l1, l2=l2, weights_only=weights_only),
        weights,
        Health(2, CPU),
    )
    before = [p.detach().clone() for p in params]
    stats = pipe.step((net(x) - y).square().mean(dim=(1, 2)), env_step=0)

    base_loss = (ref(x) - y).square().mean(dim=(1, 2))
    base_loss.sum().backward()
    penalized = {id(w) for w in weights} if weights_only else {id(p) for p in params}
    expected_loss = base_loss.detach().clone()
    for p_new, p_old, r in zip(params, before, ref.parameters()):
        expected_grad = r.grad.clone()
        if id(p_new) in penalized:
            expected_grad += l1 * torch.sign(p_old) + 2 * l2 * p_old
            expected_loss += l1 * p_old.abs().flatten(1).sum(1) + l2 * (p_old**2).flatten(1).sum(1)
        else:
            torch.testing.assert_close(p_new.grad, r.grad)  # unpenalized: the plain gradient
        torch.testing.assert_close(p_new.grad, expected_grad)
        torch.testing.assert_close(p_new.detach(), p_old - lr * expected_grad)
    torch.testing.assert_close(stats.loss, expected_loss)
    bias_grad_changed = not torch.allclose(net.layers[0].bias.grad, ref.layers[0].bias.grad)
    assert bias_grad_changed == (not weights_only)
