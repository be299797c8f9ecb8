"""DQN jobs through rlexp.train.run_job: the loop stores every step as a transition (truncation
bootstraps, termination does not), the output contract of a tiny run, a divergence is a result,
threads=-1, gradients written without autograd only where exact."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from composing import compose_config

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra)
from rlexp.algos import dqn as dqn_module
from rlexp.algos.common import epsilon
from rlexp.data.buffers import ReplayBuffer
from rlexp.envs.gym import PopulationEnv
from rlexp.nn.nets import PopMLP
from rlexp.optim.pipeline import CAUSES
from rlexp.train import population_threads, run_job

torch.set_num_threads(1)


def _row(obs, act, rew, nxt, term):
    return torch.cat([obs, nxt, torch.tensor([float(act), float(rew), float(term)])])


# ---------------------------------------------------------------- the training loop's storage
# evaluation off: these runs record every step of the (training) environments
TINY = [
    "logger.mode=disabled",
    "logger.progress=off",
    "network.hidden=[16,16]",
    "device=cpu",
    "threads=1",
    "eval.episodes=0",
]


class _EnvRecorder:
    """Patches PopulationEnv.reset/step to record what the environments returned and got."""

    def __init__(self, monkeypatch):
        self.resets, self.steps, self.actions = [], [], []
        real_reset, real_step = PopulationEnv.reset, PopulationEnv.step
        rec = self

        def reset(env):
            obs = real_reset(env)
            rec.resets.append(torch.as_tensor(obs).clone())
            return obs

        def step(env, actions):
            rec.actions.append(torch.as_tensor(actions).clone())
            res = real_step(env, actions)
            recorded = copy.deepcopy(res)
            recorded.obs, recorded.next_obs = torch.as_tensor(recorded.obs), torch.as_tensor(recorded.next_obs)
            rec.steps.append(recorded)
            return res

        monkeypatch.setattr(PopulationEnv, "reset", reset)
        monkeypatch.setattr(PopulationEnv, "step", step)


def _is_cartpole_start(x: torch.Tensor) -> bool:
    return bool((x.abs() <= 0.05).all())


def _is_cartpole_terminal(x: torch.Tensor) -> bool:
    return bool(x[0].abs() > 2.4 or x[2].abs() > 12 * 2 * math.pi / 360)


@pytest.fixture(scope="module")
def recorded_dqn_run(tmp_path_factory):
    """A real dqn.train run (P=2, E=2, random actions, short time limit) with its replay memory and
    every environment step recorded."""
    mp = pytest.MonkeyPatch()
    buffers = []

    class RecordingBuffer(ReplayBuffer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            buffers.append(self)

    try:
        mp.setattr(dqn_module, "ReplayBuffer", RecordingBuffer)
        envrec = _EnvRecorder(mp)
        cfg = compose_config(
            TINY
            + [
                "total_steps=400",
                "num_seeds=2",
                "env.num_envs=2",
                "env.max_episode_steps=15",
                "algo.end_e=1.0",
                "algo.learning_starts=300",
                "algo.train_frequency=50",
                "algo.batch_size=16",
                "algo.buffer_size=1000",
                "logger.log_every=100",
            ]
        )
        out = tmp_path_factory.mktemp("recorded")
        job = run_job(cfg, out)
    finally:
        mp.undo()
    assert len(buffers) == 1
    return job, buffers[0], envrec


def _expected_transitions(envrec, P, E):
    """Per member, the transitions dqn.train should store, in storage order: (env, row, done, truncated)."""
    out = [[] for _ in range(P)]
    prev = envrec.resets[0]
    assert len(envrec.resets) == 1
    for actions, res in zip(envrec.actions, envrec.steps):
        for p in range(P):
            for e in range(E):
                row = _row(prev[p, e], actions[p, e], res.reward[p, e], res.obs[p, e], float(res.terminated[p, e]))
                out[p].append((e, row, bool(res.terminated[p, e]), bool(res.truncated[p, e])))
        prev = res.next_obs
    return out


def test_training_loop_stores_every_step_as_a_transition(recorded_dqn_run):
    """Every step of every environment is stored, the ending ones with their final observation: 400 env
    steps per member make 400 transitions (no step only resets)."""
    job, buf, envrec = recorded_dqn_run
    assert job["status"] == "ok"
    P, E = 2, 2
    assert len(envrec.steps) == 400 // E
    expected = _expected_transitions(envrec, P, E)
    assert sum(int((s.terminated | s.truncated).sum()) for s in envrec.steps) > 10  # episodes ended and ...
    assert [len(x) for x in expected] == [400] * P  # ... every step is a transition
    for p in range(P):
        assert int(buf.size[p]) == len(expected[p]) <= buf.capacity
        for j, (_, row, _, _) in enumerate(expected[p]):
            torch.testing.assert_close(buf.data[p, j], row, rtol=0, atol=0)


def test_stored_transitions_chain_per_env_and_never_start_from_a_final_observation(recorded_dqn_run):
    _, buf, envrec = recorded_dqn_run
    P, E, O = 2, 2, 4
    expected = _expected_transitions(envrec, P, E)
    checked_chain = checked_reset = 0
    for p in range(P):
        rows = buf.data[p, : int(buf.size[p])]
        envs = [e for e, _, _, _ in expected[p]]
        done = [d or tr for _, _, d, tr in expected[p]]
        final_obs = {tuple(rows[j, O : 2 * O].tolist()) for j in range(len(rows)) if done[j]}
        for j in range(len(rows)):
            assert tuple(rows[j, :O].tolist()) not in final_obs  # no row starts from a final observation
            later = [k for k in range(j + 1, len(rows)) if envs[k] == envs[j]]
            if not later:
                continue
            k = later[0]
            if done[j]:
                assert not torch.equal(rows[k, :O], rows[j, O : 2 * O])
                assert _is_cartpole_start(rows[k, :O])
                checked_reset += 1
            else:
                assert torch.equal(rows[k, :O], rows[j, O : 2 * O])
                checked_chain += 1
    assert checked_chain > 100 and checked_reset > 10


def test_truncation_bootstraps_termination_does_not(recorded_dqn_run):
    """Stored terminated flag: 1 for terminations, 0 for time-limit truncations (and ordinary steps)."""
    _, buf, envrec = recorded_dqn_run
    P, E, O = 2, 2, 4
    expected = _expected_transitions(envrec, P, E)
    n_term = n_trunc = 0
    for p in range(P):
        for j, (_, _, terminated, truncated) in enumerate(expected[p]):
            stored = float(buf.data[p, j, 2 * O + 2])
            next_obs = buf.data[p, j, O : 2 * O]
            if terminated:
                assert stored == 1.0 and _is_cartpole_terminal(next_obs)
                n_term += 1
            else:
                assert stored == 0.0
                n_trunc += truncated
                if truncated:
                    assert not _is_cartpole_terminal(next_obs)
    assert n_term > 0 and n_trunc > 0


# ---------------------------------------------------------------- end to end
def _read_metrics(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_tiny_training_run_writes_the_output_contract(tmp_path, monkeypatch):
    envrec = _EnvRecorder(monkeypatch)
    total, starts, freq, gsteps, log_every = 600, 200, 50, 4, 100
    cfg = compose_config(
        TINY
        + [
            f"total_steps={total}",
            "num_seeds=2",
            f"algo.learning_starts={starts}",
            f"algo.train_frequency={freq}",
            f"algo.gradient_steps={gsteps}",
            "algo.batch_size=32",
            f"logger.log_every={log_every}",
        ]
    )
    job = run_job(cfg, tmp_path)

    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["status"] == job["status"] == "ok"
    assert on_disk["counts"] == {"ok": 2, "diverged": 0, "crashed": 0}
    assert [m["seed"] for m in on_disk["members"]] == [0, 1]
    assert on_disk["num_seeds"] == 2 and on_disk["total_steps"] == total
    assert on_disk["error"] is None

    # episodes per member, summed from the recorded step rewards
    P = 2
    returns = [[] for _ in range(P)]
    running = np.zeros(P)
    for res in envrec.steps:
        for p in range(P):
            running[p] += res.reward[p, 0]
            if res.terminated[p, 0] or res.truncated[p, 0]:
                returns[p].append(running[p])
                running[p] = 0.0
    assert len(envrec.steps) == total

    # update phases: steps s > learning_starts where s // train_frequency ticks
    phases = sum(1 for s in range(1, total + 1) if s > starts and s // freq > (s - 1) // freq)
    for k in range(P):
        member = json.loads((tmp_path / f"seed_{k}" / "summary.json").read_text())
        assert member == on_disk["members"][k]
        assert member["status"] == "ok" and member["seed"] == k and member["member"] == k
        assert member["steps"] == total
        assert member["episodes"] == len(returns[k]) > 10
        assert isinstance(member["final_return"], float)
        assert member["final_return"] == pytest.approx(float(np.mean(returns[k][-10:])))
        assert member["diverged_at_step"] is None and member["divergence"] is None

        lines = _read_metrics(tmp_path / f"seed_{k}" / "metrics.jsonl")
        steps = [line["step"] for line in lines]
        assert steps == list(range(log_every, total + 1, log_every))
        for line in lines:
            assert ("train/loss" in line) == (line["step"] > starts)
            if "train/loss" in line:
                assert math.isfinite(line["train/loss"]) and line["train/loss"] >= 0
            n_phases = sum(1 for s in range(1, line["step"] + 1) if s > starts and s // freq > (s - 1) // freq)
            assert line["train/updates"] == gsteps * n_phases
            assert line["train/epsilon"] == pytest.approx(
                epsilon(line["step"], cfg.algo.start_e, cfg.algo.end_e, cfg.algo.exploration_fraction, total)
            )
        assert lines[-1]["train/updates"] == gsteps * phases
        assert lines[-1]["episode/return_last10"] == pytest.approx(member["final_return"])
        assert lines[-1]["episode/count"] == member["episodes"]


def test_a_divergence_is_a_result(tmp_path):
    total, starts, freq, log_every = 600, 200, 50, 100
    cfg = compose_config(
        TINY
        + [
            f"total_steps={total}",
            "num_seeds=2",
            f"algo.learning_starts={starts}",
            f"algo.train_frequency={freq}",
            "algo.gradient_steps=4",
            "algo.batch_size=32",
            f"logger.log_every={log_every}",
            "optimizer=sgd",
            "optimizer.lr=1e6",
        ]
    )
    job = run_job(cfg, tmp_path)  # returns normally

    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["status"] == job["status"] == "diverged"
    assert on_disk["error"] is None
    counts = on_disk["counts"]
    assert counts["crashed"] == 0 and counts["diverged"] >= 1 and counts["ok"] + counts["diverged"] == 2
    phase_steps = {s for s in range(1, total + 1) if s > starts and s // freq > (s - 1) // freq}
    for k in range(2):
        member = json.loads((tmp_path / f"seed_{k}" / "summary.json").read_text())
        assert member == on_disk["members"][k]
        if member["status"] != "diverged":
            continue
        at = member["diverged_at_step"]
        assert at in phase_steps  # divergence is detected at an update
        assert member["divergence"]["cause"] in CAUSES[1:]
        assert at <= member["steps"] < at + log_every  # reported at the first log after it
        lines = _read_metrics(tmp_path / f"seed_{k}" / "metrics.jsonl")
        assert lines[-1]["step"] == member["steps"]  # the member's log stops there


@pytest.mark.parametrize("members", [1, 7, 16, 40])
def test_threads_minus_one_picks_one_thread_per_8_members_within_the_cores(members, tmp_path):
    cores = len(os.sched_getaffinity(0))
    expected = max(1, min(cores, members // 8))  # 1 below 16 members; never more than the cores
    assert population_threads(members) == expected
    try:
        job = run_job(
            compose_config(
                TINY[:-1] + ["threads=-1", f"num_seeds={members}", "total_steps=40", "algo.learning_starts=20"]
            ),
            tmp_path,
        )
        assert job["threads"] == expected == torch.get_num_threads()
    finally:
        torch.set_num_threads(1)  # the rest of the suite runs on one thread


@pytest.mark.parametrize(
    "overrides,written",
    [
        ([], True),
        (["regularization.l2=1e-4"], False),
        (["normalization=layer"], True),
        (["activation=softsign"], True),
        (["normalization=weight"], True),
        (["normalization=batch"], True),
    ],
    ids=["plain", "l2_penalty", "layer_norm", "softsign", "weight_norm", "batch_norm"],
)
def test_training_writes_gradients_without_autograd_only_where_exact(tmp_path, monkeypatch, overrides, written):
    """Training takes the written gradients for a plain network without a penalty, and autograd
    otherwise; both train (every update reaches the optimizer)."""
    calls = []
    real = PopMLP.backward_to_grads
    monkeypatch.setattr(PopMLP, "backward_to_grads", lambda self, *a: calls.append(1) or real(self, *a))
    cfg = compose_config(
        TINY
        + overrides
        + [
            "total_steps=300",
            "num_seeds=2",
            "algo.learning_starts=100",
            "algo.train_frequency=20",
            "algo.gradient_steps=2",
            "algo.batch_size=16",
        ]
    )
    job = run_job(cfg, tmp_path)
    assert job["status"] == "ok"
    updates = 2 * ((300 - 100) // 20)
    assert len(calls) == (updates if written else 0)
