"""Job dirs (rlexp/run/jobs.py): the lock names its holder, a stale lock confuses neither resume nor the
report, finished and corrupt jobs, attempts moved aside, resume refusing a finished job of another
config."""

from __future__ import annotations

import errno
import json
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from composing import compose_config
from launching import (
    file_hashes,
)
from omegaconf import OmegaConf

from rlexp.config.schema import ConfigError
from rlexp.report.main import find_job_dirs, load_job
from rlexp.run.jobs import (
    _ABSENT,
    CORRUPT,
    LOCK,
    RESERVE,
    DiskFull,
    _holder,
    config_difference,
    free_reserve,
    hold_dir,
    inspect_job,
    is_finished,
    move_aside,
    release_dir,
    schema_default,
    space_checked,
    start_job,
    write_json,
)
from rlexp.run.loggers import MemberLog


def make_finished_job(job_dir: Path, seeds: int = 2) -> dict:
    """A finished job's files as the runner writes them: the job's summary, each member's summary and
    metrics.jsonl; returns the job's config."""
    config = OmegaConf.to_container(compose_config([f"num_seeds={seeds}"]), resolve=True)
    members = []
    for k in range(seeds):
        member = {
            "status": "ok",
            "seed": k,
            "member": k,
            "steps": 600,
            "final_return": 21.5,
            "episodes": 30,
            "wall_s": 1.0,
            "diverged_at_step": None,
            "divergence": None,
        }
        write_json(job_dir / f"seed_{k}" / "summary.json", member)
        (job_dir / f"seed_{k}" / "metrics.jsonl").write_text('{"step": 300}\n{"step": 600}\n')
        members.append(member)
    write_json(job_dir / "summary.json", {"status": "ok", "num_seeds": seeds, "members": members, "config": config})
    return config


