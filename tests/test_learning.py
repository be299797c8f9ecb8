"""Learning checks (slow): populations of 10 seeds must learn CartPole-v1 (DQN, PPO) and Pendulum-v1 (TD3, SAC).

Run with ``python -m pytest -m slow``; each test drives scripts/learning_check.py, which exits
non-zero when fewer than 8 of 10 members pass.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
