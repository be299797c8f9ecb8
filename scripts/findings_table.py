"""A report's tables (written by ``python -m rlexp.report``) as the Markdown tables docs/findings.md gives.

Per cell (cells.csv): diverged of ran members, the divergence rate with its Wilson 95% interval, and the
score's IQM and mean with their stratified-bootstrap 95% intervals, as the report computes them (rliable's
median is the median over tasks of each task's mean: with one env, the mean again). Per value
of a swept key (``--by``, from grid.csv beside it: every member of the cells with that value, whatever the
other keys): the same counts and rate, and the IQM of the members' last evaluation returns (95% bootstrap
interval; a diverged member's is its last evaluation before it diverged, where it had one).

    python scripts/findings_table.py outputs/findings/no_target_network/cells.csv
    python scripts/findings_table.py cells.csv --sort iqm                 # best IQM first (default: file order)
    python scripts/findings_table.py cells.csv --by activation normalization   # one table per key
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from rlexp.report.stats import bootstrap_iqm, wilson

RAN = ("ok", "diverged")  # statuses of members that trained (not crashed, not unfinished)


def number(text: str, digits: int) -> str:
    """A cell of cells.csv rounded for reading ("" when the report left it empty: nothing scored)."""
    return "" if text in ("", "nan") else f"{float(text):.{digits}f}"


def interval(row: dict[str, str], key: str, digits: int) -> str:
    """``value [low, high]`` of an estimate and its interval columns (``<key>``, ``<key>_ci_low``, ...)."""
    low_key = "rate_ci_low" if key == "divergence_rate" else f"{key}_ci_low"
    high_key = "rate_ci_high" if key == "divergence_rate" else f"{key}_ci_high"
    value = number(row[key], digits)
    return f"{value} [{number(row[low_key], digits)}, {number(row[high_key], digits)}]" if value else "—"


def markdown(rows: list[dict[str, str]]) -> str:
    """The rows of cells.csv as a Markdown table."""
    lines = [
        "| cell | diverged / ran | divergence rate [95% CI] | IQM [95% CI] | mean [95% CI] |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['cell']} | {row['diverged']} / {row['n_ran']} | {interval(row, 'divergence_rate', 2)} "
            f"| {interval(row, 'iqm', 1)} | {interval(row, 'mean', 1)} |"
        )
    return "\n".join(lines)


def by_value(rows: list[dict[str, str]], key: str, reps: int = 2000, seed: int = 0) -> str:
    """Members of grid.csv ``rows`` pooled by their value of the swept ``key``, as a Markdown table."""
    groups: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        groups.setdefault(row[key], []).append(row)
    lines = [
        f"| {key} | diverged / ran | divergence rate [95% CI] | IQM of eval return [95% CI] |",
        "|---|---|---|---|",
    ]
    rng = np.random.default_rng(seed)
    for value, members in groups.items():
        ran = [m for m in members if m["status"] in RAN]
        diverged = sum(m["status"] == "diverged" for m in ran)
        low, high = wilson(diverged, len(ran))
        rate = f"{diverged / len(ran):.2f} [{low:.2f}, {high:.2f}]" if ran else "—"
        scores = np.array([float(m["eval_return"]) for m in ran if m["eval_return"] not in ("", "nan")])
        iqm, iqm_low, iqm_high = bootstrap_iqm([scores], reps, rng)
        score = f"{iqm:.1f} [{iqm_low:.1f}, {iqm_high:.1f}]" if len(scores) else "—"
        lines.append(f"| {value} | {diverged} / {len(ran)} | {rate} | {score} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description="Print a report's cells.csv (or grid.csv, --by) as Markdown tables.")
    parser.add_argument("cells", type=Path, help="a cells.csv written by python -m rlexp.report")
    parser.add_argument("--sort", choices=["file", "iqm", "rate"], default="file", help="row order (default: file)")
    parser.add_argument("--by", nargs="+", metavar="KEY", help="per value of these swept keys instead (grid.csv)")
    args = parser.parse_args()
    grid = args.cells.with_name("grid.csv")
    for path in (args.cells, grid) if args.by else (args.cells,):
        if not path.is_file():
            print(f"findings_table: {path} is not a file; give the cells.csv of a report's dir", file=sys.stderr)
            return 2
    if args.by:
        with grid.open(newline="") as f:
            rows = list(csv.DictReader(f))
        for key in args.by:
            if rows and key not in rows[0]:
                print(f"findings_table: --by {key}: not a column of {grid}; give a swept key", file=sys.stderr)
                return 2
        print("\n\n".join(by_value(rows, key) for key in args.by))
        return 0
    with args.cells.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if args.sort != "file":
        key = "iqm" if args.sort == "iqm" else "divergence_rate"
        rows.sort(key=lambda r: -float(r[key]) if r[key] not in ("", "nan") else float("inf"))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
