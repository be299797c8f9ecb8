"""Learning checks (slow): populations of 10 seeds must learn CartPole-v1 (DQN, PPO) and Pendulum-v1 (TD3, SAC).

Run with ``python -m pytest -m slow``; each test drives scripts/learning_check.py, which exits
non-zero when fewer than 8 of 10 members pass. The default suite checks its --resume on a tiny budget.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _check(tmp_path: Path, preset: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "learning_check.py"), "--preset", preset, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    result = json.loads(next(tmp_path.glob("*/learning_check.json")).read_text())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return result


def test_a_stopped_check_goes_on_from_its_checkpoint_with_resume(tmp_path):
    """A check whose job stops at env step 1500 (a forced crash) says how to go on; --resume continues
    the job from its checkpoint at 1000 and gives the verdict over the whole run."""
    script = [
        sys.executable,
        str(ROOT / "scripts" / "learning_check.py"),
        "--seeds",
        "2",
        "--threshold",
        "9",
        "--min-pass",
        "1",
    ]
    run_dir = tmp_path / "check"
    budget = ["total_steps=2000", "algo.learning_starts=500", "checkpoint.every=1000", "logger.progress=off"]
    args = [*script, "--run-dir", "check", "--overrides", *budget]  # relative to the caller's dir
    first = subprocess.run([*args, "debug.crash_at_step=1500"], cwd=tmp_path, capture_output=True, text=True)
    assert first.returncode == 1 and f"go on with: --run-dir {run_dir} --resume" in first.stdout, first.stdout
    assert not (run_dir / "learning_check.json").exists()
    again = subprocess.run([*args, "--resume"], cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    result = json.loads((run_dir / "learning_check.json").read_text())
    assert result["resumed"] and result["command"].endswith("resume=true") and len(result["final_returns"]) == 2
    steps = [json.loads(line)["step"] for line in (run_dir / "seed_1" / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 2000 and len(steps) == len(set(steps))  # one history, continued from the checkpoint
    assert json.loads((run_dir / "attempt_1" / "summary.json").read_text())["status"] == "crashed"


def test_resume_without_a_job_dir_is_one_line(tmp_path):
    script = [sys.executable, str(ROOT / "scripts" / "learning_check.py"), "--resume", "--run-dir", "missing"]
    done = subprocess.run(script, cwd=tmp_path, capture_output=True, text=True)
    expected = f"--resume: --run-dir {tmp_path / 'missing'} is not a job dir"
    assert done.returncode == 2 and done.stdout.startswith(expected), done.stdout
    assert "Traceback" not in done.stderr and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_default_dqn_reaches_475_within_50k_steps(tmp_path):
    result = _check(tmp_path, "default")
    assert result["passed_reach"] >= 8
    assert all(s is None or s <= 50_000 for s in result["first_reach_step"])


@pytest.mark.slow
def test_cleanrl_settings_reach_475_at_500k_steps(tmp_path):
    result = _check(tmp_path, "cleanrl_dqn")
    assert result["passed_final"] >= 8


@pytest.mark.slow
def test_ppo_reaches_475_within_100k_steps(tmp_path):
    result = _check(tmp_path, "zoo_ppo")
    assert result["passed_reach"] >= 8
    assert all(s is None or s <= 100_000 for s in result["first_reach_step"])


@pytest.mark.slow
def test_td3_pendulum_ends_above_minus_250_within_20k_steps(tmp_path):
    result = _check(tmp_path, "td3_pendulum")
    assert result["passed_final"] >= 8


@pytest.mark.slow
def test_sac_pendulum_evaluates_above_minus_250_within_20k_steps(tmp_path):
    result = _check(tmp_path, "sac_pendulum")
    assert result["passed_eval"] >= 8


@pytest.mark.slow
def test_muzero_lite_final_evaluation_reaches_475_within_50k_steps(tmp_path):
    result = _check(tmp_path, "muzero_lite")
    assert result["passed_eval"] >= 8
