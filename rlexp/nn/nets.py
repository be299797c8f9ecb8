"""Population networks: every parameter carries a leading member dimension P.

A network is made of components (``rlexp.nn.component``): population linear layers (plain,
weight-normalized, spectrally normalized) holding weight [P, out, in] and bias [P, out] and running
one batched matmul over inputs [P, B, in], norms (layer, batch, RMS) that normalize per member and
sample or over each member's own batch, and activations (``rlexp.nn.activations``). Nothing reduces
across members, so member k's outputs and gradients depend on member k's parameters and inputs alone.

The ``normalization`` registry says how a normalization changes a hidden block: a norm component
after its linear layer, and/or another linear layer. ``PopMLP`` composes the blocks and runs them
in one loop.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlexp.config.schema import (
    ActivationConfig,
    BatchNormConfig,
    InitConfig,
    LayerNormConfig,
    NetworkConfig,
    NormalizationConfig,
    WeightNormConfig,
    require,
    require_choice,
)
from rlexp.nn import capabilities
from rlexp.nn.activations import ACTIVATIONS, PopActivation
from rlexp.nn.component import Component, HostForward, ParameterStorage, PopNetwork, ensure_grads, numpy_view
from rlexp.nn.init import init_linear, scheme_gain

log = logging.getLogger(__name__)

# observe(layer index, stage, value [P, B, H]): stage "input" (a layer's input, after a second input
# joined it), a component's stage ("linear", "norm", "activation"), "hidden" (a hidden layer's
# output, after the residual; a convolution's as [P, B, positions, channels]) or "output" (the
# network's output, after output_scale)
Observer = Callable[[int, str, torch.Tensor], None]


# ---------------------------------------------------------------- linear layers
TRANSPOSED_COPY_MIN = 16_384  # elements per member's matrix from which one 2-D copy per member is faster


def copy_matrices(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` for [P, rows, cols] matrices: a large transposed ``src`` (a weight's gradient
    from a batched matmul) goes member by member, where torch copies a 2-D transpose in blocks, about
    twice as fast as one strided 3-D copy (a copy: the same values either way)."""
    if src.dim() == 3 and src.stride(1) == 1 and src.shape[1] * src.shape[2] >= TRANSPOSED_COPY_MIN:
        for d, s in zip(dst, src):
            d.copy_(s)
    else:
        dst.copy_(src)


