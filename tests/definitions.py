"""Reference definitions the tests compare rlexp's components with, written out from the literature.

Every activation in the registry needs its definition here (a plugin's: the ``reference`` it declares):
the suite is parametrized over the registry, so a new activation without one fails
``test_activation_registry_matches_definitions``.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def ref_activation(name: str, x: torch.Tensor, slope: float = 0.01, alpha: float = 1.0) -> torch.Tensor:
    """The activations written out from their definitions."""
    if name == "relu":
        return torch.where(x > 0, x, torch.zeros_like(x))
    if name == "crelu":
        return torch.cat([torch.where(x > 0, x, torch.zeros_like(x)), torch.where(x < 0, -x, torch.zeros_like(x))], -1)
    if name == "leaky_relu":
        return torch.where(x > 0, x, slope * x)
    if name == "elu":
        return torch.where(x > 0, x, alpha * (torch.exp(x) - 1.0))
    if name == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if name == "silu":
        return x / (1.0 + torch.exp(-x))
    if name == "tanh":
        return (torch.exp(x) - torch.exp(-x)) / (torch.exp(x) + torch.exp(-x))
    if name == "softsign":
        return x / (1.0 + x.abs())
    if name == "sigmoid":
        return 1.0 / (1.0 + torch.exp(-x))
    if name == "mish":
        return x * torch.tanh(torch.log1p(torch.exp(x)))
    from rlexp.compose.plugins import REFERENCES  # a plugin's activation: the definition its plugin declares

    return REFERENCES[name](x)


class RMSNorm(nn.Module):
    """torch.nn.RMSNorm written out, for a torch before 2.4 (which has none): x / sqrt(mean(x^2) + eps) * weight."""

    def __init__(self, width: int, eps: float, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight
