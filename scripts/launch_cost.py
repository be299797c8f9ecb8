"""Launch cost of a packed grid: seconds from the command to its first env step, and per cell, for the
stability grid (192 cells) and two larger grids made from it with command-line sweeps.

    python scripts/launch_cost.py [--sizes 192 1536 15360] [--repeats 3] [--dry-run] [--repo DIR]

Each run is ``python -m rlexp.train +experiment=stability_grid hydra/launcher=rlexp_packed`` into a
temporary sweep dir (one worker, W&B disabled) with ``debug.crash_at_step=1``: the first pack records
its first env step (``first_step_at`` in its cells' summaries) and stops; the run is then killed. 1,536
cells sweep ``optimizer.lr`` over 8 values as well, 15,360 also ``seed`` over 10 values. ``--dry-run``
times ``hydra.launcher.dry_run=true`` instead (compose, check and plan; no pack starts). ``--repo``:
the checkout to run (default: this one). Prints the median of ``--repeats`` runs per size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LRS = "optimizer.lr=0.0001,0.0002,0.0005,0.001,0.002,0.005,0.01,0.02"
SEEDS = "seed=0,8,16,24,32,40,48,56,64,72"
SWEEPS = {192: [], 1536: [LRS], 15360: [LRS, SEEDS]}  # cells -> the sweeps added to the stability grid's


def command(cells: int, sweep_dir: Path, dry_run: bool) -> list[str]:
    """The command that launches the grid of ``cells`` cells into ``sweep_dir``."""
    args = ["+experiment=stability_grid", "hydra/launcher=rlexp_packed", "hydra.launcher.n_jobs=1"]
    args += ["logger.mode=disabled", f"hydra.sweep.dir={sweep_dir}", *SWEEPS[cells]]
    args += ["hydra.launcher.dry_run=true"] if dry_run else ["debug.crash_at_step=1"]
    return [sys.executable, "-m", "rlexp.train", *args]


def first_step(sweep_dir: Path) -> float | None:
    """The first env step's time (epoch seconds) a job of ``sweep_dir`` recorded, or None yet."""
    for summary in sweep_dir.glob("*/summary.json"):
        try:
            stamp = json.loads(summary.read_text())["first_step_at"]
        except (OSError, ValueError, KeyError):
            continue  # being written
        if stamp:
            return datetime.fromisoformat(stamp).timestamp()
    return None


def launch_seconds(cells: int, dry_run: bool, repo: Path) -> float:
    """One run: seconds from starting the command to the first env step (``dry_run``: to its end)."""
    sweep_dir = Path(tempfile.mkdtemp(prefix="launch_cost-")) / "sweep"
    env = {**os.environ, "WANDB_MODE": "disabled"}
    start = time.time()
    proc = subprocess.Popen(
        command(cells, sweep_dir, dry_run), cwd=repo, env=env, stdout=subprocess.DEVNULL, start_new_session=True
    )
    try:
        if dry_run:
            if proc.wait() != 0:
                raise SystemExit(f"the dry run of {cells} cells failed (exit {proc.returncode})")
            return time.time() - start
        while (stamp := first_step(sweep_dir)) is None:
            if proc.poll() is not None:
                raise SystemExit(f"the grid of {cells} cells ended (exit {proc.returncode}) before an env step")
            time.sleep(0.2)
        return stamp - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the run's own process group: the launcher and its worker
            proc.wait()
        shutil.rmtree(sweep_dir.parent, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SWEEPS), choices=list(SWEEPS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--repo", type=Path, default=ROOT)
    args = parser.parse_args()
    what = "dry run (compose, check, plan)" if args.dry_run else "to the first env step"
    print(f"| cells | seconds, {what} | ms per cell | runs |")
    print("|---|---|---|---|")
    for cells in args.sizes:
        runs = [launch_seconds(cells, args.dry_run, args.repo) for _ in range(args.repeats)]
        median = statistics.median(runs)
        print(f"| {cells:,} | {median:.1f} | {1000 * median / cells:.1f} | {args.repeats} |", flush=True)


if __name__ == "__main__":
    main()