@functools.cache
def transposed_out_exact(batch: int, size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """``torch.bmm(x.mT, grad, out=dst.mT)`` gives the bits of ``torch.bmm(x.mT, grad)`` for x [P, B, in],
    grad [P, B, out] and dst [P, out, in] of ``size`` and ``stride``, tried once per shape and layout on
    random values: where BLAS runs the product with the output transposed in the same order (a large
    layer), a weight's gradient is written in place (``write_weight_grads``); where it does not, it is not."""
    members, n_out, n_in = size
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(members, batch, n_in, generator=generator)
    grad = torch.randn(members, batch, n_out, generator=generator)
    dst = torch.empty_strided(size, stride)
    torch.bmm(x.mT, grad, out=dst.mT)
    return torch.equal(dst.mT, torch.bmm(x.mT, grad))


def write_weight_grads(dst: torch.Tensor, x: torch.Tensor, grad: torch.Tensor) -> None:
    """dst [P, out, in] = (x^T grad)^T for x [P, B, in] and grad [P, B, out], autograd's bits for a linear
    layer's weight (``member_bmm(x.mT, grad)`` seen transposed): written in place where that gives the
    same bits (``transposed_out_exact``), else computed and copied (``copy_matrices``)."""
    n_out, n_in = dst.shape[1:]
    large = n_out > 1 and n_in * n_out >= TRANSPOSED_COPY_MIN and x.dtype == torch.float32 and x.device.type == "cpu"
    if large and transposed_out_exact(x.shape[1], tuple(dst.shape), dst.stride()):
        torch.bmm(x.mT, grad, out=dst.mT)
    else:
        copy_matrices(dst, member_bmm(x.mT, grad).mT)


def member_baddbmm(bias: torch.Tensor, x: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """``torch.baddbmm(bias, x, weight_t)``: [P, 1, out] + [P, B, in] @ [P, in, out], computed by a
    population of one as by a member of any larger one (``member_bmm``), its backward too."""
    if x.shape[0] == 1 and 1 in (x.shape[2], weight_t.shape[2]):
        return _as_two_members(torch.baddbmm, bias, x, weight_t)
    return torch.baddbmm(bias, x, weight_t)


def member_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.bmm(a, b)``, [P, m, k] @ [P, k, n]. A population of one whose product is a matrix times a
    vector (a value head's one column, a backward over one sample's row, a layer of one input) runs as
    two views of its member: torch runs a single matrix's product by a vector with another kernel than a
    batch's, whose sums may round differently, and a member must compute alone what it computes in any
    population."""
    if a.shape[0] == 1 and 1 in (a.shape[1], a.shape[2], b.shape[2]):
        return _as_two_members(torch.bmm, a, b)
    return torch.bmm(a, b)


def member_sum(terms: Iterable[torch.Tensor]) -> torch.Tensor:
    """The elementwise sum of ``terms`` (each [P, ...]), added one after another. ``torch.stack(terms)
    .sum(0)`` reduces a dim that lies before the member dim, with kernels whose order of additions
    depends on the member count and the CPU's vector width: a member would round differently in
    populations of different sizes. Mean: ``member_sum(terms) / len(terms)``."""
    return functools.reduce(torch.add, terms)


def _as_two_members(op: Callable[..., torch.Tensor], *members: torch.Tensor) -> torch.Tensor:
    """``op`` on a population of one [1, ...] run as two expanded views of it; the first member's result."""
    return op(*(t.expand(2, -1, -1) for t in members))[:1]


class PopLinear(Component):
    """y = x W^T + b for each member: x [P, B, in] -> [P, B, out]."""

    stage = "linear"
    written_backward = True

    def __init__(self, members: int, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(members, n_out, n_in))
        self.bias = nn.Parameter(torch.zeros(members, n_out))

    def reset_parameters(
        self,
        init: InitConfig | list[InitConfig],
        gain: float | list[float],
        generators: list[torch.Generator],
        last: bool,
    ) -> None:
        """Fill weight and bias with ``init`` (see init_linear; lists: one per member); ``last``: the output layer."""
        init_linear(self.weight, self.bias, init, gain, generators, last=last)

    def effective_weight(self) -> torch.Tensor:
        return self.weight  # [P, out, in]

    def weight_problem(self, member: int) -> tuple[str, str] | None:
        """(where, detail) when member's effective weight is non-finite while its parameters are
        finite; None for a plain layer, whose weight is a parameter."""
        return None

    def instruments(self) -> dict[str, torch.Tensor]:
        """Per-member statistics of the layer's reparametrization, {metric: [P]} (none here)."""
        return {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return member_baddbmm(self.bias.unsqueeze(1), x, self.effective_weight().mT)

    def forward_saved(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """``forward`` without autograd, and what ``backward_to_grads`` needs (the input, the weight used)."""
        return member_baddbmm(self.bias.unsqueeze(1), x, self.weight.mT), (x, self.weight)

    def backward_to_grads(self, saved: tuple, grad: torch.Tensor, input_grad: bool = True) -> torch.Tensor | None:
        """As autograd runs baddbmm's backward: writes the parameters' gradients for the gradient ``grad``
        [P, B, out] wrt the output and returns the one wrt the input [P, B, in] (or None)."""
        x, weight = saved[:2]
        ensure_grads(self.weight, self.bias)
        torch.sum(grad, 1, out=self.bias.grad)
        self._output_weight_grads(saved, grad)
        return member_bmm(grad, weight) if input_grad else None

    def _output_weight_grads(self, saved: tuple, grad: torch.Tensor) -> None:
        """Write the gradients that come from ``grad`` [P, B, out] wrt the output: the weight used is the
        weight, whose gradient is written in place."""
        write_weight_grads(self.weight.grad, saved[0], grad)

    def _weight_grads(self, saved: tuple, grad_weight: torch.Tensor) -> None:
        """Write the gradients that come from the one wrt the weight used, [P, out, in]."""
        copy_matrices(self.weight.grad, grad_weight)

    def fast_forward(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """``forward`` as one raw op on detached views of the parameters (no-grad acting)."""
        bias, weight_t = self.bias.detach().unsqueeze(1), self.weight.detach().mT  # [P, 1, out], [P, in, out]
        return lambda x: member_baddbmm(bias, x, weight_t)

    def host_forward(self) -> HostForward | None:
        """x [P, B, in] -> [P, B, out] in numpy on views of the parameters."""
        weight_t, bias = numpy_view(self.weight).transpose(0, 2, 1), numpy_view(self.bias)[:, None, :]

        def linear(x: np.ndarray) -> np.ndarray:
            h = np.matmul(x, weight_t)
            h += bias
            return h

        return linear


class PopWeightNormLinear(PopLinear):
    """Weight-normalized linear layer (the seed critic's denseWN), per member and output unit.

    w = g * v / sqrt(||v||^2 + eps), with ||v|| over each output unit's input weights; g starts at
    g_init. ``weight`` holds v. eps = 0 reproduces the unguarded division g / ||v||.
    """

    def __init__(self, members: int, n_in: int, n_out: int, eps: float, g_init: float) -> None:
        super().__init__(members, n_in, n_out)
        self.g = nn.Parameter(torch.full((members, n_out), float(g_init)))
        self.eps = eps

    def unit_norms(self) -> torch.Tensor:
        """sqrt(||v_i||^2 + eps) per member and output unit: [P, out]."""
        return torch.sqrt(self.weight.square().sum(-1) + self.eps)

    def _scaled(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The effective weight [P, out, in], the norms ||v|| and g / ||v|| [P, out]."""
        norms = self.unit_norms()
        scale = self.g / norms
        return self.weight * scale.unsqueeze(-1), norms, scale

    def effective_weight(self) -> torch.Tensor:
        return self._scaled()[0]

    def fast_forward(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return self.forward

    def weight_problem(self, member: int) -> tuple[str, str] | None:
        if torch.isfinite(self.effective_weight()[member]).all():
            return None
        v_norm = self.weight[member].norm(dim=-1)
        return "weight_norm", f"g/||v|| is non-finite: smallest per-unit ||v|| = {v_norm.min().item():.3g}"

    def instruments(self) -> dict[str, torch.Tensor]:
        """The smallest and largest per-unit ||v|| (g/||v|| divides by it): wn_v_min, wn_v_max [P]."""
        v_norm = self.weight.detach().norm(dim=-1)  # [P, out]
        return {"wn_v_min": v_norm.amin(1), "wn_v_max": v_norm.amax(1)}

    def forward_saved(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """``forward`` without autograd, and what ``backward_to_grads`` needs (the norms and scales too)."""
        weight, norms, scale = self._scaled()
        return member_baddbmm(self.bias.unsqueeze(1), x, weight.mT), (x, weight, norms, scale)

    def _output_weight_grads(self, saved: tuple, grad: torch.Tensor) -> None:
        self._weight_grads(saved, member_bmm(saved[0].mT, grad).mT)  # [P, in, out] seen as [P, out, in]

    def _weight_grads(self, saved: tuple, grad_weight: torch.Tensor) -> None:
        """The gradients of v and g as autograd composes them through w = v * (g / sqrt(sum(v^2) + eps)):
        each line is the backward of one op of ``_scaled``, in autograd's formula (mul, div for both
        operands, sqrt, sum, square), the two gradients of v summed."""
        _, _, norms, scale = saved
        v = self.weight
        ensure_grads(self.g)
        grad_scale = (grad_weight * v).sum(-1)  # [P, out] wrt scale = g / norms
        torch.div(grad_scale, norms, out=self.g.grad)
        grad_norms = -grad_scale * (scale / norms)  # autograd's (g / norms) / norms
        grad_squares = (grad_norms / (2 * norms)).unsqueeze(-1).expand_as(v)  # [P, out, in] wrt v^2
        torch.add(grad_weight * scale.unsqueeze(-1), grad_squares * (2.0 * v), out=v.grad)

    def host_forward(self) -> HostForward | None:
        """x (g v / ||v||)^T = (x v^T) g / ||v|| in numpy on views of the parameters."""
        weight, bias = numpy_view(self.weight), numpy_view(self.bias)[:, None, :]  # [P, out, in], [P, 1, out]
        weight_t, g, eps = weight.transpose(0, 2, 1), numpy_view(self.g), np.float32(self.eps)

        def weight_norm_linear(x: np.ndarray) -> np.ndarray:
            h = np.matmul(x, weight_t)
            h *= (g / np.sqrt(np.square(weight).sum(-1) + eps))[:, None, :]
            h += bias
            return h

        return weight_norm_linear


class PopSpectralNormLinear(PopLinear):
    """Spectrally normalized linear layer (Gogianu et al. 2021): w = W / sigma(W) per member.

    sigma = u^T W v estimates W's largest singular value by power iteration on a persistent unit
    vector u [P, out] (buffer ``u``): each training-mode forward runs ``power_iterations`` steps
    v = W^T u / ||W^T u||, u = W v / ||W v|| without gradient, then v = W^T u / ||W^T u||; the gradient
    flows through W in sigma, as torch.nn.utils.parametrizations.spectral_norm. Eval mode uses u as it
    is. The vector normalizations divide by max(||.||, 1e-12).
    """

    written_backward = False
    mode_dependent = True  # training mode runs the power iteration
    EPS = 1e-12
    INIT_ITERATIONS = 15  # power iterations once the weight is drawn (as torch's spectral_norm)

    def __init__(self, members: int, n_in: int, n_out: int, power_iterations: int) -> None:
        super().__init__(members, n_in, n_out)
        self.power_iterations = power_iterations
        self.register_buffer("u", F.normalize(torch.ones(members, n_out), dim=-1))  # [P, out]

    def reset_parameters(
        self,
        init: InitConfig | list[InitConfig],
        gain: float | list[float],
        generators: list[torch.Generator],
        last: bool,
    ) -> None:
        super().reset_parameters(init, gain, generators, last)
        self._power_iteration(self.INIT_ITERATIONS)

    @torch.no_grad()
    def _power_iteration(self, iterations: int) -> None:
        """Move u towards W's first left singular vector, in place."""
        u, weight = self.u, self.weight.detach()
        for _ in range(iterations):
            v = self._right(weight, u)
            u = F.normalize(member_bmm(weight, v.unsqueeze(-1)).squeeze(-1), dim=-1, eps=self.EPS)  # [P, out]
        self.u.copy_(u)

    def _right(self, weight: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """v = W^T u / ||W^T u||: [P, in]."""
        return F.normalize(member_bmm(u.unsqueeze(1), weight).squeeze(1), dim=-1, eps=self.EPS)

    def sigma(self) -> torch.Tensor:
        """u^T W v per member, [P], with the gradient through W."""
        u = self.u.clone()
        v = self._right(self.weight.detach(), u)
        return (u * member_bmm(self.weight, v.unsqueeze(-1)).squeeze(-1)).sum(-1)

    def effective_weight(self) -> torch.Tensor:
        if self.training:
            self._power_iteration(self.power_iterations)
        return self.weight / self.sigma()[:, None, None]  # [P, out, in]

    def weight_problem(self, member: int) -> tuple[str, str] | None:
        sigma = self.sigma()[member]
        if torch.isfinite(self.weight[member] / sigma).all():
            return None
        return "spectral_norm", f"W/sigma is non-finite: sigma = {sigma.item():.3g}"

    def instruments(self) -> dict[str, torch.Tensor]:
        """The spectral norm estimate the layer divides by: sn_sigma [P]."""
        return {"sn_sigma": self.sigma().detach()}

    def fast_forward(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return self.forward

    def host_forward(self) -> HostForward | None:
        return None  # the power iteration runs in torch


# ---------------------------------------------------------------- norms
class PopLayerNorm(Component):
    """LayerNorm over features, per member and sample, with a per-member affine: [P, B, H]."""

    stage = "norm"

    def __init__(self, members: int, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(members, width))
        self.bias = nn.Parameter(torch.zeros(members, width))
        self.eps = eps

    @property
    def written_backward(self) -> bool:
        """ATen's layer-norm kernels are there (``forward_saved``, ``backward_to_grads``)."""
        return capabilities.has_torch("native_layer_norm") and capabilities.has_aten("native_layer_norm_backward")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x, x.shape[-1:], eps=self.eps)
        return x * self.weight.unsqueeze(1) + self.bias.unsqueeze(1)

    def forward_saved(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """``forward`` without autograd (the kernel F.layer_norm runs), and what ``backward_to_grads`` needs."""
        x_hat, mean, rstd = torch.native_layer_norm(x, x.shape[-1:], None, None, self.eps)
        return x_hat * self.weight.unsqueeze(1) + self.bias.unsqueeze(1), (x, x_hat, mean, rstd)

    def backward_to_grads(self, saved: tuple, grad: torch.Tensor, input_grad: bool = True) -> torch.Tensor:
        """As autograd runs it: writes the weight's and bias's gradients (the affine's, summed over the
        batch) and returns the gradient wrt the input [P, B, H] (ATen's layer-norm backward kernel)."""
        x, x_hat, mean, rstd = saved
        ensure_grads(self.weight, self.bias)
        torch.sum(grad * x_hat, 1, out=self.weight.grad)
        torch.sum(grad, 1, out=self.bias.grad)
        return torch.ops.aten.native_layer_norm_backward(
            grad * self.weight.unsqueeze(1), x, x.shape[-1:], mean, rstd, None, None, [True, False, False]
        )[0]

    def host_forward(self) -> HostForward | None:
        """Over features, per member and sample, in numpy on views of the parameters."""
        weight, bias = numpy_view(self.weight)[:, None, :], numpy_view(self.bias)[:, None, :]
        eps = np.float32(self.eps)

        def layer_norm(h: np.ndarray) -> np.ndarray:
            h = h - h.mean(-1, keepdims=True)
            h /= np.sqrt(np.square(h).mean(-1, keepdims=True) + eps)
            h *= weight
            h += bias
            return h

        return layer_norm


class PopRMSNorm(Component):
    """RMSNorm over features, per member and sample, with a per-member scale: [P, B, H].

    y = x / sqrt(mean(x^2) + eps) * weight: torch.nn.RMSNorm for each member (F.rms_norm; a torch before 2.4,
    which has neither, the same formula in public ops).
    """

    stage = "norm"

    def __init__(self, members: int, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(members, width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if capabilities.has_functional("rms_norm"):
            x = F.rms_norm(x, x.shape[-1:], eps=self.eps)
        else:
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * self.weight.unsqueeze(1)

    def host_forward(self) -> HostForward | None:
        weight, eps = numpy_view(self.weight)[:, None, :], np.float32(self.eps)

        def rms_norm(h: np.ndarray) -> np.ndarray:
            h = h / np.sqrt(np.square(h).mean(-1, keepdims=True) + eps)
            h *= weight
            return h

        return rms_norm


class PopBatchNorm(Component):
    """BatchNorm over each member's own batch: mean/var over B of [P, B, H], per member and feature.

    Training mode normalizes with the batch statistics and updates the running ones (momentum,
    unbiased variance), eval mode normalizes with the running statistics: torch.nn.BatchNorm1d for
    each member. It runs as one F.batch_norm over the [B, P * H] view, whose P * H channels are
    exactly the members' features, so nothing is shared between members.
    """

    stage = "norm"
    uses_batch_stats = True
    mode_dependent = True

    def __init__(self, members: int, width: int, eps: float, momentum: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(members, width))
        self.bias = nn.Parameter(torch.zeros(members, width))
        self.register_buffer("running_mean", torch.zeros(members, width))
        self.register_buffer("running_var", torch.ones(members, width))
        self.eps = eps
        self.momentum = momentum

    @property
    def written_backward(self) -> bool:
        """ATen's batch-norm kernels are there (``forward_saved``, ``backward_to_grads``)."""
        return capabilities.has_torch("native_batch_norm") and capabilities.has_aten("native_batch_norm_backward")

    @staticmethod
    def _channels(x: torch.Tensor) -> torch.Tensor:
        """[P, B, H] -> the [B, P * H] view the batch-norm kernels run on (a copy)."""
        return x.transpose(0, 1).reshape(x.shape[1], -1)

    def _members(self, y: torch.Tensor) -> torch.Tensor:
        """[B, P * H] -> [P, B, H] (a view)."""
        return y.view(y.shape[0], *self.weight.shape).transpose(0, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the running statistics are updated in place through their flat views; weight and bias may
        # be strided views into a pipeline's buffer, so they are reshaped (copied when they must be)
        y = F.batch_norm(
            self._channels(x),
            self.running_mean.view(-1),
            self.running_var.view(-1),
            self.weight.reshape(-1),
            self.bias.reshape(-1),
            self.training,
            self.momentum,
            self.eps,
        )
        return self._members(y)  # [P, B, H]

    def forward_saved(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """``forward`` without autograd (the kernel F.batch_norm runs, updating the running statistics
        in training mode), and what ``backward_to_grads`` needs."""
        channels, weight = self._channels(x), self.weight.reshape(-1)
        y, mean, invstd = torch.native_batch_norm(
            channels,
            weight,
            self.bias.reshape(-1),
            self.running_mean.view(-1),
            self.running_var.view(-1),
            self.training,
            self.momentum,
            self.eps,
        )
        return self._members(y), (channels, weight, mean, invstd, self.training)

    def backward_to_grads(self, saved: tuple, grad: torch.Tensor, input_grad: bool = True) -> torch.Tensor:
        """As autograd runs it (ATen's batch-norm backward kernel on the [B, P * H] view): writes the
        weight's and bias's gradients and returns the gradient wrt the input [P, B, H]."""
        channels, weight, mean, invstd, training = saved
        grad_in, grad_weight, grad_bias = torch.ops.aten.native_batch_norm_backward(
            self._channels(grad),
            channels,
            weight,
            self.running_mean.view(-1),
            self.running_var.view(-1),
            mean,
            invstd,
            training,
            self.eps,
            [True, True, True],
        )
        ensure_grads(self.weight, self.bias)
        self.weight.grad.copy_(grad_weight.view(self.weight.shape))
        self.bias.grad.copy_(grad_bias.view(self.bias.shape))
        return self._members(grad_in)

    def host_forward(self) -> HostForward | None:
        """Eval mode only (the running statistics), in numpy on views of the parameters and buffers."""
        weight, bias = numpy_view(self.weight)[:, None, :], numpy_view(self.bias)[:, None, :]
        mean, var = numpy_view(self.running_mean)[:, None, :], numpy_view(self.running_var)[:, None, :]
        eps = np.float32(self.eps)

        def batch_norm(h: np.ndarray) -> np.ndarray:
            h = h - mean
            h /= np.sqrt(var + eps)
            h *= weight
            h += bias
            return h

        return batch_norm


# ---------------------------------------------------------------- the normalization registry
# (config, members, n_in, n_out, output layer) -> the block's linear layer
LinearFactory = Callable[[NormalizationConfig, int, int, int, bool], PopLinear]
# (config, members, width) -> the norm component after a hidden linear layer
NormFactory = Callable[[NormalizationConfig, int, int], Component]


def plain_linear(cfg: NormalizationConfig, members: int, n_in: int, n_out: int, output: bool) -> PopLinear:
    return PopLinear(members, n_in, n_out)


def _weight_norm_linear(cfg: WeightNormConfig, members: int, n_in: int, n_out: int, output: bool) -> PopLinear:
    if output and not cfg.output_layer:
        return PopLinear(members, n_in, n_out)
    return PopWeightNormLinear(members, n_in, n_out, cfg.eps, cfg.g_init)


def _spectral_linear(cfg: NormalizationConfig, members: int, n_in: int, n_out: int, output: bool) -> PopLinear:
    if output:  # the output layer is not normalized
        return PopLinear(members, n_in, n_out)
    return PopSpectralNormLinear(members, n_in, n_out, cfg.power_iterations)


@dataclass(frozen=True)
class Normalization:
    """How a normalization changes each layer: ``linear`` builds the linear layer (of hidden layers
    and the output layer), ``norm`` (None: no norm) the component after each hidden linear layer;
    ``min_batch`` the smallest training batch it can normalize (2 where it takes statistics over the
    batch); ``schema`` its config class."""

    schema: type
    linear: LinearFactory = plain_linear
    norm: NormFactory | None = None
    min_batch: int = 1


NORMALIZATIONS: dict[str, Normalization] = {
    "none": Normalization(NormalizationConfig),
    "layer": Normalization(LayerNormConfig, norm=lambda cfg, members, width: PopLayerNorm(members, width, cfg.eps)),
    "batch": Normalization(
        BatchNormConfig,
        min_batch=2,
        norm=lambda cfg, members, width: PopBatchNorm(members, width, cfg.eps, cfg.momentum),
    ),
    "rms": Normalization(NormalizationConfig, norm=lambda cfg, members, width: PopRMSNorm(members, width, cfg.eps)),
    "weight": Normalization(WeightNormConfig, linear=_weight_norm_linear),
    "spectral": Normalization(NormalizationConfig, linear=_spectral_linear),
}


def check_normalization(cfg: NormalizationConfig, key: str = "normalization") -> None:
    """Refuse an unknown normalization or values out of range, whichever option is chosen (a preset
    may set any option's keys; eps = 0 is the unguarded division): ConfigError at ``key``.<field>."""
    require_choice(cfg.name, f"{key}.name", NORMALIZATIONS)
    require(cfg.eps >= 0, f"{key}.eps", cfg.eps, "a value >= 0")
    require(0 < cfg.momentum <= 1, f"{key}.momentum", cfg.momentum, "a value in (0, 1]")
    require(cfg.g_init > 0, f"{key}.g_init", cfg.g_init, "a value > 0")
    require(cfg.power_iterations >= 1, f"{key}.power_iterations", cfg.power_iterations, "an integer >= 1")


# ---------------------------------------------------------------- gradient scaling
class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return grad * ctx.scale, None


def scale_gradient(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Identity in the forward pass; multiplies the gradient by ``scale`` in the backward pass.

    MuZero's scale_gradient: a model-internal op, unlike gradient clipping, which rescales the
    gradients after backward.
    """
    return _ScaleGradient.apply(x, scale)


# ---------------------------------------------------------------- the network
def _describe(component: Component) -> str:
    """``PopRMSNorm``, ``PopActivation(gelu)``: for messages."""
    detail = component.extra_repr()
    return f"{type(component).__name__}({detail})" if detail else type(component).__name__


class PopMLP(PopNetwork):
    """Population MLP: [P, B, n_in] -> [P, B, n_out].

    Hidden layer: linear (the normalization's) -> the normalization's norm, if any -> activation
    (none on the last hidden layer with ``network.linear_last_hidden``), plus x + (...) when
    ``network.residual`` and the widths match. Output: linear (the normalization's), times
    output_scale. A critic's action (``extra``) is concatenated to the input of layer ``extra_at``
    (0 = with the observation).

    ``layers`` holds the linear layers, ``norms`` the hidden layers' norms (empty without one).
    ``observation_space`` is the environment's (read by a torso over images, ``rlexp.nn.conv.PopCNN``).
    ``fast_paths`` False (``plain_paths``): no written backward and no host or ``fast_forward`` acting, as
    if no component declared them.
    """

    fast_paths = True

    def __init__(
        self,
        members: int,
        n_in: int,
        n_out: int,
        network: NetworkConfig,
        activation: ActivationConfig,
        normalization: NormalizationConfig,
        init: InitConfig | list[InitConfig],  # or one per member
        generators: list[torch.Generator],
        extra_in: int = 0,
        extra_at: int = 0,
        observation_space: object = None,
    ) -> None:
        super().__init__()
        entry, activation_entry = NORMALIZATIONS[normalization.name], ACTIVATIONS[activation.name]
        hidden = len(network.hidden)
        self.layers = nn.ModuleList()
        self.norms = nn.ModuleList()
        self.activations = nn.ModuleList()
        self.activated: list[bool] = []
        self.residual: list[bool] = []
        # per layer: its components in forward order, and whether a residual connection adds its input
        self._blocks: list[tuple[list[Component], bool]] = []
        # the width the next layer sees (an activation of width 2 doubles its layer's), after the torso
        width = self._torso(members, n_in, network, activation, normalization, observation_space)
        torso = len(self.layers)
        self.activated += [not (network.linear_last_hidden and i == hidden - 1) for i in range(hidden)]
        self.extra_in, self.extra_at = extra_in, torso + extra_at  # a second input joins layer extra_at's input
        for i, b in enumerate([*network.hidden, n_out]):
            a = width + extra_in if i == extra_at else width
            layer = entry.linear(normalization, members, a, b, i == hidden)
            self.layers.append(layer)
            components: list[Component] = [layer]
            width = b
            if i < hidden:
                if entry.norm is not None:
                    self.norms.append(entry.norm(normalization, members, b))
                    components.append(self.norms[-1])
                if self.activated[torso + i]:
                    self.activations.append(PopActivation(activation_entry, activation))
                    components.append(self.activations[-1])
                    width = b * activation_entry.width
                self.residual.append(network.residual and a == width)
            self._blocks.append((components, i < hidden and self.residual[torso + i]))
        self.activation = activation
        self.output_scale = network.output_scale
        self._components = [c for components, _ in self._blocks for c in components]
        self.uses_batch_stats = any(c.uses_batch_stats for c in self._components)  # acting must run in eval mode
        self.mode_dependent = any(c.mode_dependent for c in self._components)
        self._sequential = not any(self.residual) and not extra_in  # one chain of components
        missing = sorted({_describe(c) for c in self._components if not c.written_backward})
        # gradients written without autograd (forward_saved, backward_to_grads)
        self._written_backward = self._sequential and not missing
        if not self._written_backward:
            why = f"no written backward for {', '.join(missing)}" if missing else "residual or second input"
            log.debug(f"PopMLP: {why}: gradients by autograd")
        gain = [scheme_gain(c, activation) for c in init] if isinstance(init, list) else scheme_gain(init, activation)
        for i, layer in enumerate(self.layers):
            layer.reset_parameters(init, gain, generators, last=i == len(self.layers) - 1)
        # what built it, for a fresh draw of the same network (interventions)
        self._build = (members, n_in, n_out, network, activation, normalization, init)
        self._build_kwargs = dict(extra_in=extra_in, extra_at=extra_at, observation_space=observation_space)

    def _torso(
        self,
        members: int,
        n_in: int,
        network: NetworkConfig,
        activation: ActivationConfig,
        normalization: NormalizationConfig,
        observation_space: object,
    ) -> int:
        """Append the layers before the hidden ones (an MLP has none; ``rlexp.nn.conv.PopCNN``'s are
        convolutions) to ``layers``, ``norms``, ``activations``, ``activated``, ``residual`` and
        ``_blocks``; returns the width of their output, [P, B, width] (here the input's, n_in)."""
        return n_in

    def _hidden_view(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """What observers see as hidden layer ``layer``'s output h [P, B, H]: h itself (a convolution's
        is [P, B, positions, channels], ``rlexp.nn.conv.PopCNN``)."""
        return h

    def fresh(self, generators: list[torch.Generator]) -> PopMLP:
        """The same network newly initialized, member k from ``generators[k]``, on this one's device and
        dtype (interventions draw their fresh weights so, from streams of their own)."""
        members, n_in, n_out, network, activation, normalization, init = self._build
        net = type(self)(
            members, n_in, n_out, network, activation, normalization, init, generators, **self._build_kwargs
        )
        weight = self.layers[0].weight
        return net.to(device=weight.device, dtype=weight.dtype)

    @property
    def written_backward(self) -> bool:
        """True when ``forward_saved`` and ``backward_to_grads`` may replace autograd: every component
        declares a written backward, the network is one chain, and its fast paths are on."""
        return self._written_backward and self.fast_paths

    def forward(
        self, x: torch.Tensor, extra: torch.Tensor | None = None, observe: Observer | None = None
    ) -> torch.Tensor:
        """x [P, B, n_in] (and extra [P, B, extra_in] when the network takes one) -> [P, B, n_out].
        ``observe(layer, stage, value)`` sees every layer's input and every component's output."""
        last = len(self._blocks) - 1
        for i, (components, residual) in enumerate(self._blocks):
            if extra is not None and i == self.extra_at:
                x = torch.cat([x, extra], -1)
            if observe is not None:
                observe(i, "input", x)
            h = x
            for component in components:
                h = component.forward(h)  # [P, B, H]
                if observe is not None:
                    observe(i, component.stage, h)
            x = x + h if residual else h
            if observe is not None and i < last:
                observe(i, "hidden", self._hidden_view(i, x))
        out = x * self.output_scale if self.output_scale != 1.0 else x
        if observe is not None:
            observe(last, "output", out)
        return out

    def forward_saved(self, x: torch.Tensor) -> tuple[torch.Tensor, list[object]]:
        """``forward`` without autograd (networks with ``written_backward`` only): the output
        [P, B, n_out] and, per component, what its ``backward_to_grads`` needs."""
        saved: list[object] = []
        with torch.no_grad():
            for component in self._components:
                x, record = component.forward_saved(x)
                saved.append(record)
            return (x * self.output_scale if self.output_scale != 1.0 else x), saved

    def backward_to_grads(self, saved: list[object], grad_out: torch.Tensor) -> None:
        """Write the gradient of sum(out * grad_out) with respect to every parameter into its
        ``.grad`` (overwritten, as after zeroing and one backward), for ``out`` = ``forward_saved``'s
        output and ``saved`` its record; grad_out [P, B, n_out]. Each component runs autograd's
        kernels in autograd's order, so the gradients are ``out.backward(grad_out)``'s, bit for bit."""
        with torch.no_grad():
            grad = grad_out * self.output_scale if self.output_scale != 1.0 else grad_out  # [P, B, out]
            for j in range(len(self._components) - 1, -1, -1):
                grad = self._components[j].backward_to_grads(saved[j], grad, input_grad=j > 0)

    def inference(self) -> Callable[..., torch.Tensor]:
        """A forward function without gradient, for acting: the same outputs as ``forward`` in the
        network's current mode, with less overhead per call.

        A network without residual connections or second input runs its components' ``fast_forward``
        functions in a list (plain linear layers: raw ops on detached views of their parameters).
        Views see in-place changes (optimizer steps, target copies, restores); storage is replaced
        only when a GradientPipeline moves parameters into its flat buffer, which it counts
        (``ParameterStorage.moves``): the views are made anew when that count changed, one
        attribute read per call, so a function made before a pipeline sees its updates. Otherwise it
        is ``forward`` under ``torch.no_grad()`` (always, with ``fast_paths`` off).
        """
        if not self._sequential or not self.fast_paths:

            def run(x: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
                with torch.no_grad():
                    return self.forward(x, extra)

            return run
        scale, components = self.output_scale, self._components
        steps, built = [c.fast_forward() for c in components], [ParameterStorage.moves]

        def run_steps(x: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
            if built[0] != ParameterStorage.moves:  # a pipeline moved parameters since
                built[0], steps[:] = ParameterStorage.moves, [c.fast_forward() for c in components]
            with torch.no_grad():
                for step in steps:
                    x = step(x)
                return x * scale if scale != 1.0 else x

        return run_steps

    def host_inference(self) -> Callable[[np.ndarray], np.ndarray]:
        """A forward function from host arrays to host arrays, for acting from the environments'
        observations: float32 [P, B, n_in] -> [P, B, n_out], no gradient, the network's current mode.

        On the CPU, when every component has a numpy form (``host_forward``) and there is no second
        input, numpy runs the layers on views of the parameters' memory: no torch dispatch per call (a
        third of the time per acting step in CleanRL's DQN loop). It gives the same greedy actions as
        ``forward`` except at near-ties, where float32 rounding order decides (tested). Views are
        made anew when a pipeline moved parameters (see ``inference``). Otherwise (and for batch
        statistics in training mode, and with ``fast_paths`` off) it moves the array to the network's
        device and back around ``inference``.
        """
        forward, device = self.inference(), self.layers[0].weight.device
        torch_path = lambda x: forward(torch.from_numpy(x).to(device)).cpu().numpy()  # noqa: E731
        if not self.fast_paths:
            return torch_path
        missing = sorted({_describe(c) for c in self._components if c.host_forward() is None})
        if missing or self.extra_in or device.type != "cpu":
            if missing:
                log.debug(f"PopMLP.host_inference: no numpy form for {', '.join(missing)}: torch runs")
            return torch_path
        scale = self.output_scale
        blocks: list[tuple[list[HostForward], bool]] = []
        built = [-1]

        def current() -> list[tuple[list[HostForward], bool]]:
            if built[0] != ParameterStorage.moves:  # first call, or a pipeline moved parameters
                built[0] = ParameterStorage.moves
                blocks[:] = [
                    ([c.host_forward() for c in components], residual)  # type: ignore[misc]
                    for components, residual in self._blocks
                ]
            return blocks

        def run_numpy(x: np.ndarray) -> np.ndarray:
            if self.uses_batch_stats and self.training:  # batch statistics: torch's forward
                return torch_path(x)
            with np.errstate(all="ignore"):  # a diverging member's overflow is a result, as in torch
                for steps, residual in current():
                    h = x
                    for step in steps:
                        h = step(h)  # [P, B, H]
                    x = x + h if residual else h
                return x * np.float32(scale) if scale != 1.0 else x

        return run_numpy


def plain_paths(module: nn.Module) -> None:
    """Turn off the fast paths of every population network in ``module`` (the run's ``fast_paths=false``):
    gradients by autograd, acting by torch's ``forward`` under no_grad, target updates tensor by tensor."""
    for m in module.modules():
        if isinstance(m, PopMLP):
            m.fast_paths = False
    log.debug("fast_paths=false: gradients by autograd, acting by torch's forward")


def _fast_paths(module: nn.Module) -> bool:
    """False when ``module`` (a network, or a ModuleList of them) is one whose fast paths are off."""
    nets = module if isinstance(module, nn.ModuleList) else (module,)
    return all(getattr(net, "fast_paths", True) for net in nets)


def weight_parameters(module: nn.Module) -> list[torch.Tensor]:
    """The weight matrices (or weight-norm directions v) of every population linear layer, and those a
    module lists with ``weights()`` (an LSTM's input and recurrent weights)."""
    found: list[torch.Tensor] = []
    for m in module.modules():
        if hasattr(m, "weights"):
            found += m.weights()
        elif isinstance(m, PopLinear):
            found.append(m.weight)
    return found


@torch.no_grad()
def soft_update_(target: nn.Module, online: nn.Module, tau: float | list[tuple[int, int, float]]) -> None:
    """EMA target update, in place: target <- (1 - tau) * target + tau * online (buffers copied);
    ``tau`` a float, or runs [(a, b, tau)] of members a..b-1 sharing one (``rlexp.config.members.member_runs``:
    each run the same scalar lerp as a population of its own)."""
    targets, onlines = list(target.parameters()), list(online.parameters())
    fast = _fast_paths(online)
    if isinstance(tau, list):
        for a, b, value in tau:
            _lerp_all([t[a:b] for t in targets], [o[a:b] for o in onlines], value, fast)
    else:
        _lerp_all(targets, onlines, tau, fast)
    buffers = list(target.buffers())
    if buffers:
        _copy_all(buffers, list(online.buffers()), fast)


def _lerp_all(targets: list[torch.Tensor], sources: list[torch.Tensor], weight: float, fast: bool) -> None:
    """``t.lerp_(s, weight)`` for each pair, in place: one foreach call, or tensor by tensor (``fast`` False, or
    a torch without the foreach kernel)."""
    if fast and capabilities.has_torch("_foreach_lerp_"):
        torch._foreach_lerp_(targets, sources, weight)
    else:
        for t, s in zip(targets, sources):
            t.lerp_(s, weight)


def _copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor], fast: bool) -> None:
    """Copy each source into its target, in place: one foreach call, or tensor by tensor (``fast`` False, or a
    torch without the foreach kernel)."""
    if fast and capabilities.has_torch("_foreach_copy_"):
        torch._foreach_copy_(targets, sources)
    else:
        for t, s in zip(targets, sources):
            t.copy_(s)


@torch.no_grad()
def hard_update_(target: nn.Module, online: nn.Module, members: torch.Tensor | None = None) -> None:
    """Hard target update, in place: target <- online (parameters and buffers); ``members`` (indices)
    copies only those members' rows."""
    targets = list(target.parameters()) + list(target.buffers())
    onlines = list(online.parameters()) + list(online.buffers())
    if members is None:
        _copy_all(targets, onlines, _fast_paths(online))
        return
    for t, o in zip(targets, onlines):
        t.index_copy_(0, members, o.index_select(0, members))
