"""The report's data: a grid's jobs, its per-cell figures and the report itself, shared by
``rlexp.report`` (which computes them) and ``rlexp.report_html`` (which renders them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
    scored: int  # members with a final return
    diverged: int
    divergence_rate: float  # diverged / members (NaN without members)
    iqm: float = float("nan")
    ci: tuple[float, float] = (float("nan"), float("nan"))
    median_return: float = float("nan")
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
    poi: tuple[str, str, tuple[float, float, float]] | None = None
    best: CellStats | None = None
    worst: CellStats | None = None
    figures: dict[str, Path] = field(default_factory=dict)
    curve_metric: str = "episode/return_last10"
    seconds: float = 0.0
