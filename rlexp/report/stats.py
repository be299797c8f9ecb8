"""The report's statistics (rliable's, Agarwal et al. 2021): scores per cell and task, IQM and the
other interval estimates with stratified-bootstrap CIs, performance profiles, the probability of
improvement, aggregate curves over env steps, and the Wilson interval of a divergence rate.

A score matrix is ``[runs, tasks]``: a cell's members (runs) per env id (task)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlexp.report.data import ESTIMATES, Normalization

# env id -> (return of a uniformly random policy, reference return): normalized score =
# (return − random) / (reference − random). random: the mean return of 100 uniformly random episodes
# (seeds 0..99, the env's own time limit; ``python scripts/random_returns.py``, docs/report.md; CartPole-v0:
# v1's episodes, none reaches 200 steps). reference: the return gymnasium registers as solving the env
# (``spec.reward_threshold``) where it has one; Pendulum has none: −150, a solved swing-up; None (Walker2d,
# MinAtar: no registered threshold): the grid's largest score.
NORMALIZATION: dict[str, tuple[float, float | None]] = {
    "CartPole-v1": (24.96, 475.0),
    "CartPole-v0": (24.96, 195.0),
    "Acrobot-v1": (-500.0, -100.0),
    "MountainCar-v0": (-200.0, -110.0),
    "MountainCarContinuous-v0": (-33.31, 90.0),
    "Pendulum-v1": (-1197.18, -150.0),
    "LunarLander-v3": (-191.0, 200.0),
    "HalfCheetah-v5": (-267.71, 4800.0),
    "Hopper-v5": (17.04, 3800.0),
    "Walker2d-v5": (1.93, None),
    "Ant-v5": (-47.46, 6000.0),
    "MinAtar/Asterix-v0": (0.51, None),
    "MinAtar/Breakout-v0": (0.56, None),
    "MinAtar/Freeway-v0": (0.19, None),
    "MinAtar/Seaquest-v0": (0.08, None),
    "MinAtar/SpaceInvaders-v0": (2.97, None),
}


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


def finite(value: Any) -> bool:
    """Whether ``value`` is a finite number."""
    return isinstance(value, float) and math.isfinite(value)


# ----------------------------------------------------------------------------- scores
def normalizations(rows: Sequence[dict[str, Any]], tasks: Sequence[str], key: str) -> dict[str, Normalization]:
    """Each task's normalization: NORMALIZATION's random and reference returns ("table"); its random return
    and the largest raw score (``key``) of the grid's members that ran ("random": no reference known);
    else (an env not in the table) the smallest and largest such score ("grid")."""
    out = {}
    for task in tasks:
        random, reference = NORMALIZATION.get(task, (None, None))
        if reference is not None:
            out[task] = Normalization(random, reference, "table")
            continue
        values = [r[key] for r in rows if r["env"] == task and r["status"] != "crashed" and finite(r[key])]
        lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
        if random is not None:
            lo, hi = random, max(values, default=random)
        out[task] = Normalization(lo, hi if hi > lo else lo + 1.0, "grid" if random is None else "random")
    return out


def add_scores(rows: Sequence[dict[str, Any]], key: str, rule: str, norms: dict[str, Normalization]) -> None:
    """Each row's ``raw_score`` (its value of ``key``) and ``score``: what enters the statistics under
    ``rule`` (--diverged-score frozen|zero|drop), None when the member is not scored; crashed: None."""
    for r in rows:
        raw = r[key]
        r["raw_score"] = raw
        if r["status"] == "crashed" or (r["status"] == "diverged" and rule == "drop"):
            r["score"] = None
        elif r["status"] == "diverged" and rule == "zero":
            r["score"] = norms[r["env"]].random
        else:
            r["score"] = raw if finite(raw) else None


def scored(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows that enter the score statistics (``score`` set by ``add_scores``)."""
    return [r for r in rows if r["score"] is not None]


def normalize(value: float, norm: Normalization) -> float:
    """(value − random) / (reference − random)."""
    return (value - norm.random) / (norm.reference - norm.random)


def score_matrices(
    rows: Sequence[dict[str, Any]], cells: Sequence[str], tasks: Sequence[str], norms: dict[str, Normalization]
) -> dict[str, np.ndarray]:
    """rliable's score dict: cell -> [runs, tasks]. With several tasks the scores are normalized per task
    (``norms``) and each cell keeps as many runs per task as its smallest task has."""
    pool = scored(rows)
    out: dict[str, np.ndarray] = {}
    for cell in cells:
        columns = []
        for task in tasks:
            x = np.array([r["score"] for r in pool if r["cell"] == cell and r["env"] == task], dtype=float)
            columns.append(normalize(x, norms[task]) if len(tasks) > 1 else x)
        n = min(len(c) for c in columns)
        if n > 0:
            out[cell] = np.stack([c[:n] for c in columns], axis=1)  # [runs, tasks]
    return out


