"""The report a person reads: ``python -m rlexp.report <multirun dir | run dir>``.

Reads the output contract (each job's ``summary.json``, ``seed_<k>/metrics.jsonl``, Hydra's
``.hydra/overrides.yaml`` and ``multirun.yaml``) and writes into that dir ``report.html``
(self-contained), ``grid.csv`` (one row per member), the figures as PNGs, and one W&B summary run
under ``report_wandb/``. Statistics follow rliable: IQM with 95% stratified-bootstrap confidence
intervals, performance profiles and the probability of improvement. Cells (the combinations of the
swept settings) are rliable's algorithms; env ids are its tasks. A member's score is its
``eval_return`` when the grid's jobs evaluated, else its training ``final_return`` (``SCORES``).
"""

from __future__ import annotations

import argparse
import csv
import difflib
import errno
import importlib.util
import json
import math
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rlexp.config.cells import cell_name, is_cell_key, job_settings, parse_overrides
from rlexp.report.data import CELL_COLUMNS, DIVERGED_SCORES, SCORES, CellStats, Curve, Job, Report, cell_rows
from rlexp.report.html import render_html
from rlexp.report.plots import (
    cell_colors,
    plot_aggregate_curves,
    plot_divergence_windows,
    plot_heatmap,
    plot_interval_estimates,
    plot_learning_curves,
    plot_poi_matrix,
    plot_profiles,
)
from rlexp.report.stats import (
    add_scores,
    aggregate_curve,
    bootstrap_iqm,
    finite,
    interval_estimates,
    normalizations,
    normalize,
    performance_profiles,
    poi_matrix,
    probability_of_improvement,
    score_matrices,
    scored,
    to_float,
    wilson,
)
from rlexp.run.loggers import WANDB_MODES
from rlexp.run.wandb_files import run_dirs

GRID_TAIL = [
    "env",
    "seed",
    "member",
    "status",
    "final_return",
    "eval_return",
    "steps",
    "episodes",
    "wall_s",
    "diverged_at_step",
    "cause",
    "where",
    "detail",
    "first_moved",
    "wandb_run",
]
FIGURES = {
    "heatmap_divergence": "heatmap_divergence.png",
    "heatmap_iqm": "heatmap_iqm.png",
    "performance_profile": "performance_profile.png",
    "learning_curves": "learning_curves.png",
    "aggregate_curves": "aggregate_curves.png",
    "interval_estimates": "interval_estimates.png",
    "poi_matrix": "poi_matrix.png",
    "divergence_windows": "divergence_windows.png",
}
# a member's instruments: every metrics.jsonl key but these (for the divergence windows' fallback)
NOT_INSTRUMENTS = ("step", "perf/", "train/updates", "train/epsilon", "episode/", "eval/", "weight_change/")


class ReportError(Exception):
    """Bad input: one line that names the argument and the fix (exit code 2)."""


# ----------------------------------------------------------------------------- reading
def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is missing, truncated or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_yaml(path: Path) -> Any:
    """The YAML document in ``path``, or None when it is missing or unreadable."""
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def read_metrics(path: Path, skipped: list[int] | None = None) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl; a line that is not a JSON object (a truncated last line, a
    corrupted one) is left out, its number (from 1) appended to ``skipped``."""
    records: list[dict[str, Any]] = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return records
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif skipped is not None:
            skipped.append(number)
    return records


def metric_curve(records: list[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of metric ``key`` in one member's records; non-finite values become NaN (gaps)."""
    points = [(to_float(r.get("step")), to_float(r.get(key))) for r in records if key in r]
    points = [(s, np.nan if y is None else y) for s, y in points if s is not None]
    if not points:
        return np.zeros(0), np.zeros(0)
    steps, values = zip(*points)
    return np.asarray(steps), np.asarray(values, dtype=float)


def learning_curve(records: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, str | None]:
    """(steps, returns, metric name) of one member: ``episode/return_last10`` (else
    ``episode/return``) against ``step``; non-finite values become NaN (gaps in the plot). The metric
    is None when the member recorded neither (an empty metrics.jsonl)."""
    for key in ("episode/return_last10", "episode/return"):
        if any(key in r for r in records):
            return (*metric_curve(records, key), key)
    return np.zeros(0), np.zeros(0), None


def _is_job_dir(path: Path) -> bool:
    return (path / "summary.json").exists() or (path / ".hydra").is_dir() or any(path.glob("seed_*"))


def _member_dirs(job_dir: Path) -> list[Path]:
    def index(p: Path) -> int:
        suffix = p.name.split("_", 1)[1]
        return int(suffix) if suffix.isdigit() else 10**9

    return sorted((p for p in job_dir.glob("seed_*") if p.is_dir()), key=index)


