"""Population layers (rlexp/nn/nets.py) against torch.nn / F per member: linear, weight norm, layer and
batch norm, PopMLP's forward and its inference and host forms after a pipeline moves its parameters,
members independent, scale_gradient, soft and hard target updates."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from definitions import ref_activation
from omegaconf import OmegaConf

from rlexp.config.schema import (
    ActivationConfig,
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
    SGDConfig,
    WeightNormConfig,
)
from rlexp.nn.activations import ACTIVATIONS
from rlexp.nn.nets import (
    NORMALIZATIONS,
    PopBatchNorm,
    PopLayerNorm,
    PopLinear,
    PopMLP,
    PopWeightNormLinear,
    hard_update_,
    member_sum,
    scale_gradient,
    soft_update_,
    weight_parameters,
)
from rlexp.optim.pipeline import CLIPPERS, GradientPipeline, Health

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


def activation_config(name: str, **kw) -> ActivationConfig:
    """The structured config of an activation, from its registry entry's schema."""
    return structured(ACTIVATIONS[name].schema, name=name, **kw)


def normalization_config(name: str, **kw) -> NormalizationConfig:
    """The structured config of a normalization, from its registry entry's schema."""
    return structured(NORMALIZATIONS[name].schema, name=name, **kw)


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


@pytest.mark.parametrize("terms", [2, 5, 9, 33])
def test_member_sum_adds_each_members_terms_in_order_whatever_the_population(terms):
    """A member's sum of terms is the float32 sum taken one term after another, in populations of 1 to
    64 alike (``torch.stack(...).sum(0)`` reduces before the member dim with kernels that depend on P)."""
    values = torch.randn(terms, 64, generator=torch.Generator().manual_seed(terms))
    direct = np.zeros(64, dtype=np.float32)
    for row in values.numpy():
        direct = direct + row  # float32 + float32: one rounding per addition
    for members in (1, 2, 3, 6, 16, 64):
        assert torch.equal(member_sum(values[:, :members].contiguous()), torch.from_numpy(direct[:members]))
        assert torch.equal(member_sum(list(values[:, :members])), torch.from_numpy(direct[:members]))


@pytest.mark.parametrize("members, n_in, n_out", [(1, 1024, 128), (3, 256, 128), (2, 128, 6), (1, 64, 1)])
def test_the_written_weight_gradient_has_autograds_bits_in_a_padded_buffer(members, n_in, n_out):
    """A layer's written backward gives its weight the gradient autograd gives, bit for bit, into a view of
    a wider buffer as the pipeline's flat gradients are, whether it writes in place (a large layer where BLAS
    allows it: ``transposed_out_exact``) or copies (a narrow head, a value head of one member)."""
    g = torch.Generator().manual_seed(0)
    x, grad = torch.randn(members, 32, n_in, generator=g), torch.randn(members, 32, n_out, generator=g)
    layer = PopLinear(members, n_in, n_out)
    torch.nn.init.normal_(layer.weight, generator=g)
    layer(x).backward(grad)
    autograd = layer.weight.grad.clone()
    flat = torch.full((members, n_out * n_in + 5), 7.0)
    layer.weight.grad = flat[:, : n_out * n_in].view(members, n_out, n_in)
    layer.backward_to_grads(layer.forward_saved(x)[1], grad, input_grad=False)
    assert torch.equal(layer.weight.grad, autograd)
    # x^T grad, the direct computation (torch's own kernel for a single matrix may round otherwise)
    torch.testing.assert_close(layer.weight.grad, torch.bmm(x.mT, grad).mT)
    assert torch.equal(flat[:, n_out * n_in :], torch.full((members, 5), 7.0))


@pytest.mark.parametrize(
    "batch, n_in, n_out",
    [(128, 64, 1), (32, 256, 1), (10, 400, 1), (256, 3, 1), (128, 64, 64), (1, 256, 256), (64, 1, 32)],
)
def test_a_population_of_one_computes_a_layer_as_a_member_of_three(batch, n_in, n_out):
    """Forward, input and parameter gradients (autograd's and the written ones) and the acting forward of a
    layer, a value head's (one output), a backward over one sample and a layer of one input among them:
    member 1 of three and the same member alone give the same bits (torch alone would take its
    single-matrix kernel for a population of one, and round otherwise)."""
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


@pytest.mark.parametrize("normalization", ["none", "layer", "weight", "batch", "spectral"])
def test_a_network_walks_its_modules_to_switch_modes_only_where_its_forward_depends_on_the_mode(normalization):
    """PopNetwork.train: a network with a batch or spectral norm switches every component (their forwards
    read the mode); one without computes the same in either mode and switches its own flag alone."""
    dependent = normalization in ("batch", "spectral")
    net = PopMLP(
        2,
        3,
        2,
        NetworkConfig(name="mlp", hidden=[8, 8]),
        ActivationConfig(name="relu"),
        NormalizationConfig(name=normalization),
        GainInitConfig(name="he"),
        [torch.Generator().manual_seed(k) for k in range(2)],
    )
    assert net.mode_dependent == dependent
    x = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        y_train = net.train()(x)
        y_eval = net.eval()(x)
    assert not net.training
    components = [m for m in net.modules() if m is not net]
    assert all(not m.training for m in components) == dependent
    if not dependent:
        assert torch.equal(y_train, y_eval)


def test_every_component_whose_code_reads_the_mode_declares_it():
    """A component class whose own code reads ``self.training`` declares ``mode_dependent`` (a network of
    components that do not switches only its own flag, PopNetwork.train)."""
    import inspect

    import rlexp.nn.conv  # noqa: F401  (the convolutional components)
    import rlexp.nn.recurrent  # noqa: F401
    from rlexp.nn.component import Component

    def subclasses(cls: type) -> list[type]:
        return [c for sub in cls.__subclasses__() for c in (sub, *subclasses(sub))]

    found = [cls for cls in subclasses(Component) if "self.training" in inspect.getsource(cls)]
    assert {cls.__name__ for cls in found} >= {"PopBatchNorm", "PopSpectralNormLinear"}
    assert all(cls.mode_dependent for cls in found)
