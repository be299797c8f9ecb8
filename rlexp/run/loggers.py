"""Loggers: one W&B run per member, a metrics.jsonl per member, and the console.

W&B runs offline unless told otherwise: ``logger.mode`` if set, else $WANDB_MODE, else offline.
The members' runs open one after another in a background thread while training starts (W&B's
start-up, ~1 s for the first run of a process, is not on the path to the first env step); what a
member logs before its run is open waits in order and goes to W&B once it is.

Online, the network never holds a job: before the first run opens, one probe asks the W&B server
for an answer within ``logger.init_timeout`` seconds; without one (or when a run's online start
fails anyway) the whole job logs offline from then on, says so in one line with the ``wandb sync``
command, and leaves no partial online run dir. A job that stops (a crash, Ctrl-C) cancels the runs
not yet opening and waits only for the one that is.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import shutil
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlexp.config.schema import LoggerConfig
from rlexp.run.jobs import space_checked, write_json

WANDB_MODES = ("offline", "online", "disabled")
STEP_METRIC = "env_step"  # every W&B record's env step per member: the x-axis of every chart


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
        self.file = open(run_dir / "metrics.jsonl", "ab" if append else "wb", buffering=0)
        self.size = self.file.seek(0, os.SEEK_END)  # bytes of whole lines: what a failed write cuts back to
        self._run: Any = None
        self._opening: Future | None = None
        if isinstance(wandb_run, Future):
            self._opening = wandb_run
        else:
            self._run = wandb_run
        self._waiting: list[tuple[dict[str, Any], int]] = []  # logged before the run was open
        self._config_waiting: dict[str, Any] = {}  # config updates made before the run was open

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
            if self._config_waiting:
                self._run.config.update(self._config_waiting, allow_val_change=True)
                self._config_waiting = {}
        return self._run

    def log_wandb(self, payload: dict[str, Any], step: int) -> None:
        """Send a record to the member's W&B run (queued while the run opens), with ``env_step``, every
        chart's x-axis (``define_metrics``); nothing when disabled."""
        payload = {**payload, STEP_METRIC: step}
        run = self._wandb(wait=False)
        if run is not None:
            run.log(payload, step=step)
        elif self._opening is not None:
            self._waiting.append((payload, step))

    def update_wandb_config(self, values: dict[str, Any]) -> None:
        """Change values of the member's W&B config (population-based training's hyperparameters; queued
        while the run opens); nothing when disabled."""
        run = self._wandb(wait=False)
        if run is not None:
            run.config.update(values, allow_val_change=True)
        elif self._opening is not None:
            self._config_waiting.update(values)

    def resend(self) -> None:
        """Send what metrics.jsonl holds to the W&B run (a job continued from its checkpoint: the records
        up to it, which the interrupted attempt's run had)."""
        for line in (self.dir / "metrics.jsonl").read_text().splitlines():
            record = json.loads(line)
            step = record.pop("step")
            self.log_wandb({k: float(v) if v in NONFINITE else v for k, v in record.items()}, step)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append a line to metrics.jsonl and send the record to W&B. A write that fails (a full disk:
        DiskFull) leaves the file as it was before, every line whole."""
        record = {"step": step, **{k: _json_value(v) for k, v in metrics.items()}}
        line = (json.dumps(record) + "\n").encode()
        path = self.dir / "metrics.jsonl"
        try:
            with space_checked(path):
                written = 0
                while written < len(line):  # an unbuffered write may take part of it
                    written += self.file.write(line[written:])
        except BaseException:
            self.file.truncate(self.size)
            self.file.seek(self.size)
            raise
        self.size += len(line)
        self.log_wandb(metrics, step)

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Write summary.json (atomic: a kill leaves all of it or none) and close metrics.jsonl."""
        write_json(self.dir / "summary.json", summary)
        if not self.file.closed:
            self.file.close()

    def close_wandb(self, summary: dict[str, Any], failed: bool = False) -> None:
        """Put the summary into the member's W&B run and end it (exit code 1 if failed); nothing when
        it has none, or when its opening was cancelled (the job stopped first)."""
        if self._opening is not None and self._opening.cancelled():
            self._opening = None
        if not self.logs_to_wandb:
            return
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

    def finish(self, summary: dict[str, Any], failed: bool = False) -> None:
        """``write_summary``, then ``close_wandb``."""
        self.write_summary(summary)
        self.close_wandb(summary, failed)


