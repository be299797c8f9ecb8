"""How well each cell of a multirun on a changing task (``env.shift``) learns each task: per cell, the
members' mean training return at the end of every task (``episode/return_last10`` in the last log
record of the task: its last 10 training episodes; a diverged member's tasks end where it diverged), and
the mean over members of three early tasks' ends (after ``--skip`` tasks, default 2: epsilon still decays
through them) and of the last three tasks' ends, each over the members that reached them, with 95%
bootstrap intervals. A network that loses plasticity learns the later tasks worse than
the early ones.

    python -m rlexp.train +experiment=finding/plasticity_shift
    python scripts/shift_table.py outputs/findings/plasticity_shift [--skip 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from rlexp.report.stats import bootstrap_mean

EDGE = 3  # tasks averaged at each end


def task_ends(metrics: Path) -> list[float]:
    """A member's training return at the end of each task, in task order (its metrics.jsonl)."""
    ends: dict[int, float] = {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if "shift/task" in record and "episode/return_last10" in record:
            ends[int(record["shift/task"])] = float(record["episode/return_last10"])
    return [ends[t] for t in sorted(ends)]


def table(sweep: Path, skip: int) -> str:
    """The Markdown table of the sweep's jobs (each ``<k>/summary.json`` with members ``seed_<n>/``);
    the early tasks are the three after the first ``skip``."""
    rows = []
    for summary_path in sorted(sweep.glob("*/summary.json"), key=lambda p: int(p.parent.name)):
        job = json.loads(summary_path.read_text())
        members = sorted(summary_path.parent.glob("seed_*/metrics.jsonl"))
        ends = [task_ends(m) for m in members]
        tasks = max(len(e) for e in ends)
        matrix = np.full((len(ends), tasks), np.nan)  # [members, tasks]; NaN after a member diverged
        for k, e in enumerate(ends):
            matrix[k, : len(e)] = e
        early, late = matrix[:, skip : skip + EDGE], matrix[:, tasks - EDGE :]
        means = [m[~np.isnan(m).any(axis=1)].mean(axis=1) for m in (early, late)]  # per member reaching them
        spans = [bootstrap_mean([v], 2000, np.random.default_rng(0)) for v in means]
        shown = [f"{v:.0f} [{lo:.0f}, {hi:.0f}]" if np.isfinite(v) else "—" for v, lo, hi in spans]
        per_task = " ".join(f"{v:.0f}" for v in np.nanmean(matrix, axis=0))
        in_late = int((~np.isnan(late).any(axis=1)).sum())
        rows.append(f"| {job['cell']} | {in_late} / {len(members)} | {per_task} | {shown[0]} | {shown[1]} |")
    header = [
        f"| cell | members in the last tasks | mean return at each task's end, task 1 → last (members there) "
        f"| tasks {skip + 1}–{skip + EDGE} [95% CI] | last {EDGE} tasks [95% CI] |",
        "|---|---|---|---|---|",
    ]
    return "\n".join(header + rows)


def main() -> int:
    parser = argparse.ArgumentParser(description="Per cell of a multirun on a changing task: each task's end.")
    parser.add_argument("sweep", type=Path, help="the multirun's dir (jobs <k>/ with seed_<n>/metrics.jsonl)")
    parser.add_argument("--skip", type=int, default=2, help="tasks before the early three (default 2)")
    args = parser.parse_args()
    if not any(args.sweep.glob("*/summary.json")):
        print(f"shift_table: sweep: {args.sweep} holds no finished job; give a multirun's dir", file=sys.stderr)
        return 2
    print(table(args.sweep, args.skip))
    return 0


if __name__ == "__main__":
    sys.exit(main())
