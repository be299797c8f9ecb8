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
import json
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rlexp.cells import cell_name, is_cell_key, job_settings, parse_overrides
from rlexp.loggers import WANDB_MODES
from rlexp.report_data import SCORES, CellStats, Job, Report
from rlexp.report_html import render_html

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
]
FIGURES = {
    "heatmap_divergence": "heatmap_divergence.png",
    "heatmap_iqm": "heatmap_iqm.png",
    "performance_profile": "performance_profile.png",
    "learning_curves": "learning_curves.png",
}


class ReportError(Exception):
    """Bad input: one line that names the argument and the fix (exit code 2)."""


# ----------------------------------------------------------------------------- reading
def to_float(value: Any) -> float | None:
    """A number from the contract: floats, ints, the strings "nan"/"inf"/"-inf"; None otherwise."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


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


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl; lines that do not parse (a truncated last line) are skipped."""
    records: list[dict[str, Any]] = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return records
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def metric_curve(records: list[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of metric ``key`` in one member's records; non-finite values become NaN (gaps)."""
    points = [(to_float(r.get("step")), to_float(r.get(key))) for r in records if key in r]
    points = [(s, np.nan if y is None else y) for s, y in points if s is not None]
    if not points:
        return np.zeros(0), np.zeros(0)
    steps, values = zip(*points)
    return np.asarray(steps), np.asarray(values, dtype=float)


def learning_curve(path: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """(steps, returns, metric name) of one member: ``episode/return_last10`` (else
    ``episode/return``) against ``step``; non-finite values become NaN (gaps in the plot)."""
    records = read_metrics(path)
    key = "episode/return_last10" if any("episode/return_last10" in r for r in records) else "episode/return"
    return (*metric_curve(records, key), key)


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
                }
            )
            rows.append(row)
    return rows


def write_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str], path: Path) -> None:
    """grid.csv: empty fields for missing values."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row.get(k) for k in columns})


# ----------------------------------------------------------------------------- statistics
def score_key(rows: Sequence[dict[str, Any]]) -> str:
    """The score of a report (a key of SCORES): eval_return when a member that ran has one, else final_return."""
    evaluated = any(r["status"] != "crashed" and r["eval_return"] is not None for r in rows)
    return "eval_return" if evaluated else "final_return"


def add_scores(rows: Sequence[dict[str, Any]], key: str) -> None:
    """Each row's ``score``: its value of ``key`` (a key of SCORES)."""
    for r in rows:
        r["score"] = r[key]


