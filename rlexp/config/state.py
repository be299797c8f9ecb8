"""The state a part carries across steps: what a checkpoint asks of it.

Every part with such state (the population's environments, replay buffers, random streams,
normalizers, the evaluator, the recorder, gradient pipelines, interventions; a torch module as it is)
is ``Stateful``: ``state_dict()`` gives its state and ``load_state_dict(state)`` takes back what a
``state_dict()`` gave, implemented beside the attributes the part owns.

A state dict maps names to values, and the value says how the population's state is split into the
members' files (``rlexp.run.checkpoint``):
- a tensor or array with a leading member dimension [P, ...]: row k is member k's;
- a ``PerMember`` list: entry k (a Python value, a dict of them, tensors) is member k's;
- a ``Shared`` tensor or array (no member dimension): the population's, in every file;
- a dict: a nested state dict, split the same way;
- anything else (a number, a string, None, a list): the population's, in every file.
``load_state_dict`` gets CPU tensors back for tensors and arrays (a split one stacked back to
[P, ...]), lists for ``PerMember`` lists and tuples, nested dicts as dicts, and the other values as
they were saved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

PLAIN = (bool, int, float, str, type(None))  # values a state dict holds as they are


class Stateful(Protocol):
    """A part whose state goes into checkpoints (a torch ``nn.Module`` is one as it is)."""

    def state_dict(self) -> dict[str, Any]:
        """The part's state (see the module docstring for how its values split per member)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``, as a ``state_dict()`` gave it (tensors on the CPU)."""
        ...


class PerMember(list):
    """One entry per member (Python values): entry k goes into member k's file."""


@dataclass
class Shared:
    """A tensor or array without a member dimension: the population's, in every file."""

    value: Any