def load_job(job_dir: Path, root: Path) -> Job:
    """Read one job: its summary if it exists; otherwise (it died before writing one) a crashed job
    whose members come from ``seed_<k>/summary.json`` or, failing that, from ``.hydra/config.yaml``."""
    summary = read_json(job_dir / "summary.json")
    hydra_dir = job_dir / ".hydra"
    config = (summary or {}).get("config") or read_yaml(hydra_dir / "config.yaml") or {}
    config = config if isinstance(config, dict) else {}
    choices = (summary or {}).get("choices")
    if not isinstance(choices, dict):  # no summary: Hydra's record of the choices
        hydra_cfg = read_yaml(hydra_dir / "hydra.yaml") or {}
        choices = ((hydra_cfg.get("hydra") or {}).get("runtime") or {}).get("choices") or {}
    settings = job_settings(choices, read_yaml(hydra_dir / "overrides.yaml"))
    env = str((summary or {}).get("env") or (config.get("env") or {}).get("id") or "unknown")
    logger_cfg = config.get("logger") or {}
    name = "." if job_dir == root else str(job_dir.relative_to(root))

    members = (summary or {}).get("members")
    if not isinstance(members, list) or not members:
        members = [s for s in (read_json(d / "summary.json") for d in _member_dirs(job_dir)) if s is not None]
    if summary is None:
        status = "crashed"
        error = "no readable summary.json: the job died before writing it (or is still running)"
        if (job_dir / "error.txt").exists():
            lines = (job_dir / "error.txt").read_text(errors="replace").strip().splitlines()
            error = lines[-1] if lines else error
    else:
        status = str(summary.get("status") or "crashed")
        error = summary.get("error")
    if status == "crashed":  # every member of a crashed job counts as crashed
        n = len(members) or int(config.get("num_seeds") or 1)
        seed0 = int(config.get("seed") or 0)
        members = [
            {**(members[k] if k < len(members) else {"seed": seed0 + k, "member": k}), "status": "crashed"}
            for k in range(n)
        ]
        error = error or "status crashed without an error message"
    return Job(
        job_dir,
        name,
        status,
        None if error is None else str(error),
        env,
        settings,
        [m for m in members if isinstance(m, dict)],
        project=str(logger_cfg.get("project") or "rlexp"),
        entity=logger_cfg.get("entity"),
        sweep=logger_cfg.get("sweep"),
    )


def find_job_dirs(root: Path) -> list[Path]:
    """The job dirs under a multirun dir (its numbered children), or ``[root]`` for a run dir."""
    if (root / "summary.json").exists() or (root / ".hydra").is_dir():
        return [root]

    def order(p: Path) -> tuple[int, str]:
        return (int(p.name), "") if p.name.isdigit() else (10**9, p.name)

    return sorted(
        (
            p
            for p in root.iterdir()
            if p.is_dir() and not p.name.startswith(".") and p.name != "report_wandb" and _is_job_dir(p)
        ),
        key=order,
    )


# ----------------------------------------------------------------------------- the grid
def sweep_order(root: Path) -> list[str]:
    """Keys in the order the sweep named them (``multirun.yaml``), for rows/cols and cell labels."""
    data = read_yaml(root / "multirun.yaml") or {}
    task = (((data.get("hydra") or {}).get("overrides") or {}).get("task")) if isinstance(data, dict) else None
    return [k for k in parse_overrides(task) if is_cell_key(k)]


def varying_keys(jobs: Sequence[Job], order: Sequence[str]) -> list[str]:
    """Keys whose value differs across jobs: the sweep's own keys first, then the others sorted."""
    keys = {k for j in jobs for k in j.settings}
    varying = {k for k in keys if len({j.settings.get(k) for j in jobs}) > 1}
    return [k for k in order if k in varying] + sorted(varying - set(order))


def cell_keys(jobs: Sequence[Job], varying: Sequence[str]) -> list[str]:
    """The keys that name a cell: each varying key unless an earlier kept key already fixes its value
    (``+experiment=nan_hunt/tanh`` implies ``activation=tanh``, so activation is not repeated)."""
    kept: list[str] = []
    for key in varying:
        values: dict[tuple[str | None, ...], set] = {}
        for j in jobs:
            values.setdefault(tuple(j.settings.get(k) for k in kept), set()).add(j.settings.get(key))
        if not kept or any(len(v) > 1 for v in values.values()):
            kept.append(key)
    return kept


