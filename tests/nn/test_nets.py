"""Unit tests of the population building blocks: nets, initializers, clipping, gradient pipeline,
optimizers, gradient scaling and target updates.

Every check compares rlexp against a direct computation written out here (plain torch / torch.nn
applied member by member, or the formula itself). Tensors are small so the file runs in seconds.
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from definitions import ref_activation
from omegaconf import OmegaConf

from rlexp.config.schema import (
    ActivationConfig,
    AdamConfig,
    AGCConfig,
    BatchNormConfig,
    ClippingConfig,
    ELUConfig,
    GainInitConfig,
    InitConfig,
    LayerNormConfig,
    LeakyReLUConfig,
    NetworkConfig,
    NormalizationConfig,
    NormClipConfig,
    RegularizationConfig,
    RMSpropConfig,
    RMSpropTFConfig,
    SGDConfig,
    ValueClipConfig,
    WeightNormConfig,
)
from rlexp.nn.activations import ACTIVATIONS, activation_gain
from rlexp.nn.init import INITIALIZERS, init_linear, scheme_gain
from rlexp.nn.nets import (
    NORMALIZATIONS,
    PopBatchNorm,
    PopLayerNorm,
    PopLinear,
    PopMLP,
    PopWeightNormLinear,
    hard_update_,
    scale_gradient,
    soft_update_,
    weight_parameters,
)
from rlexp.optim.optimizers import _sqrt, make_optimizer
from rlexp.optim.pipeline import CAUSES, CLIPPERS, GradientPipeline, Health, member_norms

ROOT = Path(__file__).resolve().parents[2]

CPU = torch.device("cpu")


# ---------------------------------------------------------------- helpers
def gens(*seeds: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def sgd_pipeline(net: torch.nn.Module, members: int) -> GradientPipeline:
    """A plain SGD pipeline (lr 0.5, no clipping): it moves the parameters into its flat buffer."""
    return GradientPipeline(
        list(net.parameters()),
        SGDConfig(name="sgd", lr=0.5),
        ClippingConfig(name="none"),
        RegularizationConfig(),
        weight_parameters(net),
        Health(members, CPU),
    )


def structured(cls, **kw):
    """A config node as Hydra hands it to the code (a structured DictConfig)."""
    return OmegaConf.structured(cls(**kw))


ACT_NAMES = sorted(ACTIVATIONS)


def activation_config(name: str, **kw) -> ActivationConfig:
    """The structured config of an activation, from its registry entry's schema."""
    return structured(ACTIVATIONS[name].schema, name=name, **kw)


def normalization_config(name: str, **kw) -> NormalizationConfig:
    """The structured config of a normalization, from its registry entry's schema."""
    return structured(NORMALIZATIONS[name].schema, name=name, **kw)


def make_activation(cfg: ActivationConfig):
    return ACTIVATIONS[cfg.name].function(cfg)


# ---------------------------------------------------------------- activations
@pytest.mark.parametrize("name", ACT_NAMES)
def test_activation_registry_matches_definitions(name):
    x = torch.linspace(-4.0, 4.0, 41, dtype=torch.float64)
    torch.testing.assert_close(make_activation(activation_config(name))(x), ref_activation(name, x))


def test_activation_functions_use_configured_slope_and_alpha():
    x = torch.linspace(-3.0, 3.0, 25, dtype=torch.float64)
    leaky = make_activation(activation_config("leaky_relu", negative_slope=0.2))
    elu = make_activation(activation_config("elu", alpha=0.5))
    torch.testing.assert_close(leaky(x), ref_activation("leaky_relu", x, slope=0.2))
    torch.testing.assert_close(elu(x), ref_activation("elu", x, alpha=0.5))
    # the configured parameters matter (not the library defaults)
    assert not torch.allclose(leaky(x), ref_activation("leaky_relu", x, slope=0.01))
    assert not torch.allclose(elu(x), ref_activation("elu", x, alpha=1.0))


# ---------------------------------------------------------------- population layers
def test_pop_linear_forward_is_f_linear_per_member():
    torch.manual_seed(0)
    layer = PopLinear(3, 5, 4)
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.normal_()
    x = torch.randn(3, 6, 5)
    y = layer(x)
    assert y.shape == (3, 6, 4)
    for p in range(3):
        torch.testing.assert_close(y[p], F.linear(x[p], layer.weight[p], layer.bias[p]))
        torch.testing.assert_close(y[p], x[p] @ layer.weight[p].T + layer.bias[p])


@pytest.mark.parametrize("members", [1, 3])
@pytest.mark.parametrize("shape", [(8, 16), (128, 160)], ids=["small", "per_member"])
def test_copy_matrices_copies_transposed_and_plain_sources(members, shape):
    """copy_matrices: dst equals src whichever path it takes (a transposed source above the size bound
    goes member by member), into a view of a wider buffer as the pipeline's gradients are."""
    from rlexp.nn.nets import TRANSPOSED_COPY_MIN, copy_matrices

    rows, cols = shape
    assert (rows * cols >= TRANSPOSED_COPY_MIN) == (shape == (128, 160))
    flat = torch.zeros(members, rows * cols + 16)
    dst = flat[:, : rows * cols].view(members, rows, cols)
    for src in (torch.randn(members, cols, rows).mT, torch.randn(members, rows, cols)):
        copy_matrices(dst, src)
        assert torch.equal(dst, src)
    assert torch.equal(flat[:, rows * cols :], torch.zeros(members, 16))


