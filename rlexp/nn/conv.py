"""Convolutional torsos: population convolutions before ``PopMLP``'s head (``network=cnn``, ``nature_cnn``).

A convolution is a population linear layer whose rows are kernels: the kernel of output channel o is
row o of the layer's weight [P, out, kernel * kernel * in] (patch order: row, column,
channel), so everything that treats a linear layer treats a convolution the same way — init draws
each member's [out, k*k*in] matrix (fan-in in_channels * kh * kw, as torch.nn.Conv2d's), weight norm
normalizes each filter, spectral norm divides by the largest singular value of the [out, k*k*in]
matrix (torch's spectral_norm on a convolution), redo recycles an output channel's row, its bias and
its columns in the next layer, and the optimizer sees the parameters in the flat buffer as any other.

Feature maps run channels-last, flat: [P, B, H * W * C] (the observation's [C, H, W] is read once by
the first convolution), so member k's maps are rows k of every tensor. A layer runs as one grouped
``F.conv2d`` with groups = P over the [B, P * C, H, W] view: group k holds member k's input channels
and filters alone, so nothing mixes members (tested bitwise); on a CPU it is faster than unfolding
every patch for a batched matmul. Per convolution, a norm over the batch
(``normalization=batch``) takes channel statistics over the batch and the positions (BatchNorm2d's),
the others (layer, rms) normalize each sample's whole map (LayerNorm over [C, H, W]); the activation
is elementwise (crelu doubles the channels). Observers see a convolution's hidden output as
[P, B, H * W, C]: the instruments' dormant units are channels (score over the batch and the
positions, Sokar et al. 2023's convention), the feature ranks those of the flattened maps
[P, B, H * W * C].

Plain and weight-normalized convolutions have a written backward (``convolve_backward``: autograd's
view backwards and ATen's ``convolution_backward``, bit for bit), as do elementwise activations on
maps, so MinAtar's network trains without autograd; spectral norm, batch norm over channels and crelu
on maps have none, and no convolution has a numpy form: such a network trains through autograd and
acts through torch (``PopMLP`` falls back by itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from rlexp.config.schema import ActivationConfig, ConfigError, NetworkConfig, NormalizationConfig
from rlexp.nn import capabilities
from rlexp.nn.activations import ACTIVATIONS, Activation, PopActivation
from rlexp.nn.component import Component, ensure_grads
from rlexp.nn.nets import (
    NORMALIZATIONS,
    PopBatchNorm,
    PopLinear,
    PopMLP,
    PopSpectralNormLinear,
    PopWeightNormLinear,
)


@dataclass(frozen=True)
class Geometry:
    """A convolution's input map and kernel: height x width x channels, square kernel, stride, no padding."""

    height: int
    width: int
    channels: int
    kernel: int
    stride: int
    channels_first: bool = False  # the input is the observation [C, H, W], not a previous layer's [H, W, C]
    scale: float = 1.0  # the input is multiplied by it (1/255 for 0-255 frames)

    @property
    def out_height(self) -> int:
        return (self.height - self.kernel) // self.stride + 1

    @property
    def out_width(self) -> int:
        return (self.width - self.kernel) // self.stride + 1

    @property
    def patch(self) -> int:
        """Values per patch: kernel * kernel * channels (the fan-in)."""
        return self.kernel * self.kernel * self.channels


def _maps(x: torch.Tensor, g: Geometry) -> torch.Tensor:
    """The members' input maps x [P, B, H * W * C] (channels-first: [P, B, C * H * W]) as the grouped
    convolution's input [B, P * C, H, W]."""
    members, batch = x.shape[:2]
    if g.channels_first:
        maps = x.view(members, batch, g.channels, g.height, g.width)
    else:
        maps = x.view(members, batch, g.height, g.width, g.channels).permute(0, 1, 4, 2, 3)
    return maps.transpose(0, 1).reshape(batch, members * g.channels, g.height, g.width)


