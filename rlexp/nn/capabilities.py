"""What the installed torch offers of the private entry points the fast paths call.

A fast path calls torch's private functions (``torch._fused_adam_``, ``torch._foreach_lerp_``) or ATen's
kernels (``torch.ops.aten.gelu_backward``), which a torch release may lack (an older one) or drop (a newer
one). Its caller asks here first and, without them, takes the plain torch path ``fast_paths=false`` runs
(torch.optim, autograd, tensor by tensor). Each answer is looked up on first use and kept for the process.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.cache
def has_torch(*names: str) -> bool:
    """torch has every function ``torch.<name>`` of ``names`` (``"_foreach_lerp_"``, ``"native_layer_norm"``)."""
    return all(callable(getattr(torch, name, None)) for name in names)


@functools.cache
def has_aten(*names: str) -> bool:
    """ATen has every operator ``torch.ops.aten.<name>`` of ``names`` (``"gelu_backward"``)."""
    return all(hasattr(torch.ops.aten, name) for name in names)


@functools.cache
def has_functional(name: str) -> bool:
    """``torch.nn.functional`` has the function ``name`` (``"rms_norm"``: torch 2.4 and later)."""
    return callable(getattr(F, name, None))


def clear() -> None:
    """Forget every answer (tests that take an entry point away)."""
    for check in (has_torch, has_aten, has_functional):
        check.cache_clear()