@pytest.mark.parametrize("batch, n_in, n_out", [(128, 64, 1), (32, 256, 1), (10, 400, 1), (256, 3, 1), (128, 64, 64)])
def test_a_population_of_one_computes_a_layer_as_a_member_of_three(batch, n_in, n_out):
    """Forward, input and parameter gradients (autograd's and the written ones) and the acting forward of a
    layer, a value head's (one output) among them: member 1 of three and the same member alone give the
    same bits (torch alone would take its single-matrix kernel for a population of one, and round
    otherwise)."""
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(3, n_out, n_in, generator=g), torch.randn(3, n_out, generator=g)
    x, grad = torch.randn(3, batch, n_in, generator=g), torch.randn(3, batch, n_out, generator=g)

    def run(members: slice) -> list[torch.Tensor]:
        layer = PopLinear(members.stop - members.start, n_in, n_out)
        with torch.no_grad():
            layer.weight.copy_(weight[members]), layer.bias.copy_(bias[members])
        inputs = x[members].clone().requires_grad_(True)
        y = layer(inputs)
        y.backward(grad[members])
        saved = layer.forward_saved(x[members])[1]
        layer.weight.grad, layer.bias.grad = None, None
        written_input_grad = layer.backward_to_grads(saved, grad[members])
        return [y, inputs.grad, layer.weight.grad, written_input_grad, layer.fast_forward()(x[members])]

    for alone, in_three in zip(run(slice(1, 2)), run(slice(0, 3))):
        assert torch.equal(alone[0], in_three[1])


def test_pop_linear_gradient_is_per_member():
    torch.manual_seed(1)
    layer = PopLinear(2, 3, 4)
    with torch.no_grad():
        layer.weight.normal_()
    x = torch.randn(2, 5, 3)
    y = layer(x)
    y[0].square().sum().backward()  # a loss on member 0 only
    torch.testing.assert_close(layer.weight.grad[0], 2 * y[0].detach().T @ x[0])
    torch.testing.assert_close(layer.bias.grad[0], 2 * y[0].detach().sum(0))
    assert torch.equal(layer.weight.grad[1], torch.zeros(4, 3))
    assert torch.equal(layer.bias.grad[1], torch.zeros(4))


@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_weight_norm_linear_forward_and_grads_match_formula(eps):
    torch.manual_seed(2)
    layer = PopWeightNormLinear(2, 5, 3, eps=eps, g_init=1.5)
    assert torch.equal(layer.g.detach(), torch.full((2, 3), 1.5))
    with torch.no_grad():
        layer.weight.normal_()
        layer.bias.normal_()
        layer.g.mul_(torch.rand(2, 3) + 0.5)
    x = torch.randn(2, 4, 5, dtype=torch.float32)
    y = layer(x)
    y.square().sum().backward()

    v = layer.weight.detach().clone().requires_grad_()
    g = layer.g.detach().clone().requires_grad_()
    b = layer.bias.detach().clone().requires_grad_()
    total = 0.0
    for p in range(2):
        w = g[p][:, None] * v[p] / torch.sqrt((v[p] ** 2).sum(1, keepdim=True) + eps)
        ref = F.linear(x[p], w, b[p])
        torch.testing.assert_close(y[p], ref)
        total = total + ref.square().sum()
    total.backward()
    torch.testing.assert_close(layer.weight.grad, v.grad)
    torch.testing.assert_close(layer.g.grad, g.grad)
    torch.testing.assert_close(layer.bias.grad, b.grad)


def test_weight_norm_eps0_is_unguarded_division():
    x = torch.ones(1, 2, 3)
    unguarded = PopWeightNormLinear(1, 3, 2, eps=0.0, g_init=1.0)
    guarded = PopWeightNormLinear(1, 3, 2, eps=1e-8, g_init=1.0)
    for layer in (unguarded, guarded):
        with torch.no_grad():
            layer.weight.copy_(torch.tensor([[[3.0, 4.0, 0.0], [0.0, 0.0, 0.0]]]))  # unit 1: v = 0
            layer.bias.zero_()
    # unit 0: g * v / ||v|| = [0.6, 0.8, 0] exactly (||v|| = 5)
    torch.testing.assert_close(unguarded.effective_weight()[0, 0], torch.tensor([0.6, 0.8, 0.0]))
    assert not torch.isfinite(unguarded(x)[0, :, 1]).any()  # 0 / 0
    assert torch.equal(guarded(x)[0, :, 1], torch.zeros(2))  # 0 / sqrt(eps)


def test_pop_layer_norm_matches_f_layer_norm_per_member():
    torch.manual_seed(3)
    ln = PopLayerNorm(3, 6, eps=1e-3)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    x = torch.randn(3, 4, 6) * 3 + 1
    y = ln(x)
    for p in range(3):
        torch.testing.assert_close(y[p], F.layer_norm(x[p], (6,), ln.weight[p], ln.bias[p], eps=1e-3))
        mean = x[p].mean(-1, keepdim=True)
        var = ((x[p] - mean) ** 2).mean(-1, keepdim=True)
        torch.testing.assert_close(y[p], (x[p] - mean) / torch.sqrt(var + 1e-3) * ln.weight[p] + ln.bias[p])


