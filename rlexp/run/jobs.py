"""A job's directory: one writer, finished or not, resume, refusal, corruption, crash records.

A job holds an exclusive lock on its dir (``.lock``, ``hold_dir``) from before it moves or writes
anything until it ends; a second process aiming at the same dir is refused. A job dir is *finished*
when its ``summary.json`` says ``ok`` or ``diverged`` and it and its members' files are intact.
Starting a job there is refused unless ``resume=true``, which returns the recorded summary and
touches no file (Hydra skips its ``.hydra/`` record there too: see ``hydra_subdir``). An earlier
attempt that did not finish (interrupted, killed, crashed) or whose files are corrupt loses nothing:
its files move into ``attempt_<n>/`` before the job starts again (its W&B runs renamed ``attempt-<name>``,
so that syncing never uploads them). A Ctrl-C or a SIGTERM while a job trains stops it between two env
steps and waits for its summaries (``DeferredInterrupts``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import traceback
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import MISSING, DictConfig

from rlexp.config.schema import NON_CELL_KEYS, SEED_KEYS, Config, ConfigError

FINISHED = ("ok", "diverged")
STATUSES = (*FINISHED, "crashed")
HYDRA_SUBDIR = ".hydra"
LOCK = ".lock"
CORRUPT = "corrupt.txt"
ATTEMPT = re.compile(r"attempt_(\d+)")
# an aside attempt's W&B run dir is renamed <ASIDE><name>: neither the documented sync glob
# (seed_*/wandb/offline-run-*) nor `wandb sync`, which skips dirs not named offline-*, uploads it
ASIDE = "attempt-"
WANDB_RUN = re.compile(r"(offline-)?run-.*")
# keys that may differ between a finished job and its resumption: they pick the machine or the console
RESUME_IGNORES = tuple(key for key in NON_CELL_KEYS if key not in (*SEED_KEYS, "checkpoint.replay"))
# keys a member's summary.json always holds (docs/outputs.md): without one it is corrupt
MEMBER_KEYS = (
    "status", "seed", "member", "steps", "final_return", "episodes", "wall_s", "diverged_at_step", "divergence",
)  # fmt: skip
_ABSENT = "<absent>"
RESERVE = 1 << 20  # bytes a job keeps in its lock for its crash record: ~1500 members' summaries
_TERMINATED = threading.Event()  # a SIGTERM reached this process (a launcher's, or one of its workers)
_HELD: dict[Path, int] = {}  # job dir (resolved) -> the descriptor of its .lock, locked by this process


class DiskFull(CompactHydraException):
    """A write that failed for want of space (ENOSPC, or EDQUOT: a quota): one line naming the file. A job
    that meets it is recorded crashed with it as the error (``RESERVE`` makes room for that record)."""

    def __init__(self, path: Path, exc: BaseException | None = None) -> None:
        cause = _space_error(exc) if exc is not None else None
        code = errno.errorcode.get(cause.errno, "ENOSPC") if cause is not None and cause.errno else "ENOSPC"
        super().__init__(
            f"disk full: cannot write {path}: {code} ({os.strerror(getattr(errno, code))}); free space on its "
            "filesystem, then resume=true runs the job again"
        )
        self.path = path


def _space_error(exc: BaseException | None) -> OSError | None:
    """The OSError for want of space in ``exc``'s chain (its causes and contexts), if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


@contextlib.contextmanager
def space_checked(path: Path):
    """Raise DiskFull naming ``path`` for an error for want of space in the block (also one deep in a
    library's chain, e.g. torch's zip writer's ``unexpected pos``)."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as exc:
        if _space_error(exc) is None:
            raise
        raise DiskFull(path, exc) from exc


def write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a reader (or a resume after a kill) sees all of it or none,
    and a failed write leaves no part of it (DiskFull when for want of space)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with space_checked(path):
            tmp.write_bytes(data)
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON atomically (``write_file``)."""
    write_file(path, (json.dumps(obj, indent=2, default=str) + "\n").encode())


# ---------------------------------------------------------------- one writer per job dir
def _unwritable(path: Path, exc: OSError, dir_key: str) -> ConfigError:
    code = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno is not None else type(exc).__name__
    return ConfigError(
        dir_key,
        f"cannot create or write {path}: {code} ({exc.strerror or exc})",
        f"set {dir_key} to a directory this process can create and write",
    )