def _kernels(weight: torch.Tensor, g: Geometry) -> torch.Tensor:
    """The members' kernels weight [P, out, k * k * C] as the grouped convolution's [P * out, C, k, k]."""
    members, out = weight.shape[:2]
    return weight.reshape(members * out, g.kernel, g.kernel, g.channels).permute(0, 3, 1, 2)


def _members_out(y: torch.Tensor, members: int, g: Geometry) -> torch.Tensor:
    """The grouped convolution's output y [B, P * out, Ho, Wo] as maps [P, B, Ho * Wo * out], channels-last."""
    batch = y.shape[0]
    y = y.view(batch, members, -1, g.out_height, g.out_width).permute(1, 0, 3, 4, 2)  # [P, B, Ho, Wo, out]
    return y.reshape(members, batch, -1)


def convolve(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, g: Geometry) -> torch.Tensor:
    """Each member's convolution: maps x [P, B, H * W * C] (or [P, B, C * H * W] channels-first), kernels
    weight [P, out, k * k * C] (a patch's values in the order row, column, channel), bias [P, out] ->
    [P, B, Ho * Wo * out], channels-last."""
    members = x.shape[0]
    y = F.conv2d(_maps(x, g), _kernels(weight, g), bias.reshape(-1), stride=g.stride, groups=members)
    return _members_out(y, members, g)  # [B, P * out, Ho, Wo] -> [P, B, Ho * Wo * out]


