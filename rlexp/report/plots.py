"""The report's figures as PNGs (matplotlib, Agg): heatmaps with their 95% intervals, performance
profiles, per-member and aggregate curves, interval estimates, the probability-of-improvement matrix
and the instruments before a divergence."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlexp.report.data import ESTIMATES, CellStats, Curve

RED, BLUE = "#c0392b", "#2c6fbb"


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any, path: Path) -> None:
    fig.savefig(path, format="png", dpi=100, bbox_inches="tight")
    _plt().close(fig)


def cell_colors(cells: Sequence[str]) -> dict[str, Any]:
    """One colour per cell, the same in every figure: tab10 (tab20 beyond 10 cells), in ``cells``' order."""
    colors = _plt().get_cmap("tab10" if len(cells) <= 10 else "tab20").colors
    return {cell: colors[k % len(colors)] for k, cell in enumerate(cells)}


def plot_heatmap(
    values: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    count: np.ndarray,
    axes: tuple[str | None, str | None],
    labels: tuple[Sequence[str], Sequence[str]],
    title: str,
    fmt: str,
    cmap: str,
    path: Path,
    vmin: float | None = None,
    vmax: float | None = None,
) -> None:
    """One annotated heatmap PNG [rows, cols]: the value, its 95% interval [low, high] and the member
    count in each square; grey where no member ran."""
    plt = _plt()
    row_key, col_key = axes
    row_values, col_values = labels
    fig, ax = plt.subplots(figsize=(1.6 + 1.7 * len(col_values), 1.2 + 0.9 * len(row_values)))
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
            ok = bool(np.isfinite(values[i, j]))
            text = f"{values[i, j]:{fmt}}\n[{low[i, j]:{fmt}}, {high[i, j]:{fmt}}]" if ok else "–"
            red, green, blue, _ = colormap(norm(values[i, j])) if ok else (0.87, 0.87, 0.87, 1.0)
            dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5  # the background's luminance
            ax.text(j, i, f"{text}\nn={count[i, j]}", ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")  # fmt: skip
    _png(fig, path)


def plot_profiles(
    profiles: dict[str, np.ndarray],
    bands: dict[str, np.ndarray],
    taus: np.ndarray,
    xlabel: str,
    path: Path,
    colors: dict[str, Any],
) -> None:
    """Performance profiles: fraction of runs with score > tau per cell, with 95% bands; ``colors``: each
    cell's (``cell_colors``)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k, (cell, profile) in enumerate(profiles.items()):
        color = colors[cell]
        ax.plot(taus, profile, lw=1.5, color=color, ls="-" if k < 10 else "--", label=cell)
        ax.fill_between(taus, bands[cell][0], bands[cell][1], color=color, alpha=0.15 if len(profiles) <= 4 else 0.06)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of runs with score > τ")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _png(fig, path)


def _grid(n: int, width: float = 3.6, height: float = 2.6, **kwargs: Any) -> tuple[Any, np.ndarray]:
    plt = _plt()
    ncols = min(4, max(1, n))
    nrows = math.ceil(max(1, n) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kwargs)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes


def plot_learning_curves(
    panels: list[tuple[str, list[tuple[np.ndarray, np.ndarray, bool, Any]]]], ylabel: str, path: Path
) -> None:
    """Small multiples: one panel per cell, one thin line per member (red: diverged, its last record
    marked ×), shared axes."""
    fig, axes = _grid(len(panels), sharex=True, sharey=True)
    for ax, (title, lines) in zip(axes.flat, panels):
        for steps, values, diverged, _ in lines:
            ax.plot(steps, values, lw=0.8, alpha=0.85, color=RED if diverged else BLUE)
            if diverged and len(steps):
                ax.plot(steps[-1], values[-1], "x", color=RED, ms=6)
        ax.set_title(textwrap.fill(title, 50), fontsize=8)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("env steps")
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel, fontsize=8)
    fig.tight_layout()
    _png(fig, path)


def plot_aggregate_curves(curves: Sequence[Curve], ylabel: str, path: Path, colors: dict[str, Any]) -> None:
    """One panel per task: per cell the IQM across members against env steps with its 95% band (a curve of
    one step: its point and interval); ``colors``: each cell's (``cell_colors``)."""
    tasks = list(dict.fromkeys(c.task for c in curves))
    fig, axes = _grid(len(tasks), width=5.2, height=3.4)
    for ax, task in zip(axes.flat, tasks):
        for curve in (c for c in curves if c.task == task):
            color = colors[curve.cell]
            if len(curve.steps) == 1:  # evaluated once: a line would not show
                low, high = curve.iqm[0] - curve.low[0], curve.high[0] - curve.iqm[0]
                ax.errorbar(curve.steps, curve.iqm, yerr=[[low], [high]], fmt="o", color=color, label=curve.cell)
                continue
            ax.plot(curve.steps, curve.iqm, lw=1.5, color=color, label=curve.cell)
            ax.fill_between(curve.steps, curve.low, curve.high, color=color, alpha=0.15)
        ax.set_title(task if len(tasks) > 1 else "", fontsize=9)
        ax.set_xlabel("env steps")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
    axes.flat[min(len(tasks), axes.size) - 1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    _png(fig, path)


def plot_interval_estimates(cells: Sequence[CellStats], xlabel: str, path: Path, colors: dict[str, Any]) -> None:
    """rliable's interval-estimate figure: a column per estimate (ESTIMATES), a row per cell, the point
    and its 95% interval; ``colors``: each cell's (``cell_colors``)."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(ESTIMATES), figsize=(3.2 * len(ESTIMATES), 0.9 + 0.32 * len(cells)), sharey=True)
    for ax, name in zip(axes, ESTIMATES):
        for k, stats in enumerate(cells):
            point, low, high = stats.estimates.get(name, (math.nan,) * 3)
            color = colors[stats.cell]
            ax.barh(k, high - low, left=low, height=0.6, color=color, alpha=0.6)
            ax.plot([point, point], [k - 0.3, k + 0.3], color="black", lw=1.5)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(cells)), [s.cell for s in cells], fontsize=7)
    axes[0].invert_yaxis()
    fig.tight_layout()
    _png(fig, path)


def plot_poi_matrix(p: np.ndarray, low: np.ndarray, high: np.ndarray, cells: Sequence[str], path: Path) -> None:
    """The probability-of-improvement matrix: square (i, j) holds P(row i > column j) [95% CI]."""
    plt = _plt()
    k = len(cells)
    fig, ax = plt.subplots(figsize=(2.0 + 1.5 * k, 1.2 + 1.0 * k))
    colormap = plt.get_cmap("RdBu").with_extremes(bad="#eeeeee")
    image = ax.imshow(np.ma.masked_invalid(p), cmap=colormap, vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, fraction=0.05)
    names = [f"{i + 1}: {c}" for i, c in enumerate(cells)]
    ax.set_yticks(range(k), names, fontsize=7)
    ax.set_xticks(range(k), [str(i + 1) for i in range(k)])
    ax.set_xlabel("column cell (number)")
    ax.set_title("P(row cell > column cell) [95% CI]", fontsize=10)
    for i in range(k):
        for j in range(k):
            if i != j:
                dark = abs(p[i, j] - 0.5) > 0.3
                ax.text(j, i, f"{p[i, j]:.2f}\n[{low[i, j]:.2f}, {high[i, j]:.2f}]", ha="center", va="center",
                        fontsize=7, color="white" if dark else "black")  # fmt: skip
    _png(fig, path)


def plot_divergence_windows(
    panels: Sequence[tuple[str, str, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray] | None, float]],
    path: Path,
) -> None:
    """Per diverged member: an instrument over the last log steps before its divergence (red) against a
    healthy member of the same cell over the same steps (blue); the divergence step dashed."""
    fig, axes = _grid(len(panels), width=4.6, height=3.4)
    for ax, (title, metric, diverged, healthy, step) in zip(axes.flat, panels):
        ax.plot(*diverged, color=RED, lw=1.2, marker=".", label="diverged")
        if healthy is not None:
            ax.plot(*healthy, color=BLUE, lw=1.2, marker=".", label="healthy")
        ax.axvline(step, color=RED, ls="--", lw=0.8)
        values = np.concatenate([diverged[1], healthy[1] if healthy is not None else np.zeros(0)])
        values = values[np.isfinite(values)]
        if len(values) and (values > 0).all():
            ax.set_yscale("log")
        elif len(values) and np.abs(values).max() > 0:
            ax.set_yscale("symlog", linthresh=max(1e-12, float(np.abs(values[values != 0]).min())))
        ax.set_title(textwrap.fill(title, 60), fontsize=7)
        ax.set_ylabel(metric, fontsize=8)
        ax.set_xlabel("env steps", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    _png(fig, path)
