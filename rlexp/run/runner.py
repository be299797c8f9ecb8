"""The job lifecycle: cells of a grid trained as one population; a single job is a list of one cell.

``run_cells`` holds each cell's job dir, skips or refuses a finished one and moves an unfinished attempt
aside (or continues it from its checkpoint), lets ``prepare`` validate the config and give the algorithm
and device, builds the RunContext of the cells' members side by side, continues it from the cells'
checkpoints, trains it (``train(ctx)``) and writes each cell's output contract (``summary.json``,
``seed_<k>/summary.json``, ``seed_<k>/metrics.jsonl``, ``seed_<k>/checkpoint.pt``, W&B runs) exactly as
the cell's own job would, then closes the W&B runs. ``run_population`` is a single job;
``rlexp.run.pack.run_pack`` a pack of cells. Neither picks the algorithm nor sets process-wide state
(threads, garbage collector): the entry point, ``rlexp.train``, does both (in ``prepare``).
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from rlexp.config.schema import ConfigError
from rlexp.run.checkpoint import CheckpointError, Checkpoints, PopulationCheckpoints
from rlexp.run.context import Algorithm, RunContext
from rlexp.run.jobs import (
    DeferredInterrupts,
    hold_dir,
    record_crash,
    release_dir,
    start_job,
    trained_summary,
    write_json,
    write_traceback,
)
from rlexp.run.loggers import print_summary
from rlexp.run.recorder import Job

Prepare = Callable[[DictConfig], tuple[Algorithm, torch.device]]  # validates a config; (algorithm, device)


@dataclass
class Cell:
    """One job of a grid: its composed config, its job dir and its identity (the W&B group)."""

    cfg: DictConfig
    out_dir: Path
    name: str = "default"  # the cell (Hydra's override dirname): W&B group and the job summary's cell
    choices: dict[str, str] = dataclasses.field(default_factory=dict)

    def tags(self) -> list[str]:
        """The W&B tags: ``group:option`` of each config group chosen."""
        return [f"{g}:{o}" for g, o in sorted(self.choices.items())]


@dataclass
class Started:
    """A cell whose job dir is ready to train: its place in the list, resolved config and checkpoints."""

    index: int
    cell: Cell
    config: dict[str, Any]
    checkpoints: Checkpoints
    continued_from: int | None  # the checkpoint's env step it continues from, or None: from the start


def cell_line(cell: Cell, job: dict[str, Any]) -> str:
    """The console line of a finished cell: its dir, name, status, member counts and mean final return."""
    returns = [m["final_return"] for m in job["members"] if m.get("final_return") is not None]
    mean = f"{sum(returns) / len(returns):.1f}" if returns else "-"
    counts = " ".join(f"{k} {v}" for k, v in job["counts"].items() if v)
    return f"{cell.out_dir}: {cell.name}: {job['status']} ({counts}) return {mean}"


def run_population(
    cfg: DictConfig, out_dir: Path, prepare: Prepare, cell: str = "default", choices: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run one job in ``out_dir`` and return its summary: ``run_cells`` of one cell, alone.

    A dir another process holds, or one that cannot be written, is refused (ConfigError); a finished
    job there is skipped with ``resume`` and refused (ConfigError) without it; a config ``prepare``
    refuses (ConfigError) leaves nothing recorded. A job that raises leaves a crashed summary (and
    ``error.txt``) and raises on; divergence is a result. It ends by printing its members' table.
    """
    (result,) = run_cells([Cell(cfg, out_dir, cell, choices or {})], prepare, alone=True)
    assert isinstance(result, dict)
    return result


def run_cells(cells: list[Cell], prepare: Prepare, alone: bool = False) -> list[dict[str, Any] | BaseException]:
    """Train ``cells`` (one ``pack_key`` when several) as one population and write each cell's job dir;
    returns each cell's job summary, or the exception that refused or failed it.

    Each dir is held (``hold_dir``) from before anything moves there until the cells end. A finished
    cell is skipped with ``resume`` (its recorded summary) and refused without it; an unfinished attempt
    is moved aside, or with ``resume`` continues from its checkpoint (``start_job``). The cells that
    continue from one checkpoint step (or start afresh) train as one population, each such group in turn.

    ``alone`` (a single job): a refusal (ConfigError) is raised; ``prepare(cfg)`` validates the cell and
    gives the algorithm and device, and a ConfigError there records nothing; a crash is recorded, then
    raised; the members' table is printed. Packed (not ``alone``): a refusal is that cell's result and
    the others go on; ``prepare`` validates each cell, a PBT cell is refused (a PBT population is one job),
    then ``prepare`` of the whole population gives the algorithm and device; a crash records every cell
    of its population crashed and is their result (a KeyboardInterrupt is raised after); each finished
    cell prints one line (``cell_line``) and its summary says ``packed_with``.
    """
    results: dict[int, dict[str, Any] | BaseException] = {}
    held: list[Path] = []
    try:
        started: list[Started] = []
        for i, cell in enumerate(cells):
            try:
                hold_dir(cell.out_dir, reserve=True)
                held.append(cell.out_dir)
                ready = _start(i, cell, prepare, alone)
            except ConfigError as err:
                if alone:
                    raise
                results[i] = err
                continue
            if isinstance(ready, Started):
                started.append(ready)
            else:
                results[i] = ready
        groups: dict[int | None, list[Started]] = {}
        for ready in started:  # one population per starting point, in the cells' order
            groups.setdefault(ready.continued_from, []).append(ready)
        for group in groups.values():
            results.update(_train(group, prepare, alone))
    finally:
        for out_dir in held:
            release_dir(out_dir)
    return [results[i] for i in range(len(cells))]


