"""``python -m rlexp.check <sweep or run dir>``: verify a sweep's files, one line per problem.

A sweep's jobs are those of the grid its ``multirun.yaml`` records (every combination Hydra's basic
sweeper makes; a search's: the job dirs present): a job of the grid that never started is named, as is
a job dir whose ``.hydra/overrides.yaml`` is not the grid's job of its number, or that is no job of it.
For every job dir (a sweep's children, or the run dir itself): a job that is not finished is named
(``unfinished``: no ``summary.json``; ``crashed``; ``corrupt``: what ``resume`` would move aside). For a
finished job: ``summary.json`` has every key a job summary always has, ``members`` and
``counts`` agree with ``num_seeds`` and with each other; each member's ``seed_<k>/summary.json`` is the
job's record of it; every line of ``seed_<k>/metrics.jsonl`` is a JSON object, steps increase and the
last one is the member's ``steps``; the member's W&B run (when it has a ``wandb/`` dir) is one run
that finished (its ``.wandb`` log has an exit record) with exit code 0. An attempt moved aside must
have no run named ``offline-run-*`` (the sync glob's name).

Prints ``<file>: <what is wrong>`` per problem, then a count. Exit code 0 when every job is finished
and intact, 1 when anything is not, 2 for a path that is not a directory or holds no job.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rlexp.config.cells import MULTIRUN_YAML
from rlexp.run.jobs import ATTEMPT, inspect_job, job_dirs
from rlexp.run.sweep import expected_jobs, only_in, ran_overrides, unknown_dirs
from rlexp.run.wandb_files import OFFLINE_RUNS, exit_code, run_dirs

# keys a job's summary.json always holds (docs/outputs.md)
JOB_KEYS = (
    "status", "cell", "choices", "algo", "env", "seed", "num_seeds", "total_steps", "wall_s", "counts", "members",
    "error", "config",
)  # fmt: skip


def _metrics_problem(path: Path, steps: Any) -> str | None:
    """What is wrong with a member's metrics.jsonl: a line that is not a JSON object with a step, steps
    that do not increase, a last step other than the member's ``steps``; None when intact."""
    last = None
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except ValueError:
                cut = "" if line.endswith(b"\n") else " (cut off)"
                return f"line {number} is not JSON{cut}"
            step = record.get("step") if isinstance(record, dict) else None
            if not isinstance(step, int):
                return f"line {number} is not a JSON object with an integer step"
            if last is not None and step <= last:
                return f"line {number}: step {step} after step {last}"
            last = step
    if last != steps:
        return f"ends at step {last}, the member's summary says steps {steps}"
    return None


def _job_problems(job_dir: Path, job: dict[str, Any]) -> list[str]:
    """Problems of a finished job beyond what resume checks, each '<file>: <what is wrong>'."""
    missing = [key for key in JOB_KEYS if key not in job]
    if missing:
        return [f"{job_dir / 'summary.json'}: missing key {', '.join(missing)}"]
    problems = []
    seeds, members = job["num_seeds"], job["members"]
    statuses = [m.get("status") for m in members] if isinstance(members, list) else []
    if len(statuses) != seeds:
        problems.append(f"{job_dir / 'summary.json'}: {len(statuses)} members, num_seeds is {seeds}")
    counts = {s: statuses.count(s) for s in ("ok", "diverged", "crashed")}
    if job["counts"] != counts:
        problems.append(f"{job_dir / 'summary.json'}: counts {job['counts']}, its members' statuses give {counts}")
    if job["status"] != ("diverged" if counts["diverged"] else "ok"):
        problems.append(f"{job_dir / 'summary.json'}: status {job['status']}, its members' statuses give another")
    for k in range(seeds):
        member_dir = job_dir / f"seed_{k}"
        member = json.loads((member_dir / "summary.json").read_text())  # resume's check: an object
        if k < len(statuses) and member != members[k]:
            problems.append(f"{member_dir / 'summary.json'}: differs from the job's record of member {k}")
        if member["member"] != k or member["seed"] != job["seed"] + k:
            problems.append(f"{member_dir / 'summary.json'}: member {member['member']} seed {member['seed']}")
        problem = _metrics_problem(member_dir / "metrics.jsonl", member["steps"])
        if problem:
            problems.append(f"{member_dir / 'metrics.jsonl'}: {problem}")
        if (member_dir / "wandb").is_dir():
            problems.extend(_wandb_problems(member_dir))
    return problems


