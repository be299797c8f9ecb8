"""Replay memory in one preallocated tensor with a member dimension: rows [P, capacity, fields]."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def take_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` [P * M] (member k's from its own block k*N ...) of x [P, N, ...] -> [P, M, ...],
    in one index_select."""
    members = x.shape[0]
    return x.reshape(members * x.shape[1], *x.shape[2:]).index_select(0, rows).view(members, -1, *x.shape[2:])


@dataclass
class Batch:
    obs: torch.Tensor  # [P, B, obs]
    actions: torch.Tensor  # [P, B] long (discrete) or [P, B, A] float (continuous)
    rewards: torch.Tensor  # [P, B]
    next_obs: torch.Tensor  # [P, B, obs]
    terminated: torch.Tensor  # [P, B] 1.0 where the episode ended by termination


class ReplayBuffer:
    """Each member owns ``capacity`` rows, filled in order and overwritten oldest-first.

    A row packs (obs, next_obs, action, reward, terminated) as float32, so one step is one write and
    one minibatch one gather. ``action_dim`` 0 stores a discrete action index, A > 0 a vector.
    With ``frames`` (uint8 image observations: MinAtar, Atari) obs | next_obs go to a uint8 tensor of
    their own (``frames``, a quarter of the float32 bytes) and come back as float32 when sampled.
    """

    def __init__(
        self,
        members: int,
        capacity: int,
        obs_dim: int,
        device: torch.device,
        action_dim: int = 0,
        frames: bool = False,
    ) -> None:
        self.capacity = capacity
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self._action_width = max(action_dim, 1)
        self.device = device
        self._obs_width = 0 if frames else obs_dim  # float32 columns of obs (and of next_obs)
        # a row: obs | next_obs | action | reward | terminated
        self._reward_col = 2 * self._obs_width + self._action_width
        self.data = torch.zeros(members, capacity, self._reward_col + 2, device=device)  # [P, C, F]
        self.frames = (  # [P, C, 2 * obs] uint8: obs | next_obs
            torch.zeros(members, capacity, 2 * obs_dim, dtype=torch.uint8, device=device) if frames else None
        )
        self.ptr = np.zeros(members, dtype=np.int64)  # next row to write, per member (host)
        self.size = np.zeros(members, dtype=np.int64)  # rows held, per member (host)
        self._filling = True  # some member's memory is not full yet
        self._row_base = np.arange(members)[:, None] * capacity  # [P, 1]
        self._member_np = np.arange(members)[:, None]  # [P, 1]
        self._host = self.data.numpy() if self.data.device.type == "cpu" else None  # shares memory
        self._host_frames = self.frames.numpy() if self.frames is not None and self._host is not None else None

    @classmethod
    def member_bytes(
        cls, capacity: int, obs_dim: int, action_dim: int = 0, frames: bool = False, stack: int = 1, num_envs: int = 1
    ) -> int:
        """Bytes one member's memory takes, as ``__init__`` lays it out (``stack``, ``num_envs``: unused)."""
        obs_width = 0 if frames else obs_dim
        floats = 2 * obs_width + max(action_dim, 1) + 2  # obs | next_obs | action | reward | terminated
        return capacity * (4 * floats + (2 * obs_dim if frames else 0))

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        done: np.ndarray,
    ) -> None:
        """Store one step of E environments per member: obs [P, E, obs], actions [P, E] or [P, E, A],
        the others [P, E] (``done``: the episode ended, by termination or truncation; the transition
        replay keeps no episodes and does not read it).

        Inputs are host arrays (CPU tensors work too). On the CPU the rows are written through a numpy
        view of the storage; on a GPU they go over in one copy.
        """
        members, num_envs = np.shape(rewards)
        pos = (self.ptr[:, None] + np.arange(num_envs)) % self.capacity  # [P, E]
        rows = self._rows(obs, actions, rewards, next_obs, terminated)
        frames = None
        if self.frames is not None:
            frames = np.empty((members, num_envs, 2 * self.obs_dim), dtype=np.uint8)  # [P, E, 2 * obs]
            frames[..., : self.obs_dim] = obs
            frames[..., self.obs_dim :] = next_obs
        self._write(pos, rows, frames)
        self.ptr = (self.ptr + num_envs) % self.capacity
        if self._filling:  # the size stops changing once every member's memory is full
            self.size = np.minimum(self.size + num_envs, self.capacity)
            self._filling = bool((self.size < self.capacity).any())

    def _rows(
        self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray, terminated: np.ndarray
    ) -> np.ndarray:
        """One step's float32 rows [P, E, F]: obs | next_obs (none when kept as frames) | action | reward |
        terminated."""
        members, num_envs = np.shape(rewards)
        rows = np.empty((members, num_envs, self.data.shape[-1]), dtype=np.float32)
        o, a = self._obs_width, self._reward_col
        rows[..., :o] = obs if o else 0.0
        rows[..., o : 2 * o] = next_obs if o else 0.0
        rows[..., 2 * o : a] = np.asarray(actions).reshape(members, num_envs, self._action_width)
        rows[..., a] = rewards
        rows[..., a + 1] = terminated
        return rows

    def _write(self, pos: np.ndarray, rows: np.ndarray, frames: np.ndarray | None) -> None:
        """Rows [P, E, F] (and uint8 frames [P, E, ...]) at each member's rows ``pos`` [P, E]: through the
        numpy view of the storage on the CPU, in one copy each on a GPU."""
        if self._host is not None:
            self._host[self._member_np, pos] = rows
            if frames is not None:
                self._host_frames[self._member_np, pos] = frames
            return
        flat = torch.from_numpy((self._row_base + pos).reshape(-1)).to(self.device)
        self.data.view(-1, self.data.shape[-1]).index_copy_(
            0, flat, torch.from_numpy(rows).to(self.device).flatten(0, 1)
        )
        if frames is not None:
            values = torch.from_numpy(frames).to(self.device).flatten(0, 1)
            self.frames.view(-1, *self.frames.shape[2:]).index_copy_(0, flat, values)

    def sample(self, uniform: np.ndarray | torch.Tensor) -> Batch:
        """A minibatch per member from uniform numbers [P, B] in [0, 1): row = floor(u * size)."""
        if isinstance(uniform, torch.Tensor):
            uniform = uniform.cpu().numpy()
        idx = (uniform * self.size[:, None]).astype(np.int64)  # [P, B] row within each member's memory
        flat = torch.from_numpy((self._row_base + idx).reshape(-1)).to(self.device)  # [P * B] row of data
        rows = take_rows(self.data, flat)  # [P, B, F]
        o, a = self._obs_width, self._reward_col
        actions = rows[..., 2 * o : a] if self.action_dim else rows[..., 2 * o].long()
        if self.frames is None:
            obs, next_obs = rows[..., :o], rows[..., o : 2 * o]
        else:
            frames = take_rows(self.frames, flat).float()  # [P, B, 2 * obs]
            obs, next_obs = frames[..., : self.obs_dim], frames[..., self.obs_dim :]
        return Batch(obs, actions, rows[..., a], next_obs, rows[..., a + 1])

    def state_dict(self) -> dict[str, Any]:
        """The rows [P, R, F] (and uint8 frames [P, R, ...]), each member's write position and size, and
        whether some member's memory is still filling."""
        frames = {} if self.frames is None else {"frames": self.frames}
        return {"data": self.data, "ptr": self.ptr, "size": self.size, "filling": self._filling} | frames

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():  # in place: the host views of the storage stay valid
            self.data.copy_(state["data"].to(self.device))
            if self.frames is not None:
                self.frames.copy_(state["frames"].to(self.device))
        self.ptr, self.size = state["ptr"].numpy().copy(), state["size"].numpy().copy()
        self._filling = state["filling"]