def grid_rows(jobs: Sequence[Job], keys: Sequence[str]) -> list[dict[str, Any]]:
    """One row per member (the columns of grid.csv): job, cell, the swept keys, then GRID_TAIL."""
    rows = []
    for job in jobs:
        for k, m in enumerate(job.members):
            div = m.get("divergence") if isinstance(m.get("divergence"), dict) else {}
            row: dict[str, Any] = {"job": job.name, "cell": job.cell}
            row.update({key: job.settings.get(key, "") for key in keys})
            row.update(
                {
                    "env": job.env,
                    "seed": m.get("seed"),
                    "member": m.get("member", k),
                    "status": m.get("status") or "crashed",
                    "final_return": to_float(m.get("final_return")),
                    "eval_return": to_float(m.get("eval_return")),
                    "steps": m.get("steps"),
                    "episodes": m.get("episodes"),
                    "wall_s": to_float(m.get("wall_s")),
                    "diverged_at_step": m.get("diverged_at_step"),
                    "cause": div.get("cause"),
                    "where": div.get("where"),
                    "detail": div.get("detail"),
                    "first_moved": moved_text(div.get("first_moved")),
                    "wandb_run": " ".join(
                        p.name.rsplit("-", 1)[-1] for p in run_dirs(job.dir / f"seed_{m.get('member', k)}")
                    ),
                    "_first_moved": div.get("first_moved") if isinstance(div.get("first_moved"), dict) else None,
                    "_dir": job.dir / f"seed_{m.get('member', k)}",
                }
            )
            rows.append(row)
    return rows


def moved_text(moved: Any) -> str | None:
    """``first_moved`` in one line: ``grad_norm/q.0 55 -> 1.02e+03 (steps 2000-5000)``; None without one."""
    if not isinstance(moved, dict):
        return None
    return (
        f"{moved.get('instrument')} {to_float(moved.get('from')) or 0:.3g} -> {to_float(moved.get('to')) or 0:.3g} "
        f"(steps {moved.get('since_step')}-{moved.get('step')})"
    )


def write_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str], path: Path) -> None:
    """grid.csv: empty fields for missing values."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in columns})


# ----------------------------------------------------------------------------- statistics per cell
def cell_stats(
    rows: Sequence[dict[str, Any]],
    cells: Sequence[str],
    estimates: dict[str, dict[str, tuple[float, float, float]]],
    tasks: Sequence[str],
) -> list[CellStats]:
    """The per-cell table: counts (total, ran, scored), divergence rate [Wilson CI], the interval
    estimates, raw medians per task, causes and the members' W&B run ids."""
    out = []
    for cell in cells:
        mine = [r for r in rows if r["cell"] == cell]
        live = [r for r in mine if r["status"] != "crashed"]
        diverged = [r for r in live if r["status"] == "diverged"]
        used = scored(live)
        steps = [r["diverged_at_step"] for r in diverged if to_float(r["diverged_at_step"]) is not None]
        by_task = {t: [r["raw_score"] for r in used if r["env"] == t and finite(r["raw_score"])] for t in tasks}
        stats = CellStats(
            cell,
            len(mine),
            len(live),
            len(used),
            len(diverged),
            len(diverged) / len(live) if live else float("nan"),
            rate_ci=wilson(len(diverged), len(live)),
            median_return=float(np.median(by_task[tasks[0]])) if len(tasks) == 1 and by_task[tasks[0]] else math.nan,
            median_by_task={t: float(np.median(v)) for t, v in by_task.items() if v},
            median_diverged_step=float(np.median(steps)) if steps else float("nan"),
            causes=Counter(f"{r['cause'] or '?'}@{r['where'] or '?'}" for r in diverged),
            wandb_runs=[run for r in mine for run in str(r.get("wandb_run") or "").split()],
        )
        if cell in estimates:
            stats.estimates = estimates[cell]
            stats.iqm, low, high = estimates[cell]["IQM"]
            stats.ci = (low, high)
        out.append(stats)
    return out