def scored(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows that enter the statistics: not crashed, with a finite score."""
    return [r for r in rows if r["status"] != "crashed" and r["score"] is not None and math.isfinite(r["score"])]


def score_matrices(rows: Sequence[dict[str, Any]], cells: Sequence[str], tasks: Sequence[str]) -> dict[str, np.ndarray]:
    """rliable's score dict: cell -> [runs, tasks]. With several tasks the returns are min-max
    normalized per task over the whole grid, and each cell keeps as many runs as its smallest task."""
    pool = scored(rows)
    bounds = {}
    for task in tasks:
        values = [r["score"] for r in pool if r["env"] == task]
        bounds[task] = (min(values), max(values)) if values else (0.0, 1.0)
    out: dict[str, np.ndarray] = {}
    for cell in cells:
        columns = []
        for task in tasks:
            x = np.array([r["score"] for r in pool if r["cell"] == cell and r["env"] == task], dtype=float)
            if len(tasks) > 1:
                lo, hi = bounds[task]
                x = (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)
            columns.append(x)
        n = min(len(c) for c in columns)
        if n > 0:
            out[cell] = np.stack([c[:n] for c in columns], axis=1)  # [runs, tasks]
    return out


def _seeded(seed: int, fn: Callable[[], Any]) -> Any:
    # rliable's stratified bootstrap draws from numpy's global generator: seed it for each estimate
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        return fn()
    finally:
        np.random.set_state(state)


def iqm_fast(scores: np.ndarray) -> float:
    """rliable's IQM (scipy's trim_mean(scores, 0.25, axis=None): drop floor(n/4) lowest and highest
    of all n scores, average the rest) in plain numpy, ~20x faster inside the bootstrap."""
    x = np.sort(np.asarray(scores, dtype=float).ravel())
    cut = int(0.25 * x.size)
    return float(x[cut : x.size - cut].mean())


def iqm_estimates(
    scores: dict[str, np.ndarray], reps: int = 2000, seed: int = 0
) -> dict[str, tuple[float, float, float]]:
    """cell -> (IQM, CI low, CI high): rliable's aggregate_iqm and the 95% percentile interval of
    rliable's stratified bootstrap over runs (``get_interval_estimates``, ``reps`` resamples, numpy
    seeded with ``seed`` for each cell; the resamples use ``iqm_fast``, the same statistic)."""
    from rliable import library, metrics

    out = {}
    for cell, x in scores.items():
        _, ci = _seeded(
            seed,
            lambda cell=cell, x=x: library.get_interval_estimates(
                {cell: x}, lambda s: np.array([iqm_fast(s)]), reps=reps
            ),
        )
        out[cell] = (float(metrics.aggregate_iqm(x)), float(ci[cell][0, 0]), float(ci[cell][1, 0]))
    return out


def performance_profiles(
    scores: dict[str, np.ndarray], taus: np.ndarray, reps: int = 2000, seed: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """rliable's score-distribution profiles: per cell the fraction of runs with score > tau [T],
    and its 95% bootstrap band [2, T]."""
    from rliable import library

    def fraction_above(x: np.ndarray, tau_list: np.ndarray) -> np.ndarray:
        return (x.reshape(-1, 1) > tau_list.reshape(1, -1)).mean(axis=0)  # [runs·tasks, T] -> [T]

    return _seeded(
        seed, lambda: library.create_performance_profile(scores, taus, custom_profile_func=fraction_above, reps=reps)
    )


def poi_fast(x: np.ndarray, y: np.ndarray) -> float:
    """rliable's probability_of_improvement in numpy: per task P(X > Y) + ½·P(X = Y) over all pairs
    of runs (Mann-Whitney U / (n·m)), averaged over tasks. x: [n, tasks], y: [m, tasks]."""
    greater = (x[:, None, :] > y[None, :, :]).mean(axis=(0, 1))  # [tasks]
    ties = (x[:, None, :] == y[None, :, :]).mean(axis=(0, 1))
    return float(np.mean(greater + 0.5 * ties))


def probability_of_improvement(
    x: np.ndarray, y: np.ndarray, reps: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """P(X > Y) as rliable defines it (``metrics.probability_of_improvement``) with the 95% interval
    of its stratified independent bootstrap (``poi_fast`` in the resamples): (point, low, high)."""
    from rliable import library, metrics

    _, ci = _seeded(
        seed, lambda: library.get_interval_estimates({"p": [x, y]}, lambda a, b: np.array([poi_fast(a, b)]), reps=reps)
    )
    return float(metrics.probability_of_improvement(x, y)), float(ci["p"][0, 0]), float(ci["p"][1, 0])


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean (rliable's definition); NaN when empty."""
    return iqm_fast(np.asarray(values, dtype=float)) if len(values) else float("nan")


def cell_stats(
    rows: Sequence[dict[str, Any]], cells: Sequence[str], estimates: dict[str, tuple[float, float, float]]
) -> list[CellStats]:
    """The per-cell table: counts, divergence rate, IQM [CI], medians, causes."""
    out = []
    for cell in cells:
        live = [r for r in rows if r["cell"] == cell and r["status"] != "crashed"]
        diverged = [r for r in live if r["status"] == "diverged"]
        returns = [r["score"] for r in scored(live)]
        steps = [r["diverged_at_step"] for r in diverged if to_float(r["diverged_at_step"]) is not None]
        stats = CellStats(
            cell,
            len(live),
            len(returns),
            len(diverged),
            len(diverged) / len(live) if live else float("nan"),
            median_return=float(np.median(returns)) if returns else float("nan"),
            median_diverged_step=float(np.median(steps)) if steps else float("nan"),
            causes=Counter(f"{r['cause'] or '?'}@{r['where'] or '?'}" for r in diverged),
        )
        if cell in estimates:
            stats.iqm, low, high = estimates[cell]
            stats.ci = (low, high)
        out.append(stats)
    return out


