"""Convolutional torsos (rlexp/nn/conv.py) against torch.nn written here: P separate Conv2d/Linear stacks,
BatchNorm2d per member, LayerNorm over [C, H, W], weight norm per filter; member isolation for every
normalization; written backwards bit for bit; dormant channels and ReDo per channel; divergence located
at a convolution."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from torch import nn

from rlexp.config.schema import (
    ActivationConfig,
    BatchNormConfig,
    CNNConfig,
    DefaultInitConfig,
    InterventionConfig,
    LayerNormConfig,
    NatureCNNConfig,
    NormalizationConfig,
    WeightNormConfig,
)
from rlexp.diagnostics.instruments import activation_stats, hidden_outputs
from rlexp.diagnostics.interventions import dormant_units
from rlexp.nn.conv import PopCNN

P, B = 3, 5
MINATAR = gym.spaces.Box(0, 1, (4, 10, 10), dtype=bool)


def make(normalization="none", activation="relu", network=None, space=MINATAR, members=P) -> PopCNN:
    norm = {"batch": BatchNormConfig, "layer": LayerNormConfig, "weight": WeightNormConfig}.get(
        normalization, NormalizationConfig
    )(name=normalization)
    net = PopCNN(
        members,
        int(torch.tensor(space.shape).prod()),
        6,
        network or CNNConfig(name="cnn"),
        ActivationConfig(name=activation),
        norm,
        DefaultInitConfig(name="default"),
        [torch.Generator().manual_seed(10 + k) for k in range(members)],
        observation_space=space,
    )
    return net.double()


def twin(net: PopCNN, member: int, shape: tuple[int, int, int], norm: str = "none") -> nn.Sequential:
    """Member ``member`` of ``net`` as torch.nn: Conv2d (weights [out, C, k, k] from the patch rows),
    per-layer norm, ReLU, ..., Flatten in channels-last order, Linear, ReLU, Linear."""
    modules: list[nn.Module] = []
    channels = shape[0]
    convs = [layer for layer in net.layers if hasattr(layer, "geometry")]
    for layer in convs:
        g = layer.geometry
        conv = nn.Conv2d(channels, layer.weight.shape[1], g.kernel, g.stride).double()
        w = layer.effective_weight()[member].detach()  # [out, k*k*C], patch order row, column, channel
        conv.weight.data = w.view(-1, g.kernel, g.kernel, channels).permute(0, 3, 1, 2).contiguous()
        conv.bias.data = layer.bias[member].detach().clone()
        modules.append(conv)
        if norm == "batch":
            bn = nn.BatchNorm2d(conv.out_channels, eps=1e-5).double()
            modules.append(bn)
        elif norm == "layer":
            ln = nn.LayerNorm([conv.out_channels, g.out_height, g.out_width]).double()
            modules.append(ln)
        modules.append(nn.ReLU())
        channels = conv.out_channels
    modules.append(nn.Flatten(2))  # [N, C, H*W]
    modules.append(Transpose())  # channels-last flatten, as the population's maps
    for j, layer in enumerate(net.layers[len(convs) :]):
        linear = nn.Linear(layer.weight.shape[2], layer.weight.shape[1]).double()
        linear.weight.data = layer.weight[member].detach().clone()
        linear.bias.data = layer.bias[member].detach().clone()
        modules.append(linear)
        if j < len(net.layers) - len(convs) - 1:
            modules.append(nn.ReLU())
    return nn.Sequential(*modules)


class Transpose(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).flatten(1)


@pytest.mark.parametrize("layout", ["cnn", "nature_cnn"])
def test_population_equals_separate_conv2d(layout):
    """Each member's Q-values are those of its own torch.nn.Conv2d/Linear stack: the same greedy
    action, values equal up to the summation order of the two matmul kernels."""
    if layout == "cnn":
        space, network, members = MINATAR, CNNConfig(name="cnn"), P
    else:
        space, network, members = gym.spaces.Box(0, 255, (4, 84, 84), dtype="uint8"), NatureCNNConfig(name="n"), 2
    net = make(network=network, space=space, members=members)
    x = torch.randint(0, 2 if layout == "cnn" else 256, (members, B, *space.shape)).double()
    out = net(x.flatten(2))  # [P, B, 6]
    scale = 1.0 if layout == "cnn" else 1 / 255
    for k in range(members):
        ref = twin(net, k, space.shape)(x[k] * scale)
        torch.testing.assert_close(out[k], ref, rtol=1e-9, atol=1e-9)
        assert torch.equal(out[k].argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_conv_norms_as_torch(norm):
    """The convolution's block, per member: batch norm takes channel statistics over the batch and the
    positions (BatchNorm2d), layer norm normalizes each sample's [C, H, W] (LayerNorm)."""
    net = make(norm)
    net.train()
    x = torch.rand(P, B, 400, dtype=torch.float64)
    block = hidden_outputs(net, x)[1][0]  # [P, B, 64, 16]
    for k in range(P):
        ref = twin(net, k, MINATAR.shape, norm)[:3].train()(x[k].view(B, 4, 10, 10))  # conv, norm, relu
        torch.testing.assert_close(block[k], ref.flatten(2).transpose(1, 2), rtol=1e-9, atol=1e-9)


