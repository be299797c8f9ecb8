"""One sweep dir, one grid.

A multirun claims its sweep dir as a whole before any job starts (``claim_sweep``): it holds the sweep
dir's lock (``<sweep dir>/.lock``, as a job holds its own dir) until it ends, and the grid it runs must
be the one the dir records in ``multirun.yaml`` (Hydra's record of the sweep, written once the claim
holds). A second multirun into a held dir is refused in one line, whatever its grid; a later multirun
with another grid is refused in one line too, before it writes anything. The same grid again (to
resume it) claims the dir, as does a grid whose jobs begin with the recorded grid's jobs in their order
(more values of a key swept last, e.g. ``seed=0,1`` then ``seed=0,1,2``). A grid whose dir holds its
finished jobs is refused without ``resume=true``, in one line. While it runs jobs in worker processes
(joblib, packed) the multirun's process passes a SIGTERM on to them (``rlexp.run.jobs.forward_sigterm``).

A grid is its jobs' override lists in their order (``grid_jobs``): Hydra's basic sweeper makes every
combination of the command line's sweeps and ``hydra.sweeper.params``. Keys that may differ when a job
is resumed (``RESUME_IGNORES``: ``resume``, ``threads``, the console, …) are left out. A search's
sweeper (Optuna) picks its jobs while it runs, each trial in a dir of its own: a search claims a dir
that holds a search of the same sweeper (its study goes on), and no other.
"""

from __future__ import annotations

import shlex
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rlexp.config.cells import MULTIRUN_YAML
from rlexp.config.schema import ConfigError
from rlexp.run.jobs import (
    RESUME_IGNORES,
    check_writable,
    forward_sigterm,
    hold_dir,
    is_finished,
    job_dirs,
    refuse,
    release_dir,
)

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
WORKER_LAUNCHERS = ("JoblibLauncher", "PackedLauncher")  # launchers whose jobs run in worker processes
_CLAIMED: list[Path] = []  # the sweep dir this process holds, while its multirun runs


def _kept(line: str) -> bool:
    """False for an override of a key that may differ between a grid and its resumption."""
    key = line.split("=", 1)[0].lstrip("+~")
    return not any(key == k or key.startswith(f"{k}.") for k in RESUME_IGNORES)


def _sweep_lines(hydra: Mapping[str, Any]) -> list[str]:
    """The sweep as the basic sweeper reads it: ``hydra.sweeper.params`` then the command line."""
    params = (hydra.get("sweeper") or {}).get("params") or {}
    task = (hydra.get("overrides") or {}).get("task") or []
    return [f"{k}={v}" for k, v in params.items()] + [str(line) for line in task]