def test_pop_batch_norm_matches_batchnorm1d_per_member_train_and_eval():
    torch.manual_seed(4)
    P, B, H = 3, 7, 5
    bn = PopBatchNorm(P, H, eps=1e-3, momentum=0.2)
    with torch.no_grad():
        bn.weight.normal_()
        bn.bias.normal_()
    refs = []
    for p in range(P):
        r = torch.nn.BatchNorm1d(H, eps=1e-3, momentum=0.2)
        with torch.no_grad():
            r.weight.copy_(bn.weight[p])
            r.bias.copy_(bn.bias[p])
        refs.append(r)
    bn.train()
    for step in range(3):
        x = (torch.randn(P, B, H) * (step + 1) + step).requires_grad_()
        y = bn(x)
        (y * torch.arange(H)).sum().backward()
        for p in range(P):
            xp = x[p].detach().clone().requires_grad_()
            yp = refs[p](xp)
            (yp * torch.arange(H)).sum().backward()
            torch.testing.assert_close(y[p], yp)
            torch.testing.assert_close(x.grad[p], xp.grad)
            torch.testing.assert_close(bn.running_mean[p], refs[p].running_mean)
            torch.testing.assert_close(bn.running_var[p], refs[p].running_var)
    assert not torch.allclose(bn.running_var, torch.ones(P, H))  # the statistics did move
    bn.eval()
    x = torch.randn(P, B, H)
    y = bn(x)
    for p in range(P):
        refs[p].eval()
        torch.testing.assert_close(y[p], refs[p](x[p]))
        # eval: the running statistics, written out
        expected = (x[p] - bn.running_mean[p]) / torch.sqrt(bn.running_var[p] + 1e-3) * bn.weight[p] + bn.bias[p]
        torch.testing.assert_close(y[p], expected)


def test_pop_batch_norm_statistics_are_per_member():
    torch.manual_seed(5)
    a, b = PopBatchNorm(2, 4, 1e-5, 0.1), PopBatchNorm(2, 4, 1e-5, 0.1)
    x = torch.randn(2, 6, 4)
    x2 = x.clone()
    x2[0] = x2[0] * 1e3 + 50.0  # a wildly different batch for member 0 only
    ya, yb = a(x), b(x2)
    assert torch.equal(ya[1], yb[1])
    assert torch.equal(a.running_mean[1], b.running_mean[1])
    assert torch.equal(a.running_var[1], b.running_var[1])
    assert not torch.allclose(a.running_mean[0], b.running_mean[0])


# ---------------------------------------------------------------- PopMLP
def mlp_reference(net: PopMLP, x, network, act, norm) -> torch.Tensor:
    """Forward pass written out member by member with F.linear / F.layer_norm and the formulas."""
    slope = getattr(act, "negative_slope", 0.01)
    alpha = getattr(act, "alpha", 1.0)
    n_layers = len(network.hidden) + 1
    outs = []
    for p in range(x.shape[0]):
        h = x[p]
        for i, layer in enumerate(net.layers):
            last = i == n_layers - 1
            v, b = layer.weight[p], layer.bias[p]
            if norm.name == "weight" and (not last or norm.output_layer):
                w = layer.g[p][:, None] * v / torch.sqrt((v**2).sum(1, keepdim=True) + norm.eps)
            else:
                w = v
            z = F.linear(h, w, b)
            if last:
                outs.append(z * network.output_scale)
                break
            nm = net.norms[i] if len(net.norms) else None  # a norm after every hidden layer, or none
            if norm.name == "layer":
                z = F.layer_norm(z, z.shape[-1:], nm.weight[p], nm.bias[p], eps=norm.eps)
            elif norm.name == "batch":
                mean = z.mean(0)
                var = ((z - mean) ** 2).mean(0)
                z = (z - mean) / torch.sqrt(var + norm.eps) * nm.weight[p] + nm.bias[p]
            a = ref_activation(act.name, z, slope=slope, alpha=alpha)
            h = h + a if (network.residual and h.shape[-1] == a.shape[-1]) else a
    return torch.stack(outs)


MLP_CASES = {
    "none-relu": (
        NetworkConfig(name="mlp", hidden=[8, 8]),
        ActivationConfig(name="relu"),
        NormalizationConfig(name="none"),
    ),
    "layer-tanh-residual": (
        NetworkConfig(name="mlp", hidden=[8, 8, 8], residual=True),
        ActivationConfig(name="tanh"),
        LayerNormConfig(name="layer", eps=1e-3),
    ),
    "batch-leaky-residual-scaled": (
        NetworkConfig(name="mlp", hidden=[8, 8], residual=True, output_scale=0.5),
        LeakyReLUConfig(name="leaky_relu", negative_slope=0.2),
        BatchNormConfig(name="batch", eps=1e-3),
    ),
    "weight-elu-output": (
        NetworkConfig(name="mlp", hidden=[8, 8]),
        ELUConfig(name="elu", alpha=0.7),
        WeightNormConfig(name="weight", eps=1e-8, g_init=1.3),
    ),
    "weight0-gelu-no-output": (
        NetworkConfig(name="mlp", hidden=[6], output_scale=3.0),
        ActivationConfig(name="gelu"),
        WeightNormConfig(name="weight", eps=0.0, output_layer=False),
    ),
}


