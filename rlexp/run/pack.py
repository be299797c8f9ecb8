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

import json
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlexp.config.schema import NON_CELL_KEYS, ConfigError
from rlexp.run.jobs import _flatten
from rlexp.run.runner import Cell, Prepare, cell_line, run_cells

__all__ = ["Cell", "cell_line", "pack_key", "pack_work", "plan_packs", "run_pack"]


def _member_key(key: str, member_keys: tuple[str, ...]) -> bool:
    return any(key == k or key.startswith(f"{k}.") for k in (*NON_CELL_KEYS, *member_keys))


def pack_key(cfg: DictConfig, member_keys: tuple[str, ...]) -> str:
    """What cells must share to be trained in one pack: every resolved config value but the seeds, the
    keys that make no cell (``NON_CELL_KEYS``) and the algorithm's per-member keys ``member_keys``.
    Cells that differ in the network's shape, the algorithm or the loop never get the same key."""
    flat = _flatten(OmegaConf.to_container(cfg, resolve=True))
    return json.dumps({k: v for k, v in sorted(flat.items()) if not _member_key(k, member_keys)}, default=str)


def plan_packs(cells: list[Cell], member_keys: Callable[[str], tuple[str, ...]], max_members: int) -> list[list[Cell]]:
    """Group ``cells`` by ``pack_key`` (``member_keys(algo name)``: its per-member keys), in their
    order; within a pack, cells with equal optimizer and clipping configs sit side by side (each such
    run of members steps as one group); a pack holds at most ``max_members`` members (a cell is never
    split; a larger cell is a pack of its own). The packs come largest ``pack_work`` first (equal ones
    in the cells' order), so that workers taking them in turn end close together."""
    if max_members < 1:
        raise ConfigError("hydra.launcher.max_members", f"{max_members} is below 1", "give a value >= 1")
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(pack_key(cell.cfg, member_keys(cell.cfg.algo.name)), []).append(cell)
    packs: list[list[Cell]] = []
    for group in groups.values():
        group = sorted(group, key=lambda c: (repr(c.cfg.optimizer), repr(c.cfg.clipping)))  # stable
        pack: list[Cell] = []
        for cell in group:
            if pack and sum(c.cfg.num_seeds for c in pack) + cell.cfg.num_seeds > max_members:
                packs.append(pack)
                pack = []
            pack.append(cell)
        packs.append(pack)
    return sorted(packs, key=pack_work, reverse=True)


def pack_work(pack: list[Cell]) -> int:
    """A pack's estimated cost, for its place in the queue: members x env steps x the components of
    a hidden layer's forward (linear, activation, and the normalization unless none) summed over the
    network's layers. A pack's time is its updates' arithmetic, which grows with each of them."""
    cfg = pack[0].cfg
    per_layer = 2 + (cfg.normalization.name != "none")
    components = per_layer * len(cfg.network.hidden) + 1  # + the output layer
    return sum(c.cfg.num_seeds for c in pack) * int(cfg.total_steps) * components


def run_pack(cells: list[Cell], prepare: Prepare) -> list[dict[str, Any] | BaseException]:
    """Train ``cells`` (one ``pack_key``) as one population and write each cell's job dir; returns each
    cell's job summary, or the exception that refused or failed it (``rlexp.run.runner.run_cells``,
    packed: a refused cell does not stop the others; a crash records every cell of its population
    crashed; checkpoints, resume and fault injection work as in each cell's own job)."""
    return run_cells(cells, prepare, alone=False)