def grid_jobs(hydra: Mapping[str, Any]) -> list[list[str]] | None:
    """The override lists of the jobs of the sweep that ``hydra`` (a multirun's ``hydra`` node, as a dict)
    defines, in Hydra's order, without ``RESUME_IGNORES`` keys; None when its sweeper is not Hydra's basic
    one (a search picks its jobs as it runs) or Hydra's grammar does not read it."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if (hydra.get("sweeper") or {}).get("_target_") != BASIC_SWEEPER:
        return None
    try:
        overrides = OverridesParser.create().parse_overrides(_sweep_lines(hydra))
        batches = BasicSweeper.split_arguments(overrides, None)
    except Exception:  # e.g. glob(), which needs the config loader: the grid is not known here
        return None
    return [[line for line in job if _kept(line)] for batch in batches for job in batch]


def recorded_hydra(sweep_dir: Path) -> dict[str, Any] | None:
    """The ``hydra`` node of ``sweep_dir/multirun.yaml``; None when there is no readable record."""
    try:
        record = OmegaConf.to_container(OmegaConf.load(sweep_dir / MULTIRUN_YAML))
    except Exception:  # missing, unreadable, not YAML
        return None
    hydra = record.get("hydra") if isinstance(record, dict) else None
    return hydra if isinstance(hydra, dict) else None


def _search(hydra: Mapping[str, Any]) -> list[str]:
    """A sweep as written: its sweeper's name, then its params and command line (``RESUME_IGNORES`` keys
    left out)."""
    return [str((hydra.get("sweeper") or {}).get("_target_")), *(x for x in _sweep_lines(hydra) if _kept(x))]


def only_in(first: Sequence[str], second: Sequence[str]) -> str:
    """The overrides of ``first`` that ``second`` lacks, space-separated ('no other override' for none)."""
    return " ".join(x for x in first if x not in second) or "no other override"


def grid_difference(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """How the grid ``current`` defines differs from the ``recorded`` one; None when it is the same grid
    or extends it (its jobs begin with the recorded jobs, in their order)."""
    old, new = grid_jobs(recorded), grid_jobs(current)
    if old is None or new is None:
        old_search, new_search = _search(recorded), _search(current)
        if old is None and new is None and old_search[0] == new_search[0]:
            return None  # the same search: its study goes on, each trial in a dir of its own
        return f"it records the sweep {' '.join(old_search)}; this command's is {' '.join(new_search)}"
    for k, (was, now) in enumerate(zip(old, new)):
        if was != now:
            return f"its job {k} runs {only_in(was, now)} where this command's runs {only_in(now, was)}"
    if len(new) < len(old):
        return f"it records {len(old)} jobs; this command's grid has {len(new)}"
    return None


def claim_sweep(config: DictConfig) -> None:
    """Claim the sweep dir of the multirun ``config`` defines for this process (see the module's doc): a
    ConfigError when another process holds it, when it holds a job of another grid, a file where a job's
    dir goes, or (without ``resume``) finished jobs of this grid; the dir is then left as it was."""
    sweep_dir = Path(config.hydra.sweep.dir)
    hold_dir(sweep_dir, "hydra.sweep.dir", holder="multirun")
    refusal = _refusal(config, sweep_dir)
    if refusal is not None:
        release_dir(sweep_dir)
        raise refusal
    _CLAIMED.append(sweep_dir)


def _refusal(config: DictConfig, sweep_dir: Path) -> ConfigError | None:
    """Why the multirun ``config`` may not run in the held ``sweep_dir``; None when it may."""
    current = OmegaConf.to_container(config.hydra, resolve=False)
    recorded = recorded_hydra(sweep_dir)
    if recorded is not None and job_dirs(sweep_dir):
        difference = grid_difference(recorded, current)
        if difference is not None:
            return ConfigError(
                "hydra.sweep.dir",
                f"{sweep_dir} holds jobs of another grid ({difference})",
                "set hydra.sweep.dir to a new directory, or run the recorded grid "
                f"(python -m rlexp.check {shlex.quote(str(sweep_dir))} lists its jobs)",
            )
    blocked = sorted((p for p in sweep_dir.iterdir() if p.name.isdigit() and not p.is_dir()), key=lambda p: int(p.name))
    if blocked:
        return ConfigError(
            "hydra.sweep.dir",
            f"{blocked[0]} is not a directory: job {blocked[0].name}'s dir cannot be made there",
            f"move it out of {sweep_dir}, or set hydra.sweep.dir to a new directory",
        )
    jobs = grid_jobs(current) or []  # a search's jobs are new trials: none is finished
    finished = sum(is_finished(sweep_dir / str(k)) for k in range(len(jobs)))
    if not finished or config.get("resume", False):
        return None
    if finished == len(jobs):
        return ConfigError(
            "resume",
            f"{sweep_dir} holds this grid finished (all {finished} jobs): nothing to run",
            f"read it with python -m rlexp.report {shlex.quote(str(sweep_dir))}, or set hydra.sweep.dir to a new "
            "directory",
        )
    return ConfigError(
        "resume",
        f"{sweep_dir} holds {finished} finished jobs of this grid's {len(jobs)}",
        "pass resume=true to keep them and run the others, or set hydra.sweep.dir to a new directory",
    )


class SweepClaim(Callback):
    """Hydra callback, before a multirun's sweeper writes anything: its sweep dir can be written and is
    claimed for its grid (``claim_sweep``). A refusal is one line and exit code 2."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse(lambda: check_writable(Path(config.hydra.sweep.dir), "hydra.sweep.dir"))
        refuse(lambda: claim_sweep(config))
        launcher = str(config.hydra.launcher.get("_target_", ""))
        if launcher.endswith(WORKER_LAUNCHERS) and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, forward_sigterm)  # its jobs run in workers: they get it and record it


def release_sweep() -> None:
    """Release the sweep dir this process claimed (nothing when none), and SIGTERM's handler."""
    while _CLAIMED:
        release_dir(_CLAIMED.pop())
    if signal.getsignal(signal.SIGTERM) is forward_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def expected_jobs(sweep_dir: Path) -> list[tuple[Path, list[str]]] | None:
    """Each job of the grid ``sweep_dir`` records: (its dir, its overrides); None when the record names no
    job list (no ``multirun.yaml``, or a search)."""
    recorded = recorded_hydra(sweep_dir)
    jobs = grid_jobs(recorded) if recorded is not None else None
    return None if jobs is None else [(sweep_dir / str(k), job) for k, job in enumerate(jobs)]


def ran_overrides(job_dir: Path) -> list[str] | None:
    """The overrides a job dir's latest attempt ran with (``.hydra/overrides.yaml``), ``RESUME_IGNORES``
    keys left out; None when there is no readable record."""
    try:
        lines = OmegaConf.to_container(OmegaConf.load(job_dir / ".hydra" / "overrides.yaml"))
    except Exception:
        return None
    return [str(x) for x in lines if _kept(str(x))] if isinstance(lines, list) else None


def unknown_dirs(sweep_dir: Path, expected: Sequence[tuple[Path, list[str]]]) -> list[Path]:
    """Job dirs in ``sweep_dir`` that are no job of its grid."""
    names = {path.name for path, _ in expected}
    return [path for path in job_dirs(sweep_dir) if path != sweep_dir and path.name not in names]
