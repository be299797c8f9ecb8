"""report.html: one self-contained page (inline CSS, figures as base64 PNG data URIs, no scripts)."""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

from rlexp.report_data import SCORES, CellStats, Report

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px auto;
       max-width: 1200px; padding: 0 16px; color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
code { background: #f3f3f3; padding: 1px 4px; border-radius: 3px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f0f3f7; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
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


def _ci(stats: CellStats) -> str:
    if not math.isfinite(stats.iqm):
        return "–"
    return f"{stats.iqm:.1f} [{stats.ci[0]:.1f}, {stats.ci[1]:.1f}]"


def render_html(report: Report) -> str:
    """The whole page as a string."""
    c = report.status_counts
    name, meaning = SCORES[report.score_key]
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
        f"Cells: {escape(', '.join(report.keys) or 'all')}. Score: <b>{escape(name)}</b> = {escape(meaning)}; "
        "crashed jobs are left out of every statistic. IQM = mean of the middle 50% of runs; [95% CI] from "
        "rliable's stratified bootstrap "
        f"({report.reps} resamples, seed {report.seed}).</p>",
    ]

    ranked = sorted(report.cells, key=lambda s: -s.iqm if math.isfinite(s.iqm) else math.inf)
    rows, classes = [], []
    for s in ranked:
        rows.append(
            [
                escape(s.cell),
                str(s.members),
                f"{s.diverged}/{s.members}",
                _num(s.divergence_rate, ".2f"),
                _ci(s),
                _num(s.median_return),
                _num(s.median_diverged_step, ".0f"),
                _top_cause(s),
            ]
        )
        classes.append("best" if report.best is s else "worst" if report.worst is s else "")
    parts += [
        "<h2>Cells</h2>",
        f'<p class="note">Sorted by IQM of the {name}; n = members that ran (crashed jobs excluded).</p>',
        _table(
            [
                "cell",
                "n",
                "diverged",
                "divergence rate",
                "IQM [95% CI]",
                f"median {name}",
                "median diverged step",
                "top cause@where",
            ],
            rows,
            numeric=(1, 2, 3, 4, 5, 6),
            classes=classes,
        ),
    ]

    parts.append("<h2>Best and worst cells</h2>")
    if report.best is not None:
        lines = [
            f"<li>best: <b>{escape(report.best.cell)}</b> — IQM {_ci(report.best)}, "
            f"divergence rate {_num(report.best.divergence_rate, '.2f')}</li>"
        ]
        if report.worst is not None:
            lines.append(
                f"<li>worst: <b>{escape(report.worst.cell)}</b> — IQM {_ci(report.worst)}, "
                f"divergence rate {_num(report.worst.divergence_rate, '.2f')}</li>"
            )
        parts.append(f"<ul>{''.join(lines)}</ul>")
    else:
        parts.append(f"<p>No cell has a {name} to rank.</p>")

    parts.append("<h2>Probability of improvement</h2>")
    if report.poi is not None:
        a, b, (p, low, high) = report.poi
        parts.append(
            f"<p>P(<b>{escape(a)}</b> &gt; <b>{escape(b)}</b>) = <b>{p:.2f}</b> [95% CI {low:.2f}, {high:.2f}]"
            f'</p><p class="note">The probability that a run of the first cell has a higher {name} than a '
            "run of the second (ties count half), averaged over tasks (rliable). Choose the pair with "
            "<code>--compare CELL_A CELL_B</code>; the default is the best against the worst cell.</p>"
        )
    else:
        parts.append(f"<p>Needs two cells with a {name}.</p>")

    figures = report.figures
    parts.append("<h2>Heatmaps</h2>")
    pooled = [k for k in report.varying if k not in (report.row_key, report.col_key)]
    parts.append(
        f'<p class="note">Rows: {escape(report.row_key or "–")}, columns: {escape(report.col_key or "–")}'
        + (f"; pooled over {escape(', '.join(pooled))}" if pooled else "")
        + ". Change with <code>--rows GROUP --cols GROUP</code>; grey: no member ran.</p>"
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
            f'<p class="note">For each threshold τ, the fraction of runs whose {name} exceeds τ, '
            "with a 95% bootstrap band (rliable's score distribution); a curve above another dominates it."
            "</p>" + _image(figures["performance_profile"], "performance profile")
        )
    else:
        parts.append(f"<p>No {name} to profile.</p>")

    parts.append("<h2>Learning curves</h2>")
    if "learning_curves" in figures:
        parts.append(
            f'<p class="note">{escape(report.curve_metric)} against env steps, one line per seed; red: '
            "diverged, × at its last record (the step of the divergence is in the tables).</p>"
            + _image(figures["learning_curves"], "learning curves")
        )
    else:
        parts.append("<p>No metrics.jsonl to draw.</p>")

    curves = [k for k in figures if k.startswith("curve/")]
    if curves:
        parts.append("<h2>Instrument curves</h2>")
        parts.append(
            '<p class="note">Each metric named with <code>--curves</code> against env steps, one line per '
            "member; red: diverged. Names: docs/instruments.md.</p>"
            + "".join(f"<h3>{escape(k[len('curve/') :])}</h3>" + _image(figures[k], k) for k in curves)
        )

    parts.append("<h2>Divergence causes and places</h2>")
    diverging = [s for s in report.cells if s.diverged]
    if diverging:
        rows = [
            [
                escape(s.cell),
                f"{s.diverged}/{s.members}",
                _num(s.median_diverged_step, ".0f"),
                "<br>".join(f"{escape(k)}: {n}" for k, n in s.causes.most_common()),
            ]
            for s in diverging
        ]
        parts.append(_table(["cell", "diverged", "median diverged step", "cause@where: count"], rows, numeric=(1, 2)))
    else:
        parts.append("<p>No member diverged.</p>")

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
        '<p class="note">Files in this dir: grid.csv (one row per member), '
        + ", ".join(p.name for p in figures.values())
        + "; the W&amp;B summary run (job_type report) under report_wandb/. "
        f"Report computed in {report.seconds:.1f} s.</p>"
    )
    body = "\n".join(parts)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>rlexp report: '
        f"{escape(report.root.name)}</title><style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )
