"""Stacked frames stored once (FrameStackReplay, rlexp/data/buffers.py): uint8 frames, a sample bit for
bit the plain replay's, its checkpoint state, and the memory check counting two frames a row."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from composing import compose_config

P, B = 3, 5


def test_replay_keeps_frames_as_uint8():
    """frames=True: observations stored as uint8 (no float columns for them), sampled back as float32."""
    from rlexp.data.buffers import ReplayBuffer

    buffer = ReplayBuffer(2, 4, 3, torch.device("cpu"), frames=True)
    assert buffer.frames.dtype == torch.uint8 and buffer.data.shape[-1] == 3  # action | reward | terminated
    obs = torch.tensor([[[0, 1, 255]], [[7, 0, 1]]]).numpy().astype("float32")  # [P, E, obs]
    buffer.add(obs, [[1], [2]], [[0.5], [1.0]], obs[:, :, ::-1].copy(), [[0], [1]], [[True], [True]])
    batch = buffer.sample(torch.zeros(2, 1))
    assert batch.obs.dtype == torch.float32
    assert torch.equal(batch.obs, torch.from_numpy(obs))
    assert torch.equal(batch.next_obs, torch.from_numpy(obs[:, :, ::-1].copy()))
    assert batch.actions.tolist() == [[1], [2]] and batch.terminated.tolist() == [[0.0], [1.0]]


class _Frames(gym.Env):
    """uint8 [2, 3] frames (the step's count, then random bytes) whose episodes end, terminated or
    truncated, with probability 0.25 a step."""

    observation_space = gym.spaces.Box(0, 255, (2, 3), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        end = self.np_random.random() < 0.25
        return self._frame(), 1.0, end and self.t % 2 == 0, end and self.t % 2 == 1, {}

    def _frame(self):
        frame = self.np_random.integers(0, 256, (2, 3), dtype=np.uint8)
        frame[0, 0] = self.t % 256
        return frame


def _stacked_steps(members: int, num_envs: int, steps: int, seed: int = 0):
    """(obs, actions, rewards, next_obs, terminated, done) of ``steps`` vector steps of gymnasium's
    FrameStackObservation (4 frames, the first repeated at an episode's start) over ``_Frames``, stepped
    as PopulationEnv steps its environments: an episode that ends is reset within the step, and the next
    transition starts from the new episode's first stack."""
    from gymnasium.wrappers import FrameStackObservation

    P, E = members, num_envs
    envs = [FrameStackObservation(_Frames(), 4) for _ in range(P * E)]
    obs = np.stack([env.reset(seed=seed + k)[0] for k, env in enumerate(envs)]).reshape(P, E, 24)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        actions = rng.integers(0, 3, (P, E))
        next_obs, acting = np.zeros((P * E, 24), np.uint8), np.zeros((P * E, 24), np.uint8)
        terminated, done = np.zeros(P * E, dtype=bool), np.zeros(P * E, dtype=bool)
        for k, env in enumerate(envs):
            frame, _, terminated[k], truncated, _ = env.step(actions.flat[k])
            next_obs[k] = acting[k] = frame.reshape(-1)
            done[k] = terminated[k] or truncated
            if done[k]:  # reset within the step: the next transition starts from the new episode's stack
                acting[k] = env.reset()[0].reshape(-1)
        yield obs, actions, rng.random((P, E)), next_obs.reshape(P, E, 24), terminated.reshape(P, E), done.reshape(P, E)
        obs = acting.reshape(P, E, 24)


def test_frame_stack_replay_samples_what_the_plain_replay_samples_bit_for_bit():
    """Episodes that end often, P = 2 members x E = 3 environments, a capacity of 7 wrapped dozens of
    times: after every step, a minibatch drawn with the same uniform numbers is the same from
    FrameStackReplay as from ReplayBuffer(frames=True), field by field, bit for bit."""
    from gymnasium.wrappers import FrameStackObservation

    from rlexp.data.buffers import FrameStackReplay, ReplayBuffer
    from rlexp.envs.gym import frame_stack

    P, E, C = 2, 3, 7
    assert frame_stack(FrameStackObservation(_Frames(), 4)) == 4
    assert frame_stack(FrameStackObservation(_Frames(), 4, padding_type="zero")) == 1  # not its first frame
    plain = ReplayBuffer(P, C, 24, torch.device("cpu"), frames=True)
    shared = FrameStackReplay(P, C, 24, torch.device("cpu"), stack=4, num_envs=E)
    assert 4 * shared.frames[0, 0].numel() == plain.frames[0, 0].numel()  # a row: 2 frames instead of 8
    rng, resets = np.random.default_rng(1), 0
    for step in _stacked_steps(P, E, 200):
        plain.add(*step)
        shared.add(*step)
        resets += step[-1].sum()
        uniform = rng.random((P, 64))
        want, got = plain.sample(uniform), shared.sample(uniform)
        for field in ("obs", "actions", "rewards", "next_obs", "terminated"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert (shared.count > 20 * C).all()  # wrapped many times
    assert resets > 100 and (shared.prev == -1).any(1).all()  # many episodes, starts in the rows held


def test_frame_stack_replay_goes_on_bitwise_from_its_checkpoint_state():
    """The replay's state split per member and stacked back (as a checkpoint does) into a new replay:
    both sample the same and go on the same after more steps."""
    from rlexp.data.buffers import FrameStackReplay
    from rlexp.run.checkpoint import split, stack

    P, E = 2, 3
    steps = list(_stacked_steps(P, E, 90, seed=5))
    first = FrameStackReplay(P, 11, 24, torch.device("cpu"), stack=4, num_envs=E)
    for step in steps[:60]:
        first.add(*step)
    second = FrameStackReplay(P, 11, 24, torch.device("cpu"), stack=4, num_envs=E)
    second.load_state_dict(stack(*split(first.state_dict(), P)))
    rng = np.random.default_rng(2)
    for step in steps[60:]:
        first.add(*step)
        second.add(*step)
        uniform = rng.random((P, 32))
        a, b = first.sample(uniform), second.sample(uniform)
        assert torch.equal(a.obs, b.obs) and torch.equal(a.next_obs, b.next_obs) and torch.equal(a.actions, b.actions)


def test_the_memory_check_counts_two_frames_a_row_for_stacked_frames():
    """The replay memory a member of the zoo's Atari DQN needs: 2 of the 4 x 84 x 84 frames, the
    action | reward | terminated floats and the link per row, over buffer_size + 3 x num_envs rows."""
    from rlexp.compose.validate import memory_per_member

    cfg = compose_config(["+experiment=zoo_dqn_atari"])
    frame, rows = 84 * 84, cfg.algo.buffer_size + 3 * cfg.env.num_envs
    shared, _ = memory_per_member(cfg, 4 * frame, 4, frames=True, stack=4)
    plain, _ = memory_per_member(cfg, 4 * frame, 4, frames=True)
    assert shared == rows * (3 * 4 + 2 * frame + 8)
    assert plain == cfg.algo.buffer_size * (3 * 4 + 8 * frame)
