"""Multi-agent worlds (rlexp/envs/marl.py: PettingZoo parallel, VMAS): a member steps as it would alone,
the step limit turned into a termination, per-agent spaces."""

import numpy as np
import pytest

pytest.importorskip("pettingzoo", reason="pip install -e '.[marl]'")
pytest.importorskip("mpe2", reason="pip install -e '.[marl]'")
pytest.importorskip("vmas", reason="pip install -e '.[marl]'")


from rlexp.config.schema import EnvConfig  # noqa: E402
from rlexp.envs.marl import population_env  # noqa: E402


# ====================================================================== environments
def random_actions(env, rng) -> list[np.ndarray]:
    shape = (env.members, env.num_envs)
    return [
        rng.integers(0, a.action_dim, shape) if a.discrete else rng.uniform(-1, 1, (*shape, a.action_dim))
        for a in env.agents
    ]


@pytest.mark.parametrize(
    "cfg",
    [
        EnvConfig(id="mpe2.simple_adversary_v3", api="pettingzoo", max_episode_steps=5),
        EnvConfig(id="balance", api="vmas", num_envs=2, max_episode_steps=5),
    ],
    ids=["pettingzoo", "vmas"],
)
def test_a_member_steps_as_it_would_alone(cfg):
    """Member 1 of seeds [0, 1] sees what a population of seed 1 alone sees (own seeds, own random state),
    with per-agent spaces, the team reward the agents' sum, and episodes reset at once."""
    pair, alone = population_env(cfg, [0, 1]), population_env(cfg, [1])
    assert np.array_equal(pair.reset()[1], alone.reset()[0])
    assert pair.obs_dim == sum(a.obs_dim for a in pair.agents)
    rng = np.random.default_rng(0)
    for _ in range(12):
        actions = random_actions(pair, rng)
        a, b = pair.step(actions), alone.step([x[1:] for x in actions])
        assert np.array_equal(a.next_obs[1], b.next_obs[0]) and np.array_equal(a.agent_reward[1], b.agent_reward[0])
        assert np.allclose(a.reward, a.agent_reward.sum(-1))
    episodes = pair.take_episodes()
    assert [n for _, n in episodes[0]] == [5, 5] * cfg.num_envs
    assert np.allclose(episodes[0][0][0], pair.agent_returns()[0][0].sum())
    pair.close(), alone.close()


@pytest.mark.parametrize("api, env_id", [("pettingzoo", "mpe2.simple_adversary_v3"), ("vmas", "balance")])
def test_timeout_terminal_turns_the_step_limit_into_a_termination(api, env_id):
    """env.timeout_terminal: the same steps, with each truncation reported as a termination instead."""
    runs = []
    for terminal in (False, True):
        env = population_env(
            EnvConfig(id=env_id, api=api, num_envs=2, max_episode_steps=4, timeout_terminal=terminal), [3]
        )
        env.reset()
        rng = np.random.default_rng(0)
        runs.append([env.step(random_actions(env, rng)) for _ in range(9)])
        env.close()
    for plain, terminal in zip(*runs):
        assert np.array_equal(plain.next_obs, terminal.next_obs)
        assert np.array_equal(terminal.terminated, plain.terminated | plain.truncated) and not terminal.truncated.any()
    assert sum(r.truncated.sum() for r in runs[0]) == 4  # steps 4 and 8 of both environments were cut


def test_simple_adversary_has_per_agent_spaces():
    env = population_env(EnvConfig(id="mpe2.simple_adversary_v3", api="pettingzoo"), [0])
    assert [(a.obs_dim, a.discrete, a.action_dim) for a in env.agents] == [(8, True, 5), (10, True, 5), (10, True, 5)]
    assert env.slices[1] == slice(8, 18)
