"""The job runner: one job's population trained by the algorithm it is handed.

``run_population`` builds the RunContext, calls the algorithm (``train(ctx)``) and writes the output contract
(``summary.json``, ``seed_<k>/summary.json``, ``seed_<k>/metrics.jsonl``, W&B runs). It neither
picks the algorithm nor sets process-wide state (threads, garbage collector): the entry point,
``rlexp.train``, does both.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from rlexp.config.schema import ConfigError
from rlexp.run.checkpoint import CheckpointError, Checkpoints
from rlexp.run.context import Algorithm, RunContext
from rlexp.run.jobs import (
    DeferredInterrupts,
    hold_dir,
    record_crash,
    release_dir,
    start_job,
    trained_summary,
    write_json,
)
from rlexp.run.loggers import print_summary
from rlexp.run.recorder import Job


def run_population(
    cfg: DictConfig,
    out_dir: Path,
    prepare: Callable[[DictConfig], tuple[Algorithm, torch.device]],
    cell: str = "default",
    choices: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run one job in ``out_dir`` and return its summary.

    The job holds ``out_dir`` (``hold_dir``) from before it moves or writes anything there until it
    returns: a dir another process holds, or one that cannot be written, is refused (ConfigError).
    A finished job there is skipped with ``resume`` and refused (ConfigError) without it. Otherwise
    ``prepare(cfg)`` validates the config (a ConfigError: refused, nothing recorded) and gives the
    algorithm and the device; the algorithm trains a RunContext built from ``cfg``. A job that
    raises leaves a crashed summary (and ``error.txt``) and raises on; divergence is a result.
    However it ends, the members' summaries and the job's are written before the W&B runs are
    closed, and a Ctrl-C during that clean-up waits for it (``DeferredInterrupts``).
    """
    hold_dir(out_dir)
    try:
        return _run_held(cfg, out_dir, prepare, cell, choices or {})
    finally:
        release_dir(out_dir)


def _run_held(
    cfg: DictConfig,
    out_dir: Path,
    prepare: Callable[[DictConfig], tuple[Algorithm, torch.device]],
    cell: str,
    choices: dict[str, str],
) -> dict[str, Any]:
    """``run_population`` in a dir this process holds."""
    config = OmegaConf.to_container(cfg, resolve=True)  # plain dict, for logs and summaries
    checkpoints = Checkpoints(out_dir, config, cfg.checkpoint.replay)

    def read_checkpoint() -> tuple[int | None, str | None]:
        try:
            return checkpoints.load(cfg.num_seeds), None
        except CheckpointError as err:
            return None, str(err)

    recorded = start_job(out_dir, config, cfg.resume, read_checkpoint)
    if recorded is not None:
        return recorded
    continued_from = checkpoints.step if checkpoints.saved is not None else None
    start = time.perf_counter()
    interrupts = DeferredInterrupts()  # a second Ctrl-C waits until the summaries are on disk
    try:
        train, device = prepare(cfg)
        ctx = RunContext.create(OmegaConf.to_object(cfg), device)  # dataclasses: fast attribute access
        ctx.checkpoints = checkpoints
        if continued_from is not None:
            checkpoints.restore({"recorder": ctx.recorder})  # before it opens the members' logs
    except ConfigError:
        interrupts.restore(raise_deferred=False)
        raise  # bad input: refused before any work, nothing recorded
    except BaseException as exc:
        interrupts.stopping = True
        record_crash(out_dir, config, cell, choices, exc, time.perf_counter() - start)
        interrupts.restore(raise_deferred=False)
        raise
    recorder = ctx.recorder
    out_dir.mkdir(parents=True, exist_ok=True)
    error: str | None = None
    try:
        tags = [f"{g}:{o}" for g, o in sorted(choices.items())]
        recorder.open([Job(out_dir, cell, tags, config, cfg.num_seeds)], continued_from)
        recorder.schedule.stop_requested = interrupts.stop_requested
        interrupts.training = True
        train(ctx)
    except BaseException as exc:
        interrupts.stopping = True
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        (out_dir / "error.txt").write_text(traceback.format_exc())
        raise
    finally:
        interrupts.stopping = True
        try:
            members = recorder.close(error)  # the members' summaries, then the job's, then W&B
            wall = time.perf_counter() - recorder.start_time
            job = trained_summary(
                config, cell, choices, members, wall, error, recorder.first_step_at, torch.get_num_threads()
            )
            write_json(out_dir / "summary.json", job)
        finally:
            try:
                recorder.close_wandb()
                ctx.env.close()
            finally:
                interrupts.restore(raise_deferred=error is None)
        print_summary(recorder.progress.console, f"{cell}: {ctx.cfg.algo.name} on {ctx.cfg.env.id}", members)
    return job