def _holder(fd: int) -> str:
    """Who holds the lock whose file is open as ``fd``: the pid and host it wrote there, or 'another
    process' while the file says nothing yet, or still names a dead process of this host (a new holder
    has taken the lock over and not written yet)."""
    try:
        held = json.loads(os.pread(fd, 4096, 0).split(b"\0", 1)[0])  # the reserve's zeros follow
        pid, host = int(held["pid"]), str(held["host"])
    except (OSError, ValueError, TypeError, KeyError):
        return "another process"
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "another process"
        except PermissionError:  # alive, another user's
            pass
    return f"pid {pid} on host {host}"


def _same_file(fd: int, path: Path) -> bool:
    """True when ``path`` still names the file open as ``fd`` (a releasing holder removes it)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def hold_dir(out_dir: Path, dir_key: str | None = None, holder: str = "job", reserve: bool = False) -> None:
    """Take this process's exclusive lock on the job dir ``out_dir`` (made if missing), for the job's lifetime
    (a multirun holds its sweep dir so: ``holder`` names what holds it in the refusal).

    The lock is ``flock`` on ``<out_dir>/.lock``, which then holds ``{"pid": …, "host": …}`` (and with
    ``reserve``, zeros up to ``RESERVE`` bytes: room for the job's crash record on a full disk, given back
    by ``free_reserve``). The kernel drops it when the holder dies, so a lock left by a killed job is taken
    over (its file's old content is overwritten). Holding it already: nothing. A ConfigError at ``dir_key``
    (default: the key that picks this job's dir) when another live process holds it, naming that process,
    or when the dir cannot be made or written, naming the errno; DiskFull when there is no room for it.
    """
    path = out_dir.resolve()
    if path in _HELD:
        return
    dir_key = dir_key or _dir_key()
    try:
        path.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _same_file(fd, path / LOCK):
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode(), 0)
                    if reserve:
                        _reserve(fd)
                    break
            except BlockingIOError:
                who = _holder(fd)
                os.close(fd)
                raise ConfigError(
                    dir_key,
                    f"{out_dir} is in use by {who} (it holds {out_dir / LOCK})",
                    f"wait for that {holder} to end, or set {dir_key} to another directory",
                ) from None
            except BaseException as exc:
                if _space_error(exc) is not None and _same_file(fd, path / LOCK):
                    os.unlink(path / LOCK)  # locked by us: no one else's
                os.close(fd)
                raise
            os.close(fd)  # its holder removed the file between our open and our lock: lock the new one
    except OSError as exc:
        if _space_error(exc) is not None:
            raise DiskFull(path / LOCK, exc) from None
        raise _unwritable(out_dir, exc, dir_key) from None
    _HELD[path] = fd


def _reserve(fd: int) -> None:
    """Extend the lock file ``fd`` to ``RESERVE`` bytes, allocated; nothing on a filesystem that cannot
    allocate ahead (EOPNOTSUPP, EINVAL): a job there keeps no room. Raises for want of space."""
    try:
        os.posix_fallocate(fd, 0, RESERVE)
    except OSError as exc:
        if _space_error(exc) is not None:
            raise


def free_reserve(out_dir: Path) -> None:
    """Give back the room ``hold_dir`` reserved in ``out_dir``'s lock (nothing when none): before a crash
    record, which a full disk may otherwise refuse."""
    fd = _HELD.get(out_dir.resolve())
    if fd is not None:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, len(os.pread(fd, 4096, 0).split(b"\0", 1)[0]))


def release_dir(out_dir: Path) -> None:
    """Drop this process's lock on ``out_dir`` and remove its ``.lock`` (nothing when it holds none)."""
    path = out_dir.resolve()
    fd = _HELD.pop(path, None)
    if fd is None:
        return
    try:
        with contextlib.suppress(OSError):
            (path / LOCK).unlink()  # while still locked: whoever locks next makes a fresh file
    finally:
        os.close(fd)


def check_writable(out_dir: Path, dir_key: str) -> None:
    """Make ``out_dir`` if missing and write (then remove) an empty file there; a ConfigError at ``dir_key``
    naming the dir and the errno when that fails."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write_check"):
            pass
    except OSError as exc:
        raise _unwritable(out_dir, exc, dir_key) from None


def refuse(check: Callable[[], None]) -> None:
    """Run ``check``; a ConfigError is printed as its one line and the process exits with code 2 (a DiskFull:
    with code 1)."""
    try:
        check()
    except (ConfigError, DiskFull) as err:
        print(err, file=sys.stderr)
        raise SystemExit(2 if isinstance(err, ConfigError) else 1) from None


class JobDirCheck(Callback):
    """Hydra callback, before Hydra makes or writes a single run's dir: the run takes its lock (``hold_dir``;
    a multirun claims its sweep dir: ``rlexp.run.sweep.SweepClaim``). A refusal is one line and exit code 2."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse(lambda: hold_dir(Path(config.hydra.run.dir), "hydra.run.dir", reserve=True))


# ---------------------------------------------------------------- finished, unfinished or corrupt
def _json_kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")


def _read_object(path: Path, keys: Sequence[str] = ("status",)) -> tuple[dict[str, Any] | None, str | None]:
    """(the JSON object in ``path``, None), or (None, what is wrong with it): missing, not JSON, not an
    object, missing key <k>, unknown status."""
    try:
        obj = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror})"
    except ValueError as exc:  # cut off, garbage, not UTF-8
        return None, f"not JSON ({exc})"
    if not isinstance(obj, dict):
        return None, f"not an object ({_json_kind(obj)})"
    missing = [key for key in keys if key not in obj]
    if missing:
        return None, f"missing key {', '.join(missing)}"
    if obj["status"] not in STATUSES:
        return None, f"unknown status {obj['status']!r}"
    return obj, None