def convolve_backward(
    saved: tuple, grad: torch.Tensor, g: Geometry, input_grad: bool
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The gradients autograd gives through ``convolve`` for ``saved`` = (x, maps, kernels, bias) and the
    gradient ``grad`` [P, B, Ho * Wo * out] wrt its output: (wrt x or None, wrt weight [P, out, k * k * C],
    wrt bias [P, out]). Each view's backward is autograd's (``reshape`` to the view's input sizes, the
    inverse ``permute``) and the convolution's is ATen's ``convolution_backward`` with autograd's arguments,
    so the values are bit for bit ``backward``'s."""
    x, maps, kernels, bias = saved
    members, batch = x.shape[:2]
    out = kernels.shape[0] // members
    grad = grad.reshape(members, batch, g.out_height, g.out_width, out).permute(1, 0, 4, 2, 3)
    grad = grad.reshape(batch, members * out, g.out_height, g.out_width)  # [B, P * out, Ho, Wo]
    grad_maps, grad_kernels, grad_bias = torch.ops.aten.convolution_backward(
        grad,
        maps,
        kernels,
        [bias.numel()],
        [g.stride, g.stride],
        [0, 0],
        [1, 1],
        False,
        [0, 0],
        members,
        [input_grad, True, True],
    )
    grad_weight = grad_kernels.permute(0, 2, 3, 1).reshape(members, out, -1)  # [P, out, k * k * C]
    grad_x = None
    if input_grad:
        grad_x = grad_maps.reshape(batch, members, g.channels, g.height, g.width).transpose(0, 1)
        if not g.channels_first:
            grad_x = grad_x.permute(0, 1, 3, 4, 2)  # [P, B, H, W, C]
        grad_x = grad_x.reshape(x.shape)
    return grad_x, grad_weight, grad_bias.view(members, out)


class _Convolution:
    """Mixin making a population linear layer (plain, weight-normalized or spectral) a convolution with
    its effective weight as the members' kernels: [P, B, H * W * C] -> [P, B, Ho * Wo * out]. Its written
    backward (``convolve_backward``, then the linear layer's ``_weight_grads`` from the gradient wrt the
    effective weight) is autograd's bit for bit; the layer kind declares whether it has one."""

    geometry: Geometry

    @property
    def written_backward(self) -> bool:
        """The layer kind's, when ATen's convolution backward kernel is there (``convolve_backward``)."""
        return super().written_backward and capabilities.has_aten("convolution_backward")  # type: ignore[misc]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.geometry.scale != 1.0:
            x = x * self.geometry.scale
        return convolve(x, self.effective_weight(), self.bias, self.geometry)  # type: ignore[attr-defined]

    def forward_saved(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """``forward`` without autograd, and what ``backward_to_grads`` needs."""
        g = self.geometry
        if g.scale != 1.0:
            x = x * g.scale
        weights = self._weights_saved()  # (None, the effective weight, ...): the linear layer's record
        maps, kernels, bias = _maps(x, g), _kernels(weights[1], g), self.bias.reshape(-1)  # type: ignore[attr-defined]
        y = F.conv2d(maps, kernels, bias, stride=g.stride, groups=x.shape[0])
        return _members_out(y, x.shape[0], g), ((x, maps, kernels, bias), weights)

    def _weights_saved(self) -> tuple:
        """What the linear layer's ``_weight_grads`` reads, in its ``forward_saved`` record's order."""
        raise NotImplementedError(f"{type(self).__name__} has no written backward")

    def backward_to_grads(self, saved: tuple, grad: torch.Tensor, input_grad: bool = True) -> torch.Tensor | None:
        """Writes the parameters' gradients for ``grad`` [P, B, Ho * Wo * out] wrt the output and returns
        the one wrt the input (None without ``input_grad``), as autograd does."""
        conv, weights = saved
        grad_x, grad_weight, grad_bias = convolve_backward(conv, grad, self.geometry, input_grad)
        ensure_grads(self.weight, self.bias)  # type: ignore[attr-defined]
        self.bias.grad.copy_(grad_bias)  # type: ignore[attr-defined]
        self._weight_grads(weights, grad_weight)  # type: ignore[attr-defined]
        return grad_x

    def fast_forward(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return self.forward

    def host_forward(self) -> None:
        return None


class PopConv(_Convolution, PopLinear):
    """A population convolution (weight [P, out, k*k*in], bias [P, out])."""

    def _weights_saved(self) -> tuple:
        return None, self.weight


class PopWeightNormConv(_Convolution, PopWeightNormLinear):
    """A weight-normalized population convolution: each filter w_o = g_o v_o / ||v_o||."""

    def _weights_saved(self) -> tuple:
        return None, *self._scaled()


class PopSpectralNormConv(_Convolution, PopSpectralNormLinear):
    """A spectrally normalized population convolution: W / sigma([out, k*k*in])."""


CONVOLUTIONS: dict[type, type] = {
    PopLinear: PopConv,
    PopWeightNormLinear: PopWeightNormConv,
    PopSpectralNormLinear: PopSpectralNormConv,
}


def conv_layer(normalization: NormalizationConfig, members: int, g: Geometry, out_channels: int) -> PopLinear:
    """The normalization's linear layer over a patch (a hidden layer's), as a convolution."""
    layer = NORMALIZATIONS[normalization.name].linear(normalization, members, g.patch, out_channels, False)
    layer.__class__ = CONVOLUTIONS[type(layer)]  # the same parameters and buffers, applied to every patch
    layer.geometry = g
    return layer


class PopBatchNorm2d(PopBatchNorm):
    """BatchNorm over each member's batch and positions, per channel: torch.nn.BatchNorm2d per member
    on maps [P, B, H * W * C] (the [P, B * H * W, C] view through ``PopBatchNorm``)."""

    written_backward = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        members, batch = x.shape[:2]
        return super().forward(x.reshape(members, -1, self.weight.shape[1])).reshape(members, batch, -1)

    def host_forward(self) -> None:
        return None


class ChannelActivation(PopActivation):
    """An activation on maps [P, B, H * W * C]: elementwise; crelu concatenates per position, doubling
    the channels."""

    def __init__(self, entry: Activation, cfg: ActivationConfig, channels: int) -> None:
        super().__init__(entry, cfg)
        self.written_backward = self.written_backward and self.width == 1  # elementwise: PopActivation's
        self.channels = channels

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.width == 1:
            return self.function(h)
        members, batch = h.shape[:2]
        return self.function(h.reshape(members, -1, self.channels)).reshape(members, batch, -1)

    def fast_forward(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return self.forward

    def host_forward(self) -> None:
        return None


def image_shape(observation_space: object) -> tuple[int, int, int] | None:
    """(C, H, W) of an image observation space (3 dimensions), else None."""
    shape = tuple(getattr(observation_space, "shape", None) or ())
    return shape if len(shape) == 3 else None  # type: ignore[return-value]


def check_conv(network: NetworkConfig, shape: tuple[int, ...], env_id: str) -> None:
    """Refuse layers that are not [channels, kernel, stride] of positive integers, and kernels larger than
    their input map (ConfigError at network.conv); ``shape`` is the observation's (C, H, W)."""
    if not network.conv:
        raise ConfigError("network.conv", "[] has no convolution", "give at least one [channels, kernel, stride]")
    height, width = shape[1], shape[2]
    for i, spec in enumerate(network.conv):
        if len(spec) != 3 or min(spec) < 1:
            raise ConfigError(f"network.conv[{i}]", f"{list(spec)} is not a layer", "write [channels, kernel, stride]")
        _, kernel, stride = spec
        if kernel > min(height, width):
            raise ConfigError(
                f"network.conv[{i}]",
                f"a {kernel}x{kernel} kernel does not fit the {height}x{width} map it gets from {env_id}",
                "use network=cnn for MinAtar's 10x10 maps, network=nature_cnn for 84x84 frames, or smaller kernels",
            )
        height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1


class PopCNN(PopMLP):
    """Convolutions (``network.conv``) over image observations [P, B, C * H * W] (the environment's
    [C, H, W], flat), then ``PopMLP``'s head: network.hidden, the output layer. Each convolution is a
    block of its own: conv (the normalization's linear kind) -> norm (per channel for batch norm, per
    sample's map otherwise) -> activation. Layer indices count the convolutions first (``q.0`` is the
    first convolution). Inputs with a largest value above 1 (0-255 frames) are divided by it."""

    def _torso(
        self,
        members: int,
        n_in: int,
        network: NetworkConfig,
        activation: ActivationConfig,
        normalization: NormalizationConfig,
        observation_space: object,
    ) -> int:
        shape = image_shape(observation_space)
        if shape is None:
            raise ValueError(f"PopCNN needs an image observation space [C, H, W], got {observation_space}")
        channels, height, width = shape
        high = float(np.max(getattr(observation_space, "high", 1.0)))
        entry, activation_entry = NORMALIZATIONS[normalization.name], ACTIVATIONS[activation.name]
        self._maps: list[tuple[int, int]] = []  # per convolution: (positions, channels) of its hidden output
        for i, (out_channels, kernel, stride) in enumerate(network.conv):
            first = i == 0
            g = Geometry(height, width, channels, kernel, stride, first, 1.0 / high if first and high > 1 else 1.0)
            layer = conv_layer(normalization, members, g, out_channels)
            self.layers.append(layer)
            components: list[Component] = [layer]
            height, width = g.out_height, g.out_width
            if entry.norm is not None:
                if entry.min_batch > 1:  # statistics over the batch: per channel
                    norm = PopBatchNorm2d(members, out_channels, normalization.eps, normalization.momentum)
                else:  # over each sample's whole map
                    norm = entry.norm(normalization, members, height * width * out_channels)
                self.norms.append(norm)
                components.append(norm)
            self.activations.append(ChannelActivation(activation_entry, activation, out_channels))
            components.append(self.activations[-1])
            channels = out_channels * activation_entry.width
            self.activated.append(True)
            self.residual.append(False)
            self._blocks.append((components, False))
            self._maps.append((height * width, channels))
        return height * width * channels

    def _hidden_view(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        if layer < len(self._maps):
            return h.view(*h.shape[:2], *self._maps[layer])  # [P, B, positions, channels]
        return h
