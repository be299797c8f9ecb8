"""Loggers: one W&B run per member, a metrics.jsonl per member, and the console.

W&B runs offline unless told otherwise: ``logger.mode`` if set, else $WANDB_MODE, else offline.
A run that cannot reach the W&B server falls back to offline instead of blocking the job. The
members' runs open in a background thread while training starts (W&B's start-up, ~1 s for the
first run of a process, is not on the path to the first env step); what a member logs before its
run is open waits in order and goes to W&B once it is.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlexp.config import LoggerConfig
from rlexp.jobs import set_runs_aside, write_json

WANDB_MODES = ("offline", "online", "disabled")


def resolve_wandb_mode(cfg: LoggerConfig) -> str:
    """logger.mode if set, else $WANDB_MODE (dryrun counts as offline), else offline."""
    if cfg.mode is not None:
        return cfg.mode
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    if env == "dryrun":
        return "offline"
    return env if env in WANDB_MODES else "offline"


NONFINITE = ("nan", "inf", "-inf")  # how metrics.jsonl writes non-finite floats


def _json_value(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # NaN / inf as strings: metrics.jsonl stays strict JSON
    return v


class MemberLog:
    """metrics.jsonl (always) and a W&B run (unless disabled) for one population member.

    ``wandb_run`` is a run, a Future of one (opening in the background) or None (disabled).
    """

    def __init__(self, run_dir: Path, wandb_run: Any, append: bool = False) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.dir = run_dir
        # a rerun into this dir starts afresh; a job continued from its checkpoint appends
        self.file = open(run_dir / "metrics.jsonl", "a" if append else "w", buffering=1)
        self._run: Any = None
        self._opening: Future | None = None
        if isinstance(wandb_run, Future):
            self._opening = wandb_run
        else:
            self._run = wandb_run
        self._waiting: list[tuple[dict[str, Any], int]] = []  # logged before the run was open

    @property
    def logs_to_wandb(self) -> bool:
        return self._run is not None or self._opening is not None

    def _wandb(self, wait: bool) -> Any:
        """The open run (flushing what waited), or None while it is still opening and not ``wait``."""
        if self._opening is not None and (wait or self._opening.done()):
            future, self._opening = self._opening, None
            self._run = future.result()  # an init that failed raises here, in the job's thread
            for payload, step in self._waiting:
                self._run.log(payload, step=step)
            self._waiting = []
        return self._run

    def log_wandb(self, payload: dict[str, Any], step: int) -> None:
        """Send a record to the member's W&B run (queued while the run opens); nothing when disabled."""
        run = self._wandb(wait=False)
        if run is not None:
            run.log(payload, step=step)
        elif self._opening is not None:
            self._waiting.append((payload, step))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _json_value(v) for k, v in metrics.items()}}
        self.file.write(json.dumps(record) + "\n")
        self.log_wandb(metrics, step)

    def finish(self, summary: dict[str, Any], failed: bool = False) -> None:
        """Write summary.json, put the summary into the W&B run and end it (exit code 1 if failed)."""
        write_json(self.dir / "summary.json", summary)  # atomic: a kill leaves all of it or none
        if not self.file.closed:
            self.file.close()
        if self.logs_to_wandb:
            try:
                run = self._wandb(wait=True)
            except Exception as err:  # the run never opened: the local files hold everything
                print(f"W&B run of {self.dir.name} did not open ({type(err).__name__}: {err})", file=sys.stderr)
                return
            self._run = None
            try:
                run.summary.update({k: v for k, v in summary.items() if v is not None})
            finally:
                run.finish(exit_code=1 if failed else 0)


def open_member_logs(
    cfg: LoggerConfig,
    out_dir: Path,
    seeds: list[int],
    group: str,
    tags: list[str],
    config: dict[str, Any],
    continued_from: int | None = None,
    finished: list[bool] | None = None,
) -> list[MemberLog]:
    """One MemberLog per seed under ``out_dir/seed_<k>``; W&B files in ``seed_<k>/wandb``. The W&B
    runs open one after another in a background thread (each log holds a Future of its run).

    ``continued_from``: a job continued from its checkpoint at that env step: each metrics.jsonl goes
    on, and each member opens a new W&B run of the same name and group (config ``continued_from``)
    that first gets the records metrics.jsonl kept, while the interrupted attempt's run is renamed
    out of sync's way (``set_runs_aside``); a member ``finished`` already keeps its run and opens none."""
    mode = resolve_wandb_mode(cfg)
    logs: list[MemberLog] = []
    opener = None if mode == "disabled" else ThreadPoolExecutor(max_workers=1, thread_name_prefix="wandb-init")
    if continued_from is not None:
        config = {**config, "continued_from": continued_from}
    for member, seed in enumerate(seeds):
        run_dir = out_dir / f"seed_{member}"
        run_dir.mkdir(parents=True, exist_ok=True)
        run = None
        if opener is not None and not (finished and finished[member]):
            if continued_from is not None:
                set_runs_aside(out_dir, run_dir.name)
            run = opener.submit(_init_wandb, cfg, mode, run_dir, seed, member, group, tags, config)
        logs.append(MemberLog(run_dir, run, append=continued_from is not None))
        if run is not None and continued_from is not None:
            for line in (run_dir / "metrics.jsonl").read_text().splitlines():  # the records up to the checkpoint
                record = json.loads(line)
                step = record.pop("step")
                logs[-1].log_wandb({k: float(v) if v in NONFINITE else v for k, v in record.items()}, step)
    if opener is not None:
        opener.shutdown(wait=False)  # the thread ends once every run is open
    return logs