def _last_line_problem(path: Path) -> str | None:
    """What is wrong with the end of a JSON-lines file: missing, its last line cut off or not a JSON
    object; None when intact (an empty file is)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            tail, start = b"", size
            while start > 0 and b"\n" not in tail[:-1]:  # read back to the line before the last one
                start = max(0, start - 65536)
                f.seek(start)
                tail = f.read(size - start)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if not tail:
        return None
    if not tail.endswith(b"\n"):
        return "last line cut off (no newline at its end)"
    try:
        record = json.loads(tail[:-1].rsplit(b"\n", 1)[-1])
    except ValueError:
        return "last line is not JSON"
    return None if isinstance(record, dict) else "last line is not a JSON object"


def _members_problem(out_dir: Path, job: dict[str, Any]) -> str | None:
    """The first corrupt member file of a finished job, as '<file>: <what is wrong>'; None when all of its
    ``num_seeds`` members' files are intact."""
    seeds = job.get("num_seeds", 0)  # a summary without it names no member files
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 0:
        return f"summary.json: num_seeds is {seeds!r}, not a member count"
    for k in range(seeds):
        for name, problem in (
            ("summary.json", _read_object(out_dir / f"seed_{k}" / "summary.json", MEMBER_KEYS)[1]),
            ("metrics.jsonl", _last_line_problem(out_dir / f"seed_{k}" / "metrics.jsonl")),
        ):
            if problem is not None:
                return f"seed_{k}/{name}: {problem}"
    return None