@pytest.mark.parametrize("case", list(MLP_CASES))
def test_pop_mlp_forward_matches_direct_computation(case):
    network, act, norm = (OmegaConf.structured(c) for c in MLP_CASES[case])
    init = structured(GainInitConfig, name="he", gain=None, bias=0.1)
    net = PopMLP(2, 8 if network.residual else 3, 2, network, act, norm, init, gens(0, 1)).double()
    with torch.no_grad():  # make every affine / gain parameter matter
        for name, prm in net.named_parameters():
            if not name.endswith(".weight") or name.startswith("norms"):
                prm.add_(0.3 * torch.randn(prm.shape, dtype=prm.dtype, generator=torch.Generator().manual_seed(7)))
    # structure: weight-normalized layers exactly where the config says
    n_layers = len(network.hidden) + 1
    for i, layer in enumerate(net.layers):
        wn = norm.name == "weight" and (i < n_layers - 1 or norm.output_layer)
        assert isinstance(layer, PopWeightNormLinear) == wn
    x = torch.randn(
        2, 5, net.layers[0].weight.shape[-1], dtype=torch.float64, generator=torch.Generator().manual_seed(3)
    )
    y = net(x)
    assert y.shape == (2, 5, 2)
    torch.testing.assert_close(y, mlp_reference(net, x, network, act, norm))
    if network.residual:  # the residual connection changes the result
        plain = OmegaConf.merge(network, {"residual": False})
        assert not torch.allclose(y, mlp_reference(net, x, plain, act, norm))
    if network.output_scale != 1.0:
        unscaled = OmegaConf.merge(network, {"output_scale": 1.0})
        torch.testing.assert_close(y, network.output_scale * mlp_reference(net, x, unscaled, act, norm))


@pytest.mark.parametrize("normalization", ["none", "layer"])  # the raw-op path and the forward() path
def test_inference_matches_forward_after_a_pipeline_moves_and_updates_the_parameters(normalization):
    norm = LayerNormConfig(name="layer") if normalization == "layer" else NormalizationConfig(name="none")
    net = PopMLP(
        3,
        4,
        2,
        NetworkConfig(name="mlp", hidden=[8, 8]),
        ActivationConfig(name="tanh"),
        norm,
        GainInitConfig(name="he"),
        gens(1, 2, 3),
    )
    infer = net.inference()  # made before the pipeline moves the parameters into its flat buffer
    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0))
    initial = infer(x)
    assert torch.equal(initial, net(x).detach())
    pipe = sgd_pipeline(net, 3)
    for _ in range(2):
        pipe.step(net(x).square().mean((1, 2)), env_step=0)
        assert torch.equal(infer(x), net(x).detach())
    assert not torch.equal(infer(x), initial)  # the updates moved the outputs, and inference saw them


HOST_CASES = [(name, "none", False) for name in sorted(ACTIVATIONS)] + [
    ("relu", norm, residual) for norm in sorted(NORMALIZATIONS) if norm != "none" for residual in (False, True)
]


