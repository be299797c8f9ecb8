"""Every activation and every normalization of the registries, tested the same way: a new entry is
covered as soon as it is registered (an activation needs its written-out definition in
tests/definitions.py; a new kind of layer its torch.nn twin here).

Per entry: per-member output shapes; population equivalence against plain torch.nn modules built
per member (outputs, gradients, buffers); the init gain He and orthogonal use; the instruments and
divergence location on the network's own forward; the written backward (where every component
declares one) bit for bit autograd's; the value checks.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from definitions import RMSNorm, ref_activation
from omegaconf import OmegaConf
from torch import nn

from rlexp.config.schema import (
    ActivationConfig,
    ConfigError,
    DiagnosticsConfig,
    GainInitConfig,
    NetworkConfig,
    NormalizationConfig,
)
from rlexp.diagnostics.instruments import activity_instruments, locate_nonfinite, resolve
from rlexp.nn.activations import ACTIVATIONS, check_activation
from rlexp.nn.init import INITIALIZERS, check_init
from rlexp.nn.nets import (
    NORMALIZATIONS,
    PopBatchNorm,
    PopLayerNorm,
    PopLinear,
    PopMLP,
    PopRMSNorm,
    PopSpectralNormLinear,
    PopWeightNormLinear,
    check_normalization,
)

torch.set_num_threads(1)

P, B, N_IN, N_OUT, HIDDEN = 3, 7, 4, 3, [8, 6]


class Definition(nn.Module):
    """An activation as its written-out definition (tests/definitions.py), with the config's parameters."""

    def __init__(self, cfg: ActivationConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ref_activation(self.cfg.name, x, self.cfg.negative_slope, self.cfg.alpha)


NON_DEFAULT = {"leaky_relu": {"negative_slope": 0.2}, "elu": {"alpha": 0.7}}  # parameters that must be used


def activation_config(name: str) -> ActivationConfig:
    return OmegaConf.structured(ACTIVATIONS[name].schema(name=name, **NON_DEFAULT.get(name, {})))


def normalization_config(name: str) -> NormalizationConfig:
    return OmegaConf.structured(NORMALIZATIONS[name].schema(name=name))


def make_net(activation: str, normalization: str, dtype: torch.dtype = torch.float64, **network) -> PopMLP:
    """A population whose members differ, with biases and norm affines away from their initial values."""
    gens = [torch.Generator().manual_seed(10 + k) for k in range(P)]
    net = PopMLP(
        P,
        N_IN,
        N_OUT,
        NetworkConfig(name="mlp", hidden=list(HIDDEN), **network),
        activation_config(activation),
        normalization_config(normalization),
        GainInitConfig(name="he"),
        gens,
    ).to(dtype)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if not name.endswith("weight") or name.startswith("norms"):
                p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=dtype))
    return net


