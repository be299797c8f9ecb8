"""Tests of faults around a job: one writer per dir (a second job refused, a lock taken over from a dead
holder), an unwritable output dir, a corrupt summary on resume, Ctrl-C (twice, and in a pack), too many
members for the open files, a crash's clean-up, W&B online without a server. The fault table in
docs/grids.md names them; their pieces in process are in tests/run/ (test_jobs.py, test_interrupts.py)
and tests/compose/test_validate.py.

Runs that train use ``python -m rlexp.train`` in a subprocess with a tiny budget and W&B disabled where the
process is what is tested (its signals, its exit, its lock); a job that only takes over a dead holder's lock
or resumes what a process left runs in process (``run_job``, as the CLI's job runs it). Every output is under
pytest's tmp_path.
"""

from __future__ import annotations

import json
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from composing import compose_config
from launching import ROOT, Launch, cli_env, describe, file_hashes, message_lines, read_json, read_wandb_run, run_cli
from test_grid import check_crashed_job, check_finished_job

from rlexp import check
from rlexp.compose.validate import FILES_RESERVED
from rlexp.config.schema import ConfigError
from rlexp.run.jobs import (
    CORRUPT,
    LOCK,
    RESERVE,
    hold_dir,
)
from rlexp.train import run_job

BUDGET = ["total_steps=600", "algo.learning_starts=200", "logger.log_every=300", "logger.progress=off"]
TINY = [*BUDGET, "num_seeds=1", "logger.mode=disabled"]
# a process that takes a job dir's lock with rlexp's own function, says so, and keeps it
HOLDER = (
    "import sys, time; from pathlib import Path; from rlexp.run.jobs import hold_dir; "
    "hold_dir(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)"
)