def greedy_actions(q: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """argmax over actions of q [P, B, A], on the samples where ``expected`` (torch's values) has
    no near-tie: its best two values apart by more than 1e-3 relative (most samples, asserted)."""
    top2 = np.sort(expected, -1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > 1e-3 * np.maximum(np.abs(top2[..., 1]), 1.0)  # [P, B]
    assert clear.mean() > 0.9
    return q.argmax(-1)[clear]


@pytest.mark.parametrize(
    "activation,normalization,residual",
    HOST_CASES,
    ids=[f"{a}-{n}" + ("-residual" if r else "") for a, n, r in HOST_CASES],
)
def test_host_inference_matches_forward_after_a_pipeline_moves_and_updates_the_parameters(
    activation, normalization, residual
):
    """numpy (every component has a numpy form) or torch from host arrays: forward's greedy actions
    (eval mode) on samples without near-ties; values are not compared, float32 rounding order and
    the CPU's exp may differ."""
    net = PopMLP(
        3,
        4,
        5,
        NetworkConfig(name="mlp", hidden=[32, 32], output_scale=0.5, residual=residual),
        activation_config(activation),
        normalization_config(normalization),
        GainInitConfig(name="he"),
        gens(1, 2, 3),
    )
    net.eval()
    with torch.no_grad():  # pre-activations of both signs, some far below zero; norms away from identity
        for layer in net.layers:
            layer.bias.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(5))
        for tensor in [*net.norms.parameters(), *net.norms.buffers()]:
            tensor.add_(torch.rand(tensor.shape, generator=torch.Generator().manual_seed(6)))
    host = net.host_inference()  # made before the pipeline moves the parameters into its flat buffer
    x = torch.randn(3, 200, 4, generator=torch.Generator().manual_seed(0)) * 3

    def check() -> np.ndarray:
        out, expected = host(x.numpy()), net(x).detach().numpy()
        assert isinstance(out, np.ndarray) and out.shape == (3, 200, 5) and out.dtype == np.float32
        assert np.array_equal(greedy_actions(out, expected), greedy_actions(expected, expected))
        return out

    initial = check()
    pipe = sgd_pipeline(net, 3)
    for _ in range(2):
        pipe.step(net(x).square().mean((1, 2)), env_step=0)
        check()
    assert not np.array_equal(check(), initial)  # the updates moved the outputs, and host_inference saw them
    if net.uses_batch_stats:  # training mode normalizes with the batch's statistics (torch's forward)
        net.train()
        train_out = host(x.numpy())
        assert np.array_equal(train_out, net(x).detach().numpy())
        net.eval()
        assert not np.allclose(train_out, host(x.numpy()))


def test_pop_mlp_members_are_independent_with_batch_norm():
    network = NetworkConfig(name="mlp", hidden=[8, 8])
    args = (
        network,
        ActivationConfig(name="relu"),
        BatchNormConfig(name="batch"),
        InitConfig(name="default", bias=None),
    )
    net_a = PopMLP(2, 3, 2, *args, gens(0, 1))
    net_b = PopMLP(2, 3, 2, *args, gens(0, 1))
    x = torch.randn(2, 6, 3)
    x2 = x.clone()
    x2[0] = x2[0] * 100.0 - 7.0
    ya, yb = net_a(x), net_b(x2)
    assert torch.equal(ya[1], yb[1])
    assert not torch.allclose(ya[0], yb[0])
    ya[1].sum().backward()  # member 1's loss gives member 0 no gradient
    assert all(torch.equal(p.grad[0], torch.zeros_like(p.grad[0])) for p in net_a.parameters())


ALL_SCHEMES = sorted(INITIALIZERS)


def test_initializer_registry_names():
    assert set(ALL_SCHEMES) == {
        "default",
        "xavier",
        "xavier_uniform",
        "xavier_normal",
        "he",
        "he_normal",
        "he_uniform",
        "orthogonal",
        "lecun",
    }


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_pop_mlp_member_initialization_depends_only_on_its_own_generator(scheme):
    cls = InitConfig if scheme in ("default", "lecun") else GainInitConfig
    init = structured(cls, name=scheme, bias=None if scheme == "default" else 0.0)
    args = (
        NetworkConfig(name="mlp", hidden=[8, 8]),
        ActivationConfig(name="tanh"),
        LayerNormConfig(name="layer"),
        init,
    )
    a = PopMLP(2, 4, 3, *args, gens(0, 1))
    b = PopMLP(2, 4, 3, *args, gens(9, 1))
    c = PopMLP(1, 4, 3, *args, gens(1))  # member 1 alone in a population of one
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa[1], pb[1]), name
        assert torch.equal(pa[1], pc[0]), name
    wa = [w[0] for w in weight_parameters(a)]
    wb = [w[0] for w in weight_parameters(b)]
    assert all(not torch.equal(x, y) for x, y in zip(wa, wb))  # seed 0 != seed 9


# ---------------------------------------------------------------- initializers
@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_init_linear_member_depends_only_on_its_own_generator(scheme):
    cfg = structured(InitConfig if scheme in ("default", "lecun") else GainInitConfig, name=scheme, bias=None)
    w_a, b_a = torch.empty(2, 5, 7), torch.empty(2, 5)
    w_b, b_b = torch.empty(2, 5, 7), torch.empty(2, 5)
    init_linear(w_a, b_a if scheme == "default" else None, cfg, 1.2, gens(0, 1))
    init_linear(w_b, b_b if scheme == "default" else None, cfg, 1.2, gens(9, 1))
    assert torch.equal(w_a[1], w_b[1])
    assert not torch.equal(w_a[0], w_b[0])
    if scheme == "default":
        assert torch.equal(b_a[1], b_b[1])


def test_he_init_member_equals_a_direct_draw_from_its_generator():
    cfg = GainInitConfig(name="he", gain=None)
    w = torch.empty(3, 6, 10)
    init_linear(w, None, cfg, math.sqrt(2.0), gens(4, 5, 6))
    for p, seed in enumerate((4, 5, 6)):
        direct = torch.empty(6, 10).normal_(
            0.0, math.sqrt(2.0) / math.sqrt(10), generator=torch.Generator().manual_seed(seed)
        )
        torch.testing.assert_close(w[p], direct)


def test_default_init_matches_nn_linear_reset_parameters():
    w, b = torch.empty(2, 6, 9), torch.empty(2, 6)
    init_linear(w, b, InitConfig(name="default", bias=None), 1.0, gens(3, 8))
    for p, seed in enumerate((3, 8)):
        g = torch.Generator().manual_seed(seed)
        ref_w = torch.nn.init.kaiming_uniform_(torch.empty(6, 9), a=math.sqrt(5), generator=g)
        ref_b = torch.empty(6).uniform_(-1 / math.sqrt(9), 1 / math.sqrt(9), generator=g)
        torch.testing.assert_close(w[p], ref_w)
        torch.testing.assert_close(b[p], ref_b)


