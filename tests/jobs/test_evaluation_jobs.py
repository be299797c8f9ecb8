"""Evaluation in jobs (DQN, PPO, TD3): evaluation leaves every training metric bitwise unchanged, its
records land at the expected log steps, and each member's ``eval_return`` is its last evaluation (a
diverged member's last one before the divergence)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from composing import compose_config

from rlexp.train import run_job

QUIET = ["logger.mode=disabled", "logger.progress=off", "device=cpu", "threads=1"]


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