def inspect_job(out_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The job recorded in ``out_dir``: (its summary, None) when it finished (ok or diverged) and its files
    are intact; (None, None) when it did not finish (no summary.json, or crashed); (None, '<file>: <what
    is wrong>') when its summary.json, or a finished job's member summary or metrics.jsonl, is corrupt."""
    path = out_dir / "summary.json"
    if not path.exists():
        return None, None
    job, problem = _read_object(path)
    if job is None:
        return None, f"summary.json: {problem}"
    if job["status"] not in FINISHED:
        return None, None
    problem = _members_problem(out_dir, job)
    return (None, problem) if problem else (job, None)


def is_finished(out_dir: Path) -> bool:
    """True when ``out_dir`` holds a job whose summary says ok or diverged and whose files are intact."""
    return inspect_job(out_dir)[0] is not None


def hydra_subdir() -> str | None:
    """``hydra.output_subdir`` of a job: ``.hydra``, or None (Hydra writes no config record) when the job's
    dir already holds a finished job, so that neither a resume nor a refusal touches it, or when another
    process holds the dir (the job runner then refuses the job). Hydra asks once it has made the dir and
    before it writes there: the job takes the dir's lock here (``hold_dir``) and its runner releases it."""
    try:
        out_dir = Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # outside a job (--cfg, compose): the output dir is not set
        return HYDRA_SUBDIR
    if _TERMINATED.is_set():  # a worker of a sweep a SIGTERM stopped: the job is not started
        return None
    try:
        hold_dir(out_dir, reserve=True)
    except (ConfigError, DiskFull):  # in use, not writable, full: the runner refuses the job in one line
        return None
    if shutil.disk_usage(out_dir).free < RESERVE:  # Hydra's record would be cut short: the runner says why
        return None
    return None if is_finished(out_dir) else HYDRA_SUBDIR


def _dir_key() -> str:
    """The key that picks this job's dir: hydra.sweep.dir in a multirun, else hydra.run.dir."""
    try:
        return "hydra.sweep.dir" if HydraConfig.get().mode == RunMode.MULTIRUN else "hydra.run.dir"
    except Exception:
        return "hydra.run.dir"


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix.rstrip("."): node}
    flat: dict[str, Any] = {}
    for key, value in node.items():
        flat.update(_flatten(value, f"{prefix}{key}."))
    return flat


def schema_default(key: str) -> Any:
    """The default the config schema (``Config``) declares for a dotted key, or ``_ABSENT`` when the key
    has none there (a group option's own key, a key of no field)."""
    node: Any = Config
    value: Any = _ABSENT
    for name in key.split("."):
        if not dataclasses.is_dataclass(node):
            return _ABSENT
        field = next((f for f in dataclasses.fields(node) if f.name == name), None)
        if field is None:
            return _ABSENT
        if field.default is not dataclasses.MISSING and field.default != MISSING:  # MISSING: a group's choice
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            value = _ABSENT
        node = typing.get_type_hints(node)[name] if value is _ABSENT else value
    return value


def config_difference(
    recorded: dict[str, Any], current: dict[str, Any], ignore: Sequence[str] = ()
) -> tuple[str, Any, Any] | None:
    """The first key (dotted) whose value differs between two resolved configs, with both values;
    None when they agree on every key outside ``RESUME_IGNORES`` and ``ignore``. A key the recorded
    config lacks (a job started before rlexp had the option) agrees when the current value is the
    schema's default: a new option's default keeps what the code did without it."""
    old, new = _flatten(recorded), _flatten(current)
    for key in sorted(set(old) | set(new)):
        if any(key == k or key.startswith(f"{k}.") for k in (*RESUME_IGNORES, *ignore)):
            continue
        if key not in old and new[key] == schema_default(key):
            continue
        if old.get(key, _ABSENT) != new.get(key, _ABSENT):
            return key, old.get(key, _ABSENT), new.get(key, _ABSENT)
    return None


def move_aside(out_dir: Path, corrupt: str | None = None) -> Path | None:
    """Move an earlier attempt's files (all but ``.hydra/``, ``.lock`` and earlier attempts) into
    ``out_dir/attempt_<n>/``; returns that dir, or None when there was nothing to move. ``corrupt``
    ('<file>: <what is wrong>') marks a corrupt attempt: it is printed and kept in ``attempt_<n>/corrupt.txt``."""
    if not out_dir.is_dir():
        return None
    entries = list(out_dir.iterdir())
    leftovers = [p for p in entries if p.name not in (HYDRA_SUBDIR, LOCK) and not ATTEMPT.fullmatch(p.name)]
    if not leftovers:
        return None
    n = 1 + max((int(m.group(1)) for p in entries if (m := ATTEMPT.fullmatch(p.name))), default=0)
    dest = out_dir / f"attempt_{n}"
    dest.mkdir()
    for path in leftovers:
        path.rename(dest / path.name)
    set_runs_aside(dest)
    if corrupt is None:
        print(f"{out_dir}: the files of an unfinished earlier attempt moved to {dest.name}/", flush=True)
    else:
        (dest / CORRUPT).write_text(corrupt + "\n")
        file, problem = corrupt.split(": ", 1)
        print(
            f"corrupt: {out_dir / file}: {problem}; the job's files moved to {dest.name}/ ({CORRUPT}) "
            "and the job runs again",
            flush=True,
        )
    return dest


def set_runs_aside(attempt: Path, members: str = "seed_*") -> list[Path]:
    """Rename the W&B runs of an attempt moved aside (``seed_<k>/wandb/offline-run-*`` and ``run-*``) to
    ``attempt-<name>``, W&B's links there (``latest-run``, ``debug.log``) following; returns the renamed dirs.
    ``members``: the member dirs whose runs to rename (a job continued from its checkpoint: one at a time)."""
    renamed = []
    for wandb_dir in attempt.glob(f"{members}/wandb"):
        names = [
            p.name for p in wandb_dir.iterdir() if p.is_dir() and not p.is_symlink() and WANDB_RUN.fullmatch(p.name)
        ]
        for name in names:
            renamed.append((wandb_dir / name).rename(wandb_dir / (ASIDE + name)))
        for link in (p for p in wandb_dir.iterdir() if p.is_symlink()):
            target = os.readlink(link)
            if target.split("/", 1)[0] in names:
                link.unlink()
                link.symlink_to(ASIDE + target)
    return renamed


def job_dirs(root: Path) -> list[Path]:
    """The job dirs of a run or sweep dir: ``[root]`` when it is a job dir (it has ``summary.json``,
    ``.hydra/`` or ``seed_*``), else its children that are, numbered ones first in their order."""

    def is_job(path: Path) -> bool:
        return (path / "summary.json").exists() or (path / HYDRA_SUBDIR).is_dir() or any(path.glob("seed_*"))

    if is_job(root):
        return [root]
    children = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and is_job(p)]
    return sorted(children, key=lambda p: (int(p.name), "") if p.name.isdigit() else (10**9, p.name))