def heatmap_values(
    rows: Sequence[dict[str, Any]],
    row_key: str | None,
    col_key: str | None,
    row_values: Sequence[str],
    col_values: Sequence[str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(divergence rate, IQM of the scores, members) per [row, col], pooling the members of every
    cell with those two values (the other swept keys are aggregated). NaN where no member ran."""
    shape = (len(row_values), len(col_values))
    rate, iqm_grid, count = np.full(shape, np.nan), np.full(shape, np.nan), np.zeros(shape, dtype=int)
    for i, rv in enumerate(row_values):
        for j, cv in enumerate(col_values):
            live = [
                r
                for r in rows
                if r["status"] != "crashed"
                and (row_key is None or r.get(row_key) == rv)
                and (col_key is None or r.get(col_key) == cv)
            ]
            count[i, j] = len(live)
            if live:
                rate[i, j] = sum(r["status"] == "diverged" for r in live) / len(live)
                iqm_grid[i, j] = iqm([r["score"] for r in scored(live)])
    return rate, iqm_grid, count


# ----------------------------------------------------------------------------- figures
def _png(fig: Any, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)


def plot_heatmap(
    values: np.ndarray,
    count: np.ndarray,
    row_key: str | None,
    col_key: str | None,
    row_values: Sequence[str],
    col_values: Sequence[str],
    title: str,
    fmt: str,
    cmap: str,
    path: Path,
    vmin: float | None = None,
    vmax: float | None = None,
) -> None:
    """One annotated heatmap PNG [rows, cols]; grey where no member ran."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 + 1.5 * len(col_values), 1.2 + 0.8 * len(row_values)))
    colormap = plt.get_cmap(cmap).with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=colormap, vmin=vmin, vmax=vmax, aspect="auto")
    fig.colorbar(image, ax=ax, fraction=0.05)
    ax.set_xticks(range(len(col_values)), [str(v) for v in col_values], rotation=30, ha="right")
    ax.set_yticks(range(len(row_values)), [str(v) for v in row_values])
    ax.set_xlabel(col_key or "")
    ax.set_ylabel(row_key or "")
    ax.set_title(title, fontsize=10)
    norm = image.norm
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            finite = bool(np.isfinite(values[i, j]))
            text = format(values[i, j], fmt) if finite else "–"
            red, green, blue, _ = colormap(norm(values[i, j])) if finite else (0.87, 0.87, 0.87, 1.0)
            dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5  # the background's luminance
            ax.text(
                j,
                i,
                f"{text}\nn={count[i, j]}",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if dark else "black",
            )
    _png(fig, path)


def plot_profiles(
    profiles: dict[str, np.ndarray], bands: dict[str, np.ndarray], taus: np.ndarray, xlabel: str, path: Path
) -> None:
    """Performance profiles: fraction of runs with score > tau per cell, with 95% bands."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = plt.get_cmap("tab10" if len(profiles) <= 10 else "tab20").colors
    for k, (cell, profile) in enumerate(profiles.items()):
        color = colors[k % len(colors)]
        ax.plot(taus, profile, lw=1.5, color=color, ls="-" if k < len(colors) else "--", label=cell)
        ax.fill_between(taus, bands[cell][0], bands[cell][1], color=color, alpha=0.15 if len(profiles) <= 4 else 0.06)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of runs with score > τ")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _png(fig, path)


def plot_learning_curves(
    panels: list[tuple[str, list[tuple[np.ndarray, np.ndarray, bool, Any]]]], ylabel: str, path: Path
) -> None:
    """Small multiples: one panel per cell, one thin line per member (red: diverged, its divergence
    step marked ×), shared axes."""
    import matplotlib.pyplot as plt

    n = max(1, len(panels))
    ncols = min(4, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.6 * nrows), sharex=True, sharey=True, squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (title, lines) in zip(axes.flat, panels):
        for steps, values, diverged, _ in lines:
            ax.plot(steps, values, lw=0.8, alpha=0.85, color="#c0392b" if diverged else "#2c6fbb")
            if diverged and len(steps):
                ax.plot(steps[-1], values[-1], "x", color="#c0392b", ms=6)
        ax.set_title(title, fontsize=8)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("env steps")
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel, fontsize=8)
    fig.tight_layout()
    _png(fig, path)


# ----------------------------------------------------------------------------- W&B
def resolve_mode(flag: str | None) -> str:
    """``--wandb-mode`` if given, else $WANDB_MODE (dryrun = offline), else offline."""
    from rlexp.config import LoggerConfig
    from rlexp.loggers import resolve_wandb_mode

    return resolve_wandb_mode(LoggerConfig(mode=flag))


def log_to_wandb(report: Report, mode: str, timeout: float) -> Path | None:
    """One W&B summary run (job_type report, group report) with grid.csv as a table, the figures as
    images and the per-cell IQM in the summary; files under ``<dir>/report_wandb``. Returns the run
    dir, or None when disabled."""
    if mode == "disabled":
        return None
    import wandb

    wandb_dir = report.root / "report_wandb"
    wandb_dir.mkdir(exist_ok=True)
    first = report.jobs[0]
    kwargs = dict(
        project=first.project,
        entity=first.entity,
        group="report",
        job_type="report",
        name=f"report {report.root.name}"[:128],
        dir=str(wandb_dir),
        reinit="create_new",
        config={
            "dir": str(report.root),
            "rows": report.row_key,
            "cols": report.col_key,
            "swept": report.keys,
            "reps": report.reps,
            "seed": report.seed,
        },
        settings=wandb.Settings(init_timeout=timeout, console="off", silent=True),
    )
    try:
        run = wandb.init(mode=mode, **kwargs)
    except Exception as err:  # no network or no credentials: never block, log offline
        if mode != "online":
            raise
        print(f"W&B online init failed ({type(err).__name__}: {err}); logging offline instead", file=sys.stderr)
        run = wandb.init(mode="offline", **kwargs)
    try:
        columns = report.columns
        table = wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in report.rows])
        images = {f"report/{name}": wandb.Image(str(path)) for name, path in report.figures.items()}
        run.log({"report/grid": table, **images})
        summary: dict[str, Any] = {
            "jobs": len(report.jobs),
            "members": len(report.rows),
            **{f"members_{s}": n for s, n in report.status_counts.items()},
        }
        for s in report.cells:
            summary[f"divergence_rate/{s.cell}"] = s.divergence_rate
            if math.isfinite(s.iqm):
                summary.update(
                    {f"iqm/{s.cell}": s.iqm, f"iqm_ci_low/{s.cell}": s.ci[0], f"iqm_ci_high/{s.cell}": s.ci[1]}
                )
        if report.poi is not None:
            a, b, (p, low, high) = report.poi
            summary.update({"poi/a": a, "poi/b": b, "poi/p": p, "poi/ci_low": low, "poi/ci_high": high})
        run.summary.update(summary)
        run_dir = Path(run.dir).parent
    finally:
        run.finish()
    return run_dir


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
    compare: Sequence[str] | None = None,
    reps: int = 2000,
    seed: int = 0,
    curves: Sequence[str] = (),
) -> Report:
    """Read ``root`` (a multirun or a run dir), compute the statistics and draw the figures into it.

    Raises ReportError on bad input (missing dir, no job summaries, unknown --rows/--cols/--compare).
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
    score = score_key(rows)
    add_scores(rows, score)
    columns = ["job", "cell", *varying, *GRID_TAIL]
    tasks = sorted({r["env"] for r in scored(rows)}) or sorted({j.env for j in jobs})
    cell_names = list(dict.fromkeys(j.cell for j in jobs))
    scores = score_matrices(rows, cell_names, tasks)
    for name in compare or ():
        if name not in scores:
            raise ReportError(
                f"--compare: unknown cell {name!r}; choose cells with scores: {', '.join(scores) or '(none)'}"
            )
    estimates = iqm_estimates(scores, reps, seed)
    cells = cell_stats(
        rows, [c for c in cell_names if any(r["cell"] == c and r["status"] != "crashed" for r in rows)], estimates
    )
    ranked = sorted((s for s in cells if math.isfinite(s.iqm)), key=lambda s: -s.iqm)

    pair = tuple(compare) if compare else ((ranked[0].cell, ranked[-1].cell) if len(ranked) > 1 else None)
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
        best=ranked[0] if ranked else None,
        worst=ranked[-1] if len(ranked) > 1 else None,
    )
    if pair is not None:
        report.poi = (pair[0], pair[1], probability_of_improvement(scores[pair[0]], scores[pair[1]], reps, seed))
    draw_figures(report, scores, curves)
    report.seconds = time.perf_counter() - start
    return report


