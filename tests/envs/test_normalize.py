"""Observation and reward normalization (rlexp/envs/normalize.py) against numpy and the written-out
formulas, per member, with masks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra)
from rlexp.config.schema import (
    ObsNormConfig,
    RewardNormConfig,
)
from rlexp.envs.normalize import ObsNormalizer, RewardScaler, RunningMeanStd

torch.set_num_threads(1)


# ====================================================================== normalization
def test_running_mean_std_matches_numpy_per_member():
    g = np.random.default_rng(0)
    chunks = [g.normal(3.0, 2.0, size=(2, 5, 4)) for _ in range(6)]
    rms = RunningMeanStd(2, 4)
    for x in chunks:
        rms.update(x)
    for k in range(2):
        data = np.concatenate([x[k] for x in chunks])
        np.testing.assert_allclose(rms.mean[k], data.mean(0), rtol=1e-4)
        np.testing.assert_allclose(rms.var[k], data.var(0), rtol=1e-3)
        assert rms.count[k] == pytest.approx(len(data) + 1e-4)


def test_observation_normalizer_is_x_minus_mean_over_std_plus_eps_clipped():
    norm = ObsNormalizer(ObsNormConfig(enabled=True, clip=1.5), members=2, obs_dim=3)
    data = np.random.default_rng(1).normal(5, 3, size=(2, 40, 3))
    norm.update(data)
    x = np.random.default_rng(2).normal(5, 6, size=(2, 4, 3))
    expected = np.clip((x - norm.stats.mean[:, None]) / (np.sqrt(norm.stats.var[:, None]) + 1e-8), -1.5, 1.5)
    np.testing.assert_allclose(norm(x), expected, rtol=1e-5)
    np.testing.assert_allclose(norm.tensor(torch.tensor(x, dtype=torch.float32)).numpy(), expected, rtol=1e-5)
    assert (np.abs(norm(x)) == 1.5).any()
    off = ObsNormalizer(ObsNormConfig(enabled=False), 2, 3)
    assert off(x) is x


def test_reward_scaler_divides_by_the_std_of_the_discounted_return():
    P, E, T, gamma = 1, 2, 30, 0.9
    g = np.random.default_rng(3)
    rewards = g.normal(1.0, 2.0, size=(T, P, E))
    dones = g.random((T, P, E)) < 0.1
    scaler = RewardScaler(RewardNormConfig(enabled=True, clip=100.0), P, E, gamma)
    returns, seen = np.zeros((P, E)), []
    for t in range(T):
        out = scaler(rewards[t], dones[t])
        returns = returns * gamma + rewards[t]
        seen.extend(returns[0].tolist())
        np.testing.assert_allclose(out, rewards[t] / np.sqrt(np.var(seen) + 1e-8), rtol=1e-4)
        returns = np.where(dones[t], 0.0, returns)
