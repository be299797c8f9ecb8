"""Packed training: several cells of a grid trained as one population.

A grid's cells that agree on everything but their per-member keys (``pack_key``: the network's shape,
the algorithm, the environment, the budget, ...) are trained together, each cell's ``num_seeds``
members side by side in one population; each cell's job dir is written exactly as its own job would
write it (``summary.json``, ``seed_<k>/`` with ``metrics.jsonl``, ``summary.json`` and one W&B run
per member grouped by the cell, the lock, resume's skip, crash records). A member computes in a pack
what it computes alone: the per-member keys are tensors or runs of members (``rlexp.config.members``), never
a branch per member. ``hydra/launcher=rlexp_packed`` packs a multirun's jobs with it.
"""

from __future__ import annotations

import dataclasses
import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from rlexp.config.schema import NON_CELL_KEYS, ConfigError
from rlexp.run.context import Algorithm, RunContext
from rlexp.run.jobs import (
    DeferredInterrupts,
    _flatten,
    hold_dir,
    record_crash,
    release_dir,
    start_job,
    trained_summary,
    write_json,
)
from rlexp.run.recorder import Job


@dataclass
class Cell:
    """One job of a grid: its composed config, its job dir and its identity (the W&B group)."""

    cfg: DictConfig
    out_dir: Path
    name: str = "default"  # the cell (Hydra's override dirname): W&B group and the job summary's cell
    choices: dict[str, str] = dataclasses.field(default_factory=dict)


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


def cell_line(cell: Cell, job: dict[str, Any]) -> str:
    """The console line of a finished cell: its dir, name, status, member counts and mean final return."""
    returns = [m["final_return"] for m in job["members"] if m.get("final_return") is not None]
    mean = f"{sum(returns) / len(returns):.1f}" if returns else "-"
    counts = " ".join(f"{k} {v}" for k, v in job["counts"].items() if v)
    return f"{cell.out_dir}: {cell.name}: {job['status']} ({counts}) return {mean}"


def run_pack(
    cells: list[Cell], prepare: Callable[[DictConfig], tuple[Algorithm, torch.device]]
) -> list[dict[str, Any] | BaseException]:
    """Train ``cells`` (one ``pack_key``) as one population and write each cell's job dir; returns each
    cell's job summary, or the exception that refused or failed it.

    Each dir is held (``hold_dir``) until the pack ends. A finished cell is skipped with ``resume`` (its
    recorded summary) and refused without it; an unfinished attempt is moved aside. ``prepare`` validates
    each cell's config (a ConfigError refuses that cell only) and then, for the whole population, sets
    the process state and gives the algorithm and device. A pack that raises records every cell of it
    as crashed (``error.txt``, crashed summaries); divergence is a member's result.
    """
    results: dict[int, dict[str, Any] | BaseException] = {}
    held: list[Path] = []
    try:
        todo: list[tuple[int, Cell, dict[str, Any]]] = []
        for i, cell in enumerate(cells):
            try:
                hold_dir(cell.out_dir)
                held.append(cell.out_dir)
                config = OmegaConf.to_container(cell.cfg, resolve=True)
                recorded = start_job(cell.out_dir, config, cell.cfg.resume)
                if recorded is not None:
                    results[i] = recorded
                    continue
                if cell.cfg.pbt.interval > 0:
                    raise ConfigError(
                        "pbt.interval",
                        f"{cell.cfg.pbt.interval}: a PBT population is one job, never packed with other cells",
                        "run it with hydra/launcher=basic or rlexp_joblib, or set pbt.interval=0",
                    )
                prepare(cell.cfg)  # validates (ConfigError)
                todo.append((i, cell, config))
            except ConfigError as err:
                results[i] = err
        if todo:
            jobs = _train(todo, prepare)
            results.update(jobs)
    finally:
        for out_dir in held:
            release_dir(out_dir)
    return [results[i] for i in range(len(cells))]


def _train(
    todo: list[tuple[int, Cell, dict[str, Any]]], prepare: Callable[[DictConfig], tuple[Algorithm, torch.device]]
) -> dict[int, dict[str, Any] | BaseException]:
    """Train the cells ``todo`` (index, cell, resolved config) of one pack as one population."""
    start = time.perf_counter()
    sizes = [cell.cfg.num_seeds for _, cell, _ in todo]
    interrupts = DeferredInterrupts()  # a Ctrl-C while training waits for every cell's summaries
    try:
        first = todo[0][1].cfg.copy()
        first.num_seeds = sum(sizes)  # the population: threads and resources for every member
        train, device = prepare(first)
        member_cfgs, seeds = [], []
        for _, cell, _ in todo:
            typed = OmegaConf.to_object(cell.cfg)
            member_cfgs += [typed] * cell.cfg.num_seeds
            seeds += [cell.cfg.seed + k for k in range(cell.cfg.num_seeds)]
        shared = dataclasses.replace(member_cfgs[0], num_seeds=len(seeds))
        ctx = RunContext.create(shared, device, member_cfgs, seeds)
    except BaseException as exc:
        interrupts.stopping = True
        wall = time.perf_counter() - start
        crashed = {i: _crashed(cell, config, exc, wall) for i, cell, config in todo}
        interrupts.restore(raise_deferred=False)
        if not isinstance(exc, Exception):
            raise  # KeyboardInterrupt: every cell is recorded crashed; the launcher stops
        return crashed
    recorder = ctx.recorder
    error: str | None = None
    results: dict[int, dict[str, Any] | BaseException] = {}
    try:
        recorder.open(
            [
                Job(cell.out_dir, cell.name, [f"{g}:{o}" for g, o in sorted(cell.choices.items())], config, size)
                for (_, cell, config), size in zip(todo, sizes)
            ]
        )
        recorder.schedule.stop_requested = interrupts.stop_requested
        interrupts.training = True
        train(ctx)
    except BaseException as exc:
        interrupts.stopping = True
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        for _, cell, _ in todo:
            cell.out_dir.mkdir(parents=True, exist_ok=True)
            (cell.out_dir / "error.txt").write_text(traceback.format_exc())
        if not isinstance(exc, Exception):
            raise  # KeyboardInterrupt: the summaries below are written on the way out
    finally:
        interrupts.stopping = True
        members = recorder.close(error)
        wall = time.perf_counter() - recorder.start_time
        first_member = 0
        for (i, cell, config), size in zip(todo, sizes):
            own = members[first_member : first_member + size]
            first_member += size
            threads = torch.get_num_threads()
            job = trained_summary(config, cell.name, cell.choices, own, wall, error, recorder.first_step_at, threads)
            job["packed_with"] = len(todo)  # cells trained in this population
            write_json(cell.out_dir / "summary.json", job)
            results[i] = job
            print(cell_line(cell, job), flush=True)
        try:
            recorder.close_wandb()
            ctx.env.close()
        finally:
            interrupts.restore(raise_deferred=error is None)
    return results


def _crashed(cell: Cell, config: dict[str, Any], exc: BaseException, wall: float) -> dict[str, Any]:
    """A cell whose pack raised before training: its crash record, and the printed line."""
    job = record_crash(cell.out_dir, config, cell.name, cell.choices, exc, wall)
    print(cell_line(cell, job), flush=True)
    return job