class FrameStackReplay(ReplayBuffer):
    """A transition replay for observations that stack the last ``stack`` frames (Atari's [4, 84, 84],
    oldest first, an episode's first stack its first frame repeated: gymnasium's FrameStackObservation
    with ``padding_type="reset"``) that keeps each transition's two newest frames only: the newest of
    obs and of next_obs, uint8. The older frames of obs are the newest ones of the same environment's
    previous transitions (``prev``: their row, -1 at an episode's first), so a row costs 2 frames
    instead of ``2 * stack`` (Atari: 14 KB instead of 56 KB).

    Sampling gives what ``ReplayBuffer`` gives, bit for bit, for the same uniform numbers: logical row
    p holds the newest transition whose count is p modulo ``capacity``, and the rows are a ring of
    ``capacity + (stack - 1) * num_envs`` so the previous transitions of every row held are still
    there (an environment writes at most one row per vector step). ``count`` [P] is the transitions
    stored per member, ``last`` [P, E] each environment's newest row while its episode goes on.
    """

    def __init__(self, members: int, capacity: int, obs_dim: int, device: torch.device, stack: int, num_envs: int):
        self.capacity, self.obs_dim, self.device = capacity, obs_dim, device
        self.action_dim, self._action_width, self._obs_width = 0, 1, 0
        self._reward_col = 1  # a row of data: action | reward | terminated
        self.stack, self.frame = stack, obs_dim // stack
        self.ring = capacity + (stack - 1) * num_envs
        self.ptr = np.zeros(members, dtype=np.int64)  # as ReplayBuffer's: the next logical row
        self.size = np.zeros(members, dtype=np.int64)
        self._filling = True
        self.data = torch.zeros(members, self.ring, self._reward_col + 2, device=device)  # [P, R, F]
        self.frames = torch.zeros(members, self.ring, 2, self.frame, dtype=torch.uint8, device=device)
        self.prev = np.full((members, self.ring), -1, dtype=np.int64)  # [P, R] previous row, same episode
        self.last = np.full((members, num_envs), -1, dtype=np.int64)  # [P, E] newest row of an episode going on
        self.count = np.zeros(members, dtype=np.int64)
        self._row_base = np.arange(members)[:, None] * self.ring  # [P, 1]
        self._member_np = np.arange(members)[:, None]  # [P, 1]
        self._host = self.data.numpy() if self.data.device.type == "cpu" else None
        self._host_frames = self.frames.numpy() if self._host is not None else None

    @classmethod
    def member_bytes(
        cls, capacity: int, obs_dim: int, action_dim: int = 0, frames: bool = True, stack: int = 4, num_envs: int = 1
    ) -> int:
        """Bytes one member's memory takes, as ``__init__`` lays it out: per row of the ring action | reward |
        terminated as float32, two uint8 frames and the int64 link ``prev``."""
        rows = capacity + (stack - 1) * num_envs
        return rows * (4 * 3 + 2 * (obs_dim // stack) + 8)

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        done: np.ndarray,
    ) -> None:
        """Store one step of E environments per member (as ``ReplayBuffer.add``): each transition's newest
        frames and its link to the environment's previous transition; after a ``done`` [P, E] the
        environment's next transition starts its next episode."""
        members, num_envs = np.shape(rewards)
        pos = (self.count[:, None] + np.arange(num_envs)) % self.ring  # [P, E]
        rows = self._rows(obs, actions, rewards, next_obs, terminated)  # [P, E, 3]: action | reward | terminated
        newest = np.empty((members, num_envs, 2, self.frame), dtype=np.uint8)  # [P, E, 2, frame]
        newest[:, :, 0] = np.asarray(obs).reshape(members, num_envs, self.stack, self.frame)[:, :, -1]
        newest[:, :, 1] = np.asarray(next_obs).reshape(members, num_envs, self.stack, self.frame)[:, :, -1]
        self.prev[self._member_np, pos] = self.last
        self.last = np.where(done, -1, pos)
        self._write(pos, rows, newest)
        self.count += num_envs
        self.ptr = self.count % self.capacity
        self.size = np.minimum(self.count, self.capacity)
        self._filling = bool((self.size < self.capacity).any())

    def sample(self, uniform: np.ndarray | torch.Tensor) -> Batch:
        """A minibatch per member from uniform numbers [P, B] in [0, 1): the transitions ``ReplayBuffer``
        would give, their stacks put together from the rows' newest frames."""
        if isinstance(uniform, torch.Tensor):
            uniform = uniform.cpu().numpy()
        idx = (uniform * self.size[:, None]).astype(np.int64)  # [P, B] logical row
        count = idx + self.capacity * ((self.count[:, None] - 1 - idx) // self.capacity)  # its transition's count
        row = count % self.ring  # [P, B]
        chain = np.empty((*row.shape, self.stack), dtype=np.int64)  # [P, B, K] rows of obs's frames, newest last
        chain[..., -1] = row
        for k in range(self.stack - 2, -1, -1):  # back through the episode; its first frame repeats
            back = self.prev[self._member_np, chain[..., k + 1]]
            chain[..., k] = np.where(back >= 0, back, chain[..., k + 1])
        # frames [P, R, 2, frame] as [P * R * 2, frame]: obs's frames (slot 0 of the chain's rows), then
        # next_obs's newest (slot 1 of the row)
        frame_index = np.concatenate([chain * 2, row[..., None] * 2 + 1], -1) + self._row_base[..., None] * 2
        flat = torch.from_numpy(frame_index.reshape(-1)).to(self.device)
        frames = self.frames.view(-1, self.frame).index_select(0, flat).view(*row.shape, self.stack + 1, self.frame)
        frames = frames.float()  # [P, B, K + 1, frame]
        rows = take_rows(self.data, torch.from_numpy((self._row_base + row).reshape(-1)).to(self.device))
        a = self._reward_col
        actions = rows[..., 0].long()
        obs = frames[:, :, :-1].reshape(*row.shape, self.obs_dim)
        next_obs = frames[:, :, 1:].reshape(*row.shape, self.obs_dim)
        return Batch(obs, actions, rows[..., a], next_obs, rows[..., a + 1])

    def state_dict(self) -> dict[str, Any]:
        """``ReplayBuffer``'s, and the links: ``prev`` [P, R], ``last`` [P, E], ``count`` [P]."""
        return super().state_dict() | {"prev": self.prev, "last": self.last, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.prev, self.last, self.count = (state[name].numpy().copy() for name in ("prev", "last", "count"))


@dataclass
class SequenceBatch:
    """Windows of ``L`` consecutive steps of one environment, per member; index j = 0 .. L-1 of a window."""

    obs: torch.Tensor  # [P, B, L, obs]
    actions: torch.Tensor  # [P, B, L] long
    rewards: torch.Tensor  # [P, B, L]
    next_obs: torch.Tensor  # [P, B, L, obs]
    terminated: torch.Tensor  # [P, B, L] 1.0 where the episode ended by termination at this step
    done: torch.Tensor  # [P, B, L] 1.0 where it ended (terminated or truncated)
    stored: torch.Tensor  # [P, B, L] bool: step j is the environment's j-th step after the window's first


class SequenceReplay(ReplayBuffer):
    """Replay of trajectories: each member keeps, per environment, a ring of ``capacity // E`` steps in
    the order they happened, so a window of consecutive steps is one gather (unrolled models).

    A row packs obs | next_obs | action | reward | terminated | done | n (the environment's count of
    stored steps at this one): consecutive rows of a ring are consecutive steps. ``ptr`` [P, E] counts
    the steps stored per environment (the ring's write position is ptr % capacity), ``size`` [P, E] the
    rows held; its state (``state_dict``) is theirs and ``data``'s, as for the transition replay.
    """

    def __init__(self, members: int, capacity: int, num_envs: int, obs_dim: int, device: torch.device) -> None:
        self.ring = max(capacity // num_envs, 1)  # steps per environment
        self.num_envs, self.obs_dim, self.device = num_envs, obs_dim, device
        self.capacity = self.ring * num_envs
        self._reward_col = 2 * obs_dim + 1
        self.data = torch.zeros(members, self.capacity, self._reward_col + 4, device=device)  # [P, E * ring, F]
        self.ptr = np.zeros((members, num_envs), dtype=np.int64)
        self.size = np.zeros((members, num_envs), dtype=np.int64)
        self._filling = True  # kept for the state dict's layout (ReplayBuffer's)
        self.frames = None  # observations are stored as float32 rows (no uint8 frames)
        self._row_base = np.arange(members)[:, None] * self.capacity  # [P, 1]
        self._env_base = np.arange(num_envs)[None, :] * self.ring  # [1, E]

    @classmethod
    def member_bytes(
        cls, capacity: int, obs_dim: int, action_dim: int = 0, frames: bool = False, stack: int = 1, num_envs: int = 1
    ) -> int:
        """Bytes one member's memory takes, as ``__init__`` lays it out: ``num_envs`` rings of
        ``capacity // num_envs`` rows of obs | next_obs | action | reward | terminated | done | n."""
        return max(capacity // num_envs, 1) * num_envs * 4 * (2 * obs_dim + 5)

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        done: np.ndarray,
    ) -> None:
        """Store one step of E environments per member (host arrays: obs [P, E, obs], the others [P, E])."""
        members, num_envs = np.shape(rewards)
        rows = np.empty((members, num_envs, self.data.shape[-1]), dtype=np.float32)  # [P, E, F]
        o, a = self.obs_dim, self._reward_col
        rows[..., :o] = obs
        rows[..., o : 2 * o] = next_obs
        rows[..., 2 * o] = actions
        rows[..., a] = rewards
        rows[..., a + 1] = terminated
        rows[..., a + 2] = done
        rows[..., a + 3] = self.ptr
        pos = self._row_base + self._env_base + self.ptr % self.ring  # [P, E]
        flat = torch.from_numpy(pos.reshape(-1)).to(self.device)
        values = torch.from_numpy(rows.reshape(members * num_envs, -1)).to(self.device)
        self.data.view(-1, self.data.shape[-1]).index_copy_(0, flat, values)
        self.ptr += 1
        self.size = np.minimum(self.ptr, self.ring)

    def sample_windows(self, uniform: np.ndarray, length: int) -> SequenceBatch:
        """Windows of ``length`` steps per member from uniform numbers [P, 2B] in [0, 1): the first B
        pick the environment, the last B the window's first step among the rows it holds. A window
        may run past the newest step or into the next episode: ``stored`` and ``done`` say where."""
        batch = uniform.shape[1] // 2
        env = (uniform[:, :batch] * self.num_envs).astype(np.int64)  # [P, B]
        held = np.maximum(np.take_along_axis(self.size, env, 1), 1)
        oldest = np.take_along_axis(self.ptr, env, 1) - held  # count of the oldest row held
        start = oldest + (uniform[:, batch:] * held).astype(np.int64)  # [P, B] counts
        counts = start[..., None] + np.arange(length)  # [P, B, L]
        pos = self._env_base[0, env][..., None] + counts % self.ring
        flat = torch.from_numpy((self._row_base[:, :, None] + pos).reshape(-1)).to(self.device)
        rows = take_rows(self.data, flat).view(uniform.shape[0], batch, length, -1)  # [P, B, L, F]
        o, a = self.obs_dim, self._reward_col
        expected = torch.from_numpy(counts).to(self.device, torch.float32)
        return SequenceBatch(
            obs=rows[..., :o],
            actions=rows[..., 2 * o].long(),
            rewards=rows[..., a],
            next_obs=rows[..., o : 2 * o],
            terminated=rows[..., a + 1],
            done=rows[..., a + 2],
            stored=rows[..., a + 3] == expected,
        )