def heatmap_values(
    report: Report, row_values: Sequence[str], col_values: Sequence[str], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Per [row, col], pooling the members of every cell with those two values: the divergence rate
    with its Wilson interval, the IQM of the scores (normalized with several tasks) with its stratified
    bootstrap interval, and the members that ran. NaN where no member ran."""
    shape = (len(row_values), len(col_values))
    out = {k: np.full(shape, np.nan) for k in ("rate", "rate_low", "rate_high", "iqm", "iqm_low", "iqm_high")}
    out["count"] = np.zeros(shape, dtype=int)
    for i, rv in enumerate(row_values):
        for j, cv in enumerate(col_values):
            live = [
                r
                for r in report.rows
                if r["status"] != "crashed"
                and (report.row_key is None or r.get(report.row_key) == rv)
                and (report.col_key is None or r.get(report.col_key) == cv)
            ]
            out["count"][i, j] = len(live)
            if not live:
                continue
            k = sum(r["status"] == "diverged" for r in live)
            out["rate"][i, j] = k / len(live)
            out["rate_low"][i, j], out["rate_high"][i, j] = wilson(k, len(live))
            groups = [np.array([_stat_score(report, r) for r in scored(live) if r["env"] == t]) for t in report.tasks]
            out["iqm"][i, j], out["iqm_low"][i, j], out["iqm_high"][i, j] = bootstrap_iqm(groups, report.reps, rng)
    return out


def _stat_score(report: Report, row: dict[str, Any]) -> float:
    """A row's score as the statistics use it: normalized with several tasks, else raw."""
    return normalize(row["score"], report.normalization[row["env"]]) if report.normalized else row["score"]


# ----------------------------------------------------------------------------- the report
def _values_in_order(rows: Sequence[dict[str, Any]], key: str | None) -> list[str]:
    if key is None:
        return [""]
    seen: dict[str, None] = {}
    for r in rows:
        seen.setdefault(r.get(key, ""), None)
    return list(seen)


def build_report(
    root: Path,
    rows_key: str | None = None,
    cols_key: str | None = None,
    compare: Sequence[Sequence[str]] | None = None,
    reps: int = 2000,
    seed: int = 0,
    curves: Sequence[str] = (),
    diverged_score: str = "frozen",
    top: int = 8,
    last_n: int = 20,
    windows: int = 8,
    draw: bool = True,
    out: Path | None = None,
) -> Report:
    """Read ``root`` (a multirun or a run dir), compute the statistics and draw the figures into it (or
    into ``out``).
    ``compare``: pairs of cells for the probability of improvement (default: the matrix over the
    ``top`` cells, at most 6); ``top``: cells drawn in the curve, profile and interval figures;
    ``last_n``: log steps drawn before a divergence; ``windows``: diverged members drawn; ``draw``: False
    computes the statistics alone (no figures, no curves, no probability-of-improvement matrix).

    Raises ReportError on bad input (missing dir, no job summaries, unknown --rows/--cols/--compare/--curves).
    """
    start = time.perf_counter()
    if not root.exists():
        raise ReportError(
            f"DIR: {root} does not exist; pass a multirun dir (outputs/multirun/<date>/<time>) or a run dir"
        )
    if not root.is_dir():
        raise ReportError(f"DIR: {root} is not a directory; pass a multirun dir or a run dir")
    job_dirs = find_job_dirs(root)
    if not any((d / "summary.json").exists() for d in job_dirs):
        raise ReportError(
            f"DIR: no job summary.json under {root}; pass the multirun dir that holds the job dirs "
            "(0/, 1/, …) or a run dir that holds summary.json"
        )
    jobs = [load_job(d, root) for d in job_dirs]
    varying = varying_keys(jobs, sweep_order(root))
    keys = cell_keys(jobs, varying)
    for job in jobs:
        job.cell = cell_name(job.settings, keys)
    for flag, key in (("--rows", rows_key), ("--cols", cols_key)):
        if key is not None and key not in varying:
            swept = ", ".join(varying) or "(none: nothing was swept)"
            raise ReportError(f"{flag}: {key!r} is not a swept group; choose one of: {swept}")
    if rows_key is not None and rows_key == cols_key:
        raise ReportError(f"--cols: {cols_key!r} is also --rows; choose two different swept groups")
    rest = [k for k in varying if k not in (rows_key, cols_key)]
    row_key = rows_key or (rest.pop(0) if rest else None)
    col_key = cols_key or (rest.pop(0) if rest else None)

    rows = grid_rows(jobs, varying)
    evaluated = any(r["status"] != "crashed" and r["eval_return"] is not None for r in rows)
    score = "eval_return" if evaluated else "final_return"
    tasks = sorted({r["env"] for r in rows if r["status"] != "crashed"}) or sorted({j.env for j in jobs})
    norms = normalizations(rows, tasks, score)
    add_scores(rows, score, diverged_score, norms)
    columns = ["job", "cell", *varying, *GRID_TAIL]
    cell_names = list(dict.fromkeys(j.cell for j in jobs))
    scores = score_matrices(rows, cell_names, tasks, norms)
    pairs = [tuple(p) for p in compare or ()]
    for name in (c for p in pairs for c in p):
        if name not in scores:
            raise ReportError(
                f"--compare: unknown cell {name!r}; choose cells with scores: {', '.join(scores) or '(none)'}"
            )
    gamma = 1.0 if len(tasks) > 1 else norms[tasks[0]].reference
    estimates = interval_estimates(scores, gamma, reps, seed)
    ran = [c for c in cell_names if any(r["cell"] == c and r["status"] != "crashed" for r in rows)]
    cells = cell_stats(rows, ran, estimates, tasks)
    ranked = sorted((s for s in cells if math.isfinite(s.iqm)), key=lambda s: -s.iqm)
    counts = Counter(r["status"] for r in rows)
    report = Report(
        root,
        jobs,
        keys,
        varying,
        rows,
        columns,
        tasks,
        cells,
        row_key,
        col_key,
        reps,
        seed,
        {s: counts.get(s, 0) for s in ("ok", "diverged", "crashed")},
        score_key=score,
        diverged_score=diverged_score,
        normalization=norms,
        gamma=gamma,
        best=ranked[0] if ranked else None,
        worst=ranked[-1] if len(ranked) > 1 else None,
        last_n=last_n,
        out=out,
    )
    named = list(dict.fromkeys(c for p in pairs for c in p))
    report.shown = list(dict.fromkeys([s.cell for s in ranked[:top]] + named))
    report.poi_cells = named or [s.cell for s in ranked[: min(top, 6)]]
    if not pairs and len(ranked) > 1:
        pairs = [(ranked[0].cell, ranked[1].cell)]  # the best against the runner-up
    report.poi = [(a, b, probability_of_improvement(scores[a], scores[b], reps, seed)) for a, b in pairs]
    report.divergences = [r for r in rows if r["status"] == "diverged"]
    if draw:
        draw_figures(report, scores, curves, windows)
    report.seconds = time.perf_counter() - start
    return report


class _Records(dict):
    """metrics.jsonl records by path, each file read once; ``skipped``: the line numbers of each file's
    lines that could not be read."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped: dict[Path, list[int]] = {}

    def __missing__(self, path: Path) -> list[dict[str, Any]]:
        skipped: list[int] = []
        self[path] = records = read_metrics(path, skipped)
        if skipped:
            self.skipped[path] = skipped
        return records


def shown_members(report: Report) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(cell, task, its non-crashed members' grid rows) for each shown cell and task."""
    out = []
    for cell in report.shown:
        for task in report.tasks:
            members = [r for r in report.rows if r["cell"] == cell and r["env"] == task and r["status"] != "crashed"]
            if members:
                out.append((cell, task, members))
    return out


def check_curves(report: Report, curves: Sequence[str], records: _Records) -> None:
    """ReportError naming a ``--curves`` metric no shown member recorded, with close recorded names."""
    recorded = {
        k
        for _, _, members in shown_members(report)
        for m in members
        for r in records[m["_dir"] / "metrics.jsonl"]
        for k in r
    }
    for metric in curves:
        if metric not in recorded:
            close = difflib.get_close_matches(metric, sorted(recorded), n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}?" if close else "name a metric of docs/outputs.md"
            raise ReportError(f"--curves: {metric!r} is in no member's metrics.jsonl; {hint}")


def instrument_panels(report: Report, curves: Sequence[str], records: _Records | None = None) -> dict[str, list]:
    """For each metric named by ``--curves``, one panel per shown cell (and task) with a line per member:
    (steps, values, diverged, diverged_at_step)."""
    records = _Records() if records is None else records
    check_curves(report, curves, records)
    multi = len(report.tasks) > 1
    return {
        metric: [
            (
                f"{cell} · {task}" if multi else cell,
                [
                    (
                        *metric_curve(records[m["_dir"] / "metrics.jsonl"], metric),
                        m["status"] == "diverged",
                        m["diverged_at_step"],
                    )
                    for m in members
                ],
            )
            for cell, task, members in shown_members(report)
        ]
        for metric in curves
    }


def aggregate_curves(
    report: Report, metric: str, records: _Records, rng: np.random.Generator, returns: bool
) -> list[Curve]:
    """Per shown cell and task, the IQM of ``metric`` across members at each env step with its 95%
    stratified-bootstrap band. For a return metric (``returns``) the --diverged-score rule holds after a
    member's divergence (frozen: its last value; zero: the random-policy return; drop: left out)."""
    out = []
    for cell, task, members in shown_members(report):
        lines = []
        for m in members:
            steps, values = metric_curve(records[m["_dir"] / "metrics.jsonl"], metric)
            fill = None
            if returns and m["status"] == "diverged":
                if report.diverged_score == "drop":
                    continue
                last = values[np.isfinite(values)]
                if report.diverged_score == "zero":
                    fill = report.normalization[task].random
                elif len(last):
                    fill = float(last[-1])
            lines.append((task, steps, values, fill))
        steps, point, low, high, n = aggregate_curve(lines, report.reps, rng)
        if steps:
            out.append(Curve(cell, task, metric, steps, point, low, high, n))
    return out


def divergence_windows(report: Report, records: _Records, limit: int) -> list[tuple]:
    """Up to ``limit`` diverged members (one per cell first): the instrument that moved first (else the
    one that grew most) over the member's last ``report.last_n`` log records, against the first healthy
    member of the same cell over the same steps."""
    order = sorted(report.divergences, key=lambda r: (r["cell"], r["member"]))
    firsts = list({r["cell"]: r for r in reversed(order)}.values())[::-1]
    chosen = firsts + [r for r in order if r not in firsts]
    panels = []
    for row in chosen:
        if len(panels) >= limit:
            break
        window = records[row["_dir"] / "metrics.jsonl"][-report.last_n :]
        if not window:
            continue
        metric = (row["_first_moved"] or {}).get("instrument") or _grown_most(window)
        if metric is None:
            continue
        steps, values = metric_curve(window, metric)
        lo, hi = (steps[0], steps[-1]) if len(steps) else (0, 0)
        healthy = next(
            (r for r in report.rows if r["cell"] == row["cell"] and r["env"] == row["env"] and r["status"] == "ok"),
            None,
        )
        other = None
        if healthy is not None:
            h_steps, h_values = metric_curve(records[healthy["_dir"] / "metrics.jsonl"], metric)
            keep = (h_steps >= lo) & (h_steps <= hi)
            other = (h_steps[keep], h_values[keep])
        title = f"{row['cell']} · member {row['member']}: {row['cause']}@{row['where']}"
        if healthy is not None:
            title += f" (healthy: member {healthy['member']})"
        at = to_float(row["diverged_at_step"])
        panels.append((title, metric, (steps, values), other, hi if at is None else at))
    return panels


def _grown_most(window: list[dict[str, Any]]) -> str | None:
    """The instrument whose magnitude grew most between its first and last finite value in ``window``."""
    best, ratio = None, 0.0
    for key in {k for r in window for k in r if not k.startswith(NOT_INSTRUMENTS)}:
        values = [abs(v) for v in (to_float(r.get(key)) for r in window) if v is not None and math.isfinite(v)]
        if len(values) > 1 and values[-1] / max(values[0], 1e-12) > ratio:
            best, ratio = key, values[-1] / max(values[0], 1e-12)
    return best


def _safe(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", metric)


def draw_figures(report: Report, scores: dict[str, np.ndarray], curves: Sequence[str] = (), windows: int = 8) -> None:
    """Every figure as a PNG in the report's dir (report.figures): heatmaps with intervals, interval
    estimates, probability-of-improvement matrix, performance profile, learning curves (per member and
    aggregate), the ``curves`` instruments (``curve_<metric>.png``, ``aggregate_<metric>.png``) and the
    windows before divergences."""
    records = _Records()
    report.unreadable = records.skipped  # filled as the figures read the files
    instruments = instrument_panels(report, curves, records)  # bad input before any file is written
    root, rows, figures = report.out_dir, report.rows, report.figures
    rng = np.random.default_rng(report.seed)
    row_values = _values_in_order(rows, report.row_key)
    col_values = _values_in_order(rows, report.col_key)
    grid = heatmap_values(report, row_values, col_values, rng)
    pooled = " (other swept groups pooled)" if len(report.varying) > 2 else ""
    axes, labels = (report.row_key, report.col_key), (row_values, col_values)
    plot_heatmap(
        grid["rate"], grid["rate_low"], grid["rate_high"], grid["count"], axes, labels,
        f"divergence rate [95% Wilson CI]{pooled}", ".2f", "Reds", root / FIGURES["heatmap_divergence"], 0.0, 1.0,
    )  # fmt: skip
    name = score_name(report)
    plot_heatmap(
        grid["iqm"], grid["iqm_low"], grid["iqm_high"], grid["count"], axes, labels,
        f"IQM {name} [95% CI]{pooled}", ".2f" if report.normalized else ".1f", "viridis",
        root / FIGURES["heatmap_iqm"],
    )  # fmt: skip
    figures["heatmap_divergence"] = root / FIGURES["heatmap_divergence"]
    figures["heatmap_iqm"] = root / FIGURES["heatmap_iqm"]
    shown = [s for s in report.cells if s.cell in report.shown]
    colors = cell_colors(list(dict.fromkeys([*report.shown, *(s.cell for s in report.cells)])))  # every figure's
    if shown:
        plot_interval_estimates(shown, name, root / FIGURES["interval_estimates"], colors)
        figures["interval_estimates"] = root / FIGURES["interval_estimates"]
    if len(report.poi_cells) > 1:
        report.poi_matrix = poi_matrix(scores, report.poi_cells, report.reps, report.seed)
        plot_poi_matrix(*report.poi_matrix, report.poi_cells, root / FIGURES["poi_matrix"])
        figures["poi_matrix"] = root / FIGURES["poi_matrix"]
    profiled = {c: scores[c] for c in report.shown if c in scores}
    if profiled:
        everything = np.concatenate([x.ravel() for x in profiled.values()])
        taus = np.linspace(everything.min(), everything.max(), 101)
        profiles, bands = performance_profiles(profiled, taus, report.reps, report.seed)
        plot_profiles(profiles, bands, taus, f"{name} τ", root / FIGURES["performance_profile"], colors)
        figures["performance_profile"] = root / FIGURES["performance_profile"]

    panels, metric_names = [], set()  # the curves' metric: episode/return_last10, or episode/return in older files
    multi = len(report.tasks) > 1
    for cell, task, members in shown_members(report):
        lines = []
        for m in members:
            steps, values, metric = learning_curve(records[m["_dir"] / "metrics.jsonl"])
            if metric is not None:
                metric_names.add(metric)
            lines.append((steps, values, m["status"] == "diverged", m["diverged_at_step"]))
        panels.append((f"{cell} · {task}" if multi else cell, lines))
    report.curve_metric = " / ".join(sorted(metric_names)) or "episode/return_last10"
    if panels and metric_names:
        ylabel = "return (last 10 episodes)" if metric_names == {"episode/return_last10"} else report.curve_metric
        plot_learning_curves(panels, ylabel, root / FIGURES["learning_curves"])
        figures["learning_curves"] = root / FIGURES["learning_curves"]

    has_eval = any(
        "eval/return" in r
        for _, _, ms in shown_members(report)
        for m in ms
        for r in records[m["_dir"] / "metrics.jsonl"]
    )
    report.return_metric = "eval/return" if has_eval else "episode/return_last10"
    report.curves = aggregate_curves(report, report.return_metric, records, rng, returns=True)
    if report.curves:
        ylabel = "IQM eval return" if has_eval else "IQM return (last 10 episodes)"
        plot_aggregate_curves(report.curves, ylabel, root / FIGURES["aggregate_curves"], colors)
        figures["aggregate_curves"] = root / FIGURES["aggregate_curves"]
    for metric, metric_panels in instruments.items():
        path = root / f"curve_{_safe(metric)}.png"
        plot_learning_curves(metric_panels, metric, path)
        figures[f"curve/{metric}"] = path
        aggregate = aggregate_curves(report, metric, records, rng, returns=False)
        report.curves += aggregate
        if aggregate:
            path = root / f"aggregate_{_safe(metric)}.png"
            plot_aggregate_curves(aggregate, f"IQM {metric}", path, colors)
            figures[f"aggregate/{metric}"] = path
    window_panels = divergence_windows(report, records, windows)
    if window_panels:
        plot_divergence_windows(window_panels, root / FIGURES["divergence_windows"])
        figures["divergence_windows"] = root / FIGURES["divergence_windows"]


def score_name(report: Report) -> str:
    """What the statistics are of: ``eval return``, or ``normalized eval return`` with several tasks."""
    name = SCORES[report.score_key][0]
    return f"normalized {name}" if report.normalized else name


def write_outputs(report: Report) -> Path:
    """grid.csv, cells.csv, curves.csv and report.html in the report's dir; returns the HTML's path."""
    write_csv(report.rows, report.columns, report.out_dir / "grid.csv")
    write_csv(cell_rows(report), CELL_COLUMNS, report.out_dir / "cells.csv")
    curve_rows = [
        {"cell": c.cell, "task": c.task, "metric": c.metric, "step": s, "iqm": v, "ci_low": lo, "ci_high": hi, "n": n}
        for c in report.curves
        for s, v, lo, hi, n in zip(c.steps, c.iqm, c.low, c.high, c.n)
    ]
    write_csv(
        curve_rows, ["cell", "task", "metric", "step", "iqm", "ci_low", "ci_high", "n"], report.out_dir / "curves.csv"
    )
    path = report.out_dir / "report.html"
    path.write_text(render_html(report))
    return path


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage block
        print(f"report: error: {message}; see python -m rlexp.report --help", file=sys.stderr)
        raise SystemExit(2)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = _Parser(
        prog="python -m rlexp.report",
        description="Write report.html, grid.csv, cells.csv, curves.csv, the figures and a W&B summary run "
        "into a multirun (or run) dir.",
    )
    parser.add_argument("dir", type=Path, help="a multirun dir (outputs/multirun/<date>/<time>) or a run dir")
    parser.add_argument(
        "--out", type=Path, help="the dir to write the report into, made if missing (default: DIR itself)"
    )
    parser.add_argument("--rows", help="swept group for the heatmap rows (default: the first swept group)")
    parser.add_argument("--cols", help="swept group for the heatmap columns (default: the second)")
    parser.add_argument(
        "--compare",
        nargs=2,
        action="append",
        metavar=("CELL_A", "CELL_B"),
        help="a pair for the probability of improvement P(A > B), repeatable; the matrix then covers the cells "
        "named (default: the matrix over the top cells by IQM, at most 6, and best vs runner-up)",
    )
    parser.add_argument(
        "--curves",
        nargs="+",
        default=[],
        metavar="METRIC",
        help="instruments to draw against env steps: per member and as the IQM across members with a 95%% band "
        "(srank/q.1 grad_norm/q.0 ...)",
    )
    parser.add_argument(
        "--diverged-score",
        choices=tuple(DIVERGED_SCORES),
        default="frozen",
        help="how a diverged member is scored: frozen (its score at the divergence, default), zero (the random "
        "policy's score), drop (left out)",
    )
    parser.add_argument(
        "--top", type=int, default=8, help="cells drawn in the curves, profile and interval figure (default 8, by IQM)"
    )
    parser.add_argument("--last", type=int, default=20, help="log steps drawn before a divergence (default 20)")
    parser.add_argument(
        "--windows", type=int, default=8, help="diverged members drawn against a healthy one (default 8)"
    )
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument(
        "--wandb-mode",
        choices=WANDB_MODES,
        default=None,
        help="W&B summary run: offline | online | disabled (default: $WANDB_MODE, else offline)",
    )
    parser.add_argument(
        "--wandb-timeout",
        type=float,
        default=20.0,
        help="seconds an online W&B run may wait for the server before going offline (default 20)",
    )
    args = parser.parse_args(argv)
    for flag, value in (("--reps", args.reps), ("--top", args.top), ("--last", args.last)):
        if value < 1:
            parser.error(f"{flag}: {value} must be at least 1")
    if args.windows < 0:
        parser.error(f"--windows: {args.windows} must be at least 0")
    return args


def check_writable(out: Path) -> None:
    """ReportError when the report's dir ``out`` (made if missing) cannot be written, naming the errno
    and --out."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write_check"):
            pass
    except OSError as exc:
        code = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        raise ReportError(
            f"cannot write {out}: {code} ({exc.strerror or exc}); pass --out DIR to write the report elsewhere"
        ) from None


REPORT_EXTRA = ("rliable", "matplotlib", "pandas", "arch")  # the report extra's packages (pyproject.toml)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (2 on bad input or a missing extra, with one line on stderr)."""
    from rlexp.report.wandb_run import log_to_wandb, resolve_mode

    args = parse_args(argv)
    missing = [name for name in REPORT_EXTRA if importlib.util.find_spec(name) is None]
    if missing:  # before any file is written
        print(f"report: error: needs {', '.join(missing)}; pip install -e '.[report]'", file=sys.stderr)
        return 2
    try:
        if args.dir.is_dir():  # else build_report names the mistake
            check_writable(args.out or args.dir)
        report = build_report(
            args.dir, args.rows, args.cols, args.compare, args.reps, args.seed, args.curves,
            args.diverged_score, args.top, args.last, args.windows, out=args.out,
        )  # fmt: skip
    except ReportError as err:
        print(f"report: error: {err}", file=sys.stderr)
        return 2
    html = write_outputs(report)
    for path, numbers in report.unreadable.items():  # their points are missing from the curves
        lines = ", ".join(map(str, numbers[:10])) + (", ..." if len(numbers) > 10 else "")
        print(f"report: warning: {path}: skipped {len(numbers)} unreadable line(s): {lines}", file=sys.stderr)
    run_dir = log_to_wandb(report, resolve_mode(args.wandb_mode), args.wandb_timeout)
    c = report.status_counts
    print(
        f"report: {len(report.jobs)} jobs, {len(report.rows)} members (ok {c['ok']}, diverged {c['diverged']}, "
        f"crashed {c['crashed']}), {len(report.cells)} cells; {report.seconds:.1f} s"
    )
    print(f"wrote {html}, grid.csv, cells.csv, curves.csv" + "".join(f", {p.name}" for p in report.figures.values()))
    if run_dir is not None:
        print(f"W&B run: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
