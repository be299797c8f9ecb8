"""The seed's symptom as instruments: an agent that keeps choosing one action.

Per member and agent, over each log window, from the actions its policy takes (the algorithm hands
them over: a discrete agent's sample, a continuous agent's action binned into ``BINS`` bins per
dimension of its box):

- ``agent<i>/action_repeat_rate``: the fraction of steps whose choice equals the agent's previous one
  (in every dimension's bin);
- ``agent<i>/action_entropy``: the entropy of the window's histogram of choices over log(number of
  bins), so 1 is uniform and 0 is one action (continuous: the mean over dimensions);
- ``agent<i>/action_saturation``: the fraction of steps whose actor output is saturated (discrete: the
  largest action probability > 0.99; continuous: some |tanh| > 0.99).

A member collapsed at the first log step where one of its agents' repeat rate is at least
``diagnostics.collapse_repeat`` or its entropy at most ``diagnostics.collapse_entropy``; the recorder
writes it into the member's summary with the instrument that moved first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlexp.config.schema import DiagnosticsConfig

BINS = 10  # bins per dimension of a continuous action


class ActionWindow:
    """Per-agent action statistics of each log window, and the collapse check."""

    def __init__(self, agents: list[Any], members: int, diag: DiagnosticsConfig) -> None:
        self.agents = agents  # rlexp.envs.marl.AgentSpace per agent
        self.members = members
        self.repeat_bound, self.entropy_bound = diag.collapse_repeat, diag.collapse_entropy
        self._prev: list[np.ndarray | None] = [None] * len(agents)
        self._reset()
        self.collapsed = np.zeros(members, dtype=bool)

    def _reset(self) -> None:
        dims = [1 if a.discrete else a.action_dim for a in self.agents]
        bins = [a.action_dim if a.discrete else BINS for a in self.agents]
        self._hist = [np.zeros((self.members, d, b)) for d, b in zip(dims, bins)]  # [P, dims, bins]
        self._repeats = np.zeros((self.members, len(self.agents)))
        self._saturated = np.zeros((self.members, len(self.agents)))
        self._steps = np.zeros(len(self.agents))  # env steps x environments counted, per agent

    def _bins(self, agent: Any, choice: np.ndarray) -> np.ndarray:
        """The choice's bin per dimension [P, E, dims]."""
        if agent.discrete:
            return choice[..., None]
        unit = (choice - agent.low) / np.maximum(agent.high - agent.low, 1e-12)
        return np.clip((unit * BINS).astype(np.int64), 0, BINS - 1)

    def add(self, index: int, choice: np.ndarray, out: torch.Tensor) -> None:
        """One env step of agent ``index``: its action ([P, E] or [P, E, A]) and actor output [P, E, A]."""
        agent = self.agents[index]
        bins = self._bins(agent, choice)  # [P, E, dims]
        members, envs, dims = bins.shape
        hist = self._hist[index]
        for d in range(dims):
            np.add.at(hist[:, d], (np.repeat(np.arange(members), envs), bins[:, :, d].ravel()), 1.0)
        if self._prev[index] is not None:
            self._repeats[:, index] += (bins == self._prev[index]).all(-1).sum(1)
        self._prev[index] = bins
        with torch.no_grad():
            if agent.discrete:
                sat = torch.softmax(out, -1).amax(-1) > 0.99  # [P, E]
            else:
                sat = (torch.tanh(out).abs() > 0.99).any(-1)
        self._saturated[:, index] += sat.sum(1).cpu().numpy()
        self._steps[index] += envs

    def checkpoint(self) -> dict[str, Any]:
        """The window's state as loop variables for ``RunContext.checkpoint_state``: arrays [P, ...]
        (restored in place), each agent's previous choice [P, E, dims] (None before its first) and the
        per-agent step counts."""
        state: dict[str, Any] = {f"window_prev{i}": prev for i, prev in enumerate(self._prev)}
        state |= {f"window_hist{i}": hist for i, hist in enumerate(self._hist)}
        return state | {
            "window_repeats": self._repeats,
            "window_saturated": self._saturated,
            "window_collapsed": self.collapsed,
            "window_steps": self._steps.tolist(),
        }

    def restore(self, loop: dict[str, Any]) -> None:
        """Take back the state ``checkpoint`` gave, from the restored loop variables."""
        for i in range(len(self.agents)):
            prev = loop[f"window_prev{i}"]
            self._prev[i] = prev.numpy().copy() if isinstance(prev, torch.Tensor) else prev
        self._steps = np.array(loop["window_steps"], dtype=float)

    def take(self, step: int) -> tuple[dict[str, np.ndarray], dict[int, dict[str, Any]]]:
        """The window's metrics ({name: [P]}) and the members newly collapsed at log step ``step``
        ({member: {agent, step, instrument, value, bound}}); starts a new window."""
        metrics: dict[str, np.ndarray] = {}
        collapsed: dict[int, dict[str, Any]] = {}
        for i in range(len(self.agents)):
            if self._steps[i] == 0:
                continue
            hist = self._hist[i]
            p = hist / np.maximum(hist.sum(-1, keepdims=True), 1.0)  # [P, dims, bins]
            logs = np.log(np.where(p > 0, p, 1.0))
            entropy = (-(p * logs).sum(-1) / np.log(hist.shape[-1])).mean(-1)  # [P] in [0, 1]
            repeat = self._repeats[:, i] / self._steps[i]
            name = f"agent{i}"
            metrics[f"{name}/action_repeat_rate"] = repeat
            metrics[f"{name}/action_entropy"] = entropy
            metrics[f"{name}/action_saturation"] = self._saturated[:, i] / self._steps[i]
            for k in range(self.members):
                if self.collapsed[k] or k in collapsed:
                    continue
                if repeat[k] >= self.repeat_bound:
                    collapsed[k] = {
                        "agent": name,
                        "step": step,
                        "instrument": "action_repeat_rate",
                        "value": float(repeat[k]),
                        "bound": self.repeat_bound,
                    }
                elif entropy[k] <= self.entropy_bound:
                    collapsed[k] = {
                        "agent": name,
                        "step": step,
                        "instrument": "action_entropy",
                        "value": float(entropy[k]),
                        "bound": self.entropy_bound,
                    }
        for k in collapsed:
            self.collapsed[k] = True
        self._reset()
        return metrics, collapsed