def _start(i: int, cell: Cell, prepare: Prepare, alone: bool) -> Started | dict[str, Any]:
    """Prepare cell ``i``'s held dir (``start_job``): its recorded summary when it is finished and resumed,
    else the cell ready to train. ConfigError when it is refused."""
    cfg = cell.cfg
    config = OmegaConf.to_container(cfg, resolve=True)  # plain dict, for logs and summaries
    checkpoints = Checkpoints(cell.out_dir, config, cfg.checkpoint.replay)

    def read_checkpoint() -> tuple[int | None, str | None]:
        try:
            return checkpoints.read(cfg.num_seeds), None
        except CheckpointError as err:
            return None, str(err)

    recorded = start_job(cell.out_dir, config, cfg.resume, read_checkpoint)
    if recorded is not None:
        return recorded
    if not alone:
        if cfg.pbt.interval > 0:
            raise ConfigError(
                "pbt.interval",
                f"{cfg.pbt.interval}: a PBT population is one job, never packed with other cells",
                "run it with hydra/launcher=basic or rlexp_joblib, or set pbt.interval=0",
            )
        prepare(cfg)  # validates (ConfigError)
    continued_from = checkpoints.step if checkpoints.files is not None else None
    return Started(i, cell, config, checkpoints, continued_from)


def _context(group: list[Started], prepare: Prepare) -> tuple[Algorithm, RunContext]:
    """The algorithm and the population's context: the cells' members side by side, in order (one cell:
    its own job's population, PBT's initial draws included); continued from the cells' checkpoints."""
    if len(group) == 1:
        cfg = group[0].cell.cfg
        train, device = prepare(cfg)
        ctx = RunContext.create(OmegaConf.to_object(cfg), device)  # dataclasses: fast attribute access
    else:
        population = group[0].cell.cfg.copy()
        population.num_seeds = sum(s.cell.cfg.num_seeds for s in group)  # threads and resources for all
        train, device = prepare(population)
        member_cfgs, seeds = [], []
        for s in group:
            typed = OmegaConf.to_object(s.cell.cfg)
            member_cfgs += [typed] * s.cell.cfg.num_seeds
            seeds += [s.cell.cfg.seed + k for k in range(s.cell.cfg.num_seeds)]
        shared = dataclasses.replace(member_cfgs[0], num_seeds=len(seeds))
        ctx = RunContext.create(shared, device, member_cfgs, seeds)
    ctx.checkpoints = PopulationCheckpoints([s.checkpoints for s in group])
    if ctx.checkpoints.saved is not None:
        ctx.checkpoints.restore({"recorder": ctx.recorder})  # before it opens the members' logs
    return train, ctx


def _train(group: list[Started], prepare: Prepare, alone: bool) -> dict[int, dict[str, Any] | BaseException]:
    """Train the cells ``group`` (one starting point) as one population; each cell's job summary."""
    start = time.perf_counter()
    interrupts = DeferredInterrupts()  # a Ctrl-C while training waits for every cell's summaries
    try:
        train, ctx = _context(group, prepare)
    except BaseException as exc:
        interrupts.stopping = True
        if alone and isinstance(exc, ConfigError):
            interrupts.restore(raise_deferred=False)
            raise  # bad input: refused before any work, nothing recorded
        wall = time.perf_counter() - start
        crashed = {}
        for s in group:
            crashed[s.index] = record_crash(s.cell.out_dir, s.config, s.cell.name, s.cell.choices, exc, wall)
            if not alone:
                print(cell_line(s.cell, crashed[s.index]), flush=True)
        interrupts.restore(raise_deferred=False)
        if alone or not isinstance(exc, Exception):
            raise  # a single job raises on; a KeyboardInterrupt stops the launcher
        return crashed
    recorder = ctx.recorder
    jobs = [Job(s.cell.out_dir, s.cell.name, s.cell.tags(), s.config, s.cell.cfg.num_seeds) for s in group]
    error: str | None = None
    results: dict[int, dict[str, Any] | BaseException] = {}
    try:
        for s in group:
            s.cell.out_dir.mkdir(parents=True, exist_ok=True)
        recorder.open(jobs, group[0].continued_from)
        recorder.schedule.stop_requested = interrupts.stop_requested
        interrupts.training = True
        train(ctx)
    except BaseException as exc:
        interrupts.stopping = True
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        for s in group:
            write_traceback(s.cell.out_dir, traceback.format_exc())
        if alone or not isinstance(exc, Exception):
            raise  # the summaries below are written on the way out
    finally:
        interrupts.stopping = True
        summaries: list[tuple[Started, dict[str, Any]]] = []
        try:
            members = recorder.close(error)  # the members' summaries first: nothing can lose them
            wall = time.perf_counter() - recorder.start_time
            threads = torch.get_num_threads()
            first = 0
            for s, job in zip(group, jobs):
                own = members[first : first + job.members]
                first += job.members
                summary = trained_summary(
                    s.config, s.cell.name, s.cell.choices, own, wall, error, recorder.first_step_at, threads
                ) | {"resumed": recorder.resumed}
                if not alone:
                    summary["packed_with"] = len(group)  # cells trained in this population
                summaries.append((s, summary))
        finally:
            try:
                recorder.close_wandb()
                ctx.env.close()
                # the jobs' summaries last: a job dir with its summary.json is finished, its W&B runs closed
                # (a kill before this leaves the job unfinished, and resume runs it again)
                for s, summary in summaries:
                    write_json(s.cell.out_dir / "summary.json", summary)
                    results[s.index] = summary
                    if not alone:
                        print(cell_line(s.cell, summary), flush=True)
            finally:
                interrupts.restore(raise_deferred=error is None)
        if alone:
            print_summary(
                recorder.progress.console, f"{group[0].cell.name}: {ctx.cfg.algo.name} on {ctx.cfg.env.id}", members
            )
    return results