OUT, IN = 128, 256  # fan_out != fan_in so swapped fans are caught
INIT_STATS = [
    # (scheme, cfg gain, activation, distribution, expected scale: uniform bound or normal std)
    ("default", None, "relu", "uniform", lambda g: 1 / math.sqrt(IN)),
    ("xavier", None, "relu", "uniform", lambda g: 1.0 * math.sqrt(6 / (IN + OUT))),
    ("xavier_uniform", 2.0, "relu", "uniform", lambda g: 2.0 * math.sqrt(6 / (IN + OUT))),
    ("xavier_normal", None, "tanh", "normal", lambda g: 1.0 * math.sqrt(2 / (IN + OUT))),
    ("xavier_normal", 0.5, "tanh", "normal", lambda g: 0.5 * math.sqrt(2 / (IN + OUT))),
    ("he", None, "relu", "normal", lambda g: math.sqrt(2.0) / math.sqrt(IN)),
    ("he_normal", None, "tanh", "normal", lambda g: (5 / 3) / math.sqrt(IN)),
    ("he_normal", 0.3, "relu", "normal", lambda g: 0.3 / math.sqrt(IN)),
    ("he_uniform", None, "relu", "uniform", lambda g: math.sqrt(2.0) * math.sqrt(3 / IN)),
    ("he_uniform", None, "sigmoid", "uniform", lambda g: 1.0 * math.sqrt(3 / IN)),
    ("lecun", None, "relu", "normal", lambda g: math.sqrt(1 / IN)),
]


@pytest.mark.parametrize("scheme,gain,act,dist,scale", INIT_STATS, ids=[f"{s}-{g}-{a}" for s, g, a, _, _ in INIT_STATS])
def test_init_statistics_match_the_formulas(scheme, gain, act, dist, scale):
    cfg = (
        structured(InitConfig, name=scheme)
        if scheme in ("default", "lecun")
        else structured(GainInitConfig, name=scheme, gain=gain)
    )
    w = torch.empty(2, OUT, IN)
    init_linear(w, None, cfg, scheme_gain(cfg, activation_config(act)), gens(0, 1))
    s = scale(gain)
    for p in range(2):
        m = w[p].flatten().double()
        if dist == "uniform":
            assert m.abs().max() <= s
            assert m.abs().max() >= 0.99 * s
            torch.testing.assert_close(m.std().item(), s / math.sqrt(3), rtol=0.03, atol=0.0)
            assert (m.abs() > s / 2).double().mean().item() == pytest.approx(0.5, abs=0.02)
        else:
            torch.testing.assert_close(m.std().item(), s, rtol=0.03, atol=0.0)
            # Gaussian tails: P(|w| > 2 sigma) = 4.55% (a uniform with this std has none beyond 1.73 sigma)
            assert (m.abs() > 2 * s).double().mean().item() == pytest.approx(0.0455, abs=0.006)
        assert abs(m.mean().item()) < 0.03 * s


@pytest.mark.parametrize("act,gain", [("relu", None), ("tanh", None), ("relu", 0.5)])
@pytest.mark.parametrize("shape", [(32, 64), (64, 32)])
def test_orthogonal_init_is_orthogonal_with_gain(act, gain, shape):
    cfg = GainInitConfig(name="orthogonal", gain=gain)
    expected_gain = gain if gain is not None else {"relu": math.sqrt(2.0), "tanh": 5 / 3}[act]
    w = torch.empty(2, *shape, dtype=torch.float64)
    init_linear(w, None, cfg, scheme_gain(cfg, activation_config(act)), gens(0, 1))
    out, n_in = shape
    for p in range(2):
        gram = w[p] @ w[p].T if out <= n_in else w[p].T @ w[p]
        torch.testing.assert_close(
            gram, expected_gain**2 * torch.eye(min(shape), dtype=torch.float64), rtol=0, atol=1e-5
        )
    assert not torch.equal(w[0], w[1])


def test_scheme_and_activation_gains():
    he = GainInitConfig(name="he", gain=None)
    assert scheme_gain(he, activation_config("relu")) == pytest.approx(math.sqrt(2.0))
    for a in ("elu", "gelu", "silu", "mish"):
        assert scheme_gain(he, activation_config(a)) == pytest.approx(math.sqrt(2.0))
    assert scheme_gain(he, activation_config("tanh")) == pytest.approx(5.0 / 3.0)
    assert scheme_gain(he, activation_config("sigmoid")) == pytest.approx(1.0)
    assert scheme_gain(he, activation_config("softsign")) == pytest.approx(1.0)
    leaky = activation_config("leaky_relu", negative_slope=0.2)
    assert scheme_gain(he, leaky) == pytest.approx(math.sqrt(2.0 / (1.0 + 0.2**2)))
    leaky = activation_config("leaky_relu", negative_slope=0.5)
    assert activation_gain(leaky) == pytest.approx(math.sqrt(2.0 / (1.0 + 0.5**2)))
    assert activation_gain(activation_config("leaky_relu")) == pytest.approx(math.sqrt(2.0 / (1.0 + 0.01**2)))
    orthogonal = GainInitConfig(name="orthogonal", gain=None)
    assert scheme_gain(orthogonal, activation_config("tanh")) == pytest.approx(5.0 / 3.0)
    assert scheme_gain(GainInitConfig(name="he_uniform", gain=0.7), activation_config("relu")) == pytest.approx(0.7)
    # null gain -> 1 for default / xavier / lecun whatever the activation
    for cfg in (
        InitConfig(name="default"),
        InitConfig(name="lecun"),
        GainInitConfig(name="xavier", gain=None),
        GainInitConfig(name="xavier_normal", gain=None),
        GainInitConfig(name="xavier_uniform", gain=None),
    ):
        assert scheme_gain(cfg, activation_config("relu")) == pytest.approx(1.0)
    # structured configs behave like the dataclasses
    he = structured(GainInitConfig, name="he", gain=None)
    assert scheme_gain(he, activation_config("tanh")) == pytest.approx(5.0 / 3.0)
    assert scheme_gain(structured(InitConfig, name="lecun"), activation_config("relu")) == pytest.approx(1.0)


