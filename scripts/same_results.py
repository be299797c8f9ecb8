"""Check that a change of code leaves results unchanged: run a fixed set of jobs with one checkout, then
with another, and compare their files bit for bit.

    python scripts/same_results.py run OUT [--repo DIR] [--only NAME ...]   # every case into OUT/<name>
    python scripts/same_results.py compare A B                             # exit 1 if any file differs

``run`` trains each case with ``python -m rlexp.train`` from ``--repo`` (default: this checkout; another
checkout, e.g. a ``git worktree`` of the previous main, is put first on ``PYTHONPATH``). ``compare`` reads
every ``summary.json`` and ``seed_<k>/metrics.jsonl`` under A and B and compares them less the wall-clock
figures (``wall_s``, ``perf/…``, times), the paths that name the run dir, and config keys one side has
and the other lacks (a key added since, at its default; the comparison names them). Cases use ``threads=1`` so two
runs may share the machine; budgets are cut where a default would take minutes, and said so below.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# name -> overrides (a leading "-m" makes a multirun into OUT/<name>)
CASES: dict[str, list[str]] = {
    "dqn": [],
    "nan_hunt": ["+experiment=nan_hunt"],
    "seed_critic": ["+experiment=seed_critic", "total_steps=20000"],  # its preset: 100k
    "ppo": ["algo=ppo"],
    "td3_pendulum": ["algo=td3", "env=pendulum", "total_steps=6000", "algo.learning_starts=1000"],
    "sac_pendulum": ["algo=sac", "env=pendulum", "total_steps=4000", "algo.learning_starts=1000"],
    "mappo_vmas": ["algo=mappo", "env=vmas_navigation", "total_steps=12000"],
    "maddpg_spread": ["algo=maddpg", "env=simple_spread", "total_steps=6000"],
    "minatar_dqn": ["+experiment=minatar_dqn", "total_steps=3000", "algo.learning_starts=1000", "num_seeds=2"],
    "lstm_ppo": ["network=lstm", "algo=ppo", "total_steps=10000"],
    "muzero_lite": ["algo=muzero_lite", "total_steps=4000"],
    "packed_grid": [
        "-m",
        "hydra/launcher=rlexp_packed",
        "activation=relu,tanh",
        "init=xavier,he",
        "normalization=none,layer",
        "clipping=none,global_norm",
        "total_steps=3000",
        "num_seeds=2",
        "algo.learning_starts=500",
    ],
    "pbt": ["+experiment=pbt", "total_steps=6000", "num_seeds=8"],  # its preset: 20k, 16 members
}

# fields that hold wall-clock figures or the run dir's path (a multirun's ``logger.sweep`` is named after
# its dir's): the only ones that may differ
VOLATILE = {
    "sweep",
    "wall_s",
    "time",
    "timestamp",
    "started",
    "finished",
    "dir",
    "run_dir",
    "path",
    "hostname",
    "pid",
    "first_step_at",
}


def run(out: Path, repo: Path, only: list[str]) -> None:
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true")
    if repo.resolve() != Path(__file__).resolve().parents[1]:
        env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    for name, overrides in CASES.items():
        if only and name not in only:
            continue
        multirun = overrides[:1] == ["-m"]
        where = f"hydra.sweep.dir={out / name}" if multirun else f"hydra.run.dir={out / name}"
        command = [sys.executable, "-m", "rlexp.train", *overrides, "threads=1", where]
        print(" ".join(command[1:]), flush=True)
        done = subprocess.run(command, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode:
            sys.exit(f"{name}: exit code {done.returncode}\n{done.stderr[-2000:]}")


def scrub(value: Any) -> Any:
    """``value`` less its volatile fields, at any depth."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if k not in VOLATILE and not k.startswith("perf/")}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def drop_new_config_keys(left: Any, right: Any) -> tuple[Any, Any, set[str]]:
    """Two summaries less the config keys that one side has and the other lacks (a key added since:
    its default changes nothing that ran); returns them and those keys."""
    if not (isinstance(left, dict) and isinstance(right, dict) and "config" in left and "config" in right):
        return left, right, set()
    new = set(left["config"]) ^ set(right["config"])

    def strip(summary: dict[str, Any]) -> dict[str, Any]:
        return {**summary, "config": {k: v for k, v in summary["config"].items() if k not in new}}

    return strip(left), strip(right), new


def files(root: Path) -> dict[str, Any]:
    """Relative path -> scrubbed content of every summary and metrics file under ``root``."""
    found: dict[str, Any] = {}
    for path in sorted(root.rglob("summary.json")):
        found[str(path.relative_to(root))] = scrub(json.loads(path.read_text()))
    for path in sorted(root.rglob("metrics.jsonl")):
        found[str(path.relative_to(root))] = [scrub(json.loads(line)) for line in path.read_text().splitlines()]
    return found


def compare(a: Path, b: Path) -> int:
    left, right = files(a), files(b)
    differ, added = 0, set()
    for path in sorted(set(left) | set(right)):
        if path not in left or path not in right:
            print(f"{path}: only in {a if path in left else b}")
            differ += 1
            continue
        one, other, new = drop_new_config_keys(left[path], right[path])
        added |= new
        if one != other:
            print(f"{path}: differs")
            differ += 1
    note = f" (config keys on one side only, left out: {', '.join(sorted(added))})" if added else ""
    print(f"{len(set(left) | set(right))} files, {differ} differ{note}")
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="run every case into OUT/<name>")
    p_run.add_argument("out", type=Path)
    p_run.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    p_run.add_argument("--only", nargs="*", default=[], choices=sorted(CASES))
    p_cmp = sub.add_parser("compare", help="compare two OUT dirs")
    p_cmp.add_argument("a", type=Path)
    p_cmp.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.out.resolve(), args.repo, args.only)
    else:
        sys.exit(compare(args.a, args.b))


if __name__ == "__main__":
    main()
