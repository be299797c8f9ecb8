"""Jobs on a non-stationary task (env.shift, rlexp/envs/shift.py): a DQN CartPole run with permuted
observations trains and records its switches, ends bitwise as itself resumed from a checkpoint and as its
members packed with another cell, and rlexp.evaluate plays each member's task of its checkpoint; a shift that
never switches (every >= total_steps) trains bitwise as the stationary env; PPO and SAC train under permuted
actions and observations. The mechanics are tested in tests/envs/test_shift.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_checkpoints import DQN_EVAL, assert_same_job, checkpoint, crash, member_summary, metrics, run
from test_pack import DQN, assert_packed_equals_alone

from rlexp import evaluate
from rlexp.run.checkpoint import FILE

EVERY = 150
SHIFT = ["env.shift.kind=permute_obs", f"env.shift.every={EVERY}"]


@pytest.fixture(scope="module")
def shifted(tmp_path_factory) -> Path:
    """DQN on CartPole, 600 env steps, 2 members, a checkpoint every 200 steps, tasks switching every 150."""
    job = tmp_path_factory.mktemp("shifted")
    summary = run([*DQN_EVAL, *SHIFT], job)
    assert summary["status"] == "ok"
    return job


def without_shift(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("shift/")} for r in records]


def test_a_shifted_dqn_trains_and_records_its_switches(shifted):
    for k in range(2):
        records = metrics(shifted / f"seed_{k}")
        assert records[-1]["train/updates"] > 0 and "eval/return" in records[-1]
        for r in records:  # switches at 150, 300, 450 (none at the last step, 600)
            task = min(r["step"], 599) // EVERY
            assert (r["shift/task"], r["shift/switch_step"]) == (task, task * EVERY), r["step"]
    saved = checkpoint(shifted / "seed_1")  # the member's permutation and generator; the population's count
    assert saved["state"]["env/shift"]["perm"].shape == (4,) and saved["shared"]["env/shift"]["steps"] == 600


def test_a_shifted_job_resumed_from_its_checkpoint_ends_bitwise_as_the_uninterrupted_one(shifted, tmp_path):
    crash([*DQN_EVAL, *SHIFT], tmp_path, 550)
    assert checkpoint(tmp_path / "seed_0")["step"] == 400  # inside the task begun at 300
    summary = run([*DQN_EVAL, *SHIFT, "resume=true"], tmp_path)
    assert summary["resumed"]["as_uninterrupted"] is True
    assert_same_job(shifted, tmp_path, 2)


def test_shifted_members_train_in_a_pack_as_alone(tmp_path):
    variants = [[], ["optimizer.lr=0.01", "init=he"]]
    jobs = assert_packed_equals_alone(
        tmp_path, [*DQN, "env.shift.kind=permute_actions", "env.shift.every=100"], variants
    )
    assert all(job["status"] == "ok" for job in jobs)


@pytest.mark.parametrize("kind", ["permute_obs", "permute_actions"])
def test_a_shift_that_never_switches_trains_as_the_stationary_env(tmp_path, kind):
    overrides = [*DQN_EVAL, "checkpoint.every=0"]
    run(overrides, tmp_path / "stationary")
    run([*overrides, f"env.shift.kind={kind}", "env.shift.every=600"], tmp_path / "shift")
    for k in range(2):
        stationary, shift = tmp_path / "stationary" / f"seed_{k}", tmp_path / "shift" / f"seed_{k}"
        assert {r["shift/task"] for r in metrics(shift)} == {0}
        assert without_shift(metrics(shift)) == metrics(stationary)
        assert member_summary(shift) == member_summary(stationary)


@pytest.mark.parametrize(
    "overrides",
    [
        ["algo=ppo", "algo.num_steps=32", "env.shift.kind=permute_actions"],
        ["algo=sac", "env=pendulum", "algo.learning_starts=100", "algo.batch_size=32", "env.shift.kind=permute_obs"],
    ],
    ids=["ppo_permute_actions", "sac_permute_obs"],
)
def test_other_algorithms_train_on_a_shifted_task(tmp_path, overrides):
    base = ["total_steps=400", "network.hidden=[16,16]", "logger.log_every=100", "eval.episodes=1"]
    summary = run([*base, *overrides, "env.shift.every=100"], tmp_path)
    assert summary["status"] == "ok"
    records = metrics(tmp_path / "seed_0")
    assert [r["shift/task"] for r in records] == [1, 2, 3, 3] and records[-1]["train/updates"] > 0


def test_rlexp_evaluate_plays_each_members_task_of_its_checkpoint(shifted):
    paths = [shifted / f"seed_{k}" / FILE for k in range(2)]
    ctx, _, step = evaluate.load_policy(shifted, paths, 2, video=False)
    assert step == 600 and ctx.evaluator.env.shift is ctx.env.shift and ctx.env.shift.task == 3
    for k, path in enumerate(paths):
        assert (ctx.env.shift.perm[k] == checkpoint(path.parent)["state"]["env/shift"]["perm"].numpy()).all()
    ctx.env.close()
    ctx.evaluator.close()
