"""Packed training: several cells of a grid trained as one population.

A grid's cells that agree on everything but their per-member keys (``pack_key``: the network's shape,
the algorithm, the environment, the budget, ...) are trained together, each cell's ``num_seeds``
members side by side in one population. A pack runs the one job lifecycle (``rlexp.run.runner``, of
which a single job is a pack of one cell): each cell's job dir is written exactly as its own job would
write it (``summary.json``, ``seed_<k>/`` with ``metrics.jsonl``, ``summary.json``, ``checkpoint.pt``
and one W&B run per member grouped by the cell, the lock, resume's skip or continuation, crash
records). A member computes in a pack what it computes alone: the per-member keys are tensors or runs
of members (``rlexp.config.members``), never a branch per member. ``hydra/launcher=rlexp_packed``
packs a multirun's jobs with it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlexp.config.schema import NON_CELL_KEYS, ConfigError
from rlexp.run.jobs import _flatten
from rlexp.run.runner import Cell, Prepare, cell_line, run_cells

__all__ = ["Cell", "PackEntry", "cell_line", "pack_entry", "pack_key", "pack_work", "plan", "plan_packs", "run_pack"]


def _member_key(key: str, member_keys: tuple[str, ...]) -> bool:
    return any(key == k or key.startswith(f"{k}.") for k in (*NON_CELL_KEYS, *member_keys))


def pack_key(cfg: DictConfig, member_keys: tuple[str, ...]) -> str:
    """What cells must share to be trained in one pack: every resolved config value but the seeds, the
    keys that make no cell (``NON_CELL_KEYS``) and the algorithm's per-member keys ``member_keys``.
    Cells that differ in the network's shape, the algorithm or the loop never get the same key. Hydra's
    own node (``hydra``, in a launcher's job config) is no part of it."""
    task = ((key, cfg[key]) for key in cfg if key != "hydra")
    flat = _flatten({k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v for k, v in task})
    return json.dumps({k: v for k, v in sorted(flat.items()) if not _member_key(k, member_keys)}, default=str)


@dataclass(frozen=True)
class PackEntry:
    """What planning reads of a cell's config (a grid's launcher keeps this, not the config)."""

    key: str  # sha-256 of its pack_key (a grid of 10^5 cells keeps 64 characters of each)
    members: int  # num_seeds
    order: tuple[str, str]  # its optimizer and clipping configs: equal ones sit side by side in a pack
    work: int  # estimated work per member: env steps x the components of the network's layers


def pack_entry(cfg: DictConfig, member_keys: tuple[str, ...]) -> PackEntry:
    """``cfg``'s ``PackEntry`` (``member_keys``: its algorithm's per-member keys)."""
    per_layer = 2 + (cfg.normalization.name != "none")
    components = per_layer * len(cfg.network.hidden) + 1  # + the output layer
    order = (repr(cfg.optimizer), repr(cfg.clipping))
    key = hashlib.sha256(pack_key(cfg, member_keys).encode()).hexdigest()
    return PackEntry(key, int(cfg.num_seeds), order, int(cfg.total_steps) * components)


def plan(entries: list[PackEntry], max_members: int) -> list[list[int]]:
    """Group cells (their ``entries``, by index) by pack key, in their order; within a pack, cells with
    equal optimizer and clipping configs sit side by side (each such run of members steps as one group);
    a pack holds at most ``max_members`` members (a cell is never split; a larger cell is a pack of its
    own). The packs come largest work (members x work per member) first, equal ones in the cells'
    order, so that workers taking them in turn end close together."""
    if max_members < 1:
        raise ConfigError("hydra.launcher.max_members", f"{max_members} is below 1", "give a value >= 1")
    groups: dict[str, list[int]] = {}
    for i, entry in enumerate(entries):
        groups.setdefault(entry.key, []).append(i)
    packs: list[list[int]] = []
    for group in groups.values():
        group = sorted(group, key=lambda i: entries[i].order)  # stable
        pack: list[int] = []
        members = 0
        for i in group:
            if pack and members + entries[i].members > max_members:
                packs.append(pack)
                pack, members = [], 0
            pack.append(i)
            members += entries[i].members
        packs.append(pack)
    return sorted(packs, key=lambda p: sum(entries[i].members for i in p) * entries[p[0]].work, reverse=True)


def plan_packs(cells: list[Cell], member_keys: Callable[[str], tuple[str, ...]], max_members: int) -> list[list[Cell]]:
    """``plan`` of ``cells`` (``member_keys(algo name)``: its per-member keys), as lists of cells."""
    entries = [pack_entry(c.cfg, member_keys(c.cfg.algo.name)) for c in cells]
    return [[cells[i] for i in pack] for pack in plan(entries, max_members)]


def pack_work(pack: list[Cell]) -> int:
    """A pack's estimated cost, for its place in the queue: members x env steps x the components of
    a hidden layer's forward (linear, activation, and the normalization unless none) summed over the
    network's layers. A pack's time is its updates' arithmetic, which grows with each of them."""
    return sum(c.cfg.num_seeds for c in pack) * pack_entry(pack[0].cfg, ()).work


def run_pack(cells: list[Cell], prepare: Prepare) -> list[dict[str, Any] | BaseException]:
    """Train ``cells`` (one ``pack_key``) as one population and write each cell's job dir; returns each
    cell's job summary, or the exception that refused or failed it (``rlexp.run.runner.run_cells``,
    packed: a refused cell does not stop the others; a crash records every cell of its population
    crashed; checkpoints, resume and fault injection work as in each cell's own job)."""
    return run_cells(cells, prepare, alone=False)
