"""Population environments (rlexp/envs/gym.py): every step a transition (an ending episode reset within
it) and episode statistics from the rewards, stepping exactly as gymnasium's SyncVectorEnv, CartPoles
stepped together or one by one (and a state continued either way), the step limit as a termination,
member seeds, reset."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra)
from rlexp.config.schema import (
    EnvConfig,
)
from rlexp.envs.gym import PopulationEnv

torch.set_num_threads(1)


# ---------------------------------------------------------------- environments: every step a transition
def _fixed_actions(t: int, P: int, E: int) -> torch.Tensor:
    # per env its own pattern: constant pushes (terminate fast) and alternation (survive)
    patterns = [lambda t: 0, lambda t: t % 2, lambda t: 1, lambda t: (t // 2) % 2]
    return torch.tensor([[patterns[(p * E + e) % 4](t) for e in range(E)] for p in range(P)])


def test_every_step_is_a_transition_and_episode_stats_match_rewards():
    """An episode's ending step returns its final observation (``obs``) and the next episode's first
    (``next_obs``); no step only resets. Episode returns and lengths are the rewards' sums and counts."""
    P, E = 2, 2
    env = PopulationEnv(EnvConfig(id="CartPole-v1", num_envs=E, max_episode_steps=5), member_seeds=[0, 1])
    obs = env.reset()
    assert obs.shape == (P, E, 4)
    ret, length = np.zeros((P, E)), np.zeros((P, E), dtype=int)
    expected = [[] for _ in range(P)]
    ended = 0
    for t in range(23):
        res = env.step(_fixed_actions(t, P, E))
        assert res.obs.shape == res.next_obs.shape == (P, E, 4)
        assert (res.reward == 1.0).all()  # every step a transition of CartPole
        done = res.terminated | res.truncated
        np.testing.assert_array_equal(res.next_obs[~done], res.obs[~done])
        assert (np.abs(res.next_obs[done]) <= 0.05).all()  # a fresh CartPole start state
        assert (res.next_obs[done] != res.obs[done]).any(-1).all()  # the final observation kept apart
        ret += res.reward
        length += 1
        for p, e in zip(*np.nonzero(done)):
            expected[p].append((ret[p, e], length[p, e]))
            ret[p, e], length[p, e] = 0.0, 0
            ended += 1
        np.testing.assert_array_equal(env.observations(), res.next_obs)
    env.close()
    assert ended >= 8
    episodes = env.take_episodes()
    for p in range(P):
        # member order of episodes within one step is env order, as in ``expected``
        assert len(episodes[p]) == len(expected[p]) == int(env.episode_count[p])
        for (r, n), (er, en) in zip(episodes[p], expected[p]):
            assert r == pytest.approx(er) and n == en
        assert list(env.last_returns[p]) == pytest.approx([r for r, _ in expected[p][-10:]])
    assert env.take_episodes() == [[], []]  # read once


