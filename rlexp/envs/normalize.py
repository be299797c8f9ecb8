"""Observation normalization and reward scaling, per population member, for every algorithm.

Statistics live on the host (float64 numpy, [P, ...]), where the environments are; each member's
depend on its own data only. Both are off unless enabled (``obs_norm.enabled``,
``reward_norm.enabled``); disabled, they return their input unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import numpy as np
import torch

from rlexp.config.schema import ObsNormConfig, RewardNormConfig

T = TypeVar("T")


class RunningMeanStd:
    """Running mean and variance per member of values x [P, N, D] (Chan et al.'s parallel update)."""

    def __init__(self, members: int, dim: int) -> None:
        self.mean = np.zeros((members, dim))
        self.var = np.ones((members, dim))
        self.count = np.full(members, 1e-4)  # as gymnasium's RunningMeanStd: no division by zero

    def update(self, x: np.ndarray) -> None:
        """Fold in x [P, N, D]."""
        x = np.asarray(x, dtype=np.float64)
        n = x.shape[1]
        batch_mean, batch_var = x.mean(1), x.var(1)  # [P, D]
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean = self.mean + delta * (n / total)[:, None]
        m2 = self.var * self.count[:, None] + batch_var * n + delta**2 * (self.count * n / total)[:, None]
        self.var = m2 / total[:, None]
        self.count = total

    def state_dict(self) -> dict[str, Any]:
        """The statistics: mean [P, D], var [P, D], count [P]."""
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean, self.var, self.count = (state[k].numpy().copy() for k in ("mean", "var", "count"))

    def state(self, member: int) -> dict[str, Any]:
        """Member ``member``'s statistics as JSON values (``normalization.json``)."""
        return {
            "mean": self.mean[member].tolist(),
            "var": self.var[member].tolist(),
            "count": float(self.count[member]),
        }


class ObsNormalizer:
    """(x - mean) / (std + 1e-8), clipped to +-clip, with running statistics per member."""

    def __init__(self, cfg: ObsNormConfig, members: int, obs_dim: int) -> None:
        self.enabled = cfg.enabled
        self.clip = cfg.clip
        self.stats = RunningMeanStd(members, obs_dim)

    def update(self, obs: np.ndarray) -> None:
        """Fold in observations [P, E, obs] (host)."""
        if self.enabled:
            self.stats.update(obs)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """Normalize host observations [P, E, obs] -> float32."""
        if not self.enabled:
            return obs
        std = np.sqrt(self.stats.var)[:, None]  # [P, 1, obs]
        out = (obs - self.stats.mean[:, None]) / (std + 1e-8)
        return np.clip(out, -self.clip, self.clip).astype(np.float32)

    def tensor(self, obs: torch.Tensor) -> torch.Tensor:
        """Normalize device observations [P, B, obs] with the current statistics (replay samples)."""
        if not self.enabled:
            return obs
        mean = torch.as_tensor(self.stats.mean, dtype=obs.dtype, device=obs.device).unsqueeze(1)
        std = torch.as_tensor(np.sqrt(self.stats.var), dtype=obs.dtype, device=obs.device).unsqueeze(1)
        return ((obs - mean) / (std + 1e-8)).clamp(-self.clip, self.clip)

    def batch(self, batch: T) -> T:
        """A replay sample (a dataclass with ``obs`` and ``next_obs`` [P, B, obs], stored raw) with both
        normalized by the current statistics; the sample itself when normalization is off."""
        if not self.enabled:
            return batch
        return dataclasses.replace(batch, obs=self.tensor(batch.obs), next_obs=self.tensor(batch.next_obs))

    def state(self, member: int) -> dict[str, Any] | None:
        return self.stats.state(member) if self.enabled else None

    def state_dict(self) -> dict[str, Any]:
        """The running statistics (kept whether or not normalization is on)."""
        return self.stats.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats.load_state_dict(state)


class RewardScaler:
    """r / sqrt(var(G) + 1e-8), clipped to +-clip, where G = gamma * G + r is the running discounted
    return of each environment (reset at episode ends) and var(G) its running variance per member
    (gymnasium's NormalizeReward)."""

    def __init__(self, cfg: RewardNormConfig, members: int, num_envs: int, gamma: float | np.ndarray) -> None:
        """``gamma``: the discount, or one per member ([P, 1])."""
        self.enabled = cfg.enabled
        self.clip = cfg.clip
        self.gamma = gamma
        self.returns = np.zeros((members, num_envs))
        self.stats = RunningMeanStd(members, 1)

    def __call__(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Scale one step's rewards [P, E]; ``done`` ends episodes."""
        if not self.enabled:
            return reward
        self.returns = self.returns * self.gamma + reward
        self.stats.update(self.returns[..., None])
        scaled = reward / np.sqrt(self.stats.var[:, 0:1] + 1e-8)
        self.returns = np.where(done, 0.0, self.returns)
        return np.clip(scaled, -self.clip, self.clip).astype(np.float32)

    def state(self, member: int) -> dict[str, Any] | None:
        return self.stats.state(member) if self.enabled else None

    def state_dict(self) -> dict[str, Any]:
        """The running statistics and each environment's discounted return [P, E]."""
        return {**self.stats.state_dict(), "returns": self.returns}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats.load_state_dict(state)
        self.returns = state["returns"].numpy().copy()


class RewardRange:
    """The largest reward magnitude each member has met in training, |r| after ``reward_norm``'s
    scaling, at least ``floor`` (``algo.r_max``): the scale of divergence's value bound and of DQN's
    reward rescaling. A member's own experience: population-based training never copies it."""

    def __init__(self, members: int, floor: float) -> None:
        self.r_max = np.full(members, float(floor))  # [P]

    def update(self, largest: np.ndarray) -> None:
        """Take one step's largest |r| per member [P] into account."""
        self.r_max = np.maximum(self.r_max, largest)

    def state_dict(self) -> dict[str, Any]:
        return {"r_max": self.r_max}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.r_max = state["r_max"].numpy().copy()
