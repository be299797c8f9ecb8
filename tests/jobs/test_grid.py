"""Tests of the launchers, resume and failure isolation.

Every grid runs for real: ``python -m rlexp.train`` in a subprocess through Hydra's own launcher
plugins (basic, joblib, submitit local; Ray in its own environment, marked slow), with a tiny budget,
W&B offline or disabled, and every output under pytest's tmp_path.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from launching import (
    Launch,
    describe,
    file_hashes,
    job_dirs,
    message_lines,
    read_json,
    read_jsonl,
    read_wandb_run,
    run_cli,
)

from rlexp.run.jobs import write_json
from rlexp.run.loggers import _fit as fit_wandb  # W&B group names: the cell, cut to 128 characters

BUDGET = ["total_steps=600", "algo.learning_starts=200", "logger.log_every=300", "logger.progress=off"]
SMALL = ["+experiment=stability_grid_small", *BUDGET]
SMALL_CELLS = sorted(itertools.product(["relu", "tanh"], ["none", "global_norm"]))


ROWS = 2  # metrics.jsonl records per member: total_steps / log_every
JOBLIB = ["hydra/launcher=rlexp_joblib", "hydra.launcher.n_jobs=2"]
CRASH = "debug.crash_at_step=400"
CRASHED = "a forced crash at env step 400"


RAY_INSTALLED = importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is not None


# ====================================================================== helpers


def check_finished_job(job_dir: Path, wandb: bool = False) -> dict:
    """A job that ran to the end: its summary, and each member's summary and metrics, agree."""
    job = read_json(job_dir / "summary.json")
    assert job["status"] in ("ok", "diverged"), job["error"]
    assert job["error"] is None and len(job["members"]) == job["num_seeds"]
    for k, recorded in enumerate(job["members"]):
        member_dir = job_dir / f"seed_{k}"
        member = read_json(member_dir / "summary.json")
        assert member == recorded and member["status"] in ("ok", "diverged")
        rows = read_jsonl(member_dir / "metrics.jsonl")
        if member["status"] == "ok":
            assert member["steps"] == job["total_steps"] and len(rows) == ROWS
        if wandb:
            run = read_wandb_run(member_dir)
            sweep = job["config"]["logger"]["sweep"]  # a multirun's: group <sweep>/<cell>
            group = f"{sweep}/{job['cell']}" if sweep else job["cell"]
            assert run["group"] == fit_wandb(group, 128) and run["exit_code"] == 0
    return job


def check_crashed_job(job_dir: Path, error: str, wandb: bool = False) -> dict:
    """A job that raised: crashed with the error, the traceback in error.txt, every member crashed
    (the W&B runs that had opened ended with exit code 1: the first member's always; a run still
    queued when the job stopped is never opened)."""
    job = read_json(job_dir / "summary.json")
    assert job["status"] == "crashed" and error in job["error"], job
    assert error in (job_dir / "error.txt").read_text()
    assert job["counts"]["crashed"] == job["num_seeds"] == len(job["members"])
    for k in range(job["num_seeds"]):
        member = read_json(job_dir / f"seed_{k}" / "summary.json")
        assert member["status"] == "crashed" and error in member["error"]
        if wandb and (k == 0 or list((job_dir / f"seed_{k}" / "wandb").glob("offline-run-*"))):
            assert read_wandb_run(job_dir / f"seed_{k}")["exit_code"] == 1
    return job


def choices_of(job: dict) -> tuple:
    return job["choices"]["activation"], job["choices"]["clipping"]


# ====================================================================== launchers, for real
@pytest.fixture(scope="module")
def joblib_grid(tmp_path_factory):
    """Two cells of the small grid through the joblib launcher (2 workers, W&B offline), each twice:
    as is, and forced to crash at env step 400."""
    base = tmp_path_factory.mktemp("joblib")
    proc = run_cli(
        [
            *SMALL,
            *JOBLIB,
            "clipping=none",
            "debug.crash_at_step=-1,400",
            "logger.mode=offline",
            f"hydra.sweep.dir={base / 'sweep'}",
        ],
        base,
    )
    return proc, base / "sweep"


