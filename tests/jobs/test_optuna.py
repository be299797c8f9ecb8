"""Optuna studies over rlexp jobs (``hydra/sweeper=rlexp_optuna``, ``+experiment=optuna_dqn``): a trial's value
from its job's summary, a diverged trial failed with its cause, a batch of trials trained as one pack, a
study resumed from its storage beside the sweep dir, and the line a missing extra gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launching import describe, file_hashes, run_cli

INSTALL = "pip install -e '.[optuna]'"


def interquartile_mean(xs: list[float]) -> float:
    """rliable's IQM written out: drop the lowest and the highest quarter (floor), average the rest."""
    xs = sorted(xs)
    cut = len(xs) // 4
    kept = xs[cut : len(xs) - cut]
    return sum(kept) / len(kept)


# ====================================================================== a study, for real
STUDY = [
    "+experiment=optuna_dqn",
    "hydra.sweeper.n_trials=4",
    "hydra.sweeper.n_jobs=2",  # 2 batches of 2 trials
    "hydra.launcher.n_jobs=1",  # the pack in this process: no worker to start
    "total_steps=400",
    "num_seeds=2",
    "algo.learning_starts=100",
    "eval.episodes=2",
    "logger.mode=disabled",
    "logger.progress=off",
]
DIVERGE = ["hydra.sweeper.n_trials=2", "debug.inject.what=grad", "debug.inject.member=1", "debug.inject.step=200"]


def load_trials(sweep: Path):
    optuna = pytest.importorskip("optuna", reason=INSTALL)
    return optuna.load_study(study_name="optuna_dqn", storage=f"sqlite:///{sweep}/optuna.db").trials


@pytest.mark.heavy
def test_a_study_trains_batches_packed_fails_divergences_and_resumes(tmp_path):
    pytest.importorskip("optuna", reason=INSTALL)
    sweep = tmp_path / "sweep"
    first = run_cli([*STUDY, f"hydra.sweep.dir={sweep}"], tmp_path / "first")
    assert first.returncode == 0, describe(first)
    assert first.stdout.count("rlexp_packed: 2 jobs in 1 packs") == 2, describe(first)  # each batch one pack
    trials = load_trials(sweep)
    assert [t.number for t in trials] == [0, 1, 2, 3]
    for t in trials:
        job = json.loads((sweep / str(t.number) / "summary.json").read_text())
        assert t.state.name == "COMPLETE" and job["status"] == "ok" and job["packed_with"] == 2
        assert t.value == interquartile_mean([m["eval_return"] for m in job["members"]])
        assert t.user_attrs["job_dir"] == str(sweep / str(t.number))
        assert job["config"]["optimizer"]["lr"] == t.params["optimizer.lr"]
        assert job["config"]["algo"]["target_update_period"] == t.params["algo.target_update_period"]
        assert job["config"]["clipping"]["max_norm"] == t.params["clipping.max_norm"]
    before = {k: file_hashes(sweep / str(k)) for k in range(4)}

    # the same study again, its member 1 poisoned: trials 4 and 5, failed with their cause
    again = run_cli([*STUDY, *DIVERGE, f"hydra.sweep.dir={sweep}"], tmp_path / "again")
    assert again.returncode == 0, describe(again)
    assert "1 of 2 members diverged (first: member 1, nonfinite_grad" in again.stdout + again.stderr
    trials = load_trials(sweep)
    assert [t.number for t in trials] == [0, 1, 2, 3, 4, 5]
    assert {k: file_hashes(sweep / str(k)) for k in range(4)} == before  # nothing of the first run touched
    old = [t.params for t in trials[:4]]
    for t in trials[4:]:
        job = json.loads((sweep / str(t.number) / "summary.json").read_text())
        diverged = job["members"][1]
        assert t.state.name == "FAIL" and t.value is None and t.params not in old  # reseeded: new draws
        assert job["status"] == "diverged" and diverged["status"] == "diverged"
        assert t.user_attrs["cause"] == diverged["divergence"]["cause"] == "nonfinite_grad"
        assert t.user_attrs["where"] == diverged["divergence"]["where"]
        assert t.user_attrs["diverged_at_step"] == diverged["diverged_at_step"]
        assert (t.user_attrs["diverged"], t.user_attrs["diverged_member"]) == (1, 1)
