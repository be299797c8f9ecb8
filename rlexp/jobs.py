"""A job's directory: finished or not, resume, refusal, crash records.

A job dir is *finished* when its ``summary.json`` says ``ok`` or ``diverged``. Starting a job there
is refused unless ``resume=true``, which returns the recorded summary and touches no file (Hydra
skips its ``.hydra/`` record there too: see ``hydra_subdir``). An earlier attempt that did not
finish (interrupted, killed, crashed) loses nothing: its files move into ``attempt_<n>/`` before the
job starts again.
"""

from __future__ import annotations

import json
import os
import re
import traceback
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from rlexp.config import NON_CELL_KEYS, SEED_KEYS, ConfigError

FINISHED = ("ok", "diverged")
HYDRA_SUBDIR = ".hydra"
ATTEMPT = re.compile(r"attempt_(\d+)")
# keys that may differ between a finished job and its resumption: they pick the machine or the console
RESUME_IGNORES = tuple(key for key in NON_CELL_KEYS if key not in SEED_KEYS)
_ABSENT = "<absent>"


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON atomically: a reader (or a resume after a kill) sees all of it or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_summary(out_dir: Path) -> dict[str, Any] | None:
    """The job summary recorded in ``out_dir``, or None (none, or unreadable)."""
    try:
        summary = json.loads((out_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def is_finished(out_dir: Path) -> bool:
    """True when ``out_dir`` holds a job whose summary says ok or diverged."""
    summary = read_summary(out_dir)
    return summary is not None and summary.get("status") in FINISHED


def hydra_subdir() -> str | None:
    """``hydra.output_subdir`` of a job: ``.hydra``, or None (Hydra writes no config record) when
    the job's dir already holds a finished job, so that neither a resume nor a refusal touches it."""
    try:
        out_dir = HydraConfig.get().runtime.output_dir
    except Exception:  # outside a job (--cfg, compose): the output dir is not set
        return HYDRA_SUBDIR
    return None if is_finished(Path(out_dir)) else HYDRA_SUBDIR


def _dir_key() -> str:
    """The key that picks this job's dir: hydra.sweep.dir in a multirun, else hydra.run.dir."""
    try:
        return "hydra.sweep.dir" if HydraConfig.get().mode == RunMode.MULTIRUN else "hydra.run.dir"
    except Exception:
        return "hydra.run.dir"


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix.rstrip("."): node}
    flat: dict[str, Any] = {}
    for key, value in node.items():
        flat.update(_flatten(value, f"{prefix}{key}."))
    return flat


def config_difference(recorded: dict[str, Any], current: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first key (dotted) whose value differs between two resolved configs, with both values;
    None when they agree on every key outside ``RESUME_IGNORES``."""
    old, new = _flatten(recorded), _flatten(current)
    for key in sorted(set(old) | set(new)):
        if any(key == k or key.startswith(f"{k}.") for k in RESUME_IGNORES):
            continue
        if old.get(key, _ABSENT) != new.get(key, _ABSENT):
            return key, old.get(key, _ABSENT), new.get(key, _ABSENT)
    return None


def move_aside(out_dir: Path) -> Path | None:
    """Move an unfinished earlier attempt's files (all but ``.hydra/`` and earlier attempts) into
    ``out_dir/attempt_<n>/``; returns that dir, or None when there was nothing to move."""
    if not out_dir.is_dir():
        return None
    entries = list(out_dir.iterdir())
    leftovers = [p for p in entries if p.name != HYDRA_SUBDIR and not ATTEMPT.fullmatch(p.name)]
    if not leftovers:
        return None
    n = 1 + max((int(m.group(1)) for p in entries if (m := ATTEMPT.fullmatch(p.name))), default=0)
    dest = out_dir / f"attempt_{n}"
    dest.mkdir()
    for path in leftovers:
        path.rename(dest / path.name)
    print(f"{out_dir}: the files of an unfinished earlier attempt moved to {dest.name}/", flush=True)
    return dest


def start_job(out_dir: Path, config: dict[str, Any], resume: bool) -> dict[str, Any] | None:
    """Prepare ``out_dir`` for a job with the resolved ``config``.

    A finished job there: with ``resume`` its recorded summary (the caller skips the job; a config
    that differs is a ConfigError), without it a ConfigError naming the fixes. Otherwise None, after
    moving an unfinished attempt's files aside.
    """
    recorded = read_summary(out_dir)
    if recorded is None or recorded.get("status") not in FINISHED:
        move_aside(out_dir)
        return None
    status, dir_key = recorded["status"], _dir_key()
    if not resume:
        raise ConfigError(
            "resume",
            f"{out_dir} already holds a finished job (status {status})",
            f"pass resume=true to skip finished jobs, or set {dir_key} to a new directory",
        )
    differs = config_difference(recorded.get("config") or {}, config)
    if differs is not None:
        key, old, new = differs
        raise ConfigError(
            key,
            f"the finished job in {out_dir} has {key}={old!r}, this run {new!r}",
            f"resume with the config it was started with, or set {dir_key} to a new directory",
        )
    print(f"resume: {out_dir} is finished (status {status}); kept as recorded", flush=True)
    return recorded


def job_summary(
    config: dict[str, Any],
    cell: str,
    choices: dict[str, str],
    members: list[dict[str, Any]],
    wall_s: float,
    error: str | None,
) -> dict[str, Any]:
    """The job's ``summary.json`` content: status crashed when ``error`` is set, diverged when any
    member diverged, else ok."""
    statuses = [m["status"] for m in members]
    status = "crashed" if error else ("diverged" if "diverged" in statuses else "ok")
    return {
        "status": status,
        "cell": cell,
        "choices": choices,
        "algo": config["algo"]["name"],
        "env": config["env"]["id"],
        "seed": config["seed"],
        "num_seeds": config["num_seeds"],
        "total_steps": config["total_steps"],
        "wall_s": round(wall_s, 3),
        "counts": {s: statuses.count(s) for s in ("ok", "diverged", "crashed")},
        "members": members,
        "error": error,
        "config": config,
    }


def record_crash(
    out_dir: Path, config: dict[str, Any], cell: str, choices: dict[str, str], exc: BaseException, wall_s: float
) -> dict[str, Any]:
    """Record a job that raised before its trainer could: ``error.txt`` (the traceback), a crashed
    ``seed_<k>/summary.json`` per member and the job's ``summary.json``; returns the job summary."""
    error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "error.txt").write_text("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    members = []
    for k in range(config["num_seeds"]):
        member = {
            "status": "crashed",
            "seed": config["seed"] + k,
            "member": k,
            "steps": 0,
            "final_return": None,
            "episodes": 0,
            "wall_s": round(wall_s, 3),
            "diverged_at_step": None,
            "divergence": None,
            "error": error,
        }
        write_json(out_dir / f"seed_{k}" / "summary.json", member)
        members.append(member)
    job = job_summary(config, cell, choices, members, wall_s, error)
    write_json(out_dir / "summary.json", job)
    return job
