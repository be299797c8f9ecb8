"""Compare two runs of the same grid member by member: every cell of ``B`` against the cell of ``A`` with
the same config choices (e.g. a packed grid against some of its cells trained unpacked).

    python scripts/grid_diff.py A B [--metrics]

For each member: status, steps, episodes, final return, divergence step and cause (the member's
``summary.json`` less its wall time); with ``--metrics`` also every ``metrics.jsonl`` row less the
wall-clock figures. Prints one line per cell that differs and a total; exit code 1 if any differs,
2 if a cell of ``B`` has no match in ``A``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

CLOCKS = ("wall_s", "perf/steps_per_s")  # wall-clock figures: the only ones that may differ


def cells(root: Path) -> dict[str, Path]:
    """Cell (its config choices, sorted: the order of a sweep's overrides names no cell) -> job dir, for
    every job dir under ``root`` with a ``summary.json``."""
    found = {}
    for summary in sorted(root.glob("*/summary.json")):
        choices = json.loads(summary.read_text())["choices"]
        found[",".join(f"{k}={v}" for k, v in sorted(choices.items()))] = summary.parent
    return found


def member(job_dir: Path, k: int, metrics: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Member ``k``'s summary and (with ``metrics``) its metrics rows, wall-clock figures left out."""
    seed_dir = job_dir / f"seed_{k}"
    summary = {n: v for n, v in json.loads((seed_dir / "summary.json").read_text()).items() if n not in CLOCKS}
    rows = []
    if metrics:
        for line in (seed_dir / "metrics.jsonl").read_text().splitlines():
            rows.append({n: v for n, v in json.loads(line).items() if n not in CLOCKS})
    return summary, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--metrics", action="store_true", help="compare every metrics.jsonl row too")
    args = parser.parse_args()
    a, b = cells(args.a), cells(args.b)
    missing = sorted(set(b) - set(a))
    if missing:
        print(f"{len(missing)} cells of {args.b} are not in {args.a}, e.g. {missing[0]}", file=sys.stderr)
        return 2
    members = differing = 0
    for name, job_b in b.items():
        job_a = a[name]
        n = json.loads((job_b / "summary.json").read_text())["config"]["num_seeds"]
        diffs = []
        for k in range(n):
            members += 1
            (sum_a, rows_a), (sum_b, rows_b) = member(job_a, k, args.metrics), member(job_b, k, args.metrics)
            fields = sorted(f for f in set(sum_a) | set(sum_b) if sum_a.get(f) != sum_b.get(f))
            if rows_a != rows_b:
                fields.append("metrics.jsonl")
            if fields:
                differing += 1
                diffs.append(f"seed_{k}: {', '.join(fields)}")
        if diffs:
            print(f"{name}: {'; '.join(diffs)}")
    what = "summaries and metrics rows" if args.metrics else "summaries"
    print(f"{len(b)} cells, {members} members compared ({what}): {differing} differ")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
