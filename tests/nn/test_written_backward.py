"""Written backwards (``backward_to_grads``) bit for bit against autograd: every activation that declares
one, each normalization, f32 and f64, one member and three; and declared only where exact."""

from __future__ import annotations

import pytest
import torch

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra)
from rlexp.config.schema import (
    ActivationConfig,
    BatchNormConfig,
    GainInitConfig,
    LayerNormConfig,
    NetworkConfig,
    NormalizationConfig,
    WeightNormConfig,
)
from rlexp.nn.activations import ACTIVATIONS
from rlexp.nn.nets import PopMLP, PopWeightNormLinear

pytestmark = pytest.mark.compat  # bit for bit autograd's: the smoke subset run on the oldest and newest torch

torch.set_num_threads(1)


OBS, ACT = 3, 4


# ---------------------------------------------------------------- gradients without autograd
# every activation with a written derivative, from the registry; non-default parameters where it has some
_PARAMETERS = {"elu": {"alpha": 0.7}, "leaky_relu": {"negative_slope": 0.2}}
WRITTEN_ACTIVATIONS = {
    name: entry.schema(name=name, **_PARAMETERS.get(name, {}))
    for name, entry in ACTIVATIONS.items()
    if entry.backward is not None
}


def written_net(
    members: int, activation: ActivationConfig, dtype: torch.dtype = torch.float32, norm: str = "none", **network
) -> PopMLP:
    """A PopMLP with biases, norm affines and weight-norm gains randomized (so every pre-activation
    has both signs)."""
    gens = [torch.Generator().manual_seed(50 + k) for k in range(members)]
    normalization = {
        "none": NormalizationConfig(name="none"),
        "layer": LayerNormConfig(name="layer"),
        "batch": BatchNormConfig(name="batch"),
        "weight": WeightNormConfig(name="weight", g_init=0.8),
        "weight_hidden": WeightNormConfig(name="weight", g_init=0.8, output_layer=False),
    }[norm]
    net = PopMLP(
        members,
        OBS,
        ACT,
        NetworkConfig(name="mlp", hidden=[16, 12], **network),
        activation,
        normalization,
        GainInitConfig(name="he"),
        gens,
    ).to(dtype)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for layer in net.layers:
            layer.bias.copy_(0.5 * torch.randn(layer.bias.shape, generator=g))
            if isinstance(layer, PopWeightNormLinear):  # gains of both signs, away from g_init
                layer.g.add_(torch.randn(layer.g.shape, generator=g))
        for norm_layer in net.norms if norm in ("layer", "batch") else []:
            norm_layer.weight.add_(0.3 * torch.randn(norm_layer.weight.shape, generator=g))
            norm_layer.bias.add_(0.3 * torch.randn(norm_layer.bias.shape, generator=g))
    return net


@pytest.mark.parametrize("name", list(WRITTEN_ACTIVATIONS))
@pytest.mark.parametrize("members", [1, 3])
@pytest.mark.parametrize(
    "network",
    [{}, {"output_scale": 0.3}, {"linear_last_hidden": True}],
    ids=["plain", "output_scale", "linear_last_hidden"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("norm", ["none", "layer", "batch", "weight", "weight_hidden"])
def test_backward_to_grads_equals_autograd_bit_for_bit(name, members, network, dtype, norm):
    """Outputs, gradients and (batch norm, training mode) the running statistics: a network through
    autograd against its twin through forward_saved and backward_to_grads."""
    net, twin = (written_net(members, WRITTEN_ACTIVATIONS[name], dtype, norm, **network) for _ in range(2))
    assert twin.written_backward
    g = torch.Generator().manual_seed(4)
    x = torch.randn(members, 64, OBS, generator=g, dtype=dtype)
    grad_out = torch.randn(members, 64, ACT, generator=g, dtype=dtype)
    expected_out = net(x)
    expected_out.backward(grad_out)
    for p in twin.parameters():  # stale values must be overwritten, not added to
        p.grad = torch.full_like(p, 123.0)
    out, saved = twin.forward_saved(x)
    assert not out.requires_grad
    assert torch.equal(out, expected_out.detach())
    twin.backward_to_grads(saved, grad_out)
    for (pname, p), e in zip(twin.named_parameters(), net.parameters()):
        assert torch.equal(p.grad, e.grad), pname
        assert p.grad.abs().sum() > 0, pname
    for (bname, b), e in zip(twin.named_buffers(), net.buffers()):
        assert torch.equal(b, e), bname
    if norm == "batch":
        assert not torch.equal(twin.norms[0].running_mean, torch.zeros_like(twin.norms[0].running_mean))


def test_written_backward_only_where_it_is_exact():
    """Residual connections and a second input keep autograd."""
    relu = ActivationConfig(name="relu")
    gens = [torch.Generator().manual_seed(k) for k in range(2)]

    def pop(activation=relu, norm=NormalizationConfig(name="none"), extra_in=0, **network):
        return PopMLP(
            2,
            OBS,
            ACT,
            NetworkConfig(name="mlp", hidden=[8, 8], **network),
            activation,
            norm,
            GainInitConfig(name="he"),
            gens,
            extra_in=extra_in,
        )

    assert pop().written_backward
    assert pop(activation=ActivationConfig(name="softsign")).written_backward
    assert pop(norm=LayerNormConfig(name="layer")).written_backward
    assert pop(norm=BatchNormConfig(name="batch")).written_backward
    assert pop(norm=WeightNormConfig(name="weight")).written_backward
    assert pop(norm=WeightNormConfig(name="weight", output_layer=False)).written_backward
    assert not pop(residual=True).written_backward
    assert not pop(extra_in=1).written_backward