@pytest.mark.parametrize(
    "env_id, P, E, kwargs, limit, steps, together",
    [
        ("CartPole-v1", 1, 3, {}, 7, 40, False),  # one environment after another
        ("Pendulum-v1", 2, 3, {}, 7, 40, False),
        ("CartPole-v1", 4, 3, {}, 7, 40, True),  # CartPoles stepped together
        ("CartPole-v1", 1, 4, {}, 7, 40, True),  # a population of one
        ("CartPole-v1", 8, 2, {}, None, 300, True),  # 500-step TimeLimit: episodes end by the thresholds
        ("CartPole-v1", 3, 3, {"sutton_barto_reward": True}, None, 200, True),
    ],
)
def test_population_env_steps_exactly_as_gymnasium_sync_vector_env(env_id, P, E, kwargs, limit, steps, together):
    """Both ways of stepping return what gymnasium's SyncVectorEnv with SAME_STEP autoreset returns for
    the same seeds and actions: observations (the final ones as its ``final_obs``), rewards and flags, bit
    for bit, through autoresets. Observations lie in C order, so a member's matrix of them has the layout
    it has in any population (BLAS may round a product with a transposed matrix otherwise)."""
    cfg = EnvConfig(id=env_id, num_envs=E, max_episode_steps=limit, kwargs=kwargs)
    env = PopulationEnv(cfg, member_seeds=[4, 9, 1, 7, 3, 8, 2, 6][:P])
    assert (env.cartpoles is not None) == together
    sync = gym.make_vec(
        env_id,
        num_envs=P * E,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        max_episode_steps=limit,
        **kwargs,
    )
    np.testing.assert_array_equal(env.reset(), sync.reset(seed=env.seeds)[0].reshape(P, E, -1))
    rng = np.random.default_rng(0)
    resets, terminations = 0, 0
    for _ in range(steps):
        if env_id == "CartPole-v1":
            actions = rng.integers(0, 2, (P, E))
        else:
            actions = rng.uniform(-2, 2, (P, E, 1)).astype(np.float32)
        res = env.step(actions)
        obs, reward, terminated, truncated, info = sync.step(actions.reshape(P * E, *env.action_space.shape))
        done = terminated | truncated
        final = obs.copy()
        if done.any():
            final[done] = np.stack(info["final_obs"][done])
        np.testing.assert_array_equal(res.next_obs, obs.reshape(P, E, -1))
        assert res.obs.flags.c_contiguous and res.next_obs.flags.c_contiguous
        np.testing.assert_array_equal(res.obs, final.reshape(P, E, -1))
        np.testing.assert_array_equal(res.reward, reward.reshape(P, E))
        np.testing.assert_array_equal(res.terminated, terminated.reshape(P, E))
        np.testing.assert_array_equal(res.truncated, truncated.reshape(P, E))
        if together:  # the float64 states too, which float32 observations would round away
            np.testing.assert_array_equal(env.cartpoles.state.T, [e.unwrapped.state for e in sync.envs])
        resets += int(done.sum())
        terminations += int(terminated.sum())
    assert resets >= P * E  # the comparison went through autoresets
    assert terminations > 0 or limit is not None  # the thresholds ended episodes, too
    env.close()
    sync.close()


@pytest.mark.parametrize("saved_together", [True, False], ids=["together_to_alone", "alone_to_together"])
def test_a_cartpole_state_continues_whichever_way_the_next_population_steps(saved_together):
    """CartPoles stepped together and one by one save one form: a state saved by one way continues in
    the other bit for bit as it would have, through time limits and terminations (a packed grid that
    regroups its cells on resume steps them in another population)."""
    from rlexp.run.checkpoint import split, stack

    cfg = EnvConfig(id="CartPole-v1", num_envs=2, max_episode_steps=30)
    seeds = [3, 8]

    def stepped(together: bool, actions: list[np.ndarray]) -> PopulationEnv:
        env = PopulationEnv(cfg, seeds, together=together)
        env.reset()
        for a in actions:
            env.step(a)
        return env

    rng = np.random.default_rng(1)
    actions = [rng.integers(0, 2, (2, 2)) for _ in range(120)]
    reference = stepped(True, actions)  # uninterrupted
    first = stepped(saved_together, actions[:57])
    own, shared = split(first.state_dict(), 2)  # through the checkpoint's own split and stack
    resumed = stepped(not saved_together, [])
    resumed.load_state_dict(stack(own, shared))
    assert (first.cartpoles is not None) == saved_together and (resumed.cartpoles is None) == saved_together
    ended = 0
    again = stepped(True, actions[:57])
    for a in actions[57:]:
        expected, result = again.step(a), resumed.step(a)
        for name in ("obs", "reward", "terminated", "truncated", "next_obs"):
            np.testing.assert_array_equal(getattr(result, name), getattr(expected, name), err_msg=name)
        ended += int((expected.terminated | expected.truncated).sum())
    assert ended > 2 and reference.episode_count.tolist() == resumed.episode_count.tolist()


