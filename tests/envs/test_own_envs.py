"""A user's environment: ``env.id=module:EnvId`` imports the module, then makes the id; one that keeps the
state protocol (``state_dict``/``load_state_dict``) is checkpointed exactly through it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlexp.config.schema import ConfigError, EnvConfig
from rlexp.envs.gym import PopulationEnv, check_env_id, exact_state, make_env


class Walk(gym.Env):
    """A random walk whose position is a Python list (no plain attribute): only its own state_dict saves it."""

    def __init__(self, saves: bool = True) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.trail = [0.0]
        if not saves:
            self.state_dict = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.trail = [float(self.np_random.normal())]
        return np.array(self.trail[-1:], np.float32), {}

    def step(self, action):
        self.trail.append(self.trail[-1] + (1 if action else -1) * float(self.np_random.random()))
        return np.array(self.trail[-1:], np.float32), 1.0, abs(self.trail[-1]) > 5, False, {}

    def state_dict(self):
        return {"trail": list(self.trail)}

    def load_state_dict(self, state):
        self.trail = [float(v) for v in state["trail"]]


ID = f"{__name__}:OwnWalk-v0"
if "OwnWalk-v0" not in gym.registry:
    gym.register(id="OwnWalk-v0", entry_point=Walk, max_episode_steps=30)


def test_module_colon_id_imports_the_module_then_makes_the_id():
    check_env_id(ID)
    assert isinstance(make_env(EnvConfig(id=ID)).unwrapped, Walk)
    with pytest.raises(ConfigError, match=r"env.id: unknown environment 'OwnWalk-v9'; did you mean OwnWalk-v0"):
        check_env_id(f"{__name__}:OwnWalk-v9")
    with pytest.raises(
        ConfigError, match=r"env.id: cannot import module 'no_such_module_x' of 'no_such_module_x:A-v0'"
    ):
        check_env_id("no_such_module_x:A-v0")


def test_an_env_with_the_state_protocol_continues_exactly():
    cfg = EnvConfig(id=ID, num_envs=2)
    a, b = PopulationEnv(cfg, [3, 4]), PopulationEnv(cfg, [5, 6])
    a.reset(), b.reset()
    rng = np.random.default_rng(0)
    for _ in range(7):
        a.step(rng.integers(0, 2, (2, 2)))
    assert all(exact_state(e) for e in a.envs)
    state = a.state_dict()
    b.load_state_dict({k: _as_loaded(v) for k, v in state.items()})
    assert not b.restarted
    for _ in range(40):  # episodes end and restart from each env's restored generator
        actions = rng.integers(0, 2, (2, 2))
        sa, sb = a.step(actions), b.step(actions)
        assert np.array_equal(sa.next_obs, sb.next_obs) and np.array_equal(sa.reward, sb.reward)


def test_an_env_without_it_restarts_its_episodes():
    env = make_env(EnvConfig(id=ID, kwargs={"saves": False}))
    assert not exact_state(env)


def _as_loaded(value):
    """A state value as a checkpoint gives it back: arrays as tensors (rlexp/config/state.py)."""
    import torch

    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    return value
