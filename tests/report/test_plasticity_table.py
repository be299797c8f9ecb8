"""scripts/plasticity_table.py: a cell's instruments averaged over the window ending at --end, the cell's
second key from --by, against means computed here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "plasticity_table.py"


def write_job(job: Path, dormant: dict[int, float]) -> None:
    """A one-member job: config, summary and instrument records (dormant share of q.0 and q.1 by step)."""
    (job / ".hydra").mkdir(parents=True)
    config = "intervention: {name: redo}\nactivation: {name: relu}\nalgo: {gradient_steps: 16}\ntotal_steps: 40000\n"
    (job / ".hydra" / "config.yaml").write_text(config)
    member = job / "seed_0"
    member.mkdir()
    member.joinpath("summary.json").write_text(json.dumps({"eval_return": 321.0, "status": "ok"}))
    records = [{"step": s, "dormant/q.0": d, "dormant/q.1": 2 * d, "srank/q.0": 5.0, "srank/q.1": 6.0} for s, d in
               dormant.items()]  # fmt: skip
    records.append({"step": 40000, "intervention/recycled/q.0": 7.0, "intervention/recycled/q.1": 5.0})
    member.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def run(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_the_window_ending_at_end_and_the_second_key(tmp_path):
    dormant = {5000: 0.1, 10000: 0.2, 35000: 0.4, 40000: 0.6}
    write_job(tmp_path / "0", dormant)
    late = run(str(tmp_path), "--by", "algo.gradient_steps", "--window", "10000")
    assert late[0].startswith("| intervention | algo.gradient_steps | seeds |")
    assert late[2] == f"| redo | 16 | 1 | 0 | 321 | {(0.4 + 0.6) / 2:.2f} | {(0.8 + 1.2) / 2:.2f} | 5.0 | 6.0 | 12 |"
    early = run(str(tmp_path), "--window", "10000", "--end", "10000")
    assert early[0].startswith("| intervention | activation | seeds |")
    assert early[2].startswith(f"| redo | relu | 1 | 0 | 321 | {(0.1 + 0.2) / 2:.2f} | {(0.2 + 0.4) / 2:.2f} |")
