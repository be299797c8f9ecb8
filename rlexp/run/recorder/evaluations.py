"""Evaluations at log steps: the algorithm's deterministic policy played by the ``Evaluator``.

The algorithm hands its policy once (``evaluate_with``); at each log step ``Evaluator.due`` picks, the
members still running are evaluated (a diverged member is frozen: its latest evaluation stands), their
eval/ metrics go into that log step's record and each member's latest mean return into its summary.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlexp.config.state import PerMember
from rlexp.run.evaluation import Evaluation, Evaluator, Policy


class Evaluations:
    """The evaluations of one population; its state: each member's latest mean evaluation return."""

    def __init__(self, evaluator: Evaluator, members: int) -> None:
        self.evaluator = evaluator
        self.policy: Policy | None = None  # the algorithm's deterministic policy (evaluate_with)
        self._evaluation: Evaluation | None = None  # this log step's evaluation, for its record
        self._evaluated = np.zeros(members, dtype=bool)  # [P] the members it counted
        self.returns: list[float | None] = [None] * members  # each member's latest mean evaluation return

    def due(self, step: int, previous: int) -> bool:
        """Whether log step ``step`` (after ``previous``) evaluates: a policy was handed and ``eval.every`` says so."""
        return self.policy is not None and self.evaluator.due(step, previous)

    def run(self, members: np.ndarray) -> np.ndarray:
        """Evaluate ``members`` ([P] bool); returns them, the members this log step's record counts."""
        self._evaluated = members
        self._evaluation = self.evaluator.run(self.policy, members)
        returns = self._evaluation.returns
        for k in np.flatnonzero(members):
            self.returns[k] = float(returns[k].mean())
        return members

    def metrics(self, k: int) -> dict[str, float]:
        """Member k's eval/ metrics of this log step's evaluation (none when it was not evaluated)."""
        if self._evaluation is None or not self._evaluated[k]:
            return {}
        returns, lengths = self._evaluation.returns[k], self._evaluation.lengths[k]
        return {
            "eval/return": float(returns.mean()),
            "eval/return_std": float(returns.std()),
            "eval/length": float(lengths.mean()),
        }

    def recorded(self) -> None:
        """This log step's record is written: its evaluation is done with."""
        self._evaluation = None

    def close(self) -> None:
        self.evaluator.close()

    def state_dict(self) -> dict[str, Any]:
        return {"returns": PerMember(self.returns)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.returns = list(state["returns"])