def cut(path: Path, keep: float = 0.5) -> None:
    """Truncate a file to a fraction of its bytes, as a kill or a full disk mid-write would."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def drop_key(path: Path, key: str) -> None:
    obj = json.loads(path.read_text())
    del obj[key]
    path.write_text(json.dumps(obj))


# case -> (how the file is damaged, the file, what the printed line says is wrong)
CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "truncated": (lambda d: cut(d / "summary.json"), "summary.json", "not JSON"),
    "garbage": (lambda d: (d / "summary.json").write_bytes(b"\x00\xffPK garbage"), "summary.json", "not JSON"),
    "list": (lambda d: (d / "summary.json").write_text("[1, 2]\n"), "summary.json", "not an object (an array)"),
    "missing_status": (lambda d: drop_key(d / "summary.json", "status"), "summary.json", "missing key status"),
    "unknown_status": (
        lambda d: (d / "summary.json").write_text('{"status": "fine"}'),
        "summary.json",
        "unknown status 'fine'",
    ),
    "member_truncated": (lambda d: cut(d / "seed_1" / "summary.json"), "seed_1/summary.json", "not JSON"),
    "member_missing": (lambda d: (d / "seed_1" / "summary.json").unlink(), "seed_1/summary.json", "missing"),
    "member_missing_key": (
        lambda d: drop_key(d / "seed_0" / "summary.json", "steps"),
        "seed_0/summary.json",
        "missing key steps",
    ),
    "metrics_tail": (
        lambda d: (d / "seed_1" / "metrics.jsonl").write_text('{"step": 300}\n{"step": 6'),
        "seed_1/metrics.jsonl",
        "last line cut off",
    ),
    "metrics_tail_garbage": (
        lambda d: (d / "seed_0" / "metrics.jsonl").write_text('{"step": 300}\n{"st\n'),
        "seed_0/metrics.jsonl",
        "last line is not JSON",
    ),
}


# ====================================================================== one writer per job dir
def test_the_lock_names_its_holder_and_is_released(tmp_path):
    job_dir = tmp_path / "run"
    hold_dir(job_dir)
    try:
        hold_dir(job_dir)  # held already by this process: nothing
        held = json.loads((job_dir / LOCK).read_text())
        assert held["pid"] > 0 and held["host"]
    finally:
        release_dir(job_dir)
    assert not (job_dir / LOCK).exists()
    release_dir(job_dir)  # not held: nothing


def test_a_stale_lock_confuses_neither_resume_nor_the_report(tmp_path, capsys):
    config = make_finished_job(tmp_path)
    (tmp_path / LOCK).write_text('{"pid": 999999999, "host": "gone"}')  # left by a killed holder
    assert is_finished(tmp_path)
    assert start_job(tmp_path, config, resume=True)["status"] == "ok"
    assert find_job_dirs(tmp_path) == [tmp_path] and load_job(tmp_path, tmp_path).status == "ok"
    (tmp_path / "seed_0" / "summary.json").unlink()  # now an unfinished attempt: moved aside, the lock stays
    assert move_aside(tmp_path) == tmp_path / "attempt_1"
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK, "attempt_1"]
    assert "resume:" in capsys.readouterr().out


# ====================================================================== a full disk (ENOSPC injected)
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
SAID = "ENOSPC (No space left on device); free space on its filesystem, then resume=true runs the job again"


def test_a_job_reserves_room_for_its_crash_record_in_its_lock(tmp_path, monkeypatch):
    job_dir = tmp_path / "run"
    hold_dir(job_dir, reserve=True)
    try:
        assert (job_dir / LOCK).stat().st_size == RESERVE  # {"pid": …, "host": …}, then zeros
        fd = os.open(job_dir / LOCK, os.O_RDONLY)
        assert _holder(fd) == f"pid {os.getpid()} on host {socket.gethostname()}"  # the zeros are not read
        os.close(fd)
        free_reserve(job_dir)
        assert json.loads((job_dir / LOCK).read_bytes())["pid"] == os.getpid()  # the JSON alone is left
    finally:
        release_dir(job_dir)
    monkeypatch.setattr(os, "posix_fallocate", lambda *a: (_ for _ in ()).throw(ENOSPC))
    with pytest.raises(DiskFull, match=f"^disk full: cannot write {job_dir / LOCK}: {re.escape(SAID)}$"):
        hold_dir(job_dir, reserve=True)
    assert list(job_dir.iterdir()) == []  # no lock left behind, and the dir is not held
    hold_dir(job_dir)
    release_dir(job_dir)


def test_a_file_written_on_a_full_disk_is_named_and_leaves_nothing(tmp_path):
    path = tmp_path / "summary.json"
    (tmp_path / "summary.json.tmp").symlink_to("/dev/full")  # every write there fails with ENOSPC
    with pytest.raises(DiskFull, match=f"^disk full: cannot write {path}: {re.escape(SAID)}$"):
        write_json(path, {"status": "ok"})
    assert list(tmp_path.iterdir()) == []


class HalfWritten:
    """A file whose next write takes half its bytes, then meets a full disk."""

    def __init__(self, file) -> None:
        self.file = file

    def write(self, data: bytes) -> int:
        self.file.write(data[: len(data) // 2])
        raise ENOSPC

    def __getattr__(self, name: str):
        return getattr(self.file, name)


def test_a_metrics_line_cut_by_a_full_disk_is_taken_back(tmp_path):
    log = MemberLog(tmp_path, None)
    log.log(100, {"train/loss": 1.5})
    whole = (tmp_path / "metrics.jsonl").read_bytes()
    log.file = HalfWritten(log.file)
    with pytest.raises(DiskFull, match=f"^disk full: cannot write {tmp_path / 'metrics.jsonl'}: "):
        log.log(200, {"train/loss": 2.5})
    assert (tmp_path / "metrics.jsonl").read_bytes() == whole
    log.file = log.file.file  # space again: the next line follows the last whole one
    log.log(300, {"train/loss": 3.5})
    log.file.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [100, 300]


def test_an_error_for_want_of_space_deep_in_a_chain_is_a_disk_full(tmp_path):
    path = tmp_path / "checkpoint.pt"
    with pytest.raises(DiskFull, match=f"cannot write {path}: ENOSPC") as raised:
        with space_checked(path):
            try:
                raise ENOSPC
            except OSError as exc:
                raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos 633280 vs 633168") from exc
    assert isinstance(raised.value.__cause__, RuntimeError)
    with pytest.raises(OSError, match="Permission denied"), space_checked(path):
        raise PermissionError(errno.EACCES, "Permission denied")  # not for want of space: as it is


# ====================================================================== corrupt files are named, never mistaken
def test_an_intact_finished_job_is_finished(tmp_path):
    make_finished_job(tmp_path)
    job, problem = inspect_job(tmp_path)
    assert job is not None and job["status"] == "ok" and problem is None


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_corrupt_job_is_named_moved_aside_and_run_again(tmp_path, capsys, case):
    damage, file, what = CORRUPTIONS[case]
    config = make_finished_job(tmp_path)
    damage(tmp_path)
    assert not is_finished(tmp_path)
    assert start_job(tmp_path, config, resume=True) is None  # the job runs again
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"corrupt: {tmp_path / file}: {what}"), lines
    assert "attempt_1/" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attempt_1"]
    reason = (tmp_path / "attempt_1" / CORRUPT).read_text()
    assert reason.startswith(f"{file}: {what}") and reason.endswith("\n")
    assert (tmp_path / "attempt_1" / "seed_0").is_dir()  # every file kept


# ====================================================================== job dirs, in process
def test_move_aside_keeps_every_attempt(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / "seed_0").mkdir()
    (tmp_path / "seed_0" / "metrics.jsonl").write_text("first\n")
    assert move_aside(tmp_path) == tmp_path / "attempt_1"
    (tmp_path / "error.txt").write_text("second\n")
    assert move_aside(tmp_path) == tmp_path / "attempt_2"
    assert move_aside(tmp_path) is None
    assert (tmp_path / "attempt_1" / "seed_0" / "metrics.jsonl").read_text() == "first\n"
    assert (tmp_path / "attempt_2" / "error.txt").read_text() == "second\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hydra", "attempt_1", "attempt_2"]


def test_resume_refuses_a_finished_job_of_another_config(tmp_path):
    config = OmegaConf.to_container(compose_config(), resolve=True)
    write_json(tmp_path / "summary.json", {"status": "diverged", "config": config})
    before = file_hashes(tmp_path)
    assert (
        start_job(tmp_path, {**config, "resume": True, "logger": {**config["logger"], "progress": "off"}}, resume=True)[
            "status"
        ]
        == "diverged"
    )
    with pytest.raises(ConfigError, match="total_steps"):
        start_job(tmp_path, {**config, "total_steps": 7}, resume=True)
    with pytest.raises(ConfigError, match="resume=true"):
        start_job(tmp_path, config, resume=False)
    assert file_hashes(tmp_path) == before
    assert config_difference(config, {**config, "algo": {**config["algo"], "gamma": 0.5}})[0] == "algo.gamma"


def test_a_key_the_recorded_job_lacks_agrees_only_at_its_schema_default():
    """A job recorded before an option existed resumes when the option keeps its default (which keeps what
    the code did without it), and not when it is set otherwise."""
    config = OmegaConf.to_container(compose_config(), resolve=True)
    recorded = {**config, "env": {k: v for k, v in config["env"].items() if k != "shift"}}
    assert config["env"]["shift"] == {"kind": "none", "every": 10_000}  # the schema's defaults, written here
    assert config_difference(recorded, config) is None
    shifted = {**config, "env": {**config["env"], "shift": {"kind": "permute_obs", "every": 10_000}}}
    assert config_difference(recorded, shifted) == ("env.shift.kind", _ABSENT, "permute_obs")
    assert schema_default("algo.no_such_key") is _ABSENT  # a key of no schema field is never taken for a default
    assert config_difference({**config, "algo": {}}, config)[0].startswith("algo.")  # an algo's keys do not vanish
