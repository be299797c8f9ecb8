"""Fault injection (``debug.*``): the failures tests force on a job.

``debug.inject.what`` poisons member ``debug.inject.member`` (in a pack: that member of each cell) once,
at the first chance at or after env step ``debug.inject.step``: its observations (``obs``), its first
weight (``param``) or its first gradient (``grad``); ``debug.crash_at_step`` raises at that env step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlexp.config.schema import DebugConfig
from rlexp.nn.nets import PopMLP


class FaultInjector:
    """``debug.inject.*`` and ``debug.crash_at_step`` of one population; its state: whether it injected."""

    def __init__(self, debug: DebugConfig, members: int) -> None:
        self.inject = debug.inject
        self.crash_at = debug.crash_at_step  # -1: never
        self.poisons_obs = debug.inject.what == "obs"  # checked every env step: one bool
        self.rows = self.rows_of(list(range(members)))  # the members poisoned
        self.injected = False

    def rows_of(self, local: list[int]) -> list[int]:
        """The population's rows whose index in their own job (``local`` [P]) is ``debug.inject.member``."""
        return [k for k, j in enumerate(local) if j == self.inject.member]

    def crash(self, step: int) -> None:
        """Raise RuntimeError once env step ``step`` reaches ``debug.crash_at_step`` (tests of failure isolation)."""
        if 0 <= self.crash_at <= step:
            raise RuntimeError(f"debug.crash_at_step={self.crash_at}: a forced crash at env step {step}")

    def due(self, what: str, step: int) -> bool:
        """True once: the first call for ``what`` (obs, param, grad) at or after ``debug.inject.step``."""
        if self.injected or self.inject.what != what or step < self.inject.step:
            return False
        self.injected = True
        return True

    def poison_obs(self, obs: np.ndarray, step: int) -> None:
        """debug.inject.what=obs: NaN into the poisoned members' observations [P, E, obs] (in place)."""
        if self.poisons_obs and self.due("obs", step):
            obs[self.rows] = np.nan

    def poison_param(self, net: PopMLP, step: int) -> None:
        """debug.inject.what=param: NaN into the poisoned members' first weight of ``net``."""
        if self.due("param", step):
            with torch.no_grad():
                for member in self.rows:
                    net.layers[0].weight[member].view(-1)[0] = float("nan")

    def poison_grad(self, grads: list[torch.Tensor], step: int) -> None:
        """debug.inject.what=grad: NaN into the poisoned members' first gradient ([P, ...] each)."""
        if self.due("grad", step):
            for member in self.rows:
                grads[0][member].view(-1)[0] = float("nan")

    def state_dict(self) -> dict[str, Any]:
        return {"injected": self.injected}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.injected = bool(state["injected"])
