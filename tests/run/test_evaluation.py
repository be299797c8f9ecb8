"""Evaluation's pieces (rlexp/run/evaluation.py): a tiny network whose greedy action is known, evaluated
on CartPole with the evaluation seeds, returns what gymnasium's CartPole-v1 gives with those seeds and
that policy; each member counts exactly its first ``eval.episodes`` episodes, one per environment;
epsilon > 0 draws from evaluation's own stream; bad values; the console table. Its jobs are in
tests/jobs/test_evaluation_jobs.py."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from composing import compose_config
from omegaconf import OmegaConf
from rich.console import Console

from rlexp.algos import dqn
from rlexp.compose.validate import validate
from rlexp.config.schema import ActivationConfig, ConfigError, GainInitConfig, NetworkConfig, NormalizationConfig
from rlexp.envs.gym import EVALUATION, env_seeds
from rlexp.envs.normalize import ObsNormalizer
from rlexp.envs.streams import member_generator
from rlexp.nn.nets import PopMLP
from rlexp.run.evaluation import Evaluator
from rlexp.run.loggers import print_summary


def evaluator(seed: int, members: int, episodes: int, epsilon: float = 0.0) -> Evaluator:
    """An Evaluator on CartPole-v1 for members seeded seed, seed + 1, ... (no observation normalization)."""
    cfg = OmegaConf.to_object(
        compose_config([f"seed={seed}", f"num_seeds={members}", f"eval.episodes={episodes}", f"eval.epsilon={epsilon}"])
    )
    seeds = [seed + k for k in range(members)]
    return Evaluator(cfg, seeds, ObsNormalizer(cfg.obs_norm, members, 4))


def balancing_q_net(members: int) -> PopMLP:
    """Q(s) = [relu(-a), relu(a)] with a = theta + theta_dot: greedy pushes right exactly when a > 0."""
    net = PopMLP(
        members,
        4,
        2,
        NetworkConfig(name="mlp", hidden=[2]),
        ActivationConfig(name="relu"),
        NormalizationConfig(name="none"),
        GainInitConfig(name="he"),
        [torch.Generator().manual_seed(k) for k in range(members)],
    )
    with torch.no_grad():
        first, out = net.layers
        first.weight.copy_(torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, -1.0, -1.0]]))
        out.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
        first.bias.zero_()
        out.bias.zero_()
    net.eval()
    return net


def gymnasium_episode(seed: int, policy) -> tuple[float, int]:
    """(return, length) of one CartPole-v1 episode from reset(seed=seed), actions policy(obs)."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    total, length, done = 0.0, 0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(policy(obs, length))
        total, length, done = total + reward, length + 1, terminated or truncated
    env.close()
    return total, length


def balancing(obs: np.ndarray, _: int) -> int:
    return int(obs[2] + obs[3] > 0)


def test_greedy_evaluation_equals_gymnasium_with_the_evaluation_seeds():
    members, episodes, seed = 2, 3, 5  # 6 CartPoles: stepped together
    ev = evaluator(seed, members, episodes)
    policy = dqn.evaluation_policy(balancing_q_net(members).host_inference(), 2, 0.0, ev.uniform)
    result = ev.run(policy, np.ones(members, dtype=bool))
    assert result.returns.shape == result.lengths.shape == (members, episodes)
    for k in range(members):
        seeds = env_seeds(seed + k, episodes, EVALUATION)
        assert not set(seeds) & set(env_seeds(seed + k, episodes))  # never a training environment's seed
        expected = [gymnasium_episode(s, balancing) for s in seeds]
        assert result.returns[k].tolist() == [r for r, _ in expected]
        assert result.lengths[k].tolist() == [n for _, n in expected]
    assert result.lengths.max() > 50  # the policy balances: long episodes, not a trivial comparison
    # the same seeds at every evaluation, and a member's episodes are its own (independent of the population)
    again = ev.run(policy, np.ones(members, dtype=bool))
    alone = evaluator(seed + 1, 1, episodes)
    single = alone.run(
        dqn.evaluation_policy(balancing_q_net(1).host_inference(), 2, 0.0, alone.uniform), np.ones(1, bool)
    )
    assert np.array_equal(again.returns, result.returns) and np.array_equal(single.returns[0], result.returns[1])


def test_each_environment_counts_its_first_episode_only():
    """Environment 0 balances (long episodes), the others fall at once and reset many times meanwhile:
    each member still gets exactly eval.episodes episodes, each environment's first; a member left out
    is not counted and not waited for."""
    members, episodes, seed = 1, 3, 11  # 3 environments: stepped one after another

    def policy(obs: np.ndarray) -> np.ndarray:  # [P, N, 4] -> [P, N]
        actions = np.zeros(obs.shape[:2], dtype=np.int64)
        actions[:, 0] = obs[:, 0, 2] + obs[:, 0, 3] > 0
        return actions

    ev = evaluator(seed, members, episodes)
    result = ev.run(policy, np.ones(members, dtype=bool))
    seeds = env_seeds(seed, episodes, EVALUATION)
    expected = [gymnasium_episode(s, balancing if i == 0 else lambda obs, t: 0) for i, s in enumerate(seeds)]
    assert result.lengths[0].tolist() == [n for _, n in expected]
    assert result.returns[0].tolist() == [r for r, _ in expected]
    assert expected[0][1] > 3 * max(n for _, n in expected[1:])  # the short ones ended several episodes meanwhile

    pair = evaluator(seed, 2, episodes)
    skipped = pair.run(policy, np.array([False, True]))
    assert skipped.returns[0].tolist() == [0.0] * episodes and skipped.lengths[1].min() > 0


def test_epsilon_draws_from_evaluations_own_stream():
    """eval.epsilon=1: every action is random, from the member's evaluation stream (purpose 4)."""
    members, episodes, seed = 2, 2, 3
    ev = evaluator(seed, members, episodes, epsilon=1.0)
    policy = dqn.evaluation_policy(balancing_q_net(members).host_inference(), 2, 1.0, ev.uniform)
    result = ev.run(policy, np.ones(members, dtype=bool))
    for k in range(members):
        draws = torch.rand(4_096, generator=member_generator(seed + k, 4), dtype=torch.float64).numpy()
        seeds = env_seeds(seed + k, episodes, EVALUATION)
        for i, s in enumerate(seeds):  # step t of environment i uses draws[2N t + N + i]
            random_policy = lambda obs, t, i=i, u=draws: int(u[2 * episodes * t + episodes + i] * 2)  # noqa: E731
            assert (result.returns[k, i], result.lengths[k, i]) == gymnasium_episode(s, random_policy)


@pytest.mark.parametrize(
    "key,value",
    [("eval.episodes", -1), ("eval.every", -10), ("eval.epsilon", 1.5), ("eval.epsilon", -0.1)],
)
def test_bad_eval_value_is_one_line_naming_the_key(key, value):
    with pytest.raises(ConfigError) as err:
        validate(compose_config([f"{key}={value}"]))
    message = str(err.value)
    assert err.value.key == key and message.startswith(f"config error: {key}: {value}") and "\n" not in message


def test_console_table_says_which_return_it_shows():
    member = {"seed": 0, "status": "ok", "final_return": 21.5, "episodes": 9, "steps": 100, "wall_s": 1.0}
    for members, titles in (([member], ["train return"]), ([{**member, "eval_return": 187.25}], ["eval return"])):
        console = Console(record=True, width=200)
        print_summary(console, "t", members)
        text = console.export_text()
        assert all(t in text for t in titles) and "21.5" in text
    assert "187.2" in text
