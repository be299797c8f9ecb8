"""Evaluation (rlexp/run/evaluation.py and each algorithm's deterministic policy).

Checked against direct computation: a tiny network whose greedy action is known, evaluated on
CartPole with the evaluation seeds, returns what gymnasium's CartPole-v1 gives with those seeds and
that policy; each member counts exactly its first ``eval.episodes`` episodes, one per environment;
epsilon > 0 draws from evaluation's own stream. End to end (DQN, PPO, TD3): evaluation leaves every
training metric bitwise unchanged, its records land at the expected log steps, and each member's
``eval_return`` is its last evaluation (a diverged member's last one before the divergence).
"""

from __future__ import annotations

import json
from pathlib import Path

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
from rlexp.train import run_job

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
QUIET = ["logger.mode=disabled", "logger.progress=off", "device=cpu", "threads=1"]


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


# ---------------------------------------------------------------- end to end
RUNS = {
    "dqn": [
        "total_steps=600",
        "num_seeds=2",
        "network.hidden=[16,16]",
        "algo.learning_starts=200",
        "algo.train_frequency=10",
        "algo.batch_size=32",
        "logger.log_every=100",
        "eval.every=200",
        "eval.episodes=3",
        # member 1 diverges at step 350: frozen, its eval_return stays its evaluation at step 200
        "debug.inject.what=param",
        "debug.inject.member=1",
        "debug.inject.step=350",
    ],
    "ppo": [
        "algo=ppo",
        "total_steps=512",
        "num_seeds=2",
        "network.hidden=[16,16]",
        "algo.num_steps=16",
        "logger.log_every=64",
        "eval.every=256",
        "eval.episodes=2",
        "obs_norm.enabled=true",  # evaluation reads the statistics and never folds its observations in
    ],
    "td3": [
        "algo=td3",
        "env=pendulum",
        "total_steps=500",
        "num_seeds=2",
        "network.hidden=[16,16]",
        "algo.learning_starts=200",
        "algo.batch_size=32",
        "logger.log_every=100",
        "eval.every=250",
        "eval.episodes=2",
    ],
}
EXPECTED_EVAL_STEPS = {"dqn": [200, 400, 600], "ppo": [256, 512], "td3": [300, 500]}


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def training_view(record: dict) -> dict:
    """A metrics record without perf/ (wall time) and eval/ keys: what evaluation must not change."""
    return {k: v for k, v in record.items() if not k.startswith(("perf/", "eval/"))}


@pytest.mark.parametrize("algo", sorted(RUNS))
def test_evaluation_leaves_training_bitwise_unchanged(algo, tmp_path):
    jobs = {}
    for name, extra in (("on", []), ("off", ["eval.episodes=0"])):
        jobs[name] = run_job(compose_config([*RUNS[algo], *QUIET, *extra]), tmp_path / name)
    for k, (on, off) in enumerate(zip(jobs["on"]["members"], jobs["off"]["members"])):
        metrics_on = read_metrics(tmp_path / "on" / f"seed_{k}" / "metrics.jsonl")
        metrics_off = read_metrics(tmp_path / "off" / f"seed_{k}" / "metrics.jsonl")
        assert [training_view(r) for r in metrics_on] == [training_view(r) for r in metrics_off]
        assert not any(k.startswith("eval/") for r in metrics_off for k in r) and off["eval_return"] is None
        assert {k: v for k, v in on.items() if k not in ("eval_return", "wall_s")} == {
            k: v for k, v in off.items() if k not in ("eval_return", "wall_s")
        }
        evaluated = [r for r in metrics_on if "eval/return" in r]
        diverged_at = on["diverged_at_step"] or np.inf  # a diverged member is frozen: no evaluation after it
        assert [r["step"] for r in evaluated] == [s for s in EXPECTED_EVAL_STEPS[algo] if s < diverged_at]
        assert on["eval_return"] == evaluated[-1]["eval/return"]
        for r in evaluated:
            assert r["eval/length"] > 0 and r["eval/return_std"] >= 0
    if algo == "dqn":
        assert [m["status"] for m in jobs["on"]["members"]] == ["ok", "diverged"]
    normalization = [tmp_path / run / "seed_0" / "normalization.json" for run in ("on", "off")]
    if normalization[0].exists():
        assert normalization[0].read_text() == normalization[1].read_text()
