"""Actor-critic jobs (PPO, A2C, DDPG, TD3, SAC) through rlexp.train.run_job: a member poisoned with NaN
diverges alone and leaves the others bitwise unchanged; short runs' returns rise above a random
policy's."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from composing import compose_config

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra)
from rlexp.train import run_job

torch.set_num_threads(1)


QUIET = ["logger.mode=disabled", "logger.progress=off", "device=cpu", "threads=1"]


# ====================================================================== end to end
def read_metrics(out: Path, k: int) -> list[dict]:
    return [
        {key: v for key, v in json.loads(line).items() if not key.startswith("perf/")}
        for line in (out / f"seed_{k}" / "metrics.jsonl").read_text().splitlines()
    ]


RUNS = {
    "ppo": ["algo=ppo", "total_steps=2048", "algo.num_steps=32", "env.num_envs=2", "network.hidden=[16,16]"],
    "a2c_lstm": [  # recurrent rollouts, Monte-Carlo value targets: also the LSTM's smoke run
        "algo=a2c",
        "network=lstm",
        "algo.value_target=mc",
        "total_steps=2048",
        "algo.num_steps=16",
        "env.num_envs=2",
        "network.cell_size=8",
        "network.hidden=[8]",
    ],
    "ppo_tanh_normal": [
        "algo=ppo",
        "env=pendulum",
        "algo.continuous_policy=tanh_normal",
        "total_steps=1024",
        "algo.num_steps=32",
        "env.num_envs=2",
        "network.hidden=[16,16]",
    ],
    "td3": [
        "algo=td3",
        "env=pendulum",
        "total_steps=800",
        "algo.learning_starts=300",
        "algo.batch_size=32",
        "network.hidden=[16,16]",
    ],
    "sac": [
        "algo=sac",
        "env=pendulum",
        "total_steps=800",
        "algo.learning_starts=300",
        "algo.batch_size=32",
        "network.hidden=[16,16]",
    ],
}


@pytest.mark.parametrize("algo", sorted(RUNS))
def test_poisoned_member_diverges_alone_and_the_others_are_bitwise_unchanged(algo, tmp_path):
    base = RUNS[algo] + ["num_seeds=3", "logger.log_every=200", "diagnostics.every=5", *QUIET]
    step = 400 if algo == "td3" else 512
    runs = {}
    for name, extra in (
        ("base", []),
        ("poisoned", ["debug.inject.member=1", f"debug.inject.step={step}", "debug.inject.what=param"]),
    ):
        runs[name] = (tmp_path / name, run_job(compose_config(base + extra), tmp_path / name))
    (base_out, base_job), (out, job) = runs["base"], runs["poisoned"]
    assert base_job["counts"]["ok"] == 3
    assert job["counts"] == {"ok": 2, "diverged": 1, "crashed": 0}
    member = job["members"][1]
    assert member["status"] == "diverged" and member["diverged_at_step"] >= step
    assert member["divergence"]["cause"] == "nonfinite_param"
    assert member["divergence"]["where"] == ("critic.0.weight_ih" if algo == "a2c_lstm" else "critic.0.weight")
    for k in (0, 2):
        records = read_metrics(out, k)
        assert records == read_metrics(base_out, k), k
        assert any("grad_norm/actor.0" in r and "grad_norm/critic.0" in r for r in records)


def random_return(env_id: str, episodes: int = 20) -> float:
    env = gym.make(env_id)
    env.action_space.seed(0)
    total = 0.0
    for i in range(episodes):
        env.reset(seed=i)
        done = False
        while not done:
            _, r, terminated, truncated, _ = env.step(env.action_space.sample())
            total += r
            done = terminated or truncated
    return total / episodes


SMOKE = {
    "ppo": (["+experiment=cleanrl_ppo", "total_steps=20000"], "CartPole-v1"),
    "a2c": (["algo=a2c", "total_steps=20000"], "CartPole-v1"),
    "td3": (
        [
            "+experiment=td3_pendulum",
            "total_steps=6000",
            "algo.learning_starts=500",
            "algo.batch_size=64",
            "optimizer.lr=3e-3",
        ],
        "Pendulum-v1",
    ),
}


@pytest.mark.parametrize("algo", sorted(SMOKE))
def test_short_run_returns_rise_above_a_random_policy(algo, tmp_path):
    overrides, env_id = SMOKE[algo]
    normalize = ["obs_norm.enabled=true"] if algo != "td3" else []
    job = run_job(compose_config(overrides + ["num_seeds=2", *normalize, *QUIET]), tmp_path)
    random = random_return(env_id)
    # the episodes of the last logged interval (1000 steps)
    final = [read_metrics(tmp_path, k)[-1]["episode/return"] for k in range(2)]
    assert job["counts"]["ok"] == 2
    # CartPole: a random policy lasts ~22 steps; Pendulum: ~-1200 per episode
    margin = 2.0 * random if random > 0 else 0.8 * random
    assert np.mean(final) > margin, (final, random)
    if not normalize:
        assert not (tmp_path / "seed_0" / "normalization.json").exists()
        return
    saved = json.loads((tmp_path / "seed_0" / "normalization.json").read_text())
    assert saved["reward"] is None and len(saved["obs"]["mean"]) == gym.make(env_id).observation_space.shape[0]
    assert saved["obs"]["count"] == pytest.approx(
        job["members"][0]["steps"] + compose_config(overrides).env.num_envs, abs=1e-3
    )


@pytest.mark.parametrize("network", ["mlp", "lstm"])
def test_ppo_bootstraps_a_truncated_episode_from_its_final_observation(network, monkeypatch, tmp_path):
    """Every step a transition: where an episode is truncated, the value GAE bootstraps from is V(the
    episode's final observation), as acting's critic gives it (the LSTM's state carried on), not V(the
    next episode's first); elsewhere it is the next step's value."""
    import inspect

    from rlexp.algos import ppo
    from rlexp.envs.gym import PopulationEnv

    steps = []  # every training step's result, in order (evaluation is off)
    real_step, real_gae = PopulationEnv.step, ppo.gae
    monkeypatch.setattr(PopulationEnv, "step", lambda env, actions: steps.append(real_step(env, actions)) or steps[-1])
    truncations = []

    def gae(rewards, values, next_values, terminated, dones, *args):
        loop = inspect.currentframe().f_back.f_locals  # ppo.train's, between its rollout and its update
        T = values.shape[0]
        for t, res in enumerate(steps[-T:]):
            truncated = torch.from_numpy(res.truncated & ~res.terminated)  # terminated: no bootstrap
            if truncated.any():
                final = loop["final_values"][t]
                assert torch.equal(next_values[t][truncated], final[truncated])
                if network == "mlp":  # the critic on the final observations (obs_norm off: as they are)
                    with torch.no_grad():
                        direct = loop["value_of"](torch.from_numpy(res.obs)).squeeze(-1)
                    assert torch.equal(final[truncated], direct[truncated])
                truncations.append(int(truncated.sum()))
            following = values[t + 1] if t + 1 < T else loop["last_value"]
            assert torch.equal(next_values[t][~truncated], following[~truncated])
        return real_gae(rewards, values, next_values, terminated, dones, *args)

    monkeypatch.setattr(ppo, "gae", gae)
    overrides = ["algo=ppo", "total_steps=512", "algo.num_steps=32", "env.num_envs=2", "env.max_episode_steps=12"]
    overrides += [f"network={network}", "algo.num_minibatches=2", "num_seeds=2", "eval.episodes=0", *QUIET]
    job = run_job(compose_config(overrides), tmp_path)
    assert job["status"] == "ok" and len(steps) == 512 // 2
    assert sum(truncations) > 10  # episodes were truncated inside rollouts
