"""Env steps to a final evaluation >= a threshold: a PBT run against a grid of fixed settings (docs/pbt.md).

    python scripts/pbt_vs_grid.py <PBT job or sweep dir> <grid sweep dir> [--threshold 475]

Reads each member's ``eval/return`` rows (metrics.jsonl). A curve *reaches* the threshold at the first
evaluation step from which every later evaluation of it, the last one included, is >= the threshold
(never, when the last one is below). Curves:

* PBT: the best member at each evaluation step (the population's best current member), per PBT job;
* each grid cell: the median over its members at each step; the best fixed setting is the cell that
  reaches it first;
* the grid's best cell at each step (the same statistic as PBT's, over independent cells).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def evaluations(job_dir: Path) -> dict[int, list[float]]:
    """Evaluation step -> each member's eval/return at it."""
    steps: dict[int, list[float]] = {}
    for metrics in sorted(job_dir.glob("seed_*/metrics.jsonl")):
        for line in metrics.read_text().splitlines():
            row = json.loads(line)
            if "eval/return" in row:
                steps.setdefault(row["step"], []).append(float(row["eval/return"]))
    return dict(sorted(steps.items()))


def reached(curve: dict[int, float], threshold: float) -> int | None:
    """The first step from which the curve stays >= threshold to its end; None if it ends below."""
    first = None
    for step, value in curve.items():
        if value >= threshold:
            first = step if first is None else first
        else:
            first = None
    return first


def job_dirs(root: Path) -> list[Path]:
    """``root`` when it is a job dir, else the job dirs under it (a sweep), in their order."""
    if (root / "summary.json").exists():
        return [root]
    jobs = [d for d in root.iterdir() if (d / "summary.json").exists()]
    return sorted(jobs, key=lambda d: int(d.name) if d.name.isdigit() else d.name)


def first_hit(curve: dict[int, float], threshold: float) -> int | None:
    """The first step at which the curve is >= threshold (it may fall below later)."""
    return next((step for step, value in curve.items() if value >= threshold), None)


def _cell(job_dir: Path) -> str:
    summary = json.loads((job_dir / "summary.json").read_text())
    return summary.get("cell", job_dir.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pbt", type=Path, help="the PBT job dir (+experiment=pbt)")
    parser.add_argument("grid", type=Path, help="the grid's sweep dir (its job dirs 0/, 1/, ...)")
    parser.add_argument("--threshold", type=float, default=475.0)
    args = parser.parse_args()
    t = args.threshold

    rows = []
    for job in job_dirs(args.pbt):
        pbt = evaluations(job)
        best = {s: max(v) for s, v in pbt.items()}
        finals = list(pbt.values())[-1]
        seed = json.loads((job / "summary.json").read_text())["config"]["seed"]
        ending = sum(v >= t for v in finals)  # members whose last evaluation is >= t
        rows.append(
            (f"PBT seed {seed}, best member", first_hit(best, t), reached(best, t), best[max(best)], ending, 16)
        )
    cells = {}
    for job in job_dirs(args.grid):
        cells[_cell(job)] = evaluations(job)
    medians = {c: {s: float(np.median(v)) for s, v in e.items()} for c, e in cells.items()}
    steps = sorted({s for m in medians.values() for s in m})
    best_cell = min(medians, key=lambda c: (reached(medians[c], t) or float("inf"), -list(medians[c].values())[-1]))
    m = medians[best_cell]
    ending = sum(list(c.values())[-1] >= t for c in medians.values())  # cells whose final median is >= t
    rows.append(
        (f"grid, best fixed cell ({best_cell})", first_hit(m, t), reached(m, t), m[max(m)], ending, len(medians))
    )
    any_cell = {s: max(m[s] for m in medians.values() if s in m) for s in steps}
    rows.append(("grid, best cell at each step", first_hit(any_cell, t), reached(any_cell, t), any_cell[max(any_cell)]))
    print(
        f"| curve | first evaluation >= {t:g} | reaches and stays >= {t:g} from | final evaluation | ending >= {t:g} |"
    )
    print("|---|---|---|---|---|")
    for name, hit, step, final, *count in rows:
        ending = f"{count[0]}/{count[1]}" if count else ""
        hit, step = (v if v is not None else "never" for v in (hit, step))
        print(f"| {name} | {hit} | {step} | {final:.1f} | {ending} |")
    print()
    print("cells reaching it:", {c: reached(m, t) for c, m in medians.items()})


if __name__ == "__main__":
    main()
