"""The report's data: a grid's jobs, its per-cell figures and the report itself, shared by
``rlexp.report.main`` (which computes them), ``rlexp.report.html`` (which renders them) and
``rlexp.report.wandb_run`` (which logs them)."""

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
        "return at its divergence)",
    ),
}

# --diverged-score: how a diverged member is scored -> what the page says
DIVERGED_SCORES = {
    "frozen": "a diverged member keeps the score it had when it diverged (its last evaluation before the divergence, "
    "or its training return there); one with no score yet is not scored",
    "zero": "a diverged member scores as a uniformly random policy (normalized score 0: the env's random return, "
    "see Normalization)",
    "drop": "diverged members are left out of the score statistics (they still count in the divergence rate)",
}
CRASHED_RULE = "members of a crashed job are left out of every statistic (they count in n total only)"

# rliable's four interval estimates, in the order of the figure and the tables
ESTIMATES = ("median", "IQM", "mean", "optimality gap")


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
    sweep: str | None = None  # logger.sweep: its members' W&B group prefix and tag


@dataclass
class Normalization:
    """How one env's returns become normalized scores: (return − random) / (reference − random)."""

    random: float
    reference: float
    source: str  # "table" (NORMALIZATION in rlexp.report.stats), "random" (its random return, the grid's max)
    # or "grid" (min and max over this grid)


@dataclass
class CellStats:
    """Per-cell figures for the tables, the heatmaps and W&B."""

    cell: str
    total: int  # members, crashed ones included
    members: int  # members that ran (not crashed)
    scored: int  # members whose score enters the statistics (Report.score_key, --diverged-score)
    diverged: int
    divergence_rate: float  # diverged / members (NaN without members)
    rate_ci: tuple[float, float] = (float("nan"), float("nan"))  # Wilson 95% interval
    iqm: float = float("nan")
    ci: tuple[float, float] = (float("nan"), float("nan"))
    # ESTIMATES name -> (point, CI low, CI high), rliable's stratified bootstrap on the same resamples
    estimates: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    median_return: float = float("nan")  # of the raw scores (one task)
    median_by_task: dict[str, float] = field(default_factory=dict)  # env -> median raw score
    median_diverged_step: float = float("nan")
    causes: Counter = field(default_factory=Counter)  # "cause@where" -> count
    wandb_runs: list[str] = field(default_factory=list)  # the W&B run ids of its members


@dataclass
class Curve:
    """An aggregate curve: IQM across members at each env step with its 95% bootstrap band."""

    cell: str
    task: str
    metric: str
    steps: list[float]
    iqm: list[float]
    low: list[float]
    high: list[float]
    n: list[int]  # members with a value at each step


@dataclass
class Report:
    """Everything the page, the CSVs and W&B show."""

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
    score_key: str = "final_return"  # what the statistics rank: eval_return or final_return (SCORES)
    diverged_score: str = "frozen"  # DIVERGED_SCORES
    normalization: dict[str, Normalization] = field(default_factory=dict)  # env -> how it is normalized
    gamma: float = 1.0  # the optimality gap's threshold, in score units
    poi: list[tuple[str, str, tuple[float, float, float]]] = field(default_factory=list)  # P(a > b) [CI]
    poi_cells: list[str] = field(default_factory=list)  # the probability-of-improvement matrix's cells
    poi_matrix: Any = None  # (P, low, high), each [K, K] over poi_cells: P(row > column)
    shown: list[str] = field(default_factory=list)  # the cells drawn in the curve and interval figures
    best: CellStats | None = None
    worst: CellStats | None = None
    curves: list[Curve] = field(default_factory=list)
    divergences: list[dict[str, Any]] = field(default_factory=list)  # one per diverged member (grid rows)
    figures: dict[str, Path] = field(default_factory=dict)
    unreadable: dict[Path, list[int]] = field(default_factory=dict)  # metrics.jsonl -> line numbers not read
    curve_metric: str = "episode/return_last10"  # per-member learning curves' metric
    return_metric: str = "eval/return"  # the aggregate return curves' metric
    last_n: int = 20  # log steps before a divergence drawn against a healthy member
    seconds: float = 0.0
    out: Path | None = None  # where the report's files go (--out); None: into root

    @property
    def out_dir(self) -> Path:
        """The dir the report writes: ``out``, or the grid's dir it reads."""
        return self.out or self.root

    @property
    def normalized(self) -> bool:
        """Whether the score statistics are normalized scores (several tasks)."""
        return len(self.tasks) > 1


CELL_COLUMNS = [
    "cell", "n_total", "n_ran", "n_scored", "diverged", "divergence_rate", "rate_ci_low", "rate_ci_high",
    "iqm", "iqm_ci_low", "iqm_ci_high", "median", "median_ci_low", "median_ci_high", "mean", "mean_ci_low",
    "mean_ci_high", "optimality_gap", "optimality_gap_ci_low", "optimality_gap_ci_high", "wandb_runs",
]  # fmt: skip


def cell_rows(report: Report) -> list[dict[str, Any]]:
    """One row per cell (cells.csv, the W&B statistics table): counts, rates and the interval estimates."""
    out = []
    for s in report.cells:
        row: dict[str, Any] = {
            "cell": s.cell,
            "n_total": s.total,
            "n_ran": s.members,
            "n_scored": s.scored,
            "diverged": s.diverged,
            "divergence_rate": s.divergence_rate,
            "rate_ci_low": s.rate_ci[0],
            "rate_ci_high": s.rate_ci[1],
            "wandb_runs": " ".join(s.wandb_runs),
        }
        for name, (point, low, high) in s.estimates.items():
            key = name.lower().replace(" ", "_")
            row.update({key: point, f"{key}_ci_low": low, f"{key}_ci_high": high})
        out.append(row)
    return out
