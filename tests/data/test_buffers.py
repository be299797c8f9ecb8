"""Replay buffers (rlexp/data/buffers.py): valid rows added in order and wrapped, a sample is
floor(u × size) per member, invalid rows never sampled, continuous actions stored."""

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
    buf.add(obs, actions, np.ones((P, E)), nxt, np.zeros((P, E)), np.ones((P, E), dtype=bool))
    batch = buf.sample(np.tile([[0.0, 0.34, 0.67]], (P, 1)))
    assert batch.actions.shape == (P, 3, A) and batch.actions.dtype == torch.float32
    np.testing.assert_array_equal(batch.actions.numpy(), actions)
    np.testing.assert_array_equal(batch.obs.numpy(), obs)


CPU = torch.device("cpu")


# ---------------------------------------------------------------- replay memory
def _replay_rows(P, E, step, valid):
    """obs/next_obs/action/reward/terminated for one add: the obs carries a unique id per row."""
    ids = torch.tensor([[1000.0 * p + 10.0 * step + e + 1 for e in range(E)] for p in range(P)])
    if not valid.all():
        ids = torch.where(torch.as_tensor(valid), ids, -ids)  # invalid rows have negative ids
    obs = torch.stack([ids, ids + 0.5], -1)  # [P, E, 2]
    next_obs = obs + 0.25
    actions = torch.tensor([[(step + e) % 3 for e in range(E)] for _ in range(P)])
    rewards = 0.5 * ids
    terminated = torch.tensor([[float(e == 1) for e in range(E)] for _ in range(P)])
    return obs, actions, rewards, next_obs, terminated


def _row(obs, act, rew, nxt, term):
    return torch.cat([obs, nxt, torch.tensor([float(act), float(rew), float(term)])])


def test_replay_add_keeps_valid_rows_in_order_and_wraps():
    P, C, O, E = 2, 5, 2, 3
    buf = ReplayBuffer(P, C, O, CPU)
    masks = [
        [[True, False, True], [True, True, True]],
        [[False, False, False], [True, False, False]],
        [[True, True, True], [False, True, True]],
        [[True, True, False], [True, True, True]],
    ]
    stored = [[] for _ in range(P)]  # every valid row, in order, per member
    for step, mask in enumerate(masks):
        valid = np.array(mask)
        obs, actions, rewards, next_obs, terminated = _replay_rows(P, E, step, valid)
        # the numpy mask and a torch mask are the same thing
        buf.add(obs, actions, rewards, next_obs, terminated, valid if step % 2 == 0 else torch.tensor(mask))
        for p in range(P):
            for e in range(E):
                if mask[p][e]:
                    stored[p].append(_row(obs[p, e], actions[p, e], rewards[p, e], next_obs[p, e], terminated[p, e]))
        for p in range(P):
            n = len(stored[p])
            assert int(buf.size[p]) == min(n, C)
            assert int(buf.ptr[p]) == n % C
            for j in range(max(0, n - C), n):  # the C newest rows, row j at position j mod C
                torch.testing.assert_close(buf.data[p, j % C], stored[p][j], rtol=0, atol=0)
    assert [len(s) for s in stored] == [7, 9]  # both members wrapped around


def test_replay_sample_is_floor_u_times_size_per_member():
    P, C, O, E = 2, 6, 2, 2
    buf = ReplayBuffer(P, C, O, CPU)
    valid = np.array([[True, True], [True, False]])
    obs, actions, rewards, next_obs, terminated = _replay_rows(P, E, 0, valid)
    buf.add(obs, actions, rewards, next_obs, terminated, valid)
    valid2 = np.array([[True, False], [True, True]])
    obs2, actions2, rewards2, next_obs2, terminated2 = _replay_rows(P, E, 1, valid2)
    buf.add(obs2, actions2, rewards2, next_obs2, terminated2, valid2)
    # member 0 holds rows (step0,e0), (step0,e1), (step1,e0); member 1 holds (step0,e0), (step1,e0), (step1,e1)
    held = [[obs[0, 0], obs[0, 1], obs2[0, 0]], [obs[1, 0], obs2[1, 0], obs2[1, 1]]]
    acts = [[actions[0, 0], actions[0, 1], actions2[0, 0]], [actions[1, 0], actions2[1, 0], actions2[1, 1]]]
    u = torch.tensor([[0.0, 0.3, 0.34, 0.5, 0.7, 0.999999], [0.999, 0.1, 0.6666, 0.67, 0.2, 0.4]], dtype=torch.float64)
    batch = buf.sample(u)
    assert batch.obs.shape == (P, 6, O) and batch.actions.dtype == torch.long
    for p in range(P):
        for b in range(u.shape[1]):
            j = math.floor(float(u[p, b]) * 3)
            torch.testing.assert_close(batch.obs[p, b], held[p][j], rtol=0, atol=0)
            torch.testing.assert_close(batch.next_obs[p, b], held[p][j] + 0.25, rtol=0, atol=0)
            assert int(batch.actions[p, b]) == int(acts[p][j])
            assert float(batch.rewards[p, b]) == 0.5 * float(held[p][j][0])


def test_replay_never_samples_invalid_rows():
    P, C, O, E = 2, 4, 2, 3
    buf = ReplayBuffer(P, C, O, CPU)
    g = np.random.default_rng(0)
    streams = MemberStreams([0, 1])
    valid_ids = [set() for _ in range(P)]
    for step in range(6):
        valid = g.random((P, E)) < 0.5
        valid[:, 0] |= step == 0  # something valid from the start
        obs, actions, rewards, next_obs, terminated = _replay_rows(P, E, step, valid)
        buf.add(obs, actions, rewards, next_obs, terminated, valid)
        batch = buf.sample(streams.uniform(4000))
        for p in range(P):
            for e in range(E):
                if valid[p, e]:
                    valid_ids[p].add(float(obs[p, e, 0]))
            sampled = set(batch.obs[p, :, 0].tolist())
            assert all(i > 0 for i in sampled)  # no invalid (negative id) row, no empty (zero) row
            assert sampled <= valid_ids[p]
            # exactly the rows held now are drawn (the oldest may have been overwritten)
            held = set(buf.data[p, : int(buf.size[p]), 0].tolist())
            assert sampled == held