def continue_job(out_dir: Path, step: int) -> None:
    """Prepare an unfinished attempt to continue from its checkpoint at env step ``step``: its crash
    record (``summary.json``, ``error.txt``) moves into ``attempt_<n>/`` and each member's
    ``metrics.jsonl`` keeps the records up to ``step`` (a cut-off last line is dropped)."""
    record = [out_dir / name for name in ("summary.json", "error.txt") if (out_dir / name).exists()]
    moved = ""
    if record:
        n = 1 + max((int(m.group(1)) for p in out_dir.iterdir() if (m := ATTEMPT.fullmatch(p.name))), default=0)
        dest = out_dir / f"attempt_{n}"
        dest.mkdir()
        for path in record:
            path.rename(dest / path.name)
        moved = f"; its crash record moved to {dest.name}/"
    for metrics in out_dir.glob("seed_*/metrics.jsonl"):
        kept = []
        for line in metrics.read_bytes().splitlines(keepends=True):
            try:
                if line.endswith(b"\n") and json.loads(line)["step"] <= step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                pass
        tmp = metrics.with_name(".metrics.jsonl.tmp")
        tmp.write_bytes(b"".join(kept))
        os.replace(tmp, metrics)
    print(f"resume: {out_dir} continues from its checkpoint at env step {step}{moved}", flush=True)


def start_job(
    out_dir: Path,
    config: dict[str, Any],
    resume: bool,
    checkpoint: Callable[[], tuple[int | None, str | None]] | None = None,
) -> dict[str, Any] | None:
    """Prepare ``out_dir`` for a job with the resolved ``config``.

    A finished job there: with ``resume`` its recorded summary (the caller skips the job; a config
    that differs is a ConfigError), without it a ConfigError naming the fixes. Otherwise None, after
    moving an unfinished or corrupt attempt's files aside (a corrupt file named in one printed line).
    With ``resume``, an unfinished attempt with a checkpoint continues instead: ``checkpoint()`` reads
    it and gives (its step, None), (None, None) when there is none, or (None, '<file>: <what is wrong>')
    for a corrupt one; continuing moves only the attempt's crash record aside (``continue_job``).
    The caller holds the dir (``hold_dir``).
    """
    recorded, corrupt = inspect_job(out_dir)
    if recorded is None:
        if resume and corrupt is None and checkpoint is not None:
            step, corrupt = checkpoint()
            if step is not None:
                continue_job(out_dir, step)
                return None
        move_aside(out_dir, corrupt)
        return None
    status, dir_key = recorded["status"], _dir_key()
    if not resume:
        raise ConfigError(
            "resume",
            f"{out_dir} already holds a finished job (status {status})",
            f"pass resume=true to skip finished jobs, or set {dir_key} to a new directory",
        )
    differs = config_difference(recorded.get("config") or {}, config)
    if differs is not None:
        key, old, new = differs
        raise ConfigError(
            key,
            f"the finished job in {out_dir} has {key}={old!r}, this run {new!r}",
            f"resume with the config it was started with, or set {dir_key} to a new directory",
        )
    print(f"resume: {out_dir} is finished (status {status}); kept as recorded", flush=True)
    return recorded


