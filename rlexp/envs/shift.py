"""Non-stationary tasks (``env.shift``): the same world, seen through a permutation that changes.

Every ``env.shift.every`` env steps per member the task switches: each member draws a fresh random
permutation from a stream of its own (``member_generator(seed, PURPOSE)``), so its tasks depend on its
seed alone, never on the population around it.

- ``permute_obs``: the agent sees the observation's features in the task's order, ``seen[i] =
  raw[perm[i]]`` (over the flattened observation): the world unchanged, its inputs reordered, the RL
  analog of permuted MNIST (Goodfellow et al. 2013; a benchmark of Kumar et al. 2023).
- ``permute_actions`` (discrete actions): the action index ``a`` the agent picks is ``perm[a]`` in the
  environment: the same inputs, their meaning to the output reassigned, the analog of shuffled labels
  (Lyle et al. 2024).

The first task is the identity, so a run that never reaches a switch computes what the stationary
environment computes. A switch takes effect at the first vector step at or after each multiple of
``every`` below ``total_steps`` (the budget's last step starts no task, which nothing would train on):
that step's transition (``obs``, the action, ``obs`` after it) belongs to the task it was
taken in, and its ``next_obs`` (what the next step acts on) to the new task. Training's environments
count the steps; evaluation's see the current task and never switch it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from rlexp.config.schema import ConfigError, ShiftConfig, require, require_choice
from rlexp.envs.gym import EnvStep, PopulationEnv
from rlexp.envs.streams import member_generator

SHIFTS = ("none", "permute_obs", "permute_actions")
PURPOSE = 5  # member_generator purpose of the tasks' permutations


def check_shift(shift: ShiftConfig, env_id: str, multi_agent: bool) -> None:
    """``env.shift.kind`` and ``env.shift.every`` in their domains, on a single-agent env (ConfigError otherwise)."""
    require_choice(shift.kind, "env.shift.kind", SHIFTS)
    require(shift.every >= 1, "env.shift.every", shift.every, "an integer >= 1 (env steps per member)")
    if shift.kind != "none" and multi_agent:
        raise ConfigError(
            "env.shift.kind", f"{shift.kind} applies to single-agent envs and {env_id} is multi-agent", "set it to none"
        )


def check_shift_spaces(shift: ShiftConfig, env_id: str, action_kind: str, stack: int) -> None:
    """The spaces a shift applies to: discrete actions for ``permute_actions``; observations that stack
    no frames for ``permute_obs`` (a replay keeps each frame once, in the order it was seen)."""
    key = "env.shift.kind"
    if shift.kind == "permute_actions" and action_kind != "discrete":
        raise ConfigError(
            key, f"permute_actions needs discrete actions and {env_id} has {action_kind} ones", f"use {key}=permute_obs"
        )
    if shift.kind == "permute_obs" and stack > 1:
        raise ConfigError(
            key, f"permute_obs does not apply to {env_id}'s stacked frames", f"use {key}=permute_actions or none"
        )


class TaskShift:
    """Each member's current task, a permutation [P, size], and the count that switches it."""

    def __init__(self, cfg: ShiftConfig, member_seeds: list[int], size: int, total_steps: int) -> None:
        """``size``: the features of an observation (permute_obs) or the number of actions (permute_actions);
        ``total_steps``: the budget, whose last step starts no task."""
        self.every, self.last = cfg.every, total_steps - 1
        self.permutes_obs = cfg.kind == "permute_obs"
        self.generators = [member_generator(s, PURPOSE) for s in member_seeds]
        self.perm = np.tile(np.arange(size), (len(member_seeds), 1))  # [P, size] the first task: the identity
        self.steps = 0  # env steps per member taken so far
        self.switch_step = 0  # the env step at which the current task began

    @classmethod
    def of(cls, cfg: ShiftConfig, env: PopulationEnv, member_seeds: list[int], total_steps: int) -> TaskShift | None:
        """The shift ``cfg`` asks of ``env`` (None for kind none)."""
        if cfg.kind == "none":
            return None
        size = env.obs_dim if cfg.kind == "permute_obs" else int(env.action_space.n)
        return cls(cfg, member_seeds, size, total_steps)

    @property
    def task(self) -> int:
        """The current task's index: 0 the first (the identity), one more at each multiple of ``every``
        passed before the budget's last step."""
        return min(self.steps, self.last) // self.every

    def advance(self, steps: int) -> None:
        """Count ``steps`` env steps per member; each multiple of ``every`` passed draws every member's next task."""
        before = self.task
        self.steps += steps
        for _ in range(self.task - before):  # a vector step may pass several multiples: each draws one task
            size = self.perm.shape[1]
            self.perm = np.stack([torch.randperm(size, generator=g).numpy() for g in self.generators])
            self.switch_step = self.steps

    def observe(self, obs: np.ndarray) -> np.ndarray:
        """What each member sees of observations [P, E, obs]: its features in the task's order (a new array)."""
        if not self.permutes_obs:
            return obs
        return np.take_along_axis(obs, self.perm[:, None, :], axis=2)  # [P, E, obs]

    def act(self, actions: Any) -> Any:
        """The actions [P, E] the environments receive for the agent's: ``perm[a]`` per member (permute_actions)."""
        if self.permutes_obs:
            return actions
        chosen = np.asarray(actions).reshape(len(self.perm), -1)  # [P, E] action indices
        return np.take_along_axis(self.perm, chosen, axis=1)  # [P, E]

    def metrics(self) -> dict[str, int]:
        """Each log record's: the current task's index and the env step at which it began."""
        return {"shift/task": self.task, "shift/switch_step": self.switch_step}

    def state_dict(self) -> dict[str, Any]:
        """The current permutations [P, size], the generators' states [P, S] uint8 and the step counts."""
        generators = torch.stack([g.get_state() for g in self.generators])
        return {"perm": self.perm, "generators": generators, "steps": self.steps, "switch_step": self.switch_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.perm = state["perm"].numpy().copy()
        for generator, generator_state in zip(self.generators, state["generators"]):
            generator.set_state(generator_state.clone())
        self.steps, self.switch_step = int(state["steps"]), int(state["switch_step"])


class ShiftedEnv:
    """A ``PopulationEnv`` seen through a ``TaskShift``: observations out and actions in pass through the
    members' current tasks; every other attribute is the environments' own. ``counts``: this population's
    steps advance the shift (training's), else it only reads the current task (evaluation's)."""

    def __init__(self, env: PopulationEnv, shift: TaskShift, counts: bool) -> None:
        self.env, self.shift, self.counts = env, shift, counts

    def __getattr__(self, name: str) -> Any:
        if name == "env":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self) -> np.ndarray:
        return self.shift.observe(self.env.reset())

    def observations(self) -> np.ndarray:
        return self.shift.observe(self.env.observations())

    def step(self, actions: Any) -> EnvStep:
        """One step in the current task; a switch it reaches applies from its ``next_obs`` on."""
        result = self.env.step(self.shift.act(actions))
        obs = self.shift.observe(result.obs)
        if self.counts:
            self.shift.advance(self.env.num_envs)
        return dataclasses.replace(result, obs=obs, next_obs=self.shift.observe(result.next_obs))

    def state_dict(self) -> dict[str, Any]:
        """The environments' state and the shift's (``shift``)."""
        return {**self.env.state_dict(), "shift": self.shift.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.shift.load_state_dict(state["shift"])
        self.env.load_state_dict({k: v for k, v in state.items() if k != "shift"})
