"""Activations: one registry entry each (the ``activation`` config group).

An entry declares the torch function (with its config's parameters), the init gain He and
orthogonal use, and optionally its written derivative (bit for bit autograd's) and its numpy form
for host-side acting. ``PopActivation`` is the network component an entry becomes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from rlexp.config.schema import ActivationConfig, ELUConfig, LeakyReLUConfig, require, require_choice
from rlexp.nn import capabilities
from rlexp.nn.component import Component, HostForward

Function = Callable[[torch.Tensor], torch.Tensor]
# (grad wrt the output, pre-activation h, output y, config) -> grad wrt h
Backward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, ActivationConfig], torch.Tensor]
# (config) -> in-place-when-possible function on a float32 array
NumpyForm = Callable[[ActivationConfig], HostForward]


@dataclass(frozen=True)
class Activation:
    """One activation: ``function(cfg)`` the torch function; ``gain(cfg)`` the He/orthogonal gain
    (required: every activation has one); ``backward`` its derivative as autograd computes it (None:
    autograd); ``numpy(cfg)`` its numpy form for host acting (None: torch); ``width`` the outputs per
    input unit (crelu: 2, and the next layer takes twice the inputs); ``schema`` its config class;
    ``kernels`` the ATen operators ``backward`` calls (a torch without one: autograd)."""

    schema: type
    function: Callable[[ActivationConfig], Function]
    gain: Callable[[ActivationConfig], float]
    backward: Backward | None = None
    numpy: NumpyForm | None = None
    width: int = 1
    kernels: tuple[str, ...] = ()


RELU_GAIN = math.sqrt(2.0)


def _fixed(value: float) -> Callable[[ActivationConfig], float]:
    return lambda cfg: value


def _softsign_backward(g: torch.Tensor, h: torch.Tensor, y: torch.Tensor, cfg: ActivationConfig) -> torch.Tensor:
    """softsign's derivative as autograd composes it for y = h / (|h| + 1) (ATen has no kernel for it):
    division's two gradients, the second through abs's sgn, summed; bit for bit autograd's (tested)."""
    d = h.abs() + 1
    return g / d + (-g * (y / d)) * h.sgn()


def _crelu(h: torch.Tensor) -> torch.Tensor:
    """concat(relu(h), relu(-h)) over the last dimension: [P, B, H] -> [P, B, 2H] (Shang et al. 2016)."""
    return torch.cat((torch.relu(h), torch.relu(-h)), -1)


def _crelu_backward(g: torch.Tensor, h: torch.Tensor, y: torch.Tensor, cfg: ActivationConfig) -> torch.Tensor:
    """crelu's derivative as autograd composes it: each half's relu backward, the second through the
    negation, summed (a - b is a + (-b) exactly); bit for bit autograd's (tested)."""
    n = h.shape[-1]
    relu_backward = torch.ops.aten.threshold_backward
    return relu_backward(g[..., :n], y[..., :n], 0) - relu_backward(g[..., n:], y[..., n:], 0)