# ====================================================================== helpers
def start_holder(job_dir: Path) -> subprocess.Popen:
    """A subprocess holding ``job_dir``'s lock (returns once it holds it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(job_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def run_check(root: Path, tmp: Path) -> subprocess.CompletedProcess:
    """``python -m rlexp.check <root>``."""
    return subprocess.run([sys.executable, "-m", "rlexp.check", str(root)], cwd=ROOT, capture_output=True, text=True,
                          env=cli_env(tmp))  # fmt: skip


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL: the process gets no chance to clean up."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


def logged(paths: Callable[[], list[Path]], count: int) -> Callable[[], bool]:
    """Ready once ``count`` metrics files hold a record: training has started (a file exists from before,
    when the member's logs open)."""
    return lambda: len(files := paths()) == count and all(f.stat().st_size > 0 for f in files)


def interrupt_when(
    launch: Launch, ready: Callable[[], bool], signals: int = 1, signum: int = signal.SIGINT
) -> subprocess.CompletedProcess:
    """Send the launched CLI ``signals`` signals ``signum`` 50 ms apart once ``ready()`` (at most 300 s); its
    result."""
    try:
        deadline = time.monotonic() + 300
        while not ready():
            assert launch.proc.poll() is None and time.monotonic() < deadline, describe(launch.result())
            time.sleep(0.05)
        for k in range(signals):
            time.sleep(0.05 * (k > 0))
            launch.proc.send_signal(signum)
        return launch.result()
    finally:
        launch.stop()


def cut(path: Path, keep: float = 0.5) -> None:
    """Truncate a file to a fraction of its bytes, as a kill or a full disk mid-write would."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_a_second_job_is_refused_while_the_first_holds_the_dir(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "seed_0").mkdir(parents=True)
    (run_dir / "seed_0" / "metrics.jsonl").write_text('{"step": 300}\n')  # the first job's live file
    holder = start_holder(run_dir)
    try:
        before = file_hashes(run_dir)
        with pytest.raises(ConfigError, match=f"in use by pid {holder.pid} on host "):
            hold_dir(run_dir)
        proc = run_cli([*TINY, f"hydra.run.dir={run_dir}"], tmp_path)
        assert proc.returncode == 2, describe(proc)
        lines = message_lines(proc)
        assert len(lines) == 1 and "Traceback" not in proc.stderr, describe(proc)
        assert lines[0].startswith(f"config error: hydra.run.dir: {run_dir} is in use by pid {holder.pid}")
        assert file_hashes(run_dir) == before  # nothing moved, nothing written, the lock's file as it was
        assert sorted(p.name for p in run_dir.iterdir()) == [LOCK, "seed_0"]
    finally:
        kill(holder)


def test_a_held_job_dir_fails_that_job_of_a_multirun_and_the_others_run(tmp_path):
    sweep = tmp_path / "sweep"
    holder = start_holder(sweep / "0")
    try:
        proc = run_cli(["-m", *TINY, "activation=relu,tanh", f"hydra.sweep.dir={sweep}"], tmp_path)
    finally:
        kill(holder)
    assert proc.returncode != 0, describe(proc)
    assert f"{sweep / '0'} is in use by pid {holder.pid}" in proc.stdout + proc.stderr, describe(proc)
    assert sorted(p.name for p in (sweep / "0").iterdir()) == [LOCK]  # no .hydra/, no summary
    assert check_finished_job(sweep / "1")["choices"]["activation"] == "tanh"
    assert not (sweep / "1" / LOCK).exists()


@pytest.mark.heavy
def test_two_multiruns_into_one_sweep_dir_never_mix_their_grids(tmp_path, capsys):
    """A multirun holds its sweep dir: a second one, started while the first runs, is refused in one line
    naming it; once the first has stopped (SIGTERM after its first job's first record) a multirun of
    another grid is still refused, writing nothing. The first's end table, and ``rlexp.check`` after it,
    list every job of its grid: the two it never started too."""
    sweep = tmp_path / "sweep"
    first_args = ["-m", *BUDGET[1:], "total_steps=200000", "num_seeds=1", "logger.mode=disabled",
                  "activation=relu,tanh,elu", f"hydra.sweep.dir={sweep}"]  # fmt: skip
    other = [arg.replace("relu,tanh,elu", "sigmoid,softsign,gelu") for arg in first_args]
    first = Launch(first_args, tmp_path / "first")
    seconds = []

    def second_then_ready() -> bool:
        if not seconds and (sweep / "0" / "seed_0" / "metrics.jsonl").exists():
            seconds.append(run_cli(other, tmp_path / "second"))  # while the first trains its job 0
        return bool(seconds) and logged(lambda: list(sweep.glob("0/seed_*/metrics.jsonl")), 1)()

    ended = interrupt_when(first, second_then_ready, signum=signal.SIGTERM)
    second = seconds[0]
    assert second.returncode == 2 and "Traceback" not in second.stderr, describe(second)
    assert message_lines(second) == [
        f"config error: hydra.sweep.dir: {sweep} is in use by pid {first.proc.pid} on host {socket.gethostname()} "
        f"(it holds {sweep / LOCK}); wait for that multirun to end, or set hydra.sweep.dir to another directory"
    ]
    assert ended.returncode == 128 + signal.SIGTERM, describe(ended)
    table = [line.split(None, 1) for line in ended.stdout.splitlines() if line[:2] in ("0 ", "1 ", "2 ")]
    assert table[1:] == [["1", "(not started)"], ["2", "(not started)"]], describe(ended)
    assert not (sweep / LOCK).exists()

    before = file_hashes(sweep)
    third = run_cli(other, tmp_path / "third")
    assert third.returncode == 2 and "Traceback" not in third.stderr, describe(third)
    assert message_lines(third) == [
        f"config error: hydra.sweep.dir: {sweep} holds jobs of another grid (its job 0 runs activation=relu where "
        "this command's runs activation=sigmoid); set hydra.sweep.dir to a new directory, or run the recorded "
        f"grid (python -m rlexp.check {sweep} lists its jobs)"
    ]
    assert file_hashes(sweep) == before

    assert check.main([str(sweep)]) == 1
    kept = "algo.learning_starts=200 logger.log_every=300 total_steps=200000 num_seeds=1"
    assert capsys.readouterr().out.splitlines() == [
        f"{sweep / '0'}: crashed (rlexp.run.jobs.Terminated: SIGTERM)",
        f"{sweep / '1'}: never started (job 1 of the grid: {kept} activation=tanh)",
        f"{sweep / '2'}: never started (job 2 of the grid: {kept} activation=elu)",
        "check: 3 jobs, 0 finished and intact; 3 problems",
    ]


def test_a_file_where_a_job_dir_goes_refuses_the_multirun_before_any_job(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "1").write_text("a file, not job 1's dir")
    proc = run_cli(["-m", *TINY, "activation=relu,tanh", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, describe(proc)
    assert message_lines(proc) == [
        f"config error: hydra.sweep.dir: {sweep / '1'} is not a directory: job 1's dir cannot be made there; "
        f"move it out of {sweep}, or set hydra.sweep.dir to a new directory"
    ]
    assert sorted(p.name for p in sweep.iterdir()) == ["1"]  # nothing written


# ====================================================================== a full disk, for real
@pytest.fixture
def small_fs(tmp_path):
    """A 16 MiB tmpfs at tmp_path/fs, nearly full: a filler leaves ``RESERVE`` plus ``ROOM`` bytes free."""
    fs = tmp_path / "fs"
    fs.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(fs)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("needs a tmpfs mount (root or CAP_SYS_ADMIN); tests/run/test_jobs.py injects ENOSPC instead")
    try:
        (fs / "filler").write_bytes(b"\0" * (shutil.disk_usage(fs).free - RESERVE - ROOM))
        yield fs
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=True)


ROOM = 60_000  # bytes the jobs may write beyond their reserve: a few thousand env steps of metrics
FILLS = ["logger.log_every=50", "logger.progress=off", "num_seeds=2", "total_steps=8000"]


def no_partial_files(root: Path) -> None:
    """No 0-byte file, no .tmp, no lock, and every metrics.jsonl line whole."""
    files = [p for p in root.rglob("*") if p.is_file()]
    assert not [p for p in files if p.stat().st_size == 0 or p.name.endswith(".tmp") or p.name == LOCK], files
    for path in root.rglob("metrics.jsonl"):
        assert all(json.loads(line) for line in path.read_text().splitlines()), path


@pytest.mark.heavy
def test_a_full_disk_records_the_job_crashed_naming_the_file_and_resume_runs_it(small_fs, tmp_path):
    run_dir = small_fs / "run"
    args = [*FILLS, f"hydra.run.dir={run_dir}"]
    proc = run_cli([*args, "logger.mode=disabled"], tmp_path / "first")  # W&B's own writes: W&B's to report
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, describe(proc)
    said = [line for line in message_lines(proc) if line.startswith("disk full: ")]
    assert len(said) == 1 and re.fullmatch(
        rf"disk full: cannot write {run_dir}/seed_[01]/metrics.jsonl: ENOSPC \(No space left on device\); free "
        "space on its filesystem, then resume=true runs the job again", said[0]), describe(proc)  # fmt: skip
    check_crashed_job(run_dir, said[0])
    no_partial_files(run_dir)
    (small_fs / "filler").unlink()
    again = run_cli([*args, "logger.mode=offline", "resume=true"], tmp_path / "again")
    assert again.returncode == 0, describe(again)
    checked = run_check(run_dir, tmp_path)
    assert checked.stdout == "check: 1 jobs, 1 finished and intact; 0 problems\n", describe(checked)


@pytest.mark.heavy
def test_a_full_disk_in_a_checkpoint_names_the_checkpoint(small_fs, tmp_path):
    run_dir = small_fs / "run"
    args = [*FILLS, "checkpoint.every=500", "checkpoint.replay=true", "logger.mode=disabled"]
    proc = run_cli([*args, f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, describe(proc)
    check_crashed_job(run_dir, f"disk full: cannot write {run_dir}/seed_0/checkpoint.pt: ENOSPC")
    no_partial_files(run_dir)
    assert not list(run_dir.rglob(".checkpoint.pt.*"))


@pytest.mark.heavy
def test_a_full_disk_in_a_multirun_records_the_job_and_attempts_the_others(small_fs, tmp_path):
    sweep = small_fs / "sweep"
    proc = run_cli(["-m", *FILLS, "logger.mode=disabled", "activation=relu,tanh,elu", f"hydra.sweep.dir={sweep}"],
                   tmp_path)  # fmt: skip
    assert proc.returncode != 0, describe(proc)
    check_crashed_job(sweep / "0", "disk full: cannot write ")
    for k in (1, 2):  # the reserve the crash record gave back is not enough for another job: each says so
        assert f"disk full: cannot write {sweep / str(k) / LOCK}: ENOSPC" in proc.stderr, describe(proc)
    no_partial_files(sweep)
    checked = run_check(sweep, tmp_path)
    assert [line.split(": ")[1] for line in checked.stdout.splitlines()[:3]] == [
        "crashed (rlexp.run.jobs.DiskFull",
        "never started (job 1 of the grid",
        "never started (job 2 of the grid",
    ], describe(checked)


def resumed(run_dir: Path) -> dict:
    """The job of ``TINY`` in ``run_dir`` with resume=true, in process (as the CLI's job runs it): its summary."""
    return run_job(compose_config([*TINY, "resume=true"]), run_dir)


def test_a_killed_holders_lock_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    holder = start_holder(run_dir)
    kill(holder)  # the kernel drops its lock; its .lock file and content stay
    assert json.loads((run_dir / LOCK).read_text())["pid"] == holder.pid
    assert run_job(compose_config(TINY), run_dir)["status"] == "ok"
    check_finished_job(run_dir)
    assert not (run_dir / LOCK).exists()  # released at the job's end
    assert not list(run_dir.glob("attempt_*"))  # a stale lock alone is no earlier attempt


# ====================================================================== an unwritable output dir
def test_an_unwritable_run_dir_is_refused_in_one_line(tmp_path):
    (tmp_path / "afile").write_text("a file, not a dir\n")
    run_dir = tmp_path / "afile" / "run"
    with pytest.raises(ConfigError, match="ENOTDIR"):
        hold_dir(run_dir)
    proc = run_cli([*TINY, f"hydra.run.dir={run_dir}"], tmp_path)
    assert proc.returncode == 2, describe(proc)
    lines = message_lines(proc)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, describe(proc)
    assert lines[0].startswith(f"config error: hydra.run.dir: cannot create or write {run_dir}: ENOTDIR ("), lines


def test_an_unwritable_sweep_dir_is_refused_in_one_line(tmp_path):
    (tmp_path / "afile").write_text("a file, not a dir\n")
    sweep = tmp_path / "afile" / "sweep"
    proc = run_cli(["-m", *TINY, "activation=relu,tanh", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 2, describe(proc)
    lines = message_lines(proc)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, describe(proc)
    assert lines[0].startswith(f"config error: hydra.sweep.dir: cannot create or write {sweep}: ENOTDIR ("), lines


def test_resume_reruns_a_finished_run_whose_summary_is_corrupt(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run_job(compose_config(TINY), run_dir)["status"] == "ok"
    cut(run_dir / "summary.json")
    capsys.readouterr()
    assert resumed(run_dir)["status"] == "ok"
    out = capsys.readouterr().out
    assert f"corrupt: {run_dir / 'summary.json'}: not JSON (" in out, out
    check_finished_job(run_dir)
    assert (run_dir / "attempt_1" / CORRUPT).read_text().startswith("summary.json: not JSON")
    assert (run_dir / "attempt_1" / "seed_0" / "metrics.jsonl").exists()


# ====================================================================== Ctrl-C
def test_a_job_killed_before_its_wandb_runs_closed_is_not_finished(tmp_path):
    """The job's summary.json is written last, after every W&B run closed: a SIGKILL between the
    members' summaries and the W&B close leaves no job summary, so resume runs the job again (the
    killed attempt moved aside) instead of taking it for finished."""
    run_dir = tmp_path / "run"
    killed_there = (
        "import os, runpy, signal; from rlexp.run.recorder import Recorder; "
        "Recorder.close_wandb = lambda self: os.kill(os.getpid(), signal.SIGKILL); "
        "runpy.run_module('rlexp.train', run_name='__main__', alter_sys=True)"  # as python -m rlexp.train
    )
    args = [*BUDGET, "num_seeds=2", "logger.mode=offline", f"hydra.run.dir={run_dir}"]
    first = subprocess.run(
        [sys.executable, "-c", killed_there, *args], cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True
    )
    assert first.returncode == -signal.SIGKILL, describe(first)
    assert not (run_dir / "summary.json").exists()  # not finished ...
    assert all(read_json(run_dir / f"seed_{k}" / "summary.json")["status"] == "ok" for k in range(2))  # ... kept
    second = run_cli([*args, "resume=true"], tmp_path / "second")
    assert second.returncode == 0, describe(second)
    check_finished_job(run_dir, wandb=True)
    assert (run_dir / "attempt_1" / "seed_0" / "summary.json").exists()  # the killed attempt, moved aside


def test_ctrl_c_records_the_job_crashed_and_resume_runs_it_again(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        "total_steps=200000",
        "algo.learning_starts=200",
        "logger.log_every=200",
        "logger.progress=off",
        "num_seeds=1",
        "logger.mode=disabled",
        f"hydra.run.dir={run_dir}",
    ]
    metrics = run_dir / "seed_0" / "metrics.jsonl"
    first = interrupt_when(
        Launch(args, tmp_path / "first"), lambda: metrics.exists() and metrics.read_text().count("\n") >= 2
    )
    assert first.returncode != 0, describe(first)
    job = read_json(run_dir / "summary.json")
    assert job["status"] == "crashed" and job["error"] == "KeyboardInterrupt", job
    assert read_json(run_dir / "seed_0" / "summary.json")["status"] == "crashed"
    frames = [ln for ln in (run_dir / "error.txt").read_text().splitlines() if ln.lstrip().startswith("File ")]
    between_env_steps = "rlexp/run/recorder/schedule.py" in frames[-1] and frames[-1].endswith("in steps")
    assert between_env_steps, frames[-3:]
    assert not (run_dir / LOCK).exists()
    assert resumed(run_dir)["status"] == "ok"
    check_finished_job(run_dir)
    assert read_json(run_dir / "attempt_1" / "summary.json")["status"] == "crashed"


def test_sigterm_stops_the_job_as_a_ctrl_c_does_and_records_it_terminated(tmp_path):
    """SIGTERM (a scheduler's preemption, ``timeout``, ``docker stop``): the job stops between two env
    steps, writes every summary (crashed, ``Terminated: SIGTERM``), closes its W&B runs, releases its
    lock and exits 143 with one line; resume=true then runs it again."""
    run_dir = tmp_path / "run"
    args = [*BUDGET[1:], "total_steps=200000", "num_seeds=2", "logger.mode=offline", f"hydra.run.dir={run_dir}"]
    ready = logged(lambda: list(run_dir.glob("seed_*/metrics.jsonl")), 2)
    first = interrupt_when(Launch(args, tmp_path / "first"), ready, signum=signal.SIGTERM)
    assert first.returncode == 128 + signal.SIGTERM, describe(first)
    assert "terminated (SIGTERM): the job is recorded crashed; resume=true goes on with it" in first.stderr
    assert "Traceback" not in first.stderr
    job = check_crashed_job(run_dir, "Terminated: SIGTERM", wandb=True)
    assert job["error"] == "rlexp.run.jobs.Terminated: SIGTERM"
    frames = [ln for ln in (run_dir / "error.txt").read_text().splitlines() if ln.lstrip().startswith("File ")]
    assert "rlexp/run/recorder/schedule.py" in frames[-1] and frames[-1].endswith("in steps")  # between env steps
    assert not (run_dir / LOCK).exists()
    assert resumed(run_dir)["status"] == "ok"
    check_finished_job(run_dir)


@pytest.mark.heavy
def test_sigterm_to_a_joblib_sweep_is_recorded_by_every_running_job_and_no_other_starts(tmp_path):
    """SIGTERM to the launcher's process (``timeout``, ``docker stop``) of a sweep whose jobs run in joblib's
    workers: each running job records it (crashed, ``Terminated: SIGTERM``, its W&B run closed, its lock
    released), no queued job starts, the process exits 143 and no worker outlives it."""
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=rlexp_joblib", "hydra.launcher.n_jobs=2", "activation=relu,tanh,elu", *BUDGET[1:],
            "total_steps=200000", "num_seeds=1", "logger.mode=offline", f"hydra.sweep.dir={sweep}"]  # fmt: skip
    launch = Launch(args, tmp_path / "first")
    workers: list[int] = []

    def running() -> bool:
        if not logged(lambda: list(sweep.glob("[01]/seed_0/metrics.jsonl")), 2)():
            return False
        workers.extend(children(launch.proc.pid))
        return True

    ended = interrupt_when(launch, running, signum=signal.SIGTERM)
    assert ended.returncode == 128 + signal.SIGTERM, describe(ended)
    assert "terminated (SIGTERM): the job is recorded crashed; resume=true goes on with it" in ended.stderr
    for k in (0, 1):
        check_crashed_job(sweep / str(k), "Terminated: SIGTERM", wandb=True)
        assert not (sweep / str(k) / LOCK).exists()
    assert not list(sweep.glob("2/*")) and not (sweep / LOCK).exists()  # queued: never started
    deadline = time.monotonic() + 10  # joblib's resource tracker ends once it sees its parent gone
    while [pid for pid in workers if Path(f"/proc/{pid}").exists()] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert workers and not [pid for pid in workers if Path(f"/proc/{pid}").exists()], workers


def children(pid: int) -> list[int]:
    """The pids of a process's children (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def test_a_second_ctrl_c_during_the_clean_up_waits_for_every_summary(tmp_path):
    """Two SIGINTs 50 ms apart: the first stops training, the second is held until every summary is
    on disk and the W&B runs are closed."""
    run_dir = tmp_path / "run"
    args = [*BUDGET[1:], "total_steps=200000", "num_seeds=3", "logger.mode=offline", f"hydra.run.dir={run_dir}"]
    proc = interrupt_when(Launch(args, tmp_path), (run_dir / "seed_2" / "metrics.jsonl").exists, signals=2)
    assert proc.returncode != 0, describe(proc)
    job = read_json(run_dir / "summary.json")
    assert job["status"] == "crashed" and job["error"] == "KeyboardInterrupt", job
    assert [m["status"] for m in job["members"]] == ["crashed"] * 3
    for k in range(3):
        member = read_json(run_dir / f"seed_{k}" / "summary.json")
        assert member["status"] == "crashed" and member["error"] == "KeyboardInterrupt", member
    assert read_wandb_run(run_dir / "seed_0")["exit_code"] == 1  # closed, not left to W&B's exit hook
    assert not (run_dir / LOCK).exists()


def test_ctrl_c_in_a_packed_grid_records_every_cell_of_the_pack_crashed(tmp_path):
    """The packed launcher (in this process: n_jobs=1): one SIGINT while a pack of two cells trains
    stops it at the next env step; both cells' and all their members' summaries say KeyboardInterrupt,
    the W&B runs that opened are closed, and no lock is left."""
    sweep = tmp_path / "sweep"
    args = [
        "+experiment=stability_grid_small",
        *BUDGET[1:],
        "total_steps=200000",
        "activation=relu",
        "clipping=none",
        "init=he,xavier",
        "hydra/launcher=rlexp_packed",
        "hydra.launcher.n_jobs=1",
        "logger.mode=offline",
        f"hydra.sweep.dir={sweep}",
    ]
    proc = interrupt_when(Launch(args, tmp_path), logged(lambda: list(sweep.glob("*/seed_*/metrics.jsonl")), 4))
    assert proc.returncode != 0, describe(proc)
    assert "interrupt: the job stops at its next env step" in proc.stderr, describe(proc)
    cells = sorted(d for d in sweep.iterdir() if d.is_dir() and d.name.isdigit())
    assert len(cells) == 2, cells
    for cell in cells:
        job = check_crashed_job(cell, "KeyboardInterrupt", wandb=cell == cells[0])  # its W&B runs closed
        assert job["error"] == "KeyboardInterrupt" and job["packed_with"] == 2, job
        assert not (cell / LOCK).exists()


# ====================================================================== resources, before any work
def test_more_members_than_open_files_allow_are_refused_naming_the_largest_that_fits(tmp_path):
    limit = 256  # the child's soft limit; W&B offline: metrics.jsonl and a W&B connection per member
    fits = (limit - FILES_RESERVED) // 2
    run_dir = tmp_path / "run"

    def lower_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    args = [*BUDGET, "num_seeds=500", "logger.mode=offline", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(
        [sys.executable, "-m", "rlexp.train", *args],
        cwd=ROOT,
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lower_limit,
    )
    assert proc.returncode == 2, describe(proc)
    lines = message_lines(proc)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, describe(proc)
    assert lines[0] == (
        f"config error: num_seeds: 500 needs ~{FILES_RESERVED + 1000} open files (2 per member; limit {limit}); "
        f"the largest that fits is {fits}; lower num_seeds or raise the limit (ulimit -n)"
    ), lines
    assert not (run_dir / "summary.json").exists() and not list(run_dir.glob("seed_*"))


# ====================================================================== a crash's clean-up
def test_a_crash_stops_every_thread_and_closes_every_wandb_run(tmp_path, monkeypatch):
    """A crash at the first step, while the W&B runs of 20 members are still opening one by one: the
    run opening then is closed, the ones queued are never opened, no thread of the job is left."""
    for name in ("CONFIG", "CACHE", "DATA", "ARTIFACT"):
        monkeypatch.setenv(f"WANDB_{name}_DIR", str(tmp_path / "wandb_home" / name.lower()))
    before = set(threading.enumerate())
    members, run_dir = 20, tmp_path / "run"
    overrides = [*BUDGET[:-1], "logger.progress=rich", f"num_seeds={members}", "logger.mode=offline"]
    with pytest.raises(RuntimeError, match="a forced crash at env step 1"):
        run_job(compose_config([*overrides, "debug.crash_at_step=0"]), run_dir)
    # W&B's own service threads (one set per process, started with the first run) may stay
    new = set(threading.enumerate()) - before
    left = [t for t in new if t.is_alive() and not t.name.startswith(("wandb-", "Otel"))]
    assert not left, left
    job = read_json(run_dir / "summary.json")
    assert job["status"] == "crashed" and job["counts"]["crashed"] == members
    opened = [k for k in range(members) if list((run_dir / f"seed_{k}" / "wandb").glob("offline-run-*"))]
    assert 0 in opened and len(opened) < members  # ~0.1 s per run: the queue was cancelled, not worked off
    for k in opened:
        assert read_wandb_run(run_dir / f"seed_{k}")["exit_code"] == 1


# ====================================================================== W&B online without a server
def silent_server() -> tuple[socket.socket, str]:
    """A loopback socket that accepts connections (the kernel's backlog) and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    return server, f"http://127.0.0.1:{server.getsockname()[1]}"


def refusing_server() -> tuple[socket.socket, str]:
    """A closed loopback port: every connection is refused."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()
    return server, url


def run_online_without(server: Callable[[], tuple[socket.socket, str]], tmp: Path, timeout: float) -> tuple:
    """A CLI job with W&B online against ``server`` (the socket closed afterwards): (result, wall s, url)."""
    sock, url = server()
    args = [*BUDGET, "num_seeds=2", "logger.mode=online", f"logger.init_timeout={timeout}"]
    args.append(f"hydra.run.dir={tmp / 'run'}")
    start = time.monotonic()
    try:
        proc = run_cli(args, tmp, WANDB_BASE_URL=url, WANDB_API_KEY="x" * 40)
    finally:
        sock.close()
    return proc, time.monotonic() - start, url


def test_wandb_online_without_a_server_logs_offline_without_holding_the_job(tmp_path):
    """A server that accepts and never answers, and one that refuses (both jobs at once): the first
    failure switches the whole job to offline, said in one line, within the bound of one timeout."""
    timeout = 3
    with ThreadPoolExecutor(2) as pool:
        runs = {
            name: pool.submit(run_online_without, server, tmp_path / name, timeout)
            for name, server in (("silent", silent_server), ("refusing", refusing_server))
        }
    for name, run in runs.items():
        proc, wall, url = run.result()
        run_dir = tmp_path / name / "run"
        assert proc.returncode == 0, describe(proc)
        assert wall < timeout + 30, describe(proc)  # a bound on waiting for the network, not a speed test
        said = [line for line in proc.stderr.splitlines() if line.startswith("W&B:")]
        assert len(said) == 1 and said[0].startswith(f"W&B: {url} unreachable ("), describe(proc)
        assert said[0].endswith(f"logging offline — sync later with: wandb sync {run_dir}/seed_*/wandb/offline-run-*")
        check_finished_job(run_dir, wandb=True)  # each member: one offline run, finished
        for k in range(2):
            assert not list((run_dir / f"seed_{k}" / "wandb").glob("run-*"))  # no stray online run dir
