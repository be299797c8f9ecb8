"""Outputs: each member's files and W&B run, the console progress and the members' summaries.

A population's members belong to one job or, packed, to several (``Job``: one job dir, its cell, its
member count); member j of a job writes ``<job dir>/seed_<j>/`` (``metrics.jsonl``, ``summary.json``,
``normalization.json``) and one W&B run grouped by the job's cell, exactly as that job alone would. A
member's summary is written when it finishes (diverged, or at the end); its W&B run closes after every
summary is on disk (``close_wandb``), so an interruption cannot lose a summary.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlexp.config.schema import LoggerConfig
from rlexp.config.state import PerMember
from rlexp.run.jobs import set_runs_aside, write_file
from rlexp.run.loggers import ConsoleProgress, MemberLog, WandbRuns


@dataclass
class Job:
    """The outputs of one job among a population's members: its dir, its cell (the W&B group), the W&B
    tags and config, and how many consecutive members are its own."""

    out_dir: Path
    cell: str
    tags: list[str]
    config: dict[str, Any]
    members: int


class Outputs:
    """The files and W&B runs of one population's members; its state: which members finished and their
    summaries."""

    def __init__(self, logger: LoggerConfig, total_steps: int, seeds: list[int]) -> None:
        self.logger = logger
        self.total_steps = total_steps
        self.seeds = seeds
        self.members = len(seeds)
        self.local = list(range(self.members))  # [P] member k's index in its job (its seed_<j> dir)
        self.logs: list[MemberLog] = []
        self.runs: list[WandbRuns] = []  # each job's W&B runs, opening in the background
        self.progress: ConsoleProgress | None = None
        self.done: list[bool] = [False] * self.members
        self.summaries: list[dict[str, Any] | None] = [None] * self.members
        self._unclosed: list[tuple[int, bool]] = []  # (member, failed): summary written, W&B run still open
        self._stopped = False  # the job stopped with an error
        self.start_time = self._last_log_time = time.perf_counter()

    def open(self, jobs: list[Job], continued_from: int | None = None) -> None:
        """Start the clocks and the console progress, then open each member's logs, job by job in member
        order (``continued_from``: the checkpoint's step the jobs continue from; their logs go on, and a
        member finished before it keeps its files and W&B run as they are)."""
        self.start_time = self._last_log_time = time.perf_counter()
        label = jobs[0].cell if len(jobs) == 1 else f"pack of {len(jobs)} cells"
        self.progress = ConsoleProgress(self.total_steps, self.logger.progress, label)
        member = 0
        for job in jobs:
            config = job.config if continued_from is None else {**job.config, "continued_from": continued_from}
            runs = WandbRuns(self.logger, job.out_dir, job.cell, job.tags, config)
            self.runs.append(runs)
            for j in range(job.members):  # one by one: close() finds every log opened so far
                run_dir = job.out_dir / f"seed_{j}"
                self.local[member] = j
                seed = self.seeds[member]
                if continued_from is None:
                    self.logs.append(MemberLog(run_dir, runs.open(run_dir, seed, j)))
                elif self.done[member]:  # finished before the checkpoint: its files and run stay as they are
                    self.logs.append(MemberLog(run_dir, None, append=True))
                else:  # a new run of the member that first gets what metrics.jsonl kept; the interrupted one aside
                    if runs.mode != "disabled":
                        set_runs_aside(job.out_dir, run_dir.name)
                    self.logs.append(MemberLog(run_dir, runs.open(run_dir, seed, j), append=True))
                    self.logs[-1].resend()
                member += 1
            runs.opened_all()

    def running(self) -> list[int]:
        """The members whose logs are open and who have not finished."""
        return [k for k in range(len(self.logs)) if not self.done[k]]

    def steps_per_s(self, step: int, previous: int) -> float:
        """Env steps per member and second since the previous log step (restarts the clock)."""
        now = time.perf_counter()
        sps = (step - previous) / max(now - self._last_log_time, 1e-9)
        self._last_log_time = now
        return sps

    def write(self, k: int, step: int, metrics: dict[str, Any]) -> None:
        """Member k's record of log step ``step``: a line of its metrics.jsonl and its W&B run."""
        self.logs[k].log(step, metrics)

    def update_wandb_config(self, k: int, values: dict[str, Any]) -> None:
        """Change values of member k's W&B config (PBT's hyperparameters)."""
        self.logs[k].update_wandb_config(values)

    def histograms(self, step: int, histograms: Callable[[], dict[str, torch.Tensor]]) -> None:
        """W&B histograms of [P, ...] tensors (gradients, activations), per running member with a run."""
        logs = [(k, self.logs[k]) for k in self.running() if self.logs[k].logs_to_wandb]
        if not logs:
            return
        import wandb

        with torch.no_grad():
            values = {name: t.detach().float().cpu().numpy() for name, t in histograms().items() if t is not None}
        for k, log in logs:
            log.log_wandb({f"hist/{name}": wandb.Histogram(v[k].ravel()) for name, v in values.items()}, step)

    def progress_line(self, step: int, info: str) -> None:
        self.progress.update(step, info)

    def wall_s(self) -> float:
        """Seconds since the logs opened."""
        return time.perf_counter() - self.start_time

    def finish(self, k: int, summary: dict[str, Any], normalization: dict[str, Any], close_wandb: bool = True) -> None:
        """Member k is finished: its ``summary.json`` (and ``normalization.json`` when a normalizer is on);
        its W&B run ended too, unless not ``close_wandb`` (``close_wandb()`` ends it later)."""
        self.summaries[k] = summary
        self.done[k] = True
        if any(normalization.values()):
            write_file(self.logs[k].dir / "normalization.json", (json.dumps(normalization) + "\n").encode())
        failed = summary["status"] == "crashed"
        if close_wandb:
            self.logs[k].finish(summary, failed=failed)
        else:
            self.logs[k].write_summary(summary)
            self._unclosed.append((k, failed))

    def close(self, error: str | None) -> None:
        """Close the progress display; ``error``: the job stopped with it (runs still queued never open)."""
        self._stopped = error is not None
        if self.progress is not None:
            self.progress.close()

    def close_wandb(self) -> None:
        """End the W&B side after the summaries: stop the threads that open runs, then end every member's
        run still open."""
        for runs in self.runs:
            runs.stop(cancel=self._stopped)
        unclosed, self._unclosed = self._unclosed, []
        for k, failed in unclosed:
            try:
                self.logs[k].close_wandb(self.summaries[k], failed)
            except Exception as err:  # one run's trouble never leaves the others open
                print(f"W&B run of {self.logs[k].dir} did not close ({type(err).__name__}: {err})", file=sys.stderr)

    def state_dict(self) -> dict[str, Any]:
        return {"done": PerMember(self.done), "summaries": PerMember(self.summaries)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``'s values (before ``open``)."""
        self.done = list(state["done"])
        self.summaries = list(state["summaries"])
