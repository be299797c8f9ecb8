"""The protocol every network component implements.

A component is a population module: every parameter has a leading member dimension P and its
forward maps [P, B, in] -> [P, B, out] without mixing members. Beyond ``forward`` it declares:

* ``stage``: the name an observer of the network's forward sees its output under
  ("linear", "norm" or "activation");
* ``written_backward``: True when it implements ``forward_saved(x) -> (y, saved)`` (no autograd)
  and ``backward_to_grads(saved, grad, input_grad) -> grad_input``, which writes its parameters'
  ``.grad`` as autograd does, bit for bit, and returns the gradient wrt its input;
* ``host_forward()``: a numpy function [P, B, in] -> [P, B, out] on views of its parameters'
  memory, or None when it has none (acting then runs torch);
* ``fast_forward()``: a function equal to ``forward`` under no_grad with the least overhead per
  call, for acting (default: ``forward``); it may hold views of the parameters;
* ``uses_batch_stats``: True when training mode normalizes with the batch's own statistics;
* ``mode_dependent``: True when its forward in training mode differs from eval mode's (batch
  statistics, a spectral norm's power iteration): a component whose forward reads ``self.training``
  must declare it, since a network without one switches modes by its own flag alone (``PopNetwork.train``).

``PopMLP`` runs components in one loop and uses each capability only where every component of the
network declares it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

HostForward = Callable[[np.ndarray], np.ndarray]


class ParameterStorage:
    """Counts the moves of parameters into new storage (a gradient pipeline makes each parameter a view
    of its flat buffer): an acting function holding views of parameter memory makes them anew when
    ``moves`` changed since it made them."""

    moves = 0


class Component(nn.Module):
    """Base of the components: no written backward, no host form, no batch statistics, the same forward in
    either mode."""

    stage = ""
    written_backward = False
    uses_batch_stats = False
    mode_dependent = False

    def forward_saved(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError(f"{type(self).__name__} has no written backward")

    def backward_to_grads(self, saved: Any, grad: torch.Tensor, input_grad: bool = True) -> torch.Tensor | None:
        raise NotImplementedError(f"{type(self).__name__} has no written backward")

    def fast_forward(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return self.forward

    def host_forward(self) -> HostForward | None:
        return None


def ensure_grads(*params: torch.Tensor) -> None:
    """Give parameters without a ``.grad`` an (uninitialized) one, for gradients written in place."""
    for p in params:
        if p.grad is None:
            p.grad = torch.empty_like(p)


def numpy_view(t: torch.Tensor) -> np.ndarray:
    """The memory of a CPU tensor as a numpy array (no copy: in-place changes show through)."""
    return t.detach().numpy()


class PopNetwork(nn.Module):
    """Base of the population networks: ``train(mode)`` walks the modules only when a component's forward
    depends on the mode (``mode_dependent``, set by the network from its components); a network where
    none does computes the same in either mode and sets its own flag alone. The training loops switch
    modes around every update, and walking every module costs more than a small network's forward."""

    mode_dependent = True

    def train(self, mode: bool = True) -> PopNetwork:
        if self.mode_dependent:
            return super().train(mode)
        self.training = mode
        return self