def test_joblib_runs_every_job(joblib_grid):
    proc, sweep = joblib_grid
    jobs = [read_json(d / "summary.json") for d in job_dirs(sweep)]
    assert len(jobs) == 4, describe(proc)
    fine = [check_finished_job(d, wandb=True) for d, j in zip(job_dirs(sweep), jobs) if CRASH not in j["cell"]]
    assert sorted(choices_of(j) for j in fine) == [("relu", "none"), ("tanh", "none")]


def test_joblib_isolates_a_crashing_job(joblib_grid):
    proc, sweep = joblib_grid
    assert proc.returncode != 0, describe(proc)  # Hydra: the multirun ends non-zero after every job ran
    crashed = [
        check_crashed_job(d, CRASHED, wandb=True)
        for d in job_dirs(sweep)
        if CRASH in read_json(d / "summary.json")["cell"]
    ]
    assert sorted(choices_of(j) for j in crashed) == [("relu", "none"), ("tanh", "none")]
    # after Hydra's error, the table across every job (the crashed ones too) and the report command
    rows = {ln.split()[0]: ln.split() for ln in proc.stdout.splitlines() if re.match(r"\d+\s+\S+=", ln)}
    for d in job_dirs(sweep):
        job = read_json(d / "summary.json")
        counts = [str(job["counts"][s]) for s in ("ok", "diverged", "crashed")]
        assert rows[d.name][1:5] == [job["cell"], *counts], proc.stdout
    assert f"next: python -m rlexp.report {sweep}" in proc.stdout


