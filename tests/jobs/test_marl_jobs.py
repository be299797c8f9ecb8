"""Multi-agent jobs (MADDPG, MAPPO on PettingZoo and VMAS): smoke runs with per-agent metrics, a poisoned
member diverging alone, the actor-first update, the logged exploration noise, diagnostics of every
policy and the critic."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo", reason="pip install -e '.[marl]'")
pytest.importorskip("mpe2", reason="pip install -e '.[marl]'")
pytest.importorskip("vmas", reason="pip install -e '.[marl]'")

from composing import compose_config

from rlexp.train import run_job  # noqa: E402

QUIET = ["logger.mode=disabled", "logger.progress=off", "device=cpu", "threads=1"]
TINY = ["algo=maddpg", "network.hidden=[16,16]", "algo.batch_size=32", "eval.episodes=1", "eval.every=0", *QUIET]


def read_metrics(out: Path, k: int) -> list[dict]:
    return [
        {key: v for key, v in json.loads(line).items() if not key.startswith("perf/")}
        for line in (out / f"seed_{k}" / "metrics.jsonl").read_text().splitlines()
    ]


# ====================================================================== runs
def test_maddpg_smoke_on_each_env_family_with_per_agent_metrics(tmp_path):
    for name, extra in {
        "pettingzoo": ["env=simple_spread", "total_steps=300", "algo.learning_starts=100"],
        "vmas": [
            "env=vmas_navigation",
            "env.num_envs=2",
            "env.max_episode_steps=20",
            "total_steps=300",
            "algo.learning_starts=100",
        ],
    }.items():
        job = run_job(compose_config(TINY + extra + ["logger.log_every=150", "diagnostics.every=2"]), tmp_path / name)
        assert job["counts"]["ok"] == 1, name
        last = read_metrics(tmp_path / name, 0)[-1]
        for key in (
            "train/agent0/critic_grad_norm",
            "train/agent1/actor_grad_norm_post_clip",
            "agent0/action_repeat_rate",
            "agent1/action_entropy",
            "agent0/policy/saturated",
            "train/agent0/q_mean",
            "episode/return_agent1",
            "eval/return",
        ):
            assert key in last, (name, key)


@pytest.mark.parametrize("shared", [False, True], ids=["per_agent", "shared"])
def test_poisoned_member_diverges_alone_and_the_others_are_bitwise_unchanged(tmp_path, shared):
    """A poisoned member diverges alone (at agent 0's critic, or the shared one) while the others run
    bitwise as without it; shared networks log under shared/, the collapse instruments stay per agent."""
    base = TINY + [
        f"algo.share_parameters={shared}",
        "env=simple_spread",
        "num_seeds=3",
        "total_steps=300",
        "algo.learning_starts=100",
        "logger.log_every=100",
        "diagnostics.every=2",
    ]
    poison = ["debug.inject.member=1", "debug.inject.step=150", "debug.inject.what=param"]
    base_job = run_job(compose_config(base), tmp_path / "base")
    job = run_job(compose_config(base + poison), tmp_path / "poisoned")
    assert base_job["counts"]["ok"] == 3
    assert job["counts"] == {"ok": 2, "diverged": 1, "crashed": 0}
    member = job["members"][1]
    assert member["divergence"]["cause"] == "nonfinite_param"
    assert member["divergence"]["where"] == f"{'shared' if shared else 'agent0'}.critic.0.weight"
    for k in (0, 2):
        assert read_metrics(tmp_path / "poisoned", k) == read_metrics(tmp_path / "base", k), k
    last = read_metrics(tmp_path / "base", 0)[-1]
    owners = ["shared"] if shared else ["agent0", "agent1", "agent2"]
    assert {k.split("/")[1] for k in last if k.startswith("train/") and k.endswith("/q_mean")} == set(owners)
    assert "agent2/action_repeat_rate" in last


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per_agent"])
def test_actor_first_moves_the_actor_against_the_critic_before_its_step(tmp_path, monkeypatch, shared):
    """One gradient step. Each critic's forward for its loss (its parameters trainable) is followed by
    its forward for the actor's loss (frozen): with ``algo.actor_first`` the second sees the critic's
    parameters unchanged, without it the parameters after the critic's step. The critics end the same
    either way, the actors not."""
    from rlexp.nn.nets import PopMLP
    from rlexp.run.checkpoint import FILE

    calls, plain = [], PopMLP.forward

    def forward(self, x, extra=None, **kw):
        if extra is not None and torch.is_grad_enabled():  # a critic, for a loss (targets run without grad)
            calls.append((next(self.parameters()).requires_grad, [p.detach().clone() for p in self.parameters()]))
        return plain(self, x, extra, **kw)

    monkeypatch.setattr(PopMLP, "forward", forward)
    ends = {}
    for first in (True, False):
        calls.clear()
        overrides = TINY + [f"algo.share_parameters={shared}", f"algo.actor_first={first}", "env=simple_spread"]
        overrides += ["env.num_envs=1", "total_steps=40", "algo.learning_starts=39", "algo.train_frequency=1"]
        overrides += ["algo.gradient_steps=1", "diagnostics.every=0", "checkpoint.every=40"]
        run_job(compose_config(overrides), tmp_path / str(first))
        assert [trainable for trainable, _ in calls] == [True, False] * (1 if shared else 3)
        for (_, before), (_, seen) in zip(calls[::2], calls[1::2]):
            assert all(torch.equal(a, b) for a, b in zip(before, seen)) == first
        ends[first] = torch.load(tmp_path / str(first) / "seed_0" / FILE, weights_only=True)["state"]
    critics = [k for k in ends[True] if ".critic/" in k]
    actors = [k for k in ends[True] if ".actor/" in k]
    assert critics and all(torch.equal(ends[True][k], ends[False][k]) for k in critics)
    assert not all(torch.equal(ends[True][k], ends[False][k]) for k in actors)


@pytest.mark.parametrize("every", [0, 40])
def test_maddpg_logs_the_noise_its_continuous_agents_act_with(tmp_path, every):
    """train/exploration_noise at each log step is the std the last vector step acted with: the schedule
    after the steps taken before it, held through each batch of exploration_anneal_every steps."""
    schedule = dict(exploration_noise=0.8, exploration_noise_end=0.0, exploration_anneal_steps=80)
    overrides = [f"algo.{k}={v}" for k, v in schedule.items()] + [f"algo.exploration_anneal_every={every}"]
    run = ["env=vmas_navigation", "env.num_envs=2", "env.max_episode_steps=20", "total_steps=120"]
    job = run_job(compose_config(TINY + run + overrides + ["algo.learning_starts=40", "logger.log_every=20"]), tmp_path)
    assert job["counts"]["ok"] == 1
    logged = {r["step"]: r["train/exploration_noise"] for r in read_metrics(tmp_path, 0)}
    want = {20: 0.8, 40: 0.8, 60: 0.4, 80: 0.4, 100: 0.0, 120: 0.0} if every else {
        s: 0.8 * (1 - (s - 2) / 80) if s - 2 < 80 else 0.0 for s in range(20, 121, 20)
    }  # fmt: skip
    assert logged == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize(
    "policy",
    [
        ["algo.share_parameters=false"],
        # BenchMARL's MAPPO: one tanh-squashed policy without the agent's index, one value for every agent
        ["algo.continuous_policy=tanh_normal", "algo.agent_index=false", "algo.shared_value=true"],
    ],
    ids=["separate", "tanh_normal_shared_value"],
)
def test_mappo_smoke_on_vmas(tmp_path, policy):
    overrides = [
        "algo=mappo",
        "env=vmas_balance",
        "env.num_envs=2",
        "env.max_episode_steps=20",
        "algo.num_steps=32",
        "total_steps=128",
        *policy,
        "network.hidden=[16,16]",
        "logger.log_every=64",
        "eval.episodes=1",
        *QUIET,
    ]
    job = run_job(compose_config(overrides), tmp_path)
    assert job["counts"]["ok"] == 1
    last = read_metrics(tmp_path, 0)[-1]
    actor = "actor2" if "algo.share_parameters=false" in policy else "actor0"
    assert {f"train/{actor}_grad_norm", "train/critic_loss", "agent1/action_entropy", "eval/return"} <= set(last)
    assert np.isfinite(last["eval/return"]) and np.isfinite(last["train/entropy"])


def test_mappo_with_diagnostics_records_every_policys_and_the_critics_layers(tmp_path):
    overrides = [
        "algo=mappo",
        "env=simple_spread",
        "algo.share_parameters=false",
        "algo.num_steps=16",
        "total_steps=64",
        "network.hidden=[16,16]",
        "logger.log_every=32",
        "diagnostics.every=1",
        "eval.episodes=0",
        *QUIET,
    ]
    run_job(compose_config(overrides), tmp_path)
    last = read_metrics(tmp_path, 0)[-1]
    for net in ("actor0", "actor1", "actor2", "critic"):
        for key in ("grad_norm", "grad_norm_post", "param_norm", "update_ratio"):
            assert all(np.isfinite(last[f"{key}/{net}.{layer}"]) for layer in range(3)), f"{key}/{net}"
        assert {f"dormant/{net}.0", f"srank/{net}.1"} <= set(last)
    assert not any(key.startswith("grad_norm/actor3") for key in last)
    assert last["v/abs_max"] >= max(abs(last["v/min"]), abs(last["v/max"]))