def job_summary(
    config: dict[str, Any],
    cell: str,
    choices: dict[str, str],
    members: list[dict[str, Any]],
    wall_s: float,
    error: str | None,
) -> dict[str, Any]:
    """The job's ``summary.json`` content: status crashed when ``error`` is set, diverged when any
    member diverged, else ok."""
    statuses = [m["status"] for m in members]
    status = "crashed" if error else ("diverged" if "diverged" in statuses else "ok")
    return {
        "status": status,
        "cell": cell,
        "choices": choices,
        "algo": config["algo"]["name"],
        "env": config["env"]["id"],
        "seed": config["seed"],
        "num_seeds": config["num_seeds"],
        "total_steps": config["total_steps"],
        "wall_s": round(wall_s, 3),
        "counts": {s: statuses.count(s) for s in ("ok", "diverged", "crashed")},
        "members": members,
        "error": error,
        "config": config,
    }


def trained_summary(
    config: dict[str, Any],
    cell: str,
    choices: dict[str, str],
    members: list[dict[str, Any]],
    wall_s: float,
    error: str | None,
    first_step_at: str | None,
    threads: int,
) -> dict[str, Any]:
    """``job_summary`` of a job whose trainer ran (alone or in a pack), with the ISO 8601 time of its
    first env step (start-up benchmarks) and the torch threads it ran with."""
    return job_summary(config, cell, choices, members, wall_s, error) | {
        "first_step_at": first_step_at,
        "threads": threads,
    }


def write_traceback(out_dir: Path, text: str) -> None:
    """``error.txt``, the traceback of a job's crash, once the job's reserve is given back
    (``free_reserve``); a disk still too full for it leaves none (the summaries are tried after)."""
    free_reserve(out_dir)
    with contextlib.suppress(DiskFull):
        write_file(out_dir / "error.txt", text.encode())


def record_crash(
    out_dir: Path, config: dict[str, Any], cell: str, choices: dict[str, str], exc: BaseException, wall_s: float
) -> dict[str, Any]:
    """Record a job that raised before its trainer could: ``error.txt`` (the traceback), a crashed
    ``seed_<k>/summary.json`` per member and the job's ``summary.json``; returns the job summary."""
    error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    write_traceback(out_dir, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    members = []
    for k in range(config["num_seeds"]):
        member = {
            "status": "crashed",
            "seed": config["seed"] + k,
            "member": k,
            "steps": 0,
            "final_return": None,
            "episodes": 0,
            "wall_s": round(wall_s, 3),
            "diverged_at_step": None,
            "divergence": None,
            "error": error,
        }
        write_json(out_dir / f"seed_{k}" / "summary.json", member)
        members.append(member)
    job = job_summary(config, cell, choices, members, wall_s, error)
    write_json(out_dir / "summary.json", job)
    return job


class Terminated(KeyboardInterrupt):
    """A SIGTERM (a scheduler's preemption or time limit, ``timeout``, ``docker stop``, a cancelled task):
    a job handles it as a Ctrl-C, and its crash record says ``Terminated: SIGTERM``."""


class DeferredInterrupts:
    """SIGINT and SIGTERM while a job runs (main thread, the default handlers only).

    - Before and after training: the first raises KeyboardInterrupt (``Terminated`` for a SIGTERM) at
      once, as usual.
    - While the algorithm trains (``training``): it is noted (``requested``) and the recorder raises it
      at the next env step, so no call in progress (a W&B message half sent, a lock held, a file half
      written) is cut; a third one while the job has not yet stopped raises at once.
    - While the job is stopping (``stopping``: the clean-up): held back until ``restore`` — after the
      W&B runs are closed and the summaries written — which puts the default handlers back.
    """

    SIGNALS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}  # with their defaults

    def __init__(self) -> None:
        self.stopping = False
        self.training = False
        self.requested = 0  # interrupts noted while training, not yet acted on
        self.deferred = False
        self.terminated = False  # a SIGTERM came: the interruption is recorded as Terminated
        self._installed: dict[signal.Signals, Any] = {}  # signal -> the handler to put back
        if threading.current_thread() is threading.main_thread():
            for signum, default in self.SIGNALS.items():
                handler = signal.getsignal(signum)
                if handler is default or handler is _note_sigterm:  # a worker's between jobs: noted after
                    signal.signal(signum, self._handle)
                    self._installed[signum] = handler

    def interruption(self) -> KeyboardInterrupt:
        """What stops the job: ``Terminated("SIGTERM")`` once a SIGTERM came, else KeyboardInterrupt."""
        return Terminated("SIGTERM") if self.terminated else KeyboardInterrupt()

    def stop_requested(self) -> KeyboardInterrupt | None:
        """The interruption to raise once one asked the training job to stop (the recorder asks at every
        env step), else None."""
        return self.interruption() if self.requested > 0 else None

    def _handle(self, signum: int, frame: Any) -> None:
        self.terminated |= signum == signal.SIGTERM
        if self.stopping:
            if not self.deferred:
                _say("interrupt: finishing the summaries first; the job stops right after")
            self.deferred = True
        elif self.training and self.requested < 2:
            self.requested += 1
            _say(
                "interrupt: the job stops at its next env step"
                if self.requested == 1
                else "interrupt: still stopping; once more stops at once"
            )
        else:
            self.stopping = True
            raise self.interruption()

    def restore(self, raise_deferred: bool) -> None:
        """Put the default handlers back; then raise the interruption deferred (or one noted while training
        that training ended before acting on) when ``raise_deferred`` (no exception is on its way out
        already)."""
        for signum, handler in self._installed.items():
            signal.signal(signum, handler)
        self._installed = {}
        if self.terminated:
            _TERMINATED.set()
        if (self.deferred or self.requested) and raise_deferred:
            raise self.interruption()