# ----------------------------------------------------------------------------- estimates
def seeded(seed: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` with numpy's global generator seeded with ``seed`` (rliable's bootstrap draws from it)."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        return fn()
    finally:
        np.random.set_state(state)


def iqm_fast(scores: np.ndarray) -> float:
    """rliable's IQM (scipy's trim_mean(scores, 0.25, axis=None): drop floor(n/4) lowest and highest
    of all n scores, average the rest) in plain numpy: the bootstrap calls it for every resample."""
    x = np.sort(np.asarray(scores, dtype=float).ravel())
    cut = int(0.25 * x.size)
    return float(x[cut : x.size - cut].mean())


def aggregates(scores: np.ndarray, gamma: float) -> np.ndarray:
    """rliable's four aggregates of [..., runs, tasks] scores, in ESTIMATES' order (last axis): median
    (over tasks of the per-task mean), IQM, mean (of the per-task means), optimality gap at ``gamma``."""
    task_means = scores.mean(axis=-2)  # [..., tasks]
    flat = np.sort(scores.reshape(*scores.shape[:-2], -1), axis=-1)  # [..., runs·tasks]
    cut = int(0.25 * flat.shape[-1])
    return np.stack(
        [
            np.median(task_means, axis=-1),
            flat[..., cut : flat.shape[-1] - cut].mean(axis=-1),
            task_means.mean(axis=-1),
            gamma - np.minimum(flat, gamma).mean(axis=-1),
        ],
        axis=-1,
    )


def interval_estimates(
    scores: dict[str, np.ndarray], gamma: float, reps: int = 2000, seed: int = 0
) -> dict[str, dict[str, tuple[float, float, float]]]:
    """cell -> {estimate: (point, CI low, CI high)} for ESTIMATES: rliable's ``get_interval_estimates``
    (stratified bootstrap over runs, ``reps`` resamples, 95% percentile intervals, numpy's global
    generator seeded with ``seed`` for each cell), vectorized: the same resamples as rliable's
    ``StratifiedBootstrap`` (one ``randint`` draw of [runs, tasks] indices per resample, drawn here all at
    once), the four aggregates computed on each (equal to rliable's up to float rounding, checked in
    the tests)."""
    out = {}
    for cell, x in scores.items():
        runs, tasks = x.shape
        idx = seeded(seed, lambda runs=runs, tasks=tasks: np.random.randint(0, runs, size=(reps, runs, tasks)))
        resampled = x[idx, np.arange(tasks)]  # [reps, runs, tasks]
        stats = aggregates(resampled, gamma)  # [reps, 4]
        low, high = np.percentile(stats, [2.5, 97.5], axis=0)
        points = aggregates(x, gamma)
        out[cell] = {name: (float(points[i]), float(low[i]), float(high[i])) for i, name in enumerate(ESTIMATES)}
    return out


def _bootstrap(
    groups: Sequence[np.ndarray],
    reps: int,
    rng: np.random.Generator,
    per_resample: Callable[[np.ndarray], np.ndarray],
    point: Callable[[np.ndarray], float],
) -> tuple[float, float, float]:
    """(``point`` of the values in ``groups`` pooled, 95% low, 95% high), the interval from a stratified
    bootstrap: each group (a task) resampled with replacement on its own, ``reps`` times, vectorized, and
    ``per_resample`` maps the resamples [reps, n] to their statistic [reps]. NaNs when every group is empty."""
    groups = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not groups:
        return float("nan"), float("nan"), float("nan")
    resampled = np.concatenate([g[rng.integers(0, len(g), size=(reps, len(g)))] for g in groups], axis=1)
    low, high = np.percentile(per_resample(resampled), [2.5, 97.5])
    return point(np.concatenate(groups)), float(low), float(high)


def _iqm_rows(resampled: np.ndarray) -> np.ndarray:
    """Each row's IQM (``iqm_fast``'s), [reps, n] -> [reps]; sorts the rows in place."""
    resampled.sort(axis=1)
    cut = int(0.25 * resampled.shape[1])
    return resampled[:, cut : resampled.shape[1] - cut].mean(axis=1)


def bootstrap_iqm(groups: Sequence[np.ndarray], reps: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """(IQM, 95% low, 95% high) of the values in ``groups`` pooled, from a stratified bootstrap."""
    return _bootstrap(groups, reps, rng, _iqm_rows, iqm_fast)


def bootstrap_mean(groups: Sequence[np.ndarray], reps: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """(mean, 95% low, 95% high) of the values in ``groups`` pooled, from a stratified bootstrap."""
    return _bootstrap(groups, reps, rng, lambda resampled: resampled.mean(axis=1), lambda pooled: float(pooled.mean()))


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score 95% interval of a rate k/n; (NaN, NaN) when n = 0."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def performance_profiles(
    scores: dict[str, np.ndarray], taus: np.ndarray, reps: int = 2000, seed: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """rliable's score-distribution profiles: per cell the fraction of runs with score > tau [T],
    and its 95% bootstrap band [2, T]."""
    from rliable import library

    def fraction_above(x: np.ndarray, tau_list: np.ndarray) -> np.ndarray:
        return (x.reshape(-1, 1) > tau_list.reshape(1, -1)).mean(axis=0)  # [runs·tasks, T] -> [T]

    return seeded(
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
    """P(X > Y) as rliable defines it (``metrics.probability_of_improvement``) with the 95% percentile
    interval of rliable's stratified independent bootstrap (numpy's global generator seeded with
    ``seed``; per resample the runs of x, then of y, as ``StratifiedIndependentBootstrap`` draws them),
    the resamples' P computed at once: (point, low, high). x: [n, tasks], y: [m, tasks]."""

    def draw() -> tuple[np.ndarray, np.ndarray]:
        pairs = [(np.random.randint(0, len(x), x.shape), np.random.randint(0, len(y), y.shape)) for _ in range(reps)]
        return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])

    ix, iy = seeded(seed, draw)  # [reps, n, tasks], [reps, m, tasks]
    a, b = x[ix, np.arange(x.shape[1])], y[iy, np.arange(y.shape[1])]
    greater = (a[:, :, None, :] > b[:, None, :, :]).mean(axis=(1, 2))  # [reps, tasks]
    ties = (a[:, :, None, :] == b[:, None, :, :]).mean(axis=(1, 2))
    low, high = np.percentile((greater + 0.5 * ties).mean(axis=1), [2.5, 97.5])
    return poi_fast(x, y), float(low), float(high)


def poi_matrix(
    scores: dict[str, np.ndarray], cells: Sequence[str], reps: int = 2000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P, low, high) [K, K]: P[i, j] = P(cell i > cell j) with its 95% interval; the lower triangle
    mirrors the upper (P(j > i) = 1 − P(i > j), ties counting half, interval [1 − high, 1 − low] on the
    same resamples); NaN on the diagonal."""
    k = len(cells)
    p, low, high = (np.full((k, k), np.nan) for _ in range(3))
    for i in range(k):
        for j in range(i + 1, k):
            p[i, j], low[i, j], high[i, j] = probability_of_improvement(scores[cells[i]], scores[cells[j]], reps, seed)
            p[j, i], low[j, i], high[j, i] = 1 - p[i, j], 1 - high[i, j], 1 - low[i, j]
    return p, low, high


# ----------------------------------------------------------------------------- curves
def aggregate_curve(
    members: Sequence[tuple[str, np.ndarray, np.ndarray, float | None]], reps: int, rng: np.random.Generator
) -> tuple[list[float], list[float], list[float], list[float], list[int]]:
    """IQM across members at each env step with its 95% stratified-bootstrap band (rliable's sample
    efficiency curve; members stratified by task). ``members``: (task, steps, values, fill) per member;
    ``fill`` (a diverged member's value after its last record: frozen or random-policy score) or None
    (no value after its last record). Returns (steps, iqm, low, high, n)."""
    table: list[tuple[str, dict[float, float], float, float | None]] = []
    for task, steps, values, fill in members:
        points = {float(s): float(v) for s, v in zip(steps, values) if math.isfinite(v)}
        last = max(steps) if len(steps) else -math.inf
        table.append((task, points, float(last), fill))
    grid = sorted({s for _, points, _, _ in table for s in points})
    out: tuple[list, list, list, list, list] = ([], [], [], [], [])
    for step in grid:
        by_task: dict[str, list[float]] = {}
        for task, points, last, fill in table:
            value = points.get(step, fill if fill is not None and step > last else None)
            if value is not None:
                by_task.setdefault(task, []).append(value)
        point, low, high = bootstrap_iqm([np.array(v) for v in by_task.values()], reps, rng)
        for column, value in zip(out, (step, point, low, high, sum(len(v) for v in by_task.values()))):
            column.append(value)
    return out
