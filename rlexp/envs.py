"""Population environments: P x E gymnasium environments, each member seeded on its own.

All P * E environments live in one gymnasium SyncVectorEnv (autoreset NEXT_STEP, gymnasium 1.x's
default): the step after an episode ends only resets that environment, so it carries no real
transition and is flagged ``valid = False``. Everything stays on the host as numpy arrays
([P, E, ...]): the per-step path does no tensor work, and the algorithm moves what it needs.
"""

from __future__ import annotations

import difflib
from collections import deque
from dataclasses import dataclass
from typing import List

import gymnasium as gym
import numpy as np
from rlexp.config import ConfigError, EnvConfig

EXTRAS = {"box2d": "box2d"}  # gymnasium dependency name -> rlexp extra that installs it


def check_env_id(env_id: str) -> None:
    """Raise ConfigError for an id gymnasium does not know, naming close matches."""
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry.keys()), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "see gymnasium.registry for the known ids"
    raise ConfigError("env.id", f"unknown environment '{env_id}'", hint)


def make_vector_env(cfg: EnvConfig, num_envs: int) -> gym.vector.VectorEnv:
    """A SyncVectorEnv of ``num_envs`` copies of cfg.id (ConfigError if an optional extra is missing)."""
    check_env_id(cfg.id)
    kwargs = dict(cfg.kwargs)
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    try:
        # copy=False: the vector env reuses its observation array; PopulationEnv copies it to a tensor
        return gym.make_vec(cfg.id, num_envs=num_envs, vectorization_mode="sync", vector_kwargs={"copy": False},
                            **kwargs)
    except gym.error.DependencyNotInstalled as err:
        extra = next((e for dep, e in EXTRAS.items() if dep.lower() in str(err).lower()), None)
        fix = f"pip install 'rlexp[{extra}]'" if extra else str(err)
        raise ConfigError("env.id", f"{cfg.id} needs an optional dependency", fix) from None


def env_seeds(member_seed: int, num_envs: int) -> List[int]:
    """Seeds of one member's environments, derived from its seed (no overlap between members)."""
    return [int(s) for s in np.random.SeedSequence([member_seed, 1]).generate_state(num_envs)]


@dataclass
class EnvStep:
    """One step of every environment; arrays are [P, E]."""

    obs: np.ndarray  # [P, E, obs] float32 observation after the step (the final one at a done)
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray  # False where the step only reset the environment (NEXT_STEP autoreset)


class PopulationEnv:
    """P members x E environments; episode returns and lengths tracked per member."""

    def __init__(self, cfg: EnvConfig, member_seeds: List[int]) -> None:
        self.members = len(member_seeds)
        self.num_envs = cfg.num_envs
        self.vec = make_vector_env(cfg, self.members * cfg.num_envs)
        self.observation_space = self.vec.single_observation_space
        self.action_space = self.vec.single_action_space
        self.obs_dim = int(np.prod(self.observation_space.shape))
        self.seeds = [s for m in member_seeds for s in env_seeds(m, cfg.num_envs)]
        shape = (self.members, self.num_envs)
        self._prev_done = np.zeros(shape, dtype=bool)
        self._ep_return = np.zeros(shape)
        self._ep_length = np.zeros(shape, dtype=np.int64)
        self.episodes: List[List[tuple[float, int]]] = [[] for _ in range(self.members)]  # since last read
        self.last_returns = [deque(maxlen=10) for _ in range(self.members)]
        self.episode_count = np.zeros(self.members, dtype=np.int64)

    def _obs(self, obs: np.ndarray) -> np.ndarray:
        # a copy: the vector env reuses its observation array
        return np.array(obs, dtype=np.float32).reshape(self.members, self.num_envs, self.obs_dim)

    def reset(self) -> np.ndarray:
        """Reset every environment with its own seed; returns observations [P, E, obs]."""
        obs, _ = self.vec.reset(seed=self.seeds)
        self._prev_done[:] = False
        self._ep_return[:] = 0.0
        self._ep_length[:] = 0
        return self._obs(obs)

    def step(self, actions: np.ndarray) -> EnvStep:
        """Step every environment with actions [P, E] (or [P, E, A] for Box actions); records
        finished episodes per member."""
        actions = np.asarray(actions).reshape(self.members * self.num_envs, *self.action_space.shape)
        obs, reward, terminated, truncated, _ = self.vec.step(actions)
        shape = (self.members, self.num_envs)
        reward = reward.reshape(shape)
        terminated, truncated = terminated.reshape(shape), truncated.reshape(shape)
        valid = ~self._prev_done
        self._ep_return = np.where(valid, self._ep_return + reward, 0.0)
        self._ep_length = np.where(valid, self._ep_length + 1, 0)
        done = terminated | truncated
        for member, env in zip(*np.nonzero(done)):
            episode = (float(self._ep_return[member, env]), int(self._ep_length[member, env]))
            self.episodes[member].append(episode)
            self.last_returns[member].append(episode[0])
            self.episode_count[member] += 1
        self._prev_done = done
        return EnvStep(self._obs(obs), reward, terminated, truncated, valid)

    def take_episodes(self) -> List[List[tuple[float, int]]]:
        """Episodes (return, length) finished since the last call, per member."""
        episodes, self.episodes = self.episodes, [[] for _ in range(self.members)]
        return episodes

    def close(self) -> None:
        self.vec.close()