ACTIVATIONS: dict[str, Activation] = {
    "relu": Activation(
        ActivationConfig,
        lambda cfg: torch.relu,
        _fixed(RELU_GAIN),
        backward=lambda g, h, y, cfg: torch.ops.aten.threshold_backward(g, y, 0),
        kernels=("threshold_backward",),
        numpy=lambda cfg: lambda h: np.maximum(h, 0, out=h),
    ),
    "crelu": Activation(  # gain: ReLU's (each unit's two halves carry x^2 over twice the fan-in)
        ActivationConfig,
        lambda cfg: _crelu,
        _fixed(RELU_GAIN),
        backward=_crelu_backward,
        kernels=("threshold_backward",),
        numpy=lambda cfg: lambda h: np.concatenate((np.maximum(h, 0), np.maximum(-h, 0)), -1),
        width=2,
    ),
    "leaky_relu": Activation(
        LeakyReLUConfig,
        lambda cfg: lambda x: F.leaky_relu(x, cfg.negative_slope),
        lambda cfg: math.sqrt(2.0 / (1.0 + cfg.negative_slope**2)),
        backward=lambda g, h, y, cfg: torch.ops.aten.leaky_relu_backward(g, h, cfg.negative_slope, False),
        kernels=("leaky_relu_backward",),
        numpy=lambda cfg: lambda h: np.where(h > 0, h, h * np.float32(cfg.negative_slope)),
    ),
    "elu": Activation(  # gain: ReLU's (torch's calculate_gain has none for ELU)
        ELUConfig,
        lambda cfg: lambda x: F.elu(x, cfg.alpha),
        _fixed(RELU_GAIN),
        backward=lambda g, h, y, cfg: torch.ops.aten.elu_backward(g, cfg.alpha, 1, 1, False, h),
        kernels=("elu_backward",),
        numpy=lambda cfg: lambda h: np.where(h > 0, h, np.float32(cfg.alpha) * np.expm1(np.minimum(h, 0))),
    ),
    "gelu": Activation(  # gain: ReLU's
        ActivationConfig,
        lambda cfg: F.gelu,
        _fixed(RELU_GAIN),
        backward=lambda g, h, y, cfg: torch.ops.aten.gelu_backward(g, h),
        kernels=("gelu_backward",),
    ),
    "silu": Activation(  # gain: ReLU's
        ActivationConfig,
        lambda cfg: F.silu,
        _fixed(RELU_GAIN),
        backward=lambda g, h, y, cfg: torch.ops.aten.silu_backward(g, h),
        kernels=("silu_backward",),
    ),
    "mish": Activation(  # x tanh(softplus(x)); gain: ReLU's, as for ELU, GELU and SiLU
        ActivationConfig,
        lambda cfg: F.mish,
        _fixed(RELU_GAIN),
        backward=lambda g, h, y, cfg: torch.ops.aten.mish_backward(g, h),
        kernels=("mish_backward",),
    ),
    "tanh": Activation(
        ActivationConfig,
        lambda cfg: torch.tanh,
        _fixed(5.0 / 3.0),
        backward=lambda g, h, y, cfg: torch.ops.aten.tanh_backward(g, y),
        kernels=("tanh_backward",),
        numpy=lambda cfg: lambda h: np.tanh(h, out=h),
    ),
    "softsign": Activation(
        ActivationConfig,
        lambda cfg: F.softsign,
        _fixed(1.0),
        backward=_softsign_backward,
        numpy=lambda cfg: lambda h: np.divide(h, np.abs(h) + 1, out=h),
    ),
    "sigmoid": Activation(
        ActivationConfig,
        lambda cfg: torch.sigmoid,
        _fixed(1.0),
        backward=lambda g, h, y, cfg: torch.ops.aten.sigmoid_backward(g, y),
        kernels=("sigmoid_backward",),
    ),
}


def check_activation(cfg: ActivationConfig, key: str = "activation") -> None:
    """Refuse a name not in the registry, a leaky slope outside [0, 1) and an ELU alpha <= 0, whichever
    option is chosen (ConfigError at ``key``.<field>)."""
    require_choice(cfg.name, f"{key}.name", ACTIVATIONS)
    require(
        0 <= cfg.negative_slope < 1,
        f"{key}.negative_slope",
        cfg.negative_slope,
        "a value in [0, 1): the slope for x < 0 of a rectifier",
    )
    require(cfg.alpha > 0, f"{key}.alpha", cfg.alpha, "a value > 0")


def activation_gain(cfg: ActivationConfig) -> float:
    """The gain He and orthogonal use for this activation (leaky_relu: from its slope)."""
    return ACTIVATIONS[cfg.name].gain(cfg)


class PopActivation(Component):
    """An activation as a network component: elementwise, [P, B, H] -> [P, B, width * H] (width 1 but
    for crelu), no parameters."""

    stage = "activation"

    def __init__(self, entry: Activation, cfg: ActivationConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.entry = entry
        self.function = entry.function(cfg)
        self.written_backward = self.entry.backward is not None and capabilities.has_aten(*self.entry.kernels)
        self.width = entry.width

    def extra_repr(self) -> str:
        return self.cfg.name

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.function(h)

    def forward_saved(self, h: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """The output and what the derivative needs: (pre-activation, output)."""
        y = self.function(h)
        return y, (h, y)

    def backward_to_grads(self, saved: tuple, grad: torch.Tensor, input_grad: bool = True) -> torch.Tensor:
        h, y = saved
        return self.entry.backward(grad, h, y, self.cfg)  # type: ignore[misc]

    def fast_forward(self) -> Function:
        return self.function

    def host_forward(self) -> HostForward | None:
        return self.entry.numpy(self.cfg) if self.entry.numpy is not None else None
