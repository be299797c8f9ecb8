"""Replay memory in one preallocated tensor with a member dimension: rows [P, capacity, fields]."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np
import torch


@dataclass
class Batch:
    obs: torch.Tensor  # [P, B, obs]
    actions: torch.Tensor  # [P, B] long
    rewards: torch.Tensor  # [P, B]
    next_obs: torch.Tensor  # [P, B, obs]
    terminated: torch.Tensor  # [P, B] 1.0 where the episode ended by termination


class ReplayBuffer:
    """Each member owns ``capacity`` rows, filled in order and overwritten oldest-first.

    A row packs (obs, next_obs, action, reward, terminated) as float32, so one step is one
    ``index_copy_`` and one minibatch one gather. Invalid rows (autoreset steps) go to a spare row
    past the end that is never sampled, so adding never waits for the host.
    """

    def __init__(self, members: int, capacity: int, obs_dim: int, device: torch.device) -> None:
        self.capacity = capacity
        self.rows = capacity + 1  # + the spare row for invalid transitions
        self.obs_dim = obs_dim
        self.device = device
        self.data = torch.zeros(members, self.rows, 2 * obs_dim + 3, device=device)  # [P, C+1, F]
        self.ptr = np.zeros(members, dtype=np.int64)  # next row to write, per member (host)
        self.size = torch.zeros(members, dtype=torch.long, device=device)  # valid rows held
        self._size = np.zeros(members, dtype=np.int64)
        self.member = torch.arange(members, device=device).unsqueeze(1)  # [P, 1]
        self._row_base = np.arange(members)[:, None] * self.rows  # [P, 1]

    def add(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        next_obs: torch.Tensor,
        terminated: torch.Tensor,
        valid: Union[np.ndarray, torch.Tensor],
    ) -> None:
        """Store one step of E environments per member: obs [P, E, obs], others [P, E].

        ``valid`` [P, E] booleans mark real transitions (a numpy array from the environments
        keeps this free of host synchronization).
        """
        if isinstance(valid, torch.Tensor):
            valid = valid.cpu().numpy()
        valid_count = valid.cumsum(1)  # [P, E]
        pos = np.where(valid, (self.ptr[:, None] + valid_count - 1) % self.capacity, self.capacity)
        flat = torch.from_numpy((self._row_base + pos).reshape(-1)).to(self.device)
        rows = torch.cat([obs, next_obs, actions.unsqueeze(-1).float(), rewards.unsqueeze(-1),
                          terminated.unsqueeze(-1)], dim=-1)  # [P, E, F]
        self.data.view(-1, self.data.shape[-1]).index_copy_(0, flat, rows.reshape(flat.numel(), -1))
        added = valid_count[:, -1]
        self.ptr = (self.ptr + added) % self.capacity
        if (self._size < self.capacity).any():  # the size stops changing once the memory is full
            self._size = np.minimum(self._size + added, self.capacity)
            self.size = torch.from_numpy(self._size).to(self.device)

    def sample(self, uniform: torch.Tensor) -> Batch:
        """A minibatch per member from uniform numbers [P, B] in [0, 1): row = floor(u * size)."""
        idx = (uniform * self.size.unsqueeze(1)).long()  # [P, B]
        rows = self.data[self.member, idx]  # [P, B, F]
        o = self.obs_dim
        return Batch(rows[..., :o], rows[..., 2 * o].long(), rows[..., 2 * o + 1], rows[..., o : 2 * o], rows[..., 2 * o + 2])
