"""A corridor to walk: importing this module registers ``Corridor-v0`` with gymnasium, so
``env.id=rlexp_plugin_example.envs:Corridor-v0`` makes it (gymnasium's ``module:EnvId``)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

LENGTH = 8  # cells; the episode ends at the last one


class Corridor(gym.Env):
    """Start in one of the first cells, step left (0) or right (1); reaching the far end pays 1, every
    other step costs 0.01. Observation: [position, steps] scaled to [0, 1]. Its state is two integers,
    which ``state_dict``/``load_state_dict`` hand to rlexp's checkpoints (so a resumed run continues
    its episodes exactly)."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.position, self.steps = 0, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.position / (LENGTH - 1), min(self.steps / 100, 1.0)], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.position, self.steps = int(self.np_random.integers(0, 3)), 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.position = min(max(self.position + (1 if int(action) == 1 else -1), 0), LENGTH - 1)
        self.steps += 1
        done = self.position == LENGTH - 1
        return self._obs(), 1.0 if done else -0.01, done, False, {}

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position, self.steps = int(state["position"]), int(state["steps"])


gym.register(id="Corridor-v0", entry_point=Corridor, max_episode_steps=50)
