"""Weight initializers (the ``init`` config group), filled per population member.

Every scheme fills one member's ``[out, in]`` matrix from that member's own ``torch.Generator``, so
member k's initial weights depend only on its seed.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Optional

import torch

from rlexp.config import InitConfig

# gain for He / orthogonal when the config leaves it null, per activation name
_GAINS: Dict[str, float] = {
    "relu": math.sqrt(2.0),
    "elu": math.sqrt(2.0),
    "gelu": math.sqrt(2.0),
    "silu": math.sqrt(2.0),
    "tanh": 5.0 / 3.0,
    "softsign": 1.0,
    "sigmoid": 1.0,
    "linear": 1.0,
}


def activation_gain(activation: str, negative_slope: float = 0.01) -> float:
    """Recommended gain for an activation (torch.nn.init.calculate_gain; ReLU's for ELU/GELU/SiLU)."""
    if activation == "leaky_relu":
        return math.sqrt(2.0 / (1.0 + negative_slope**2))
    return _GAINS[activation]


def _default(w: torch.Tensor, gain: float, g: torch.Generator) -> None:
    # nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt(5)) == U(+-1/sqrt(fan_in))
    bound = gain / math.sqrt(w.shape[1])
    w.uniform_(-bound, bound, generator=g)


def _xavier_uniform(w: torch.Tensor, gain: float, g: torch.Generator) -> None:
    fan_out, fan_in = w.shape
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    w.uniform_(-bound, bound, generator=g)


def _xavier_normal(w: torch.Tensor, gain: float, g: torch.Generator) -> None:
    fan_out, fan_in = w.shape
    w.normal_(0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator=g)


def _he_normal(w: torch.Tensor, gain: float, g: torch.Generator) -> None:
    w.normal_(0.0, gain / math.sqrt(w.shape[1]), generator=g)


def _he_uniform(w: torch.Tensor, gain: float, g: torch.Generator) -> None:
    bound = gain * math.sqrt(3.0 / w.shape[1])
    w.uniform_(-bound, bound, generator=g)


def _orthogonal(w: torch.Tensor, gain: float, g: torch.Generator) -> None:
    torch.nn.init.orthogonal_(w, gain=gain, generator=g)


def _lecun(w: torch.Tensor, gain: float, g: torch.Generator) -> None:
    w.normal_(0.0, gain / math.sqrt(w.shape[1]), generator=g)


# name -> (fill function, how the gain is chosen when the config gives none)
INITIALIZERS: Dict[str, Callable[[torch.Tensor, float, torch.Generator], None]] = {
    "default": _default,
    "xavier": _xavier_uniform,
    "xavier_uniform": _xavier_uniform,
    "xavier_normal": _xavier_normal,
    "he": _he_normal,
    "he_normal": _he_normal,
    "he_uniform": _he_uniform,
    "orthogonal": _orthogonal,
    "lecun": _lecun,
}
_UNIT_GAIN = {"default", "xavier", "xavier_uniform", "xavier_normal", "lecun"}


def scheme_gain(cfg: InitConfig, activation: str, negative_slope: float = 0.01) -> float:
    """The gain a scheme uses for hidden layers: cfg.gain, else 1 (default/xavier/lecun) or the activation's."""
    gain: Optional[float] = getattr(cfg, "gain", None)
    if gain is not None:
        return float(gain)
    if cfg.name in _UNIT_GAIN:
        return 1.0
    return activation_gain(activation, negative_slope)


@torch.no_grad()
def init_linear(
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    cfg: InitConfig,
    gain: float,
    generators: list[torch.Generator],
    last: bool = False,
) -> None:
    """Fill a population linear layer in place: weight [P, out, in], bias [P, out].

    ``gain`` is the hidden-layer gain (see scheme_gain); for the output layer (``last``) the
    config's last-layer settings apply: ``uniform`` draws weight and bias from U(+-last_layer_scale),
    ``same`` uses the scheme with ``last_layer_gain`` if set.
    """
    fill = INITIALIZERS[cfg.name]
    for member, g in enumerate(generators):
        w = torch.empty(weight.shape[1:], dtype=weight.dtype)  # [out, in], filled on the CPU
        if last and cfg.last_layer == "uniform":
            w.uniform_(-cfg.last_layer_scale, cfg.last_layer_scale, generator=g)
        else:
            layer_gain = cfg.last_layer_gain if last and cfg.last_layer_gain is not None else gain
            fill(w, layer_gain, g)
        weight[member].copy_(w)
        if bias is None:
            continue
        if last and cfg.last_layer == "uniform":
            b = torch.empty(bias.shape[1:]).uniform_(-cfg.last_layer_scale, cfg.last_layer_scale, generator=g)
            bias[member].copy_(b)
        elif cfg.bias is None:  # PyTorch's own: U(+-1/sqrt(fan_in))
            bound = 1.0 / math.sqrt(weight.shape[2])
            bias[member].copy_(torch.empty(bias.shape[1:]).uniform_(-bound, bound, generator=g))
        else:
            bias[member].fill_(cfg.bias)