def test_pop_mlp_hidden_gain_follows_leaky_relu_slope():
    init = structured(GainInitConfig, name="he", gain=None)
    act = structured(LeakyReLUConfig, name="leaky_relu", negative_slope=0.5)
    net = PopMLP(
        1, 256, 4, NetworkConfig(name="mlp", hidden=[256]), act, NormalizationConfig(name="none"), init, gens(0)
    )
    expected = math.sqrt(2.0 / (1.0 + 0.5**2)) / math.sqrt(256)  # vs sqrt(2)/16 for slope 0.01: 10% apart
    torch.testing.assert_close(net.layers[0].weight.std().item(), expected, rtol=0.02, atol=0.0)


def test_constant_bias_and_default_bias():
    w, b = torch.empty(2, 64, 100), torch.empty(2, 64)
    init_linear(w, b, GainInitConfig(name="he", bias=0.1), 1.0, gens(0, 1))
    assert torch.equal(b, torch.full((2, 64), 0.1))
    init_linear(w, b, InitConfig(name="default", bias=0.0), 1.0, gens(0, 1))
    assert torch.equal(b, torch.zeros(2, 64))
    wide_w, wide_b = torch.empty(4, 256, 100), torch.empty(4, 256)
    init_linear(wide_w, wide_b, InitConfig(name="default", bias=None), 1.0, gens(0, 1, 2, 3))
    bound = 1.0 / math.sqrt(100)
    assert wide_b.abs().max() <= bound
    assert wide_b.abs().max() >= 0.98 * bound
    torch.testing.assert_close(wide_b.std().item(), bound / math.sqrt(3), rtol=0.06, atol=0.0)


def test_last_layer_uniform_draws_weight_and_bias_from_the_scale():
    cfg = GainInitConfig(name="he", gain=None, bias=0.5, last_layer="uniform", last_layer_scale=0.003)
    w, b = torch.empty(4, 64, 256), torch.empty(4, 64)
    init_linear(w, b, cfg, math.sqrt(2.0), gens(0, 1, 2, 3), last=True)
    assert w.abs().max() <= 0.003 and w.abs().max() >= 0.99 * 0.003
    torch.testing.assert_close(w.std().item(), 0.003 / math.sqrt(3), rtol=0.03, atol=0.0)
    assert b.abs().max() <= 0.003 and b.abs().max() >= 0.9 * 0.003  # not the constant 0.5
    # a hidden layer with the same config follows the scheme instead
    init_linear(w, b, cfg, math.sqrt(2.0), gens(0, 1, 2, 3), last=False)
    torch.testing.assert_close(w.std().item(), math.sqrt(2.0) / 16, rtol=0.03, atol=0.0)
    assert torch.equal(b, torch.full((4, 64), 0.5))


def test_last_layer_same_uses_last_layer_gain():
    cfg = GainInitConfig(name="he", gain=None, last_layer="same", last_layer_gain=0.1)
    w = torch.empty(2, 128, 256)
    init_linear(w, None, cfg, math.sqrt(2.0), gens(0, 1), last=True)
    torch.testing.assert_close(w.std().item(), 0.1 / math.sqrt(256), rtol=0.03, atol=0.0)
    init_linear(w, None, cfg, math.sqrt(2.0), gens(0, 1), last=False)
    torch.testing.assert_close(w.std().item(), math.sqrt(2.0) / math.sqrt(256), rtol=0.03, atol=0.0)
    # last_layer_gain = null: the output layer uses the hidden gain
    init_linear(w, None, GainInitConfig(name="he", gain=None), math.sqrt(2.0), gens(0, 1), last=True)
    torch.testing.assert_close(w.std().item(), math.sqrt(2.0) / math.sqrt(256), rtol=0.03, atol=0.0)


def test_pop_mlp_applies_last_layer_settings_to_the_output_layer_only():
    init = structured(GainInitConfig, name="he", gain=None, bias=0.2, last_layer="uniform", last_layer_scale=0.01)
    net = PopMLP(
        2,
        4,
        3,
        NetworkConfig(name="mlp", hidden=[16, 16]),
        ActivationConfig(name="relu"),
        NormalizationConfig(name="none"),
        init,
        gens(0, 1),
    )
    out = net.layers[-1]
    assert out.weight.abs().max() <= 0.01 and out.bias.abs().max() <= 0.01
    assert not torch.equal(out.bias, torch.full_like(out.bias, 0.2))
    for layer in net.layers[:-1]:
        assert torch.equal(layer.bias, torch.full_like(layer.bias, 0.2))
        assert layer.weight.abs().max() > 0.01


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


