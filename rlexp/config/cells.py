"""A grid cell's name, one definition for the report and the W&B runs of a sweep's members.

A job's *settings* are its config groups' options and its command-line overrides (``key=value``), without
``NON_CELL_KEYS`` (seeds, the machine, the console), the env (a task: the report's columns) and Hydra's
own keys. A cell is named by the settings that vary across the sweep, as ``k=v,k2=v2`` in the order the
sweep names them (``all`` when nothing varies). The report finds what varies from the jobs it reads; a
job of a multirun finds it from the sweep's definition (``multirun.yaml``: the command line's sweeps and
``hydra.sweeper.params``), before the other jobs ran; a single run names its cell by its own overrides.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlexp.config.schema import NON_CELL_KEYS

# how long a run is and what it logs: never in a single run's cell (a sweep names them only when it varies them)
RUN_LENGTH = ("total_steps", "algo.learning_starts", "eval", "logger", "diagnostics")
TASK_KEYS = ("env", "env.id")  # the env is a task (a column of the report's score matrix), never a cell
MULTIRUN_YAML = "multirun.yaml"  # Hydra's record of the sweep, in the sweep dir


def is_cell_key(key: str) -> bool:
    """True when ``key`` may name a cell: not in ``NON_CELL_KEYS`` (or under one), not the env, not Hydra's."""
    return not _under(key, NON_CELL_KEYS) and key not in TASK_KEYS and not key.startswith("hydra")


def sweep_name(sweep_dir: Path) -> str:
    """A multirun's default ``logger.sweep``: its dir's name (characters W&B tags take, at most 41) and 6
    hex digits of its absolute path, so that two sweeps' dirs of one name differ and a resume keeps it."""
    digest = hashlib.sha1(str(sweep_dir.resolve()).encode()).hexdigest()[:6]
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', sweep_dir.name)[:41]}-{digest}"


def parse_overrides(lines: Any) -> dict[str, str]:
    """``key=value`` overrides (``+``/``++`` prefixes dropped, deletions ``~key`` skipped) as a dict."""
    out: dict[str, str] = {}
    for line in lines if isinstance(lines, (list, tuple)) else []:
        text = str(line)
        if "=" not in text or text.startswith("~"):
            continue
        key, value = text.split("=", 1)
        out[key.lstrip("+")] = value
    return out


def job_settings(choices: Mapping[str, Any], overrides: Any) -> dict[str, str]:
    """A job's settings: its group choices (``hydra/...`` ones left out) updated by its overrides, cell keys only."""
    settings = {str(k): str(v) for k, v in choices.items() if is_cell_key(str(k)) and "/" not in str(k)}
    settings.update({k: v for k, v in parse_overrides(overrides).items() if is_cell_key(k)})
    return settings


def single_cell(choices: Mapping[str, Any], overrides: Any) -> str:
    """A single run's cell: its command-line overrides of keys that may name a cell, in their order, but
    those of its length and of what it logs (``RUN_LENGTH``), then its env: ``algo=td3,env=pendulum``;
    ``env=cartpole`` for the defaults."""
    settings, given = job_settings(choices, overrides), parse_overrides(overrides)
    names = [f"{k}={settings.get(k, '-')}" for k in given if is_cell_key(k) and not _under(k, RUN_LENGTH)]
    env_id = given.get("env.id")
    return ",".join([*names, f"env.id={env_id}" if env_id else f"env={choices.get('env', '-')}"])


def _under(key: str, prefixes: Sequence[str]) -> bool:
    """True when ``key`` is one of ``prefixes`` or lies under one (``logger`` holds ``logger.mode``)."""
    return any(key == p or key.startswith(f"{p}.") for p in prefixes)


def cell_name(settings: Mapping[str, str], keys: Sequence[str]) -> str:
    """``k=v,k2=v2`` over the cell keys (``-`` for a key the job does not set); ``all`` when there are none."""
    return ",".join(f"{k}={settings.get(k, '-')}" for k in keys) or "all"


def swept_keys(task: Iterable[str], params: Mapping[str, Any] | None) -> list[str]:
    """The cell keys a sweep varies: those of its command-line overrides (``task``, in their order) whose
    value is a sweep (``a,b``, ``choice(…)``, ``range(…)``, …, as Hydra's override grammar reads it), then
    those of ``hydra.sweeper.params`` (sorted)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [*task, *(f"{k}={v}" for k, v in sorted((params or {}).items()))]
    try:
        overrides = OverridesParser.create().parse_overrides(lines)
    except Exception:  # a record Hydra's grammar does not read: nothing is known to vary
        return []
    keys = [o.get_key_element().lstrip("+~") for o in overrides if o.is_sweep_override()]
    return [k for k in dict.fromkeys(keys) if is_cell_key(k)]


def sweep_cell_keys(sweep_dir: Path) -> list[str] | None:
    """The cell keys of the sweep recorded in ``sweep_dir/multirun.yaml``; None when there is no such record."""
    path = sweep_dir / MULTIRUN_YAML
    if not path.is_file():
        return None
    stat = path.stat()
    return list(_recorded_cell_keys(str(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=8)
def _recorded_cell_keys(path: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    """``sweep_cell_keys`` of one version of a record, read once (a sweep asks once per job)."""
    from omegaconf import OmegaConf

    hydra = OmegaConf.to_container(OmegaConf.load(path)).get("hydra") or {}
    task = (hydra.get("overrides") or {}).get("task") or []
    return tuple(swept_keys(task, (hydra.get("sweeper") or {}).get("params")))