@pytest.mark.parametrize("E", [1, 4], ids=["one_after_another", "together"])
def test_timeout_terminal_turns_the_step_limit_into_a_termination(E):
    """env.timeout_terminal: the same steps, with each truncation reported as a termination instead."""
    runs = []
    for terminal in (False, True):
        env = PopulationEnv(
            EnvConfig(id="CartPole-v1", num_envs=E, max_episode_steps=6, timeout_terminal=terminal), [5]
        )
        env.reset()
        rng = np.random.default_rng(0)
        runs.append([env.step(rng.integers(0, 2, (1, E))) for _ in range(40)])
    for plain, terminal in zip(*runs):
        np.testing.assert_array_equal(terminal.obs, plain.obs)
        np.testing.assert_array_equal(terminal.next_obs, plain.next_obs)
        np.testing.assert_array_equal(terminal.terminated, plain.terminated | plain.truncated)
        assert not terminal.truncated.any()
    assert sum(r.truncated.sum() for r in runs[0]) > 0


def test_population_env_steps_cartpoles_together_only_when_it_is_the_same():
    """Together needs 4+ environments of gymnasium's own CartPole: not for fewer, not for another
    environment, not when rendered (the single environment's render call would be skipped)."""

    def together(id, P, **kwargs):
        return PopulationEnv(EnvConfig(id=id, num_envs=1, kwargs=kwargs), list(range(P))).cartpoles is not None

    assert together("CartPole-v1", 4)
    assert not together("CartPole-v1", 3)
    assert not together("Acrobot-v1", 8)
    assert not together("CartPole-v1", 8, render_mode="rgb_array")


def test_population_env_episode_records_are_the_same_both_ways(monkeypatch):
    """Episode returns, lengths, counts and the last 10 returns do not depend on the way of stepping."""
    records = []
    for min_together in (10**9, 8):  # one by one, then together
        monkeypatch.setattr(PopulationEnv, "MIN_TOGETHER", min_together)
        env = PopulationEnv(EnvConfig(id="CartPole-v1", num_envs=4, max_episode_steps=30), member_seeds=[5, 2])
        assert (env.cartpoles is not None) == (min_together == 8)
        env.reset()
        rng = np.random.default_rng(1)
        episodes = []
        for _ in range(200):
            env.step(rng.integers(0, 2, (2, 4)))
            episodes.append(env.take_episodes())
        records.append((episodes, env.episode_count.tolist(), [list(d) for d in env.last_returns]))
        env.close()
    assert records[0] == records[1]
    assert sum(records[0][1]) > 20
    assert all(isinstance(r, float) and isinstance(n, int) for step in records[1][0] for m in step for r, n in m)


def test_population_env_member_seeds_are_independent_of_population():
    """Member with seed 7 sees the same episode in populations [3, 7] and [9, 7]."""
    runs = []
    for seeds in ([3, 7], [9, 7]):
        env = PopulationEnv(EnvConfig(id="CartPole-v1", num_envs=2, max_episode_steps=6), member_seeds=seeds)
        traj = [torch.as_tensor(env.reset()[1]).clone()]
        for t in range(10):
            traj.append(torch.as_tensor(env.step(_fixed_actions(t, 2, 2)).obs[1]).clone())
        first = env.reset()[0, 0].copy()  # member 0's first env, for the contrast below
        env.close()
        runs.append((torch.stack(traj), first))
    assert torch.equal(runs[0][0], runs[1][0])
    assert not np.array_equal(runs[0][1], runs[1][1])  # members with seeds 3 and 9 do differ


def test_population_env_reset_starts_episode_bookkeeping_afresh():
    env = PopulationEnv(EnvConfig(id="CartPole-v1", num_envs=1, max_episode_steps=5), member_seeds=[0])
    env.reset()
    for _ in range(3):
        env.step(torch.zeros(1, 1, dtype=torch.long))
    env.reset()  # a fresh start: the TimeLimit truncates 5 steps after this
    rewards = []
    while True:
        res = env.step(torch.tensor([[len(rewards) % 2]]))
        rewards.append(float(res.reward[0, 0]))
        if res.terminated[0, 0] or res.truncated[0, 0]:
            break
    env.close()
    assert env.take_episodes()[0] == [(sum(rewards), len(rewards))]