def _wandb_problems(member_dir: Path) -> list[str]:
    runs = run_dirs(member_dir)
    if len(runs) != 1:
        return [f"{member_dir / 'wandb'}: {len(runs)} W&B runs, expected 1"]
    code, problem = exit_code(runs[0])
    if problem:
        return [f"{runs[0]}: {problem}"]
    return [f"{runs[0]}: exit code {code}, expected 0"] if code != 0 else []


def _grid(root: Path) -> list[tuple[Path, str | None]]:
    """Each job of ``root``'s grid, in order, with what is wrong with its place in the grid (None: a job
    dir to inspect): with a recorded job list (``multirun.yaml`` of Hydra's basic sweeper) every job of
    it, then any dir that is no job of it; else the job dirs present."""
    present = job_dirs(root)
    expected = expected_jobs(root)
    if expected is None:
        return [(job_dir, None) for job_dir in present]
    jobs: list[tuple[Path, str | None]] = []
    for k, (job_dir, overrides) in enumerate(expected):
        ran = ran_overrides(job_dir)
        if job_dir not in present:
            jobs.append((job_dir, f"never started (job {k} of the grid: {' '.join(overrides)})"))
        elif ran is not None and ran != overrides:
            jobs.append(
                (job_dir, f"ran {only_in(ran, overrides)} where the grid's job {k} runs {only_in(overrides, ran)}")
            )
        else:
            jobs.append((job_dir, None))
    return jobs + [
        (job_dir, f"no job of the grid {root / MULTIRUN_YAML} records") for job_dir in unknown_dirs(root, expected)
    ]


def check(root: Path) -> tuple[list[str], int, int]:
    """(one line per problem, jobs, jobs finished and intact) of the grid under ``root`` (``_grid``)."""
    problems: list[str] = []
    jobs = _grid(root)
    intact = 0
    for job_dir, misplaced in jobs:
        if misplaced:
            problems.append(f"{job_dir}: {misplaced}")
            continue
        job, corrupt = inspect_job(job_dir)
        if corrupt:
            problems.append(f"{job_dir / corrupt}")  # '<file>: <what is wrong>', as resume names it
        elif job is None and not (job_dir / "summary.json").exists():
            problems.append(f"{job_dir}: unfinished (no summary.json)")
        elif job is None:
            error = json.loads((job_dir / "summary.json").read_text()).get("error")
            problems.append(f"{job_dir}: crashed ({error})")
        else:
            found = _job_problems(job_dir, job)
            problems.extend(found)
            intact += not found
        for attempt in sorted(p for p in job_dir.iterdir() if ATTEMPT.fullmatch(p.name)):
            for run in sorted(attempt.glob(f"seed_*/wandb/{OFFLINE_RUNS}")):
                problems.append(f"{run}: an attempt moved aside with a run under the sync glob's name")
    return problems, len(jobs), intact


def main(argv: list[str] | None = None) -> int:
    description = __doc__.split("\n\n")[0].replace("``", "")  # plain text, as every command's --help
    parser = argparse.ArgumentParser(prog="python -m rlexp.check", description=description)
    parser.add_argument("dir", type=Path, help="a sweep dir (its jobs) or a job's run dir")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        print(f"check: {args.dir} is not a directory; pass a sweep dir or a job's run dir", file=sys.stderr)
        return 2
    problems, jobs, intact = check(args.dir)
    if not jobs:
        print(f"check: {args.dir} holds no job dir; pass a sweep dir or a job's run dir", file=sys.stderr)
        return 2
    for line in problems:
        print(line)
    print(f"check: {jobs} jobs, {intact} finished and intact; {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
