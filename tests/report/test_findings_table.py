"""scripts/findings_table.py: a report's cells.csv and grid.csv as docs/findings.md's Markdown tables, the
rates and intervals checked against direct computations."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlexp.report.main import GRID_TAIL

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "findings_table.py"
Z = 1.959963984540054  # the normal's 97.5% quantile


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def write(path: Path, rows: list[dict], columns: list[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def member(activation: str, status: str, eval_return: float | str) -> dict:
    return {"job": 0, "cell": f"activation={activation}", "activation": activation, "status": status,
            "eval_return": eval_return}  # fmt: skip


@pytest.fixture
def report_dir(tmp_path: Path) -> Path:
    cells = [
        {"cell": "activation=relu", "n_ran": 4, "diverged": 1, "divergence_rate": 0.25, "rate_ci_low": 0.046,
         "rate_ci_high": 0.699, "iqm": 412.25, "iqm_ci_low": 300.0, "iqm_ci_high": 500.0, "mean": 450.0,
         "mean_ci_low": 200.0, "mean_ci_high": 500.0},
        {"cell": "activation=tanh", "n_ran": 4, "diverged": 0, "divergence_rate": 0.0, "rate_ci_low": 0.0,
         "rate_ci_high": 0.49, "iqm": "", "iqm_ci_low": "", "iqm_ci_high": "", "mean": "",
         "mean_ci_low": "", "mean_ci_high": ""},
    ]  # fmt: skip
    write(tmp_path / "cells.csv", cells, list(cells[0]))
    grid = [member("relu", "ok", 500.0), member("relu", "diverged", 20.0), member("relu", "ok", 400.0)]
    grid += [member("relu", "crashed", ""), member("tanh", "ok", 300.0), member("tanh", "ok", "")]
    write(tmp_path / "grid.csv", grid, ["job", "cell", "activation", *GRID_TAIL])
    return tmp_path


def test_cells_rows_keep_the_reports_figures(report_dir):
    proc = run(str(report_dir / "cells.csv"), "--sort", "iqm")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[2] == "| activation=relu | 1 / 4 | 0.25 [0.05, 0.70] | 412.2 [300.0, 500.0] | 450.0 [200.0, 500.0] |"
    assert lines[3] == "| activation=tanh | 0 / 4 | 0.00 [0.00, 0.49] | — | — |"  # nothing scored: no IQM


def test_by_key_pools_the_members_of_each_value(report_dir):
    proc = run(str(report_dir / "cells.csv"), "--by", "activation")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in proc.stdout.splitlines()[2:]}
    # relu: 3 ran (the crashed member is left out), 1 diverged; the Wilson interval computed here
    p, n = 1 / 3, 3
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    assert f"| 1 / 3 | 0.33 [{centre - half:.2f}, {centre + half:.2f}] |" in rows["relu"]
    # the IQM of 3 scores is their middle one's mean (the 25% cut of 3 values removes none): the mean
    assert rows["relu"].split(" | ")[3].startswith(f"{np.mean([500.0, 20.0, 400.0]):.1f} [")
    assert "| 0 / 2 | 0.00 [" in rows["tanh"] and rows["tanh"].split(" | ")[3].startswith("300.0 [300.0, 300.0]")


@pytest.mark.parametrize("args", [["missing.csv"], ["{dir}/cells.csv", "--by", "optimizer"]])
def test_a_missing_file_or_key_is_one_line_and_exit_2(report_dir, args):
    proc = run(*[a.format(dir=report_dir) for a in args])
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