def test_no_optimizer_imports_torch_dynamo():
    """torch.optim.Optimizer's first construction imports torch._dynamo (~1.2 s): none of ours is one."""
    code = (
        "import sys, torch\n"
        "from rlexp.config.schema import AdamConfig, RMSpropConfig, RMSpropTFConfig, SGDConfig\n"
        "from rlexp.optim.optimizers import make_optimizer\n"
        "for cfg in (AdamConfig(name='adam'), AdamConfig(name='adamw'), RMSpropConfig(name='rmsprop', centered=True,"
        " momentum=0.5), RMSpropTFConfig(name='rmsprop_tf'), SGDConfig(name='sgd', momentum=0.9)):\n"
        "    p = torch.zeros(2, 3, requires_grad=True); p.grad = torch.ones(2, 3)\n"
        "    make_optimizer([p], cfg).step()\n"
        "    assert p.detach().ne(0).all(), cfg.name\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


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


# ---------------------------------------------------------------- scale_gradient
def test_scale_gradient_is_identity_forward_and_scales_backward():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, generator=gen).requires_grad_()
    c = torch.randn(3, 4, generator=gen)
    y = scale_gradient(x, 0.25)
    assert torch.equal(y, x)
    (y * c).sum().backward()
    torch.testing.assert_close(x.grad, 0.25 * c)

    # inside a network: parameters upstream of the op get scaled gradients, downstream ones do not
    w1 = torch.randn(4, 5, generator=gen)
    w2 = torch.randn(5, 2, generator=gen)
    inp = torch.randn(6, 4, generator=gen)

    def grads(scale):
        a, b = w1.clone().requires_grad_(), w2.clone().requires_grad_()
        h = torch.tanh(inp @ a)
        if scale is not None:
            h = scale_gradient(h, scale)
        out = ((h @ b) ** 2).sum()
        out.backward()
        return out.detach(), a.grad, b.grad

    plain_out, g1, g2 = grads(None)
    for s in (0.5, 0.0, 3.0):
        out, s1, s2 = grads(s)
        assert torch.equal(out, plain_out)
        torch.testing.assert_close(s1, s * g1)
        torch.testing.assert_close(s2, g2)


def test_scale_gradient_is_not_clipping():
    gen = torch.Generator().manual_seed(0)
    for magnitude in (1e-3, 1e3):  # a small and a large gradient
        x = torch.randn(1, 8, generator=gen).requires_grad_()
        c = magnitude * torch.randn(1, 8, generator=gen)
        (scale_gradient(x, 0.5) * c).sum().backward()
        scaled = x.grad.clone()
        clipped = [c.clone()]
        CLIPPERS["global_norm"]([x.detach()], clipped, NormClipConfig(name="global_norm", max_norm=1.0))
        torch.testing.assert_close(scaled, 0.5 * c)  # always scaled, whatever the magnitude
        if magnitude < 1:
            assert torch.equal(clipped[0], c)  # clipping leaves a small gradient alone
        else:
            torch.testing.assert_close(clipped[0].norm(), torch.tensor(1.0))  # and caps a large one's norm
            assert scaled.norm() > 100


# ---------------------------------------------------------------- target updates
def bn_mlp(seeds):
    return PopMLP(
        2,
        3,
        2,
        NetworkConfig(name="mlp", hidden=[5]),
        ActivationConfig(name="relu"),
        BatchNormConfig(name="batch"),
        GainInitConfig(name="he", bias=0.0),
        gens(*seeds),
    )


@pytest.mark.parametrize("tau", [0.001, 0.005, 0.5, 1.0])
def test_soft_update_is_the_ema_formula(tau):
    target, online = bn_mlp((0, 1)), bn_mlp((5, 6))
    with torch.no_grad():
        for p in online.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    online(torch.randn(2, 4, 3))  # moves the online running statistics
    t0 = [p.detach().clone() for p in target.parameters()]
    o0 = [p.detach().clone() for p in online.parameters()]
    ob = [b.clone() for b in online.buffers()]
    soft_update_(target, online, tau)
    for t, t_old, o in zip(target.parameters(), t0, o0):
        torch.testing.assert_close(t.detach(), (1 - tau) * t_old + tau * o)
    for o, o_old in zip(online.parameters(), o0):
        assert torch.equal(o, o_old)  # online untouched
    for b, o in zip(target.buffers(), ob):
        assert torch.equal(b, o)  # buffers copied


def test_soft_update_tau_0001_repeated_converges_geometrically():
    tau, n = 0.001, 5
    target, online = bn_mlp((0, 1)), bn_mlp((5, 6))
    with torch.no_grad():
        for p in online.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    t0 = [p.detach().clone() for p in target.parameters()]
    for _ in range(n):
        soft_update_(target, online, tau)
    for t, t_old, o in zip(target.parameters(), t0, online.parameters()):
        torch.testing.assert_close(t.detach(), o.detach() + (1 - tau) ** n * (t_old - o.detach()))
        assert not torch.equal(t, o)


def test_hard_update_copies_parameters_and_buffers():
    target, online = bn_mlp((0, 1)), bn_mlp((5, 6))
    online(torch.randn(2, 4, 3))
    o0 = [p.detach().clone() for p in online.parameters()]
    hard_update_(target, online)
    for t, o, o_old in zip(target.parameters(), online.parameters(), o0):
        assert torch.equal(t, o)
        assert torch.equal(o, o_old)
        assert t.data_ptr() != o.data_ptr()  # a copy, not an alias
    for t, o in zip(target.buffers(), online.buffers()):
        assert torch.equal(t, o)
    with torch.no_grad():
        next(online.parameters()).add_(1.0)
    assert not torch.equal(next(target.parameters()), next(online.parameters()))