def probe_server(url: str, timeout: float) -> str | None:
    """None when the server at ``url`` answers HTTP (any status) within about ``timeout`` seconds, else
    why not (connection refused, no answer, ...)."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return None  # it answered
    except urllib.error.URLError as err:
        reason = err.reason
        if isinstance(reason, TimeoutError):
            return f"no answer within {timeout:g} s"
        return (reason.strerror or str(reason)) if isinstance(reason, OSError) else str(reason)
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except (OSError, ValueError) as err:
        return getattr(err, "strerror", None) or str(err) or type(err).__name__
    return None


class WandbRuns:
    """The W&B runs of a job's members, opened one after another in a background thread (``open``
    gives a Future of each); online, one probe of the server first, and offline for the whole job
    from the first failure on. ``stop`` ends the thread."""

    def __init__(self, cfg: LoggerConfig, out_dir: Path, group: str, tags: list[str], config: dict[str, Any]) -> None:
        self.cfg, self.out_dir, self.group, self.tags, self.config = cfg, out_dir, group, tags, config
        self.mode = resolve_wandb_mode(cfg)
        self.fell_back: str | None = None  # the line saying why the job logs offline although online was asked
        self._probed = self.mode != "online"
        self._opener = None
        if self.mode != "disabled":
            self._opener = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlexp-wandb-open")

    def open(self, run_dir: Path, seed: int, member: int) -> Future | None:
        """Queue the member's run (None when W&B is disabled)."""
        if self._opener is None:
            return None
        return self._opener.submit(self._init, run_dir, seed, member)

    def opened_all(self) -> None:
        """No more runs: the thread ends once the queued ones are open."""
        if self._opener is not None:
            self._opener.shutdown(wait=False)

    def stop(self, cancel: bool) -> None:
        """End the opening thread: with ``cancel`` the runs not yet opening are never opened; waits for
        the one that is (bounded by ``logger.init_timeout`` online)."""
        if self._opener is not None:
            self._opener.shutdown(wait=True, cancel_futures=cancel)

    def _fall_back(self, server: str, reason: str) -> None:
        """Offline for the rest of the job, said once."""
        if self.fell_back is not None:
            return
        self.mode = "offline"
        self.fell_back = (
            f"W&B: {server} unreachable ({reason}); logging offline — sync later with: "
            f"wandb sync {shlex.quote(str(self.out_dir))}/seed_*/wandb/offline-run-*"
        )
        print(self.fell_back, file=sys.stderr, flush=True)
        try:  # W&B's own analytics would still post to the server, holding the process's exit ~10 s
            from wandb.analytics.opentelemetry import opentelemetry_proxy

            opentelemetry_proxy.disable()
        except (ImportError, AttributeError):
            pass

    def _init(self, run_dir: Path, seed: int, member: int) -> Any:
        import wandb  # imported only when a run logs to W&B

        if not self._probed:
            self._probed = True
            server = wandb.setup().settings.base_url
            reason = probe_server(server, self.cfg.init_timeout)
            if reason is not None:
                self._fall_back(server, reason)
        choices = dict(tag.split(":", 1) for tag in self.tags)
        sweep = self.config["logger"].get("sweep")  # the group prefix: grouping never mixes two sweeps' runs
        kwargs = dict(
            project=self.cfg.project,
            entity=self.cfg.entity,
            group=_fit(f"{sweep}/{self.group}" if sweep else self.group, 128),
            name=_fit(f"{self.group}/seed={seed}", 128),
            job_type=self.config["algo"]["name"],
            tags=[_fit(t, 64) for t in self.tags] + ([f"sweep:{sweep}"] if sweep else []),
            config={**self.config, "seed": seed, "member": member, "cell": self.group, "choices": choices},
            dir=str(run_dir),
            reinit="create_new",
            # the installed packages (requirements.txt) once per job, in member 0's run: every member of a
            # job runs in one environment, and listing them costs ~0.1 s of CPU per run
            settings=wandb.Settings(
                init_timeout=self.cfg.init_timeout, console="off", silent=True, x_save_requirements=member == 0
            ),
        )
        if self.mode == "online":
            files = run_dir / "wandb"
            before = set(files.iterdir()) if files.is_dir() else set()
            try:
                return define_metrics(wandb.init(mode="online", **kwargs))
            except Exception as err:  # no network, no credentials: this run and every later one offline
                self._fall_back(wandb.setup().settings.base_url, f"{type(err).__name__}: {str(err).splitlines()[0]}")
                for path in (set(files.iterdir()) - before) if files.is_dir() else ():
                    if path.name.startswith("run-"):  # the partial online run's dir
                        shutil.rmtree(path, ignore_errors=True)
        return define_metrics(wandb.init(mode=self.mode, **kwargs))


def define_metrics(run: Any) -> Any:
    """Every chart of ``run`` against the env step per member (``env_step``); the run's summary keeps the
    last and the best (max) evaluation return (``eval/return``). Returns ``run``."""
    run.define_metric(STEP_METRIC)
    run.define_metric("*", step_metric=STEP_METRIC)
    run.define_metric("eval/return", step_metric=STEP_METRIC, summary="last,max")
    return run


def _fit(text: str, limit: int) -> str:
    """``text`` if it fits W&B's length limit, else a prefix plus a hash of the whole (stays unique)."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 9]}~{hashlib.sha1(text.encode()).hexdigest()[:8]}"


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
    table = Table(box=box.SIMPLE_HEAD)  # its title is a line of its own: a table's title wraps mid-word
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
    console.print(title, soft_wrap=True, highlight=False, markup=False)
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
    for m in members:
        collapse = m.get("collapse")
        if collapse:  # multi-agent: an agent that keeps choosing one action (rlexp/diagnostics/collapse.py)
            moved = collapse.get("first_moved")
            first = f"; moved first: {moved['instrument']} (at step {moved['step']})" if moved else ""
            console.print(
                f"seed {m['seed']}: {collapse['agent']} collapsed to one action at step {collapse['step']} "
                f"({collapse['instrument']} {collapse['value']:.3g}, bound {collapse['bound']:.3g}){first}",
                highlight=False,
            )
