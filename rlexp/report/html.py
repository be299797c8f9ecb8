"""report.html: one self-contained page (inline CSS, figures as base64 PNG data URIs, no scripts)."""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

from rlexp.report.data import CRASHED_RULE, DIVERGED_SCORES, SCORES, CellStats, Report

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px auto;
       max-width: 1200px; padding: 0 16px; color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
code { background: #f3f3f3; padding: 1px 4px; border-radius: 3px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f0f3f7; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.rule { background: #fff8e1; padding: 6px 10px; }
tr.best td { background: #eaf7ea; } tr.worst td { background: #fbeaea; }
.figures { display: flex; flex-wrap: wrap; gap: 16px; } img { max-width: 100%; border: 1px solid #eee; }
.note { color: #555; font-size: 0.9em; } .counts span { margin-right: 1.2em; }
"""


def _num(value: Any, fmt: str = ".1f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return format(value, fmt)


def _table(
    header: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = (), classes: list[str] | None = None
) -> str:
    """An HTML table; cells are already-escaped strings; ``numeric`` columns are right-aligned."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        css = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(f'<td class="num">{c}</td>' if j in numeric else f"<td>{c}</td>" for j, c in enumerate(row))
        body.append(f"<tr{css}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{escape(alt)}">'


def _top_cause(stats: CellStats) -> str:
    if not stats.causes:
        return "–"
    cause, n = stats.causes.most_common(1)[0]
    return f"{escape(cause)} ({n})"


def _ci(stats: CellStats, fmt: str = ".1f") -> str:
    if not math.isfinite(stats.iqm):
        return "–"
    return f"{stats.iqm:{fmt}} [{stats.ci[0]:{fmt}}, {stats.ci[1]:{fmt}}]"


def _normalization(report: Report) -> str:
    rows = [
        [
            escape(task),
            _num(n.random, ".2f"),
            _num(n.reference, ".2f"),
            {
                "table": "random-policy return and gymnasium's solved threshold (rlexp.report.stats.NORMALIZATION)",
                "random": "random-policy return (rlexp.report.stats.NORMALIZATION); no reference known: "
                "the largest score of this grid",
            }.get(n.source, "no reference known: the smallest and largest score of this grid"),
        ]
        for task, n in report.normalization.items()
    ]
    return _table(["env", "0 (random)", "1 (reference)", "from"], rows, numeric=(1, 2))


def render_html(report: Report) -> str:
    """The whole page as a string."""
    c = report.status_counts
    name, meaning = SCORES[report.score_key]
    stat_name = f"normalized {name}" if report.normalized else name
    crashed_jobs = [j for j in report.jobs if j.status == "crashed"]
    parts = [
        f"<h1>rlexp report</h1><p><code>{escape(str(report.root))}</code></p>",
        '<p class="counts">'
        f"<span><b>{len(report.jobs)}</b> jobs ({len(crashed_jobs)} crashed)</span>"
        f"<span><b>{len(report.rows)}</b> members: ok {c['ok']}, diverged {c['diverged']}, "
        f"crashed {c['crashed']}</span>"
        f"<span><b>{len(report.cells)}</b> cells</span>"
        f"<span>tasks: {escape(', '.join(report.tasks))}</span></p>",
        f'<p class="note">Swept: {escape(", ".join(report.varying) or "nothing (one cell)")}. '
        f"Cells: {escape(', '.join(report.keys) or 'all')}. Score: <b>{escape(name)}</b> = {escape(meaning)}. "
        "IQM = mean of the middle 50% of runs; [95% CI] from rliable's stratified bootstrap "
        f"({report.reps} resamples, seed {report.seed}).</p>",
        f'<p class="rule"><b>Scoring rule</b> (<code>--diverged-score {report.diverged_score}</code>; '
        f"frozen | zero | drop): {escape(DIVERGED_SCORES[report.diverged_score])}; {escape(CRASHED_RULE)}.</p>",
    ]
    if report.normalized:
        parts.append(
            f"<p><b>Several tasks: the statistics are of normalized scores</b> ({escape(stat_name)} = "
            "(return − random) / (reference − random) per env); raw returns are never pooled across envs: "
            "they stay in per-env columns.</p>" + _normalization(report)
        )

    ranked = sorted(report.cells, key=lambda s: -s.iqm if math.isfinite(s.iqm) else math.inf)
    per_task = report.tasks if report.normalized else []
    rows, classes = [], []
    for s in ranked:
        medians = [_num(s.median_by_task.get(t)) for t in per_task] or [_num(s.median_return)]
        rows.append(
            [
                escape(s.cell).replace(",", ",<wbr>"),
                f"{s.members}/{s.total}",
                f"{s.diverged}/{s.members}",
                f"{_num(s.divergence_rate, '.2f')} [{_num(s.rate_ci[0], '.2f')}, {_num(s.rate_ci[1], '.2f')}]",
                _ci(s, ".2f" if report.normalized else ".1f"),
                f"{s.scored}/{s.total}",
                *medians,
                _num(s.median_diverged_step, ".0f"),
                _top_cause(s),
            ]
        )
        classes.append("best" if report.best is s else "worst" if report.worst is s else "")
    median_heads = [f"median raw {name} · {t}" for t in per_task] or [f"median {name}"]
    parts += [
        "<h2>Cells</h2>",
        f'<p class="note">Sorted by IQM of the {escape(stat_name)}. n ran/total: members that ran of all the '
        "cell's members (crashed ones included); diverged/ran; n scored/total: members whose score enters the IQM "
        "and every other score statistic under the scoring rule above. Divergence rate with its 95% Wilson "
        "interval. Also in cells.csv.</p>",
        _table(
            [
                "cell",
                "n ran/total",
                "diverged/ran",
                "divergence rate [95% CI]",
                f"IQM {stat_name} [95% CI]",
                "n scored/total",
                *median_heads,
                "median diverged step",
                "top cause@where",
            ],
            rows,
            numeric=tuple(range(1, 7 + len(median_heads))),
            classes=classes,
        ),
    ]

    parts.append("<h2>Best and worst cells</h2>")
    if report.best is not None:
        lines = [
            f"<li>best: <b>{escape(report.best.cell)}</b> — IQM {_ci(report.best)} (n {report.best.scored}/"
            f"{report.best.total}), divergence rate {_num(report.best.divergence_rate, '.2f')}</li>"
        ]
        if report.worst is not None:
            lines.append(
                f"<li>worst: <b>{escape(report.worst.cell)}</b> — IQM {_ci(report.worst)} (n {report.worst.scored}/"
                f"{report.worst.total}), divergence rate {_num(report.worst.divergence_rate, '.2f')}</li>"
            )
        parts.append(f"<ul>{''.join(lines)}</ul>")
    else:
        parts.append(f"<p>No cell has a {name} to rank.</p>")

    figures = report.figures
    parts.append("<h2>Interval estimates</h2>")
    if "interval_estimates" in figures:
        parts.append(
            f'<p class="note">rliable\'s median (over tasks of the per-task mean: with one task it equals the '
            f"mean), IQM, mean and optimality gap (γ − mean of min(score, γ), γ = {report.gamma:g}: "
            + ("normalized 1" if report.normalized else "the env's reference return")
            + f") of the {escape(stat_name)} with 95% intervals, for the {len(report.shown)} cells drawn "
            "(the top cells by IQM, <code>--top N</code>, and the cells named by --compare); every cell in "
            "cells.csv.</p>" + _image(figures["interval_estimates"], "interval estimates")
        )
    else:
        parts.append(f"<p>No cell has a {name}.</p>")

    parts.append("<h2>Probability of improvement</h2>")
    for a, b, (p, low, high) in report.poi:
        parts.append(
            f"<p>P(<b>{escape(a)}</b> &gt; <b>{escape(b)}</b>) = <b>{p:.2f}</b> [95% CI {low:.2f}, {high:.2f}]</p>"
        )
    if "poi_matrix" in figures:
        parts.append(
            f'<p class="note">The probability that a run of the row cell has a higher {escape(stat_name)} than a '
            "run of the column cell (ties count half), averaged over tasks (rliable), with its 95% interval in each "
            "square. The default covers the top cells by IQM and states best against runner-up; name pairs with "
            "<code>--compare CELL_A CELL_B</code> (repeatable).</p>" + _image(figures["poi_matrix"], "poi matrix")
        )
    elif not report.poi:
        parts.append(f"<p>Needs two cells with a {name}.</p>")

    parts.append("<h2>Heatmaps</h2>")
    pooled = [k for k in report.varying if k not in (report.row_key, report.col_key)]
    parts.append(
        f'<p class="note">Rows: {escape(report.row_key or "–")}, columns: {escape(report.col_key or "–")}'
        + (f"; pooled over {escape(', '.join(pooled))}" if pooled else "")
        + ". Each square: the value, its 95% interval in brackets (divergence rate: Wilson; IQM of the "
        f"{escape(stat_name)}: stratified bootstrap) and the members that ran. Change with "
        "<code>--rows GROUP --cols GROUP</code>; grey: no member ran.</p>"
    )
    parts.append(
        '<div class="figures">'
        + "".join(
            _image(figures[k], k.replace("_", " ")) for k in ("heatmap_divergence", "heatmap_iqm") if k in figures
        )
        + "</div>"
    )

    parts.append("<h2>Performance profile</h2>")
    if "performance_profile" in figures:
        parts.append(
            f'<p class="note">For each threshold τ, the fraction of runs whose {escape(stat_name)} exceeds τ, '
            "with a 95% bootstrap band (rliable's score distribution), for the cells drawn; a curve above another "
            "dominates it.</p>" + _image(figures["performance_profile"], "performance profile")
        )
    else:
        parts.append(f"<p>No {name} to profile.</p>")

    parts.append("<h2>Learning curves</h2>")
    if "aggregate_curves" in figures:
        parts.append(
            f'<p class="note">IQM of {escape(report.return_metric)} across each cell\'s members at each env step '
            "with its 95% stratified-bootstrap band (rliable's sample-efficiency curve), a panel per env (raw "
            f"returns, never pooled across envs); after a divergence the scoring rule holds "
            f"({escape(report.diverged_score)}). Every cell drawn and step in curves.csv.</p>"
            + _image(figures["aggregate_curves"], "aggregate curves")
        )
    if "learning_curves" in figures:
        parts.append(
            f'<p class="note">{escape(report.curve_metric)} against env steps, one line per member; red: '
            "diverged, × at its last record.</p>" + _image(figures["learning_curves"], "learning curves")
        )
    if "aggregate_curves" not in figures and "learning_curves" not in figures:
        parts.append("<p>No metrics.jsonl to draw.</p>")
    for path, numbers in report.unreadable.items():
        parts.append(
            f'<p class="note">Unreadable lines left out of the curves: {escape(str(path))}, '
            f"line{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}.</p>"
        )

    curves = [k[len("curve/") :] for k in figures if k.startswith("curve/")]
    if curves:
        parts.append("<h2>Instrument curves</h2>")
        parts.append(
            '<p class="note">Each metric named with <code>--curves</code>: the IQM across members with its 95% '
            "band (members count while they record), then one line per member (red: diverged). Names: "
            "docs/instruments.md.</p>"
        )
        for metric in curves:
            parts.append(f"<h3>{escape(metric)}</h3>")
            if f"aggregate/{metric}" in figures:
                parts.append(_image(figures[f"aggregate/{metric}"], f"aggregate {metric}"))
            parts.append(_image(figures[f"curve/{metric}"], f"curve {metric}"))

    parts.append("<h2>Diverged members</h2>")
    if report.divergences:
        rows = [
            [
                escape(r["cell"]),
                escape(str(r["job"])),
                escape(str(r["member"])),
                escape(str(r["seed"])),
                _num(to_number(r["diverged_at_step"]), ".0f"),
                escape(str(r["cause"] or "–")),
                escape(str(r["where"] or "–")),
                escape(r["first_moved"] or "–"),
                escape(str(r["detail"] or "–")),
            ]
            for r in sorted(report.divergences, key=lambda r: (r["cell"], r["job"], r["member"]))
        ]
        parts.append(
            '<p class="note">Per diverged member: the env step, the cause and place, the instrument that first '
            "grew tenfold (first_moved: from → to between two steps) and the detail (docs/outputs.md).</p>"
            + _table(
                ["cell", "job", "member", "seed", "step", "cause", "where", "first moved", "detail"],
                rows,
                numeric=(2, 3, 4),
            )
        )
        if "divergence_windows" in figures:
            parts.append(
                f'<p class="note">The last {report.last_n} log steps before the divergence (<code>--last N</code>) '
                "of the instrument that moved first (else the one that grew most), red, against a healthy member "
                "of the same cell over the same steps, blue; one diverged member per cell first "
                "(<code>--windows N</code>).</p>" + _image(figures["divergence_windows"], "divergence windows")
            )
        diverging = [s for s in report.cells if s.diverged]
        rows = [
            [
                escape(s.cell),
                f"{s.diverged}/{s.members}",
                _num(s.median_diverged_step, ".0f"),
                "<br>".join(f"{escape(k)}: {n}" for k, n in s.causes.most_common()),
            ]
            for s in diverging
        ]
        parts.append("<h3>Causes and places per cell</h3>")
        parts.append(_table(["cell", "diverged", "median diverged step", "cause@where: count"], rows, numeric=(1, 2)))
    else:
        parts.append("<p>No member diverged.</p>")

    lineage = _lineage_rows(report)
    if lineage:
        parts.append("<h2>Population-based training</h2>")
        parts.append(
            '<p class="note">Each copy of a PBT round (docs/pbt.md): the member copied the parent\'s weights, '
            "optimizer state and normalizer statistics, then took the parent's hyperparameters times a factor "
            "(old → new).</p>"
            + _table(["job", "round", "step", "member", "parent", "old → new"], lineage, (1, 2, 3, 4))
        )

    parts.append("<h2>Crashed jobs</h2>")
    if crashed_jobs:
        rows = [[escape(j.name), escape(j.cell), str(len(j.members)), escape(j.error or "")] for j in crashed_jobs]
        parts.append(
            '<p class="note">Left out of every statistic; their members are in grid.csv with status '
            "crashed (the traceback, when there is one, is in the job's error.txt).</p>"
            + _table(["job", "cell", "members", "error"], rows, numeric=(2,))
        )
    else:
        parts.append("<p>None.</p>")

    parts.append(
        '<p class="note">Files in this dir: grid.csv (one row per member, with its W&amp;B run id), cells.csv, '
        "curves.csv, "
        + ", ".join(p.name for p in figures.values())
        + "; the W&amp;B summary run (job_type report) under report_wandb/. "
        f"Report computed in {report.seconds:.1f} s.</p>"
    )
    body = "\n".join(parts)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>rlexp report: '
        f"{escape(report.root.name)}</title><style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def _lineage_rows(report: Report) -> list[list[str]]:
    """One row per copy of a population-based training round, from the members' ``pbt.lineage``."""
    events = []
    for job in report.jobs:
        for member in job.members:
            for e in (member.get("pbt") or {}).get("lineage") or []:
                events.append((job.name, e["round"], e["step"], member.get("member"), e["parent"], e["old"], e["new"]))
    rows = []
    for name, round_, step, member, parent, old, new in sorted(events, key=lambda e: e[:4]):
        changes = "<br>".join(f"{escape(key)}: {old[key]:.3g} → {value:.3g}" for key, value in new.items())
        rows.append([escape(name), str(round_), str(step), str(member), str(parent), changes])
    return rows


def to_number(value: Any) -> float | None:
    """An int or float as a float, else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