def _fit(text: str, limit: int) -> str:
    """``text`` if it fits W&B's length limit, else a prefix plus a hash of the whole (stays unique)."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 9]}~{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def _init_wandb(
    cfg: LoggerConfig,
    mode: str,
    run_dir: Path,
    seed: int,
    member: int,
    group: str,
    tags: list[str],
    config: dict[str, Any],
) -> Any:
    import wandb  # imported only when a run logs to W&B

    kwargs = dict(
        project=cfg.project,
        entity=cfg.entity,
        group=_fit(group, 128),
        name=_fit(f"{group}/seed={seed}", 128),
        tags=[_fit(t, 64) for t in tags],
        config={**config, "seed": seed, "member": member},
        dir=str(run_dir),
        reinit="create_new",
        settings=wandb.Settings(init_timeout=cfg.init_timeout, console="off", silent=True),
    )
    try:
        return wandb.init(mode=mode, **kwargs)
    except Exception as err:  # no network, no credentials: keep the run, offline
        if mode != "online":
            raise
        print(f"W&B online init failed ({type(err).__name__}: {err}); logging offline instead", file=sys.stderr)
        return wandb.init(mode="offline", **kwargs)


class ConsoleProgress:
    """A rich progress bar on a terminal; plain lines every ~10% of the run otherwise."""

    def __init__(self, total: int, mode: str, label: str) -> None:
        self.console = Console()
        interactive = self.console.is_terminal
        if not interactive:  # logs and pipes: no terminal width to respect, keep tables unwrapped
            self.console = Console(width=200)
        self.mode = ("rich" if interactive else "plain") if mode == "auto" else mode
        self.total = total
        self.label = label
        self.start = time.perf_counter()
        self.next_plain = 0
        self.progress: Progress | None = None
        if self.mode == "rich":
            self.progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self.task = self.progress.add_task(label, total=total, info="")
            self.progress.start()

    def update(self, step: int, info: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step, info=info)
        elif self.mode == "plain" and step >= self.next_plain:
            elapsed = time.perf_counter() - self.start
            print(f"[{self.label}] step {step}/{self.total} ({elapsed:.0f}s) {info}", flush=True)
            self.next_plain = step + max(1, self.total // 10)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def print_summary(console: Console, title: str, members: list[dict[str, Any]]) -> None:
    """One table, a row per member: seed, status, eval return (the latest evaluation's mean, when
    any member was evaluated), train return (mean of the last 10 training episodes), episodes, steps,
    wall time; for diverged members the step, cause, place and the instrument that moved first, then
    a line each with the detail."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    diverged = any(m.get("divergence") for m in members)
    evaluated = any(m.get("eval_return") is not None for m in members)
    columns = ["seed", "status", *(["eval return"] if evaluated else []), "train return", "episodes", "steps", "wall s"]
    columns += ["diverged at", "cause", "where", "moved first"] if diverged else []
    left = ("status", "cause", "where", "moved first")
    for column in columns:
        table.add_column(column, justify="left" if column in left else "right")
    colors = {"ok": "green", "diverged": "yellow", "crashed": "red"}
    for m in members:
        returns = [m.get("eval_return")] if evaluated else []
        div = m.get("divergence") or {}
        row = [
            str(m["seed"]),
            f"[{colors.get(m['status'], 'white')}]{m['status']}[/]",
            *("-" if r is None else f"{r:.1f}" for r in [*returns, m.get("final_return")]),
            str(m.get("episodes", "-")),
            str(m.get("steps", "-")),
            f"{m.get('wall_s', 0.0):.1f}",
        ]
        if diverged:
            moved = div.get("first_moved") or {}
            row += [
                "-" if m.get("diverged_at_step") is None else str(m["diverged_at_step"]),
                div.get("cause") or "",
                div.get("where") or "",
                moved.get("instrument", ""),
            ]
        table.add_row(*row)
    console.print(table)
    for m in members:
        div = m.get("divergence") or {}
        if div.get("detail"):
            moved = div.get("first_moved")
            first = (
                f"; moved first: {moved['instrument']} ({moved['from']:.3g} -> {moved['to']:.3g} between steps "
                f"{moved['since_step']} and {moved['step']})"
                if moved
                else ""
            )
            console.print(
                f"seed {m['seed']}: {div['cause']} at step {m['diverged_at_step']} in {div['where']}: "
                f"{div['detail']}{first}",
                highlight=False,
            )
