"""The report's data: a grid's jobs, its per-cell figures and the report itself, shared by
``rlexp.report`` (which computes them) and ``rlexp.report_html`` (which renders them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# a report's score (Report.score_key) -> (its name on the page, what it is)
SCORES = {
    "eval_return": (
        "eval return",
        "a member's eval_return: the mean return of its last evaluation (eval.episodes deterministic episodes "
        "on evaluation environments, at the end of training; for a diverged member, its last one before the "
        "divergence; a member never evaluated has no score)",
    ),
    "final_return": (
        "final return",
        "a member's final_return: the mean return of its last 10 training episodes (a diverged member's "
        "return at its divergence counts)",
    ),
}


@dataclass
class Job:
    """One job dir of the grid, read defensively."""

    dir: Path
    name: str  # the dir relative to the report's root ("0", "1", …; "." for a single run)
    status: str  # ok | diverged | crashed
    error: str | None
    env: str
    settings: dict[str, str]  # group choices and overrides, without the ignored keys
    members: list[dict[str, Any]]
    cell: str = ""
    project: str = "rlexp"
    entity: str | None = None


@dataclass
class CellStats:
    """Per-cell figures for the tables, the heatmaps and W&B."""

    cell: str
    members: int  # non-crashed members
    scored: int  # members with a score (eval_return or final_return: Report.score_key)
    diverged: int
    divergence_rate: float  # diverged / members (NaN without members)
    iqm: float = float("nan")
    ci: tuple[float, float] = (float("nan"), float("nan"))
    median_return: float = float("nan")  # of the scores
    median_diverged_step: float = float("nan")
    causes: Counter = field(default_factory=Counter)  # "cause@where" -> count


@dataclass
class Report:
    """Everything the page, the CSV and W&B show."""

    root: Path
    jobs: list[Job]
    keys: list[str]  # cell keys (swept, not implied)
    varying: list[str]  # every varying key (rows/cols may use any)
    rows: list[dict[str, Any]]
    columns: list[str]
    tasks: list[str]
    cells: list[CellStats]
    row_key: str | None
    col_key: str | None
    reps: int
    seed: int
    status_counts: dict[str, int]
    score_key: str = "final_return"  # what the statistics rank: eval_return or final_return (report.SCORES)
    poi: tuple[str, str, tuple[float, float, float]] | None = None
    best: CellStats | None = None
    worst: CellStats | None = None
    figures: dict[str, Path] = field(default_factory=dict)
    curve_metric: str = "episode/return_last10"
    seconds: float = 0.0
