"""The report's W&B run: one summary run (job_type report) holding the per-cell statistics table with
the W&B run ids of each cell's members, grid.csv as a table, the figures as images and beside them
native W&B charts (bar charts of the IQM and the divergence rate, line plots of the aggregate curves
with their 95% bands as series of their own)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from rlexp.report.data import CELL_COLUMNS, ESTIMATES, Report, cell_rows


def resolve_mode(flag: str | None) -> str:
    """``--wandb-mode`` if given, else $WANDB_MODE (dryrun = offline), else offline."""
    from rlexp.config.schema import LoggerConfig
    from rlexp.run.loggers import resolve_wandb_mode

    return resolve_wandb_mode(LoggerConfig(mode=flag))


def _clean(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def charts(report: Report) -> dict[str, Any]:
    """The native charts: ``report/chart/<estimate>`` (median, iqm, mean, optimality_gap) and
    ``report/chart/divergence_rate`` (bars per cell) and
    ``report/chart/curve/<task>/<metric>`` (per shown cell its IQM, CI low and CI high against env steps)."""
    import wandb

    out: dict[str, Any] = {}
    rows = [r for r in cell_rows(report) if r.get("iqm") is not None and math.isfinite(r["iqm"])]
    for name in ESTIMATES:
        key = name.lower().replace(" ", "_")
        table = wandb.Table(columns=["cell", key], data=[[r["cell"], _clean(r[key])] for r in rows])
        out[f"report/chart/{key}"] = wandb.plot.bar(table, "cell", key, title=f"{name} per cell")
    table = wandb.Table(
        columns=["cell", "divergence_rate"], data=[[s.cell, _clean(s.divergence_rate)] for s in report.cells]
    )
    out["report/chart/divergence_rate"] = wandb.plot.bar(table, "cell", "divergence_rate", title="divergence rate")
    for task in report.tasks:
        for metric in dict.fromkeys(c.metric for c in report.curves):
            curves = [c for c in report.curves if c.task == task and c.metric == metric]
            if not curves:
                continue
            xs = [c.steps for c in curves for _ in range(3)]
            ys = [values for c in curves for values in (c.iqm, c.low, c.high)]
            keys = [f"{c.cell} {part}" for c in curves for part in ("IQM", "CI low", "CI high")]
            out[f"report/chart/curve/{task}/{metric}"] = wandb.plot.line_series(
                xs, ys, keys=keys, title=f"IQM {metric} ({task}) with 95% band", xname="env steps"
            )
    return out


def log_to_wandb(report: Report, mode: str, timeout: float) -> Path | None:
    """One W&B summary run (job_type report, group report) under ``<dir>/report_wandb``: the per-cell
    statistics table ``report/cells``, ``report/grid`` (grid.csv), the figures as images
    (``report/<figure>``), the native charts (``charts``) and per-cell figures in the summary. Returns
    the run dir, or None when disabled."""
    if mode == "disabled":
        return None
    import wandb

    wandb_dir = report.out_dir / "report_wandb"
    wandb_dir.mkdir(exist_ok=True)
    first = report.jobs[0]
    sweeps = sorted({job.sweep for job in report.jobs if job.sweep})  # the grid's members' W&B group prefixes
    kwargs = dict(
        project=first.project,
        entity=first.entity,
        group="report",
        job_type="report",
        name=f"report {report.root.name}"[:128],
        tags=[f"sweep:{sweep}" for sweep in sweeps],
        dir=str(wandb_dir),
        reinit="create_new",
        config={
            "dir": str(report.root),
            "sweep": sweeps[0] if len(sweeps) == 1 else sweeps,
            "rows": report.row_key,
            "cols": report.col_key,
            "swept": report.keys,
            "reps": report.reps,
            "seed": report.seed,
            "score": report.score_key,
            "diverged_score": report.diverged_score,
            "normalized": report.normalized,
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
        grid = wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in report.rows])
        cells = wandb.Table(
            columns=CELL_COLUMNS, data=[[_clean(r.get(c)) for c in CELL_COLUMNS] for r in cell_rows(report)]
        )
        images = {f"report/{name}": wandb.Image(str(path)) for name, path in report.figures.items()}
        run.log({"report/cells": cells, "report/grid": grid, **images, **charts(report)})
        summary: dict[str, Any] = {
            "jobs": len(report.jobs),
            "members": len(report.rows),
            **{f"members_{s}": n for s, n in report.status_counts.items()},
        }
        for s in report.cells:
            summary[f"divergence_rate/{s.cell}"] = s.divergence_rate
            summary[f"n_scored/{s.cell}"] = s.scored
            summary[f"n_total/{s.cell}"] = s.total
            if math.isfinite(s.iqm):
                summary.update(
                    {f"iqm/{s.cell}": s.iqm, f"iqm_ci_low/{s.cell}": s.ci[0], f"iqm_ci_high/{s.cell}": s.ci[1]}
                )
        for k, (a, b, (p, low, high)) in enumerate(report.poi):
            summary.update({f"poi/{k}/a": a, f"poi/{k}/b": b, f"poi/{k}/p": p, f"poi/{k}/ci_low": low})
            summary[f"poi/{k}/ci_high"] = high
        run.summary.update(summary)
        run_dir = Path(run.dir).parent
    finally:
        run.finish()
    return run_dir