def member_panels(report: Report) -> list[tuple[str, list[tuple[Path, Any]]]]:
    """Per cell (and task), the metrics.jsonl paths of its non-crashed jobs' members with their summaries."""
    panels = []
    for stats in report.cells:
        for task in report.tasks:
            members = [
                (job.dir / f"seed_{m.get('member', k)}" / "metrics.jsonl", m)
                for job in report.jobs
                if job.cell == stats.cell and job.env == task and job.status != "crashed"
                for k, m in enumerate(job.members)
            ]
            if members:
                panels.append((stats.cell if len(report.tasks) == 1 else f"{stats.cell} · {task}", members))
    return panels


def instrument_panels(report: Report, curves: Sequence[str]) -> dict[str, list]:
    """For each metric named by ``--curves``, one panel per cell with a line per member; ReportError
    naming the metric (and close recorded names) when no member recorded it."""
    panels = member_panels(report)
    records = {path: read_metrics(path) for _, members in panels for path, _ in members}
    recorded = {key for lines in records.values() for r in lines for key in r}
    out = {}
    for metric in curves:
        if metric not in recorded:
            close = difflib.get_close_matches(metric, sorted(recorded), n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}?" if close else "name a metric of docs/outputs.md"
            raise ReportError(f"--curves: {metric!r} is in no member's metrics.jsonl; {hint}")
        out[metric] = [
            (title, [(*metric_curve(records[p], metric), m.get("status") == "diverged", None) for p, m in members])
            for title, members in panels
        ]
    return out