def test_init_fan_in_and_weight_norm_per_filter():
    """default init: |w| <= 1/sqrt(in_channels * kh * kw); weight norm: each filter's effective norm is
    g ||v|| / sqrt(||v||^2 + eps), per filter."""
    net = make()
    assert net.layers[0].weight.shape == (P, 16, 4 * 3 * 3)
    assert net.layers[0].weight.abs().max() <= 1 / 6
    wn = make("weight")
    layer = wn.layers[0]
    v = layer.weight.detach().norm(dim=-1)  # [P, 16], one per filter
    expected = layer.g.detach() * v / torch.sqrt(v.square() + layer.eps)
    torch.testing.assert_close(layer.effective_weight().norm(dim=-1), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("norm", ["none", "batch", "layer", "rms", "weight", "spectral"])
def test_members_never_mix(norm):
    """Perturbing member 1's parameters and inputs leaves the others' outputs and gradients bitwise unchanged."""
    x = torch.rand(P, B, 400, dtype=torch.float64)
    results = []
    for perturb in (False, True):
        net = make(norm)
        net.train()
        xs = x.clone()
        if perturb:
            with torch.no_grad():
                for p in net.parameters():
                    p[1] += 0.3
            xs[1] += 1.0
        out = net(xs)
        out.square().sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in net.parameters()]))
    (a, ga), (b, gb) = results
    for k in (0, 2):
        assert torch.equal(a[k], b[k])
        assert all(torch.equal(g1[k], g2[k]) for g1, g2 in zip(ga, gb))
    assert not torch.equal(a[1], b[1])


TWO_CONVS = CNNConfig(name="cnn", conv=[[8, 3, 1], [6, 3, 2]], hidden=[12])  # 10x10 -> 8x8 -> 3x3


@pytest.mark.parametrize("members", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize(
    "norm,activation,network,space",
    [
        ("none", "relu", None, MINATAR),
        ("none", "tanh", TWO_CONVS, gym.spaces.Box(0, 255, (3, 10, 10), dtype="uint8")),
        ("weight", "relu", TWO_CONVS, MINATAR),
        ("layer", "elu", TWO_CONVS, MINATAR),
    ],
    ids=["cnn", "two_convs_frames", "weight_norm", "layer_norm"],
)
def test_written_backward_is_autograd_bit_for_bit(members, dtype, norm, activation, network, space):
    """forward_saved + backward_to_grads against autograd on the same network: outputs and every
    parameter's gradient bitwise equal (convolutions after the first get their input's gradient too)."""
    net = make(norm, activation, network, space, members).to(dtype)
    assert net.written_backward
    with torch.no_grad():  # biases of both signs, so every activation's derivative is exercised
        for p in net.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=dtype))
    g = torch.Generator().manual_seed(3)
    high = 255 if space.dtype == "uint8" else 1
    x = torch.randint(0, high + 1, (members, 32, space.shape[0] * 100), generator=g).to(dtype)
    grad_out = torch.randn(members, 32, 6, generator=g, dtype=dtype)
    expected = net(x)
    expected.backward(grad_out)
    autograd = [p.grad.clone() for p in net.parameters()]
    for p in net.parameters():  # stale values must be overwritten, not added to
        p.grad.fill_(123.0)
    out, saved = net.forward_saved(x)
    assert not out.requires_grad and torch.equal(out, expected.detach())
    net.backward_to_grads(saved, grad_out)
    for (name, p), e in zip(net.named_parameters(), autograd):
        assert torch.equal(p.grad, e), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("norm,activation", [("spectral", "relu"), ("batch", "relu"), ("none", "crelu")])
def test_autograd_where_no_written_backward(norm, activation):
    """Spectral norm, batch norm over channels and crelu on maps have no written backward: autograd trains."""
    assert not make(norm, activation).written_backward


def test_dormant_channels_and_redo_per_channel():
    """A channel whose bias keeps it at 0 is dormant (scored over batch and positions); redo gives it fresh
    incoming weights and zeroes its columns in the next layer (every position's)."""
    from rlexp.config.schema import AdamConfig, ClippingConfig, RegularizationConfig
    from rlexp.diagnostics.interventions import Interventions, Subject
    from rlexp.optim.pipeline import GradientPipeline, Health

    net = make()
    with torch.no_grad():
        net.layers[0].bias[2, 5] = -100.0
    x = torch.rand(P, 32, 400, dtype=torch.float64)
    hidden = hidden_outputs(net, x)[1]
    assert hidden[0].shape == (P, 32, 64, 16)  # [P, B, positions, channels]
    stats = activation_stats(hidden, "q", 0.025, 0.01)
    assert stats["dormant/q.0"][2] >= 1 / 16 and stats["dead/q.0"][2] >= 1 / 16
    health = Health(P, torch.device("cpu"))
    params = list(net.parameters())
    pipeline = GradientPipeline(
        params, AdamConfig(name="adam"), ClippingConfig(name="none"), RegularizationConfig(), [], health
    )
    redo = InterventionConfig(name="redo", every=1)
    dormant = dormant_units(net, x, None, redo.tau)
    assert dormant[0][2, 5]
    kept = ~dormant[1][2]  # rows of the next layer that redo leaves (its own dormant units get fresh rows)
    interventions = Interventions(redo, [Subject("q", net, pipeline)], [0, 1, 2], health)
    interventions(1, x)
    following = net.layers[1].weight.detach()  # [P, 128, 64 * 16], channel c at columns c, c + 16, ...
    columns = following[2, kept][:, 5::16]
    assert torch.equal(columns, torch.zeros_like(columns))
    assert net.layers[0].bias[2, 5] != -100.0


def test_divergence_location_names_the_convolution():
    """A member whose convolution overflows is located at that layer's linear output (q.0.linear)."""
    from rlexp.diagnostics.instruments import locate_nonfinite

    net = make().float()
    with torch.no_grad():
        net.layers[0].weight[1] = 1e38  # 36 inputs of 1 per patch: the sum overflows float32
    x = torch.ones(B, 400)
    assert locate_nonfinite(net, "q", 0, x, "replay.obs") is None
    cause, where, _ = locate_nonfinite(net, "q", 1, x, "replay.obs")
    assert (cause, where) == ("nonfinite_loss", "q.0.linear")