class SweepTerminated(CompactHydraException):
    """A job of a sweep whose jobs run in worker processes, stopped by a SIGTERM: recorded crashed when it
    was running, never started when it was queued. An Exception, not a KeyboardInterrupt, so that the
    launcher (joblib) waits for the other workers to record theirs instead of killing them."""


def _note_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM handler of a worker process between jobs: noted; the worker starts no other job."""
    _TERMINATED.set()


def worker_job():
    """Around a job (or a pack) a launcher runs in a worker process (``SweepTerminated``): between jobs the
    worker notes a SIGTERM instead of dying (a worker that dies makes joblib kill the others, still
    recording theirs); a job started after one is not run; a job that recorded one ends as
    ``SweepTerminated``. Outside a worker: nothing."""
    return _worker_job() if multiprocessing.parent_process() is not None else contextlib.nullcontext()


@contextlib.contextmanager
def _worker_job():
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _note_sigterm)
    if _TERMINATED.is_set():
        raise SweepTerminated("terminated (SIGTERM): this job was not started")
    try:
        yield
    except Terminated:
        raise SweepTerminated("terminated (SIGTERM): the job is recorded crashed") from None


def _workers() -> list[int]:
    """The pids of this process's children that a SIGTERM ends (Linux ``/proc``): zombies and those that
    ignore it (joblib's resource tracker, which ends with its parent) left out. Their own children (a W&B
    service) are theirs to end: a job closes its W&B runs before it ends."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != os.getpid() or fields[0] == "Z":
                continue
            ignored = next(ln for ln in (stat.parent / "status").read_text().splitlines() if ln.startswith("SigIgn"))
        except (OSError, IndexError, StopIteration):
            continue
        if not int(ignored.split()[1], 16) >> (signal.SIGTERM - 1) & 1:
            children.append(int(stat.parent.name))
    return children


def forward_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM handler of a launcher's process whose jobs run in worker processes (joblib, packed): pass it
    to each worker (``_workers``; a running job records it, a queued one is not started: ``worker_job``)
    and note it; the launcher then ends as its workers do, and ``sweep_terminated`` says so. A second
    SIGTERM ends this process at once."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _TERMINATED.set()
    _say("terminated (SIGTERM): the running jobs record it, the others are not started")
    for pid in _workers():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def sweep_terminated() -> bool:
    """True once a SIGTERM reached this process (``forward_sigterm``)."""
    return _TERMINATED.is_set()


def _say(line: str) -> None:
    """``line`` on stderr from a signal handler: one write call, never Python's buffered stream (the
    main thread may be inside a write to it)."""
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass
