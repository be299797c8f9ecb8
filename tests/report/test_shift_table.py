"""scripts/shift_table.py: each task's end read from the members' records, and the early and late means
computed here directly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "shift_table.py"


def write_member(path: Path, returns_by_task: list[list[float]]) -> None:
    """Records of a member: per task, log records with rising returns; the last one of a task is its end."""
    path.mkdir(parents=True)
    records, step = [], 0
    for task, returns in enumerate(returns_by_task):
        for value in returns:
            step += 1000
            records.append({"step": step, "shift/task": task, "episode/return_last10": value})
    records.append({"step": step, "eval/return": 1.0})  # a record without the keys is skipped
    path.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_task_ends_and_the_early_and_late_means(tmp_path):
    job = tmp_path / "0"
    job.mkdir()
    job.joinpath("summary.json").write_text(json.dumps({"cell": "normalization=layer"}))
    ends_a = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0]
    ends_b = [12.0, 22.0, 32.0, 42.0, 52.0, 62.0, 72.0, 82.0]
    write_member(job / "seed_0", [[1.0, end] for end in ends_a])  # the task's earlier record is not its end
    write_member(job / "seed_1", [[2.0, end] for end in ends_b])
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--skip", "1"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    row = proc.stdout.splitlines()[2].split(" | ")
    assert row[2] == " ".join(f"{(a + b) / 2:.0f}" for a, b in zip(ends_a, ends_b))
    early = (sum(ends_a[1:4]) / 3 + sum(ends_b[1:4]) / 3) / 2  # tasks 2-4 after --skip 1
    late = (sum(ends_a[-3:]) / 3 + sum(ends_b[-3:]) / 3) / 2
    assert row[3].startswith(f"{early:.0f} [") and row[4].startswith(f"{late:.0f} [")
    assert "tasks 2–4" in proc.stdout.splitlines()[0]


def test_a_dir_without_jobs_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