def draw_figures(report: Report, scores: dict[str, np.ndarray], curves: Sequence[str] = ()) -> None:
    """Heatmaps, performance profile, learning curves and the instrument curves ``curves`` (metric
    names, one figure each: ``curve_<metric>.png``) as PNGs in the report's dir."""
    import matplotlib

    matplotlib.use("Agg")
    instruments = instrument_panels(report, curves)  # bad input before any file is written
    root, rows = report.root, report.rows
    row_values = _values_in_order(rows, report.row_key)
    col_values = _values_in_order(rows, report.col_key)
    rate, iqm_grid, count = heatmap_values(rows, report.row_key, report.col_key, row_values, col_values)
    pooled = " (other swept groups pooled)" if len(report.varying) > 2 else ""
    plot_heatmap(
        rate,
        count,
        report.row_key,
        report.col_key,
        row_values,
        col_values,
        f"divergence rate{pooled}",
        ".2f",
        "Reds",
        root / FIGURES["heatmap_divergence"],
        0.0,
        1.0,
    )
    plot_heatmap(
        iqm_grid,
        count,
        report.row_key,
        report.col_key,
        row_values,
        col_values,
        f"IQM {SCORES[report.score_key][0]}{pooled}",
        ".1f",
        "viridis",
        root / FIGURES["heatmap_iqm"],
    )
    report.figures = {
        "heatmap_divergence": root / FIGURES["heatmap_divergence"],
        "heatmap_iqm": root / FIGURES["heatmap_iqm"],
    }
    if scores:
        everything = np.concatenate([x.ravel() for x in scores.values()])
        taus = np.linspace(everything.min(), everything.max(), 101)
        profiles, bands = performance_profiles(scores, taus, report.reps, report.seed)
        name = SCORES[report.score_key][0]
        xlabel = f"normalized {name} τ" if len(report.tasks) > 1 else f"{name} τ"
        plot_profiles(profiles, bands, taus, xlabel, root / FIGURES["performance_profile"])
        report.figures["performance_profile"] = root / FIGURES["performance_profile"]

    panels = []
    metric_names = set()  # the curves' metric: episode/return_last10, or episode/return in older files
    for title, members in member_panels(report):
        lines = []
        for path, m in members:
            steps, values, metric = learning_curve(path)
            metric_names.add(metric)
            lines.append((steps, values, m.get("status") == "diverged", m.get("diverged_at_step")))
        panels.append((title, lines))
    for metric, metric_panels in instruments.items():
        path = root / f"curve_{re.sub(r'[^A-Za-z0-9_.-]+', '_', metric)}.png"
        plot_learning_curves(metric_panels, metric, path)
        report.figures[f"curve/{metric}"] = path
    report.curve_metric = " / ".join(sorted(metric_names)) or "episode/return_last10"
    if panels:
        ylabel = "return (last 10 episodes)" if metric_names == {"episode/return_last10"} else report.curve_metric
        plot_learning_curves(panels, ylabel, root / FIGURES["learning_curves"])
        report.figures["learning_curves"] = root / FIGURES["learning_curves"]