def test_submitit_local_runs_every_job(tmp_path):
    """Two cells of the small grid (submitit's local executor starts every job at once: two keep
    the test quick on two cores)."""
    sweep = tmp_path / "sweep"
    proc = run_cli(
        [
            *SMALL,
            "hydra/launcher=rlexp_submitit_local",
            "clipping=none",
            "logger.mode=disabled",
            f"hydra.sweep.dir={sweep}",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, describe(proc)
    jobs = [check_finished_job(d) for d in job_dirs(sweep)]
    assert sorted(choices_of(j) for j in jobs) == [("relu", "none"), ("tanh", "none")]
    assert (sweep / ".submitit").is_dir()  # submitit's own records, beside the jobs


def test_basic_launcher_crash_leaves_the_next_job_and_its_wandb_run_intact(tmp_path):
    """The basic launcher runs jobs one after the other in one process: a crashed job must not
    leave its W&B run open for the next job."""
    sweep = tmp_path / "sweep"
    proc = run_cli(
        [
            *SMALL,
            "activation=relu",
            "clipping=none",
            "num_seeds=1",
            "debug.crash_at_step=400,-1",
            "logger.mode=offline",
            f"hydra.sweep.dir={sweep}",
        ],
        tmp_path,
    )
    assert proc.returncode != 0, describe(proc)
    crashed, fine = job_dirs(sweep)
    check_crashed_job(crashed, CRASHED, wandb=True)
    job = check_finished_job(fine, wandb=True)
    assert len(read_wandb_run(fine / "seed_0")["history"]) == ROWS
    assert CRASH not in job["cell"]


def test_crash_before_training_is_recorded(tmp_path):
    """A job that raises while it is being set up (here: the environment refuses a keyword) still
    leaves a crashed summary with the error, for itself and each member."""
    run_dir = tmp_path / "run"
    proc = run_cli(
        [*BUDGET, "num_seeds=2", "+env.kwargs.no_such_kwarg=1", "logger.mode=disabled", f"hydra.run.dir={run_dir}"],
        tmp_path,
    )
    assert proc.returncode != 0, describe(proc)
    check_crashed_job(run_dir, "no_such_kwarg")


# ====================================================================== resume, for real
def wait_for(paths: Sequence[Path], proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert proc.poll() is None, f"the grid ended (exit {proc.returncode}) before {paths} appeared"
        assert time.monotonic() < deadline, f"{paths} did not appear within {timeout} s"
        time.sleep(0.02)


@pytest.mark.heavy
def test_resume_after_a_kill_keeps_finished_jobs_and_completes_the_rest(tmp_path):
    sweep = tmp_path / "sweep"
    # a budget whose second half (3000 env steps of two members, learning) takes tenths of a second on a fast
    # machine: the grid is stopped within a poll (20 ms) of job 1's first record, while job 1 runs
    budget = [
        "total_steps=6000",
        "algo.learning_starts=200",
        f"logger.log_every={6000 // ROWS}",
        "logger.progress=off",
    ]
    args = ["+experiment=stability_grid_small", *budget, "logger.mode=disabled", f"hydra.sweep.dir={sweep}"]
    first = Launch(args, tmp_path / "first")
    try:  # stop, then kill, the grid once job 0 is finished and job 1 has started writing
        wait_for([sweep / "0" / "summary.json", sweep / "1" / "seed_0" / "metrics.jsonl"], first.proc)
        first.proc.send_signal(signal.SIGSTOP)
        finished = file_hashes(sweep / "0")
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=60)
    finally:
        first.stop()
    assert not (sweep / "1" / "summary.json").exists()

    second = run_cli([*args, "resume=true"], tmp_path / "second")
    assert second.returncode == 0, describe(second)
    assert f"resume: {sweep / '0'} is finished" in second.stdout
    assert file_hashes(sweep / "0") == finished  # byte for byte, .hydra/ included
    jobs = [check_finished_job(d) for d in job_dirs(sweep)]
    assert sorted(choices_of(j) for j in jobs) == SMALL_CELLS
    assert (sweep / "1" / "attempt_1" / "seed_0" / "metrics.jsonl").exists()  # the killed attempt, kept

    # the same grid without resume=true: refused in one line, nothing touched (multirun.yaml included)
    before = file_hashes(sweep)
    third = run_cli(args, tmp_path / "third")
    assert third.returncode == 2 and len(message_lines(third)) == 1, describe(third)
    assert "holds this grid finished (all 4 jobs): nothing to run" in third.stderr, describe(third)
    assert file_hashes(sweep) == before


def test_a_finished_run_dir_is_refused_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    write_json(run_dir / "summary.json", {"status": "ok"})
    before = file_hashes(run_dir)
    proc = run_cli([*BUDGET, f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 2, describe(proc)
    lines = message_lines(proc)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, describe(proc)
    assert lines[0].startswith("config error: resume:") and "resume=true" in lines[0] and "hydra.run.dir" in lines[0]
    assert file_hashes(run_dir) == before and not (run_dir / ".hydra").exists()


# ====================================================================== Ray, in its own environment
@pytest.mark.slow
@pytest.mark.skipif(
    not RAY_INSTALLED,
    reason="needs the ray extra in its own environment (python -m venv; pip install -e '.[ray]' pytest; see .ci/run)",
)
def test_ray_runs_every_job_of_the_grid(tmp_path):
    """The small grid through the Ray launcher on a local Ray cluster; Ray's files (~/.ray and its
    temp dir) stay under tmp dirs (the temp dir short: Ray's socket paths have a length limit)."""
    sweep = tmp_path / "sweep"
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    try:
        proc = run_cli(
            [
                *SMALL,
                "hydra/launcher=rlexp_ray",
                "debug.crash_at_step=-1,400",
                "logger.mode=offline",
                f"hydra.sweep.dir={sweep}",
            ],
            tmp_path,
            HOME=str(tmp_path / "home"),
            RAY_TMPDIR=ray_tmp,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode != 0, describe(proc)  # the crashed jobs
    fine, crashed = [], []
    for d in job_dirs(sweep):
        if CRASH in read_json(d / "summary.json")["cell"]:
            crashed.append(check_crashed_job(d, CRASHED, wandb=True))
        else:
            fine.append(check_finished_job(d, wandb=True))
    assert sorted(choices_of(j) for j in fine) == sorted(choices_of(j) for j in crashed) == SMALL_CELLS
    assert os.path.isdir(tmp_path / "home" / ".ray")