def inputs(dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.Tensor:
    return 2 * torch.randn(P, B, N_IN, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ---------------------------------------------------------------- twins: member k in torch.nn
class WeightNormLinear(nn.Module):
    """torch.nn.utils' weight-norm formula w = g v / ||v|| (with eps inside the root) on nn.Linear."""

    def __init__(self, v: torch.Tensor, g: torch.Tensor, b: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.v, self.g, self.b = nn.Parameter(v.clone()), nn.Parameter(g.clone()), nn.Parameter(b.clone())
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.g[:, None] * self.v / torch.sqrt(self.v.square().sum(1, keepdim=True) + self.eps)
        return F.linear(x, w, self.b)


def twin_linear(layer: PopLinear, k: int) -> tuple[nn.Module, list]:
    """Member k's linear layer as a torch.nn module, and (population tensor, twin tensor) pairs."""
    out_f, in_f = layer.weight.shape[1:]
    dtype = layer.weight.dtype
    if isinstance(layer, PopWeightNormLinear):
        twin = WeightNormLinear(layer.weight[k].detach(), layer.g[k].detach(), layer.bias[k].detach(), layer.eps)
        return twin, [(layer.weight, twin.v), (layer.g, twin.g), (layer.bias, twin.b)]
    linear = nn.Linear(in_f, out_f, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(layer.weight[k])
        linear.bias.copy_(layer.bias[k])
    if isinstance(layer, PopSpectralNormLinear):  # torch's parametrization with the same u (and v from it)
        linear = nn.utils.parametrizations.spectral_norm(linear, n_power_iterations=layer.power_iterations)
        sn = linear.parametrizations.weight[0]
        with torch.no_grad():
            w = linear.parametrizations.weight.original
            sn._u.copy_(layer.u[k])
            sn._v.copy_(F.normalize(torch.mv(w.T, sn._u), dim=0, eps=1e-12))
        return linear, [
            (layer.weight, linear.parametrizations.weight.original),
            (layer.bias, linear.bias),
            (layer.u, sn._u),
        ]
    return linear, [(layer.weight, linear.weight), (layer.bias, linear.bias)]


def twin_norm(norm: nn.Module, k: int) -> tuple[nn.Module, list]:
    """Member k's norm as nn.LayerNorm / nn.BatchNorm1d / nn.RMSNorm (written out before torch 2.4), and the tensor
    pairs."""
    width, dtype = norm.weight.shape[1], norm.weight.dtype
    if isinstance(norm, PopLayerNorm):
        twin = nn.LayerNorm(width, eps=norm.eps, dtype=dtype)
        pairs = [(norm.weight, twin.weight), (norm.bias, twin.bias)]
    elif isinstance(norm, PopBatchNorm):
        twin = nn.BatchNorm1d(width, eps=norm.eps, momentum=norm.momentum, dtype=dtype)
        pairs = [
            (norm.weight, twin.weight),
            (norm.bias, twin.bias),
            (norm.running_mean, twin.running_mean),
            (norm.running_var, twin.running_var),
        ]
    elif isinstance(norm, PopRMSNorm):
        twin = (
            nn.RMSNorm(width, eps=norm.eps, dtype=dtype) if hasattr(nn, "RMSNorm") else RMSNorm(width, norm.eps, dtype)
        )
        pairs = [(norm.weight, twin.weight)]
    else:
        raise KeyError(f"no torch.nn twin for {type(norm).__name__}")
    with torch.no_grad():
        for pop_t, twin_t in pairs:
            twin_t.copy_(pop_t[k])
    return twin, pairs


def twin_member(net: PopMLP, k: int, activation: ActivationConfig) -> tuple[nn.Sequential, list]:
    """Member k of ``net`` as nn.Sequential of torch.nn modules, and every (population, twin) tensor pair."""
    modules: list[nn.Module] = []
    pairs: list = []
    for i, layer in enumerate(net.layers):
        linear, linear_pairs = twin_linear(layer, k)
        modules.append(linear)
        pairs += linear_pairs
        if i < len(HIDDEN):
            if len(net.norms):
                norm, norm_pairs = twin_norm(net.norms[i], k)
                modules.append(norm)
                pairs += norm_pairs
            modules.append(Definition(activation))
    return nn.Sequential(*modules).to(net.layers[0].weight.dtype), pairs


# ---------------------------------------------------------------- per entry
@pytest.mark.parametrize("normalization", sorted(NORMALIZATIONS))
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_population_equals_torch_nn_twins_per_member(activation, normalization):
    """Outputs [P, B, out], input and parameter gradients and buffers (batch norm's running statistics,
    spectral norm's u) of member k equal those of member k built from torch.nn, in training mode."""
    net = make_net(activation, normalization)
    twins = [twin_member(net, k, net.activation) for k in range(P)]
    x = inputs().requires_grad_()
    grad_out = torch.randn(P, B, N_OUT, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = net(x)
    assert y.shape == (P, B, N_OUT)
    y.backward(grad_out)
    for k, (twin, pairs) in enumerate(twins):
        xk = x.detach()[k].clone().requires_grad_()
        yk = twin(xk)
        yk.backward(grad_out[k])
        torch.testing.assert_close(y[k], yk)
        torch.testing.assert_close(x.grad[k], xk.grad)
        for pop_t, twin_t in pairs:
            torch.testing.assert_close(pop_t.detach()[k], twin_t.detach())  # buffers updated alike
            if isinstance(pop_t, nn.Parameter):
                torch.testing.assert_close(pop_t.grad[k], twin_t.grad)
    # eval mode: running statistics, u as it is
    net.eval()
    y = net(x.detach())
    for k, (twin, _) in enumerate(twins):
        torch.testing.assert_close(y[k], twin.eval()(x.detach()[k]))


@pytest.mark.parametrize("scheme", ["he", "orthogonal"])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_every_activation_has_an_init_gain(activation, scheme):
    gens = [torch.Generator().manual_seed(k) for k in range(2)]
    net = PopMLP(
        2,
        N_IN,
        N_OUT,
        NetworkConfig(name="mlp", hidden=[16]),
        activation_config(activation),
        NormalizationConfig(name="none"),
        GainInitConfig(name=scheme),
        gens,
    )
    assert ACTIVATIONS[activation].gain(activation_config(activation)) > 0
    assert torch.isfinite(net.layers[0].weight).all()


@pytest.mark.parametrize("normalization", sorted(NORMALIZATIONS))
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_written_backward_is_autograd_bit_for_bit(activation, normalization, caplog):
    """Where every component declares a written backward, forward_saved + backward_to_grads give
    autograd's outputs, gradients and buffers exactly; elsewhere the network says so and uses autograd."""
    with caplog.at_level(logging.DEBUG, logger="rlexp.nn.nets"):
        net, twin = (
            make_net(activation, normalization, torch.float32),
            make_net(activation, normalization, torch.float32),
        )
    declared = all(c.written_backward for c in twin._components)
    assert twin.written_backward == declared
    if not declared:
        assert "no written backward" in caplog.text
        return
    x, grad_out = inputs(torch.float32), torch.randn(P, B, N_OUT, generator=torch.Generator().manual_seed(2))
    expected = net(x)
    expected.backward(grad_out)
    for p in twin.parameters():  # stale values are overwritten
        p.grad = torch.full_like(p, 123.0)
    out, saved = twin.forward_saved(x)
    assert torch.equal(out, expected.detach())
    twin.backward_to_grads(saved, grad_out)
    for (name, p), e in zip(twin.named_parameters(), net.parameters()):
        assert torch.equal(p.grad, e.grad), name
    for b, e in zip(twin.buffers(), net.buffers()):
        assert torch.equal(b, e)


@pytest.mark.parametrize("normalization", sorted(NORMALIZATIONS))
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_instruments_and_divergence_location(activation, normalization):
    """activity_instruments names every hidden layer; a NaN planted in member k's hidden weight is
    located there for member k and nowhere for the others; location changes no buffer."""
    net = make_net(activation, normalization, torch.float32)
    x = inputs(torch.float32)
    out, stats = activity_instruments(net, "q", x, DiagnosticsConfig())
    stats = resolve(stats)
    assert out.shape == (P, B, N_OUT)
    for metric in ("act_mean", "act_std", "dead", "dormant", "srank", "erank", "active", "feature_norm"):
        for i in range(len(HIDDEN)):
            assert stats[f"{metric}/q.{i}"].shape == (P,)
    net.eval()  # the effective weight of weight- and spectral-normalized layers, without a power iteration
    for i, layer in enumerate(net.layers):
        assert torch.equal(stats[f"weight_magnitude/q.{i}"], layer.effective_weight().detach().abs().mean((1, 2)))
    net.train()
    k = 1
    with torch.no_grad():
        net.layers[1].weight[k, 0, 0] = float("nan")
    buffers = [b.clone() for b in net.buffers()]
    for member in range(P):
        found = locate_nonfinite(net, "q", member, x[member], "replay.obs")
        if member == k:
            size = net.layers[1].weight[k].numel()  # HIDDEN[1] x HIDDEN[0] (x 2 for crelu)
            assert found == ("nonfinite_param", "q.1.weight", f"1 of {size} values non-finite")
        else:
            assert found is None
    assert all(torch.equal(b, before) for b, before in zip(net.buffers(), buffers))


# ---------------------------------------------------------------- value checks
def test_checks_refuse_unknown_names_and_bad_values():
    with pytest.raises(ConfigError, match="activation.name"):
        check_activation(OmegaConf.structured(ActivationConfig(name="swish")))
    with pytest.raises(ConfigError, match="critic.normalization.eps"):
        check_normalization(
            OmegaConf.structured(NORMALIZATIONS["rms"].schema(name="rms", eps=-1e-5)), "critic.normalization"
        )
    with pytest.raises(ConfigError, match="normalization.power_iterations"):
        check_normalization(OmegaConf.structured(NormalizationConfig(name="spectral", power_iterations=0)))
    with pytest.raises(ConfigError, match="init.gain"):
        check_init(OmegaConf.structured(GainInitConfig(name="he", gain=-1.0)))
    for name, entry in ACTIVATIONS.items():
        check_activation(OmegaConf.structured(entry.schema(name=name)))
    for name, entry in NORMALIZATIONS.items():
        check_normalization(OmegaConf.structured(entry.schema(name=name)))
    for name, entry in INITIALIZERS.items():
        check_init(OmegaConf.structured(entry.schema(name=name)))


def test_a_zero_weight_is_located_at_the_spectral_norm():
    """sigma(W) = 0 for member k's zero weight: W / sigma is 0/0 while every parameter is finite."""
    net = make_net("relu", "spectral", torch.float32)
    with torch.no_grad():
        net.layers[1].weight[1].zero_()
        net.layers[1].u[1] = F.normalize(torch.ones(HIDDEN[1]), dim=0)
    x = inputs(torch.float32)
    assert locate_nonfinite(net, "q", 1, x[1], "replay.obs") == (
        "nonfinite_loss",
        "q.1.spectral_norm",
        "W/sigma is non-finite: sigma = 0",
    )
    assert locate_nonfinite(net, "q", 0, x[0], "replay.obs") is None
