"""``python -m rlexp.sync <sweep or run dir> [--dry-run]``: upload the W&B runs of the finished jobs.

A job is finished when its ``summary.json`` says ok or diverged and its files are intact
(``rlexp.run.jobs.inspect_job``); each of its members has one run, ``seed_<k>/wandb/offline-run-*``. Those
runs, and no others, go to ``wandb sync`` (the wandb CLI, in a subprocess of this Python, with the
environment as it is: W&B's login, ``WANDB_BASE_URL``, ...). Never synced: attempts moved aside
(``attempt_<n>/``, their runs renamed ``attempt-offline-run-*``), jobs that are unfinished, crashed or
corrupt (each named in one line). ``--dry-run`` passes ``--dry-run`` to ``wandb sync``: it lists the
runs and uploads nothing. wandb itself skips a run it has synced already (``run-<id>.wandb.synced``).

Exit code: wandb's (0 when every call succeeded), 0 when there is nothing to sync, 2 for a path that
is not a directory.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from rlexp.run.jobs import inspect_job, job_dirs
from rlexp.run.wandb_files import run_dirs

CHUNK = 200  # runs per wandb sync call: a grid's 1,536 runs stay far below the command line's limit


def finished_runs(root: Path) -> tuple[list[Path], list[str]]:
    """(the W&B run dirs of every finished job under ``root``, one line per job that is skipped and why)."""
    runs: list[Path] = []
    skipped: list[str] = []
    for job_dir in job_dirs(root):
        job, problem = inspect_job(job_dir)
        if job is None:
            why = f"corrupt ({problem})" if problem else "not finished (no summary.json, or crashed)"
            skipped.append(f"skipped: {job_dir}: {why}")
            continue
        for k in range(job["num_seeds"]):
            runs.extend(run_dirs(job_dir / f"seed_{k}"))
    return runs, skipped


def sync_commands(runs: list[Path], dry_run: bool, extra: list[str]) -> list[list[str]]:
    """The ``wandb sync`` command lines that upload ``runs`` (``CHUNK`` runs each)."""
    base = [sys.executable, "-m", "wandb", "sync", *(["--dry-run"] if dry_run else []), *extra]
    return [[*base, *map(str, runs[i : i + CHUNK])] for i in range(0, len(runs), CHUNK)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    wandb_args = argv[argv.index("--") + 1 :] if "--" in argv else []  # after --: options for wandb sync
    parser = argparse.ArgumentParser(
        prog="python -m rlexp.sync",
        description=__doc__.split("\n\n")[0].replace("``", ""),  # plain text, as every command's --help
        epilog="Options after -- go to wandb sync (e.g. -- --project other).",
    )
    parser.add_argument("dir", type=Path, help="a sweep dir (its jobs) or a job's run dir")
    parser.add_argument("--dry-run", action="store_true", help="list the runs; upload nothing")
    args = parser.parse_args(argv[: len(argv) - len(wandb_args) - ("--" in argv)])
    if not args.dir.is_dir():
        print(f"sync: {args.dir} is not a directory; pass a sweep dir or a job's run dir", file=sys.stderr)
        return 2
    runs, skipped = finished_runs(args.dir)
    for line in skipped:
        print(line, flush=True)
    if not runs:
        print(f"sync: no W&B runs of finished jobs under {args.dir}", flush=True)
        return 0
    jobs = len({run.parent.parent.parent for run in runs})
    print(f"sync: {len(runs)} W&B runs of {jobs} finished jobs", flush=True)
    code = 0
    for command in sync_commands(runs, args.dry_run, wandb_args):
        code = subprocess.run(command, check=False).returncode or code
    return code


if __name__ == "__main__":
    sys.exit(main())
