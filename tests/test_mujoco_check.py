"""scripts/mujoco_check.py: rlexp and Stable-Baselines3 on MuJoCo, side by side, resumable.

The comparison itself: ``python scripts/mujoco_check.py --jobs 2`` (hours; docs/benchmarks.md). Here:
its refusals, and (slow) a tiny run of both sides that ``--resume`` continues.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mujoco_check.py"
TINY = ["--algos", "sac", "--envs", "hopper", "--seeds", "1", "--steps", "300", "--learning-starts", "200"]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[1]), "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True)


def needs_zoo() -> None:
    if importlib.util.find_spec("rl_zoo3") is None:
        pytest.skip("rl_zoo3's hyperparams files are read: pip install --no-deps rl_zoo3")


def refused(done: subprocess.CompletedProcess, key: str) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout.startswith(key) and len(done.stdout.strip().splitlines()) == 1, done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args, key", [(["--seeds", "0"], "--seeds"), (["--jobs", "0"], "--jobs")])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, key):
    refused(run(*args, "--out", "out.json", cwd=tmp_path), key)
    assert list(tmp_path.iterdir()) == []


def test_a_budget_without_updates_is_refused(tmp_path):
    needs_zoo()
    refused(run("--steps", "100", "--out", "out.json", cwd=tmp_path), "--steps: 100 leaves no update after 10000")
    assert list(tmp_path.iterdir()) == []


def test_an_earlier_invocations_records_are_kept_unless_resumed(tmp_path):
    (tmp_path / "out" / "sac_hopper").mkdir(parents=True)
    (tmp_path / "out" / "sac_hopper" / "rlexp.json").write_text("{}")
    refused(run("--out", "out.json", cwd=tmp_path), f"--out: {tmp_path / 'out'} holds an earlier invocation's")
    assert not (tmp_path / "out.json").exists()


@pytest.mark.slow  # both sides, 300 steps of SAC on Hopper (~30 s)
def test_one_invocation_runs_both_sides_and_resume_runs_only_what_is_missing(tmp_path):
    needs_zoo()
    pytest.importorskip("mujoco", reason="pip install -e '.[mujoco]'")
    pytest.importorskip("stable_baselines3", reason="pip install -e '.[bench]'")
    first = run(*TINY, "--out", "out.json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "2 of 2 processes to run" in first.stdout
    result = json.loads((tmp_path / "out.json").read_text())["results"][0]
    assert result["settings"]["learning_starts"] == 200 and "pending" not in result
    assert "total_steps=300" in result["rlexp"]["command"] and len(result["sb3"]["returns"]) == 1
    assert result["sb3"]["spread"] == [result["sb3"]["returns"][0]] * 2
    rlexp_record = (tmp_path / "out" / "sac_hopper" / "rlexp.json").read_text()
    (tmp_path / "out" / "sac_hopper" / "sb3_seed0.json").unlink()  # as if stopped while SB3 ran
    again = run(*TINY, "--resume", "--out", "out.json", cwd=tmp_path)
    assert again.returncode == 0 and "1 of 2 processes to run" in again.stdout, again.stdout
    assert "sac_hopper: sb3 seed 0 ..." in again.stdout and "rlexp ..." not in again.stdout
    assert (tmp_path / "out" / "sac_hopper" / "rlexp.json").read_text() == rlexp_record
    assert json.loads((tmp_path / "out.json").read_text())["results"][0]["rlexp"] == result["rlexp"]
    changed = [*TINY[:-3], "400", *TINY[-2:]]  # --steps 400
    refused(run(*changed, "--resume", "--out", "out.json", cwd=tmp_path), "--resume: ")
