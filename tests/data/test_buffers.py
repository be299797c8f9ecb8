"""Replay buffers (rlexp/data/buffers.py): rows added in order and wrapped, a sample is floor(u × size) per
member, only the rows held are sampled, continuous actions stored."""

from __future__ import annotations

import math

import numpy as np
import torch

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra)
from rlexp.data.buffers import ReplayBuffer
from rlexp.envs.streams import MemberStreams

torch.set_num_threads(1)


def test_replay_stores_continuous_actions():
    P, E, O, A = 2, 3, 3, 2
    buf = ReplayBuffer(P, 8, O, torch.device("cpu"), action_dim=A)
    obs, nxt = np.random.rand(P, E, O).astype(np.float32), np.random.rand(P, E, O).astype(np.float32)
    actions = np.random.rand(P, E, A).astype(np.float32)
    buf.add(obs, actions, np.ones((P, E)), nxt, np.zeros((P, E)), np.zeros((P, E), dtype=bool))
    batch = buf.sample(np.tile([[0.0, 0.34, 0.67]], (P, 1)))
    assert batch.actions.shape == (P, 3, A) and batch.actions.dtype == torch.float32
    np.testing.assert_array_equal(batch.actions.numpy(), actions)
    np.testing.assert_array_equal(batch.obs.numpy(), obs)


CPU = torch.device("cpu")


# ---------------------------------------------------------------- replay memory
def _replay_rows(P, E, step):
    """obs/next_obs/action/reward/terminated/done for one add: the obs carries a unique id per row."""
    ids = torch.tensor([[1000.0 * p + 10.0 * step + e + 1 for e in range(E)] for p in range(P)])
    obs = torch.stack([ids, ids + 0.5], -1)  # [P, E, 2]
    next_obs = obs + 0.25
    actions = torch.tensor([[(step + e) % 3 for e in range(E)] for _ in range(P)])
    rewards = 0.5 * ids
    terminated = torch.tensor([[float(e == 1) for e in range(E)] for _ in range(P)])
    return obs, actions, rewards, next_obs, terminated, terminated.bool()


def _row(obs, act, rew, nxt, term):
    return torch.cat([obs, nxt, torch.tensor([float(act), float(rew), float(term)])])


def test_replay_add_keeps_rows_in_order_and_wraps():
    P, C, O, E = 2, 5, 2, 3
    buf = ReplayBuffer(P, C, O, CPU)
    stored = [[] for _ in range(P)]  # every row, in order, per member
    for step in range(4):
        obs, actions, rewards, next_obs, terminated, done = _replay_rows(P, E, step)
        buf.add(obs, actions, rewards, next_obs, terminated, done)
        for p in range(P):
            for e in range(E):
                stored[p].append(_row(obs[p, e], actions[p, e], rewards[p, e], next_obs[p, e], terminated[p, e]))
        for p in range(P):
            n = len(stored[p])
            assert int(buf.size[p]) == min(n, C)
            assert int(buf.ptr[p]) == n % C
            for j in range(max(0, n - C), n):  # the C newest rows, row j at position j mod C
                torch.testing.assert_close(buf.data[p, j % C], stored[p][j], rtol=0, atol=0)
    assert buf.data.shape[1] == C  # no row besides the capacity


def test_replay_sample_is_floor_u_times_size_per_member():
    P, C, O, E = 2, 6, 2, 3
    buf = ReplayBuffer(P, C, O, CPU)
    obs, actions, rewards, next_obs, terminated, done = _replay_rows(P, E, 0)
    buf.add(obs, actions, rewards, next_obs, terminated, done)
    u = torch.tensor([[0.0, 0.3, 0.34, 0.5, 0.7, 0.999999], [0.999, 0.1, 0.6666, 0.67, 0.2, 0.4]], dtype=torch.float64)
    batch = buf.sample(u)
    assert batch.obs.shape == (P, 6, O) and batch.actions.dtype == torch.long
    for p in range(P):
        for b in range(u.shape[1]):
            j = math.floor(float(u[p, b]) * 3)
            torch.testing.assert_close(batch.obs[p, b], obs[p, j], rtol=0, atol=0)
            torch.testing.assert_close(batch.next_obs[p, b], obs[p, j] + 0.25, rtol=0, atol=0)
            assert int(batch.actions[p, b]) == int(actions[p, j])
            assert float(batch.rewards[p, b]) == 0.5 * float(obs[p, j][0])


def test_replay_samples_exactly_the_rows_held():
    P, C, O, E = 2, 4, 2, 3
    buf = ReplayBuffer(P, C, O, CPU)
    streams = MemberStreams([0, 1])
    for step in range(6):
        buf.add(*_replay_rows(P, E, step))
        batch = buf.sample(streams.uniform(4000))
        for p in range(P):
            sampled = set(batch.obs[p, :, 0].tolist())
            assert all(i > 0 for i in sampled)  # no empty (zero) row
            # exactly the rows held now are drawn (the oldest may have been overwritten)
            held = set(buf.data[p, : int(buf.size[p]), 0].tolist())
            assert sampled == held