def write_outputs(report: Report) -> Path:
    """grid.csv and report.html in the report's dir; returns the HTML's path."""
    write_csv(report.rows, report.columns, report.root / "grid.csv")
    path = report.root / "report.html"
    path.write_text(render_html(report))
    return path


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage block
        print(f"report: error: {message}; see python -m rlexp.report --help", file=sys.stderr)
        raise SystemExit(2)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = _Parser(
        prog="python -m rlexp.report",
        description="Write report.html, grid.csv, heatmaps, a performance profile and a W&B summary run "
        "into a multirun (or run) dir.",
    )
    parser.add_argument("dir", type=Path, help="a multirun dir (outputs/multirun/<date>/<time>) or a run dir")
    parser.add_argument("--rows", help="swept group for the heatmap rows (default: the first swept group)")
    parser.add_argument("--cols", help="swept group for the heatmap columns (default: the second)")
    parser.add_argument(
        "--compare",
        nargs=2,
        metavar=("CELL_A", "CELL_B"),
        help="probability of improvement P(A > B) (default: best vs worst cell by IQM)",
    )
    parser.add_argument(
        "--curves",
        nargs="+",
        default=[],
        metavar="METRIC",
        help="instruments to draw against env steps, a panel per cell, a line per member (srank/q.1 dormant/q.0 ...)",
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
    if args.reps < 1:
        parser.error(f"--reps: {args.reps} must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (2 on bad input, with one line on stderr)."""
    args = parse_args(argv)
    try:
        report = build_report(args.dir, args.rows, args.cols, args.compare, args.reps, args.seed, args.curves)
    except ReportError as err:
        print(f"report: error: {err}", file=sys.stderr)
        return 2
    html = write_outputs(report)
    mode = resolve_mode(args.wandb_mode)
    run_dir = log_to_wandb(report, mode, args.wandb_timeout)
    c = report.status_counts
    print(
        f"report: {len(report.jobs)} jobs, {len(report.rows)} members (ok {c['ok']}, diverged {c['diverged']}, "
        f"crashed {c['crashed']}), {len(report.cells)} cells; {report.seconds:.1f} s"
    )
    print(f"wrote {html}, {report.root / 'grid.csv'}" + "".join(f", {p.name}" for p in report.figures.values()))
    if run_dir is not None:
        print(f"W&B run: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
