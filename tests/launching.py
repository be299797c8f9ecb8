"""Helpers of the tests that run rlexp's commands: the subprocess (its environment, W&B offline under the test's
tmp dir), and readers of what a job writes (JSON lines, the offline W&B runs, file hashes)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rlexp.run.wandb_files import read_records as read_wandb_records
from rlexp.run.wandb_files import run_dirs

__all__ = ["read_wandb_records"]


ROOT = Path(__file__).resolve().parents[1]


CONF = ROOT / "conf"


HINT = "Set the environment variable HYDRA_FULL_ERROR"


TIMEOUT = 600


def cli_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess: W&B offline and silent, its dirs under tmp, no forced TTY."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "HYDRA_FULL_ERROR", "WANDB_MODE")
    }
    wandb_home = tmp / "wandb_home"
    env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_CONFIG_DIR=str(wandb_home / "config"),
        WANDB_CACHE_DIR=str(wandb_home / "cache"),
        WANDB_DATA_DIR=str(wandb_home / "data"),
        WANDB_ARTIFACT_DIR=str(wandb_home / "artifacts"),
        COLUMNS="200",
        PYTHONFAULTHANDLER="1",  # a fatal signal (a hung run aborted) prints every thread's stack
    )
    env.update(extra)
    return env


def run_cli(args: Sequence[str], tmp: Path, **env: str) -> subprocess.CompletedProcess:
    tmp.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "rlexp.train", *args],
        cwd=ROOT,
        env=cli_env(tmp, **env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


class Launch:
    """A CLI subprocess started in the background (output to files); result() waits for it."""

    def __init__(self, args: Sequence[str], tmp: Path, **env: str) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.args = [sys.executable, "-m", "rlexp.train", *args]
        self.stdout, self.stderr = tmp / "stdout.txt", tmp / "stderr.txt"
        with open(self.stdout, "w") as out, open(self.stderr, "w") as err:
            self.proc = subprocess.Popen(
                self.args, cwd=ROOT, env=cli_env(tmp, **env), stdout=out, stderr=err, stdin=subprocess.DEVNULL
            )

    def result(self) -> subprocess.CompletedProcess:
        """Its exit code and output; a process still running after TIMEOUT is aborted (SIGABRT: the
        fault handler writes every thread's stack to its stderr) and the test fails showing them."""
        try:
            code = self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            code = self.proc.wait(timeout=60)
            proc = subprocess.CompletedProcess(self.args, code, self.stdout.read_text(), self.stderr.read_text())
            pytest.fail(f"still running after {TIMEOUT} s, aborted\n{describe(proc)}")
        return subprocess.CompletedProcess(self.args, code, self.stdout.read_text(), self.stderr.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def describe(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def message_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """Non-blank lines of stdout and stderr, without Hydra's HYDRA_FULL_ERROR hint."""
    return [ln for ln in (proc.stdout + "\n" + proc.stderr).splitlines() if ln.strip() and HINT not in ln]


def wandb_items(items) -> dict[str, Any]:
    return {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items}


def wandb_run_dir(member_dir: Path) -> Path:
    runs = run_dirs(member_dir)
    assert len(runs) == 1, f"expected one offline W&B run under {member_dir}, found {runs}"
    return runs[0]


def read_wandb_run(member_dir: Path) -> dict[str, Any]:
    """The run record (config, group, tags), history rows, merged summary and exit code of a member's run."""
    files = sorted(wandb_run_dir(member_dir).glob("run-*.wandb"))
    assert len(files) == 1, files
    run, history, histograms, summary, exit_code, metrics = None, [], [], {}, None, {}
    for record in read_wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "metric":  # wandb.define_metric
            metric = record.metric
            kinds = {f.name for f, v in metric.summary.ListFields() if v} if metric.HasField("summary") else set()
            metrics[metric.name or metric.glob_name] = (metric.step_metric, kinds)
        elif kind == "history":
            row = wandb_items(record.history.item)
            logged = [key for key in row if not key.startswith("_") and key != "env_step"]
            # rows of W&B histograms only (hist/...) are W&B's alone: metrics.jsonl has no such rows
            (histograms if logged and all(key.startswith("hist/") for key in logged) else history).append(row)
        elif kind == "summary":
            summary.update(wandb_items(record.summary.update))
        elif kind == "exit":
            exit_code = record.exit.exit_code
    assert run is not None, f"no run record in {files[0]}"
    return {
        "config": wandb_items(run.config.update),
        "group": run.run_group,
        "name": run.display_name,
        "job_type": run.job_type,
        "metrics": metrics,
        "tags": list(run.tags),
        "project": run.project,
        "history": history,
        "histograms": histograms,
        "summary": summary,
        "exit_code": exit_code,
    }


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under root, by relative path."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def job_dirs(sweep: Path) -> list[Path]:
    """A multirun's job dirs (0, 1, ...), in their order."""
    return sorted((p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
