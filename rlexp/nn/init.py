"""Weight initializers (the ``init`` config group), filled per population member.

Every scheme fills one member's ``[out, in]`` matrix from that member's own ``torch.Generator``, so
member k's initial weights depend only on its seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlexp.config.schema import (
    ActivationConfig,
    DefaultInitConfig,
    GainInitConfig,
    InitConfig,
    XavierInitConfig,
    require,
    require_choice,
)
from rlexp.nn.activations import activation_gain

Fill = Callable[[torch.Tensor, float, torch.Generator], None]  # (one member's [out, in], gain, generator)


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


@dataclass(frozen=True)
class Initializer:
    """One scheme: ``fill`` draws a member's matrix; ``activation_gain``: a null gain means the
    activation's (He, orthogonal), else 1; ``schema`` its config class."""

    schema: type
    fill: Fill
    activation_gain: bool = False


INITIALIZERS: dict[str, Initializer] = {
    "default": Initializer(DefaultInitConfig, _default),
    "xavier": Initializer(XavierInitConfig, _xavier_uniform),
    "xavier_uniform": Initializer(XavierInitConfig, _xavier_uniform),
    "xavier_normal": Initializer(XavierInitConfig, _xavier_normal),
    "he": Initializer(GainInitConfig, _he_normal, activation_gain=True),
    "he_normal": Initializer(GainInitConfig, _he_normal, activation_gain=True),
    "he_uniform": Initializer(GainInitConfig, _he_uniform, activation_gain=True),
    "orthogonal": Initializer(GainInitConfig, _orthogonal, activation_gain=True),
    "lecun": Initializer(InitConfig, _lecun),
}


def check_init(cfg: InitConfig, key: str = "init") -> None:
    """Refuse an unknown scheme, an unknown last_layer mode and non-positive scales or gains
    (ConfigError at ``key``.<field>)."""
    require_choice(cfg.name, f"{key}.name", INITIALIZERS)
    require_choice(cfg.last_layer, f"{key}.last_layer", ("same", "uniform"))
    require(cfg.last_layer_scale > 0, f"{key}.last_layer_scale", cfg.last_layer_scale, "a value > 0")
    for k in ("gain", "last_layer_gain"):
        value = cfg[k]
        if value is not None:
            require(value > 0, f"{key}.{k}", value, "a value > 0 (or null)")


def scheme_gain(cfg: InitConfig, activation: ActivationConfig) -> float:
    """The gain a scheme uses for hidden layers: cfg.gain, else the activation's (He, orthogonal) or 1."""
    gain: float | None = getattr(cfg, "gain", None)
    if gain is not None:
        return float(gain)
    return activation_gain(activation) if INITIALIZERS[cfg.name].activation_gain else 1.0


@torch.no_grad()
def init_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cfg: InitConfig | list[InitConfig],
    gain: float | list[float],
    generators: list[torch.Generator],
    last: bool = False,
) -> None:
    """Fill a population linear layer in place: weight [P, out, in], bias [P, out].

    ``gain`` is the hidden-layer gain (see scheme_gain); for the output layer (``last``) the
    config's last-layer settings apply: ``uniform`` draws weight and bias from U(+-last_layer_scale),
    ``same`` uses the scheme with ``last_layer_gain`` if set. ``cfg`` and ``gain`` may be lists, one
    per member (a population whose members differ in their init).
    """
    members = len(generators)
    cfgs = cfg if isinstance(cfg, list) else [cfg] * members
    gains = gain if isinstance(gain, list) else [gain] * members
    for member, g in enumerate(generators):
        cfg, gain = cfgs[member], gains[member]
        fill = INITIALIZERS[cfg.name].fill
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
