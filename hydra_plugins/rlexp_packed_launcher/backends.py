"""Where a grid's packs run: ``hydra.launcher.backend`` = local | submitit_local | slurm | ray.

A backend runs one function over the packs' tasks, each task where the engine puts it (a joblib worker, a
submitit job, a Ray task), and hands back each task's result in order, or a ``Failure`` naming why the
task gave none (its job was killed, timed out or lost). ``backend(conf, sweep_dir)`` checks the settings
before anything is submitted or written: a ConfigError names the key, the value and the fix. The engines
are used through their own public APIs (joblib, submitit, ray), each imported when a grid uses it.
"""

import contextlib
import difflib
import importlib.util
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf

BACKENDS = ("local", "submitit_local", "slurm", "ray")
EXTRAS = {"local": ("joblib", "joblib"), "submitit_local": ("submitit", "submitit"), "slurm": ("submitit", "submitit"),
          "ray": ("ray", "ray")}  # fmt: skip  # backend -> (the module it needs, the extra that installs it)


@dataclass(frozen=True)
class Failure:
    """A task that gave no result: its cells fail with ``reason`` (one line)."""

    reason: str


class Backend(Protocol):
    name: str
    console: bool  # the tasks' output reaches this process's console (else the launcher prints each cell's line)

    def run(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        """``fn(task)`` for every task, where the engine runs it; each result, or a ``Failure``, in order."""
        ...


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}".rstrip(": ")


@dataclass
class LocalBackend:
    """joblib's loky worker processes on this machine, ``n_jobs`` at once (-1: one per core)."""

    n_jobs: int
    name: str = "local"
    console: bool = True

    def run(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        from joblib import Parallel, delayed

        return list(Parallel(n_jobs=self.n_jobs, backend="loky")(delayed(fn)(task) for task in tasks))


@dataclass
class SubmititBackend:
    """One submitit job per task (an array job of packs), through submitit's AutoExecutor: ``cluster``
    local (every job its own process on this machine) or slurm; submitit's files in ``folder``."""

    cluster: str
    folder: Path
    parameters: dict[str, Any] = field(default_factory=dict)
    name: str = "submitit"
    console: bool = False  # each job's output goes to its log in folder

    def run(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        import submitit

        executor = submitit.AutoExecutor(folder=str(self.folder / "%j"), cluster=self.cluster)  # a dir per job
        executor.update_parameters(**self.parameters)
        jobs = executor.map_array(fn, list(tasks))
        results: list[Any] = []
        for job in jobs:
            try:
                results.append(job.result())
            except Exception as exc:  # killed, timed out, lost: its pack's cells fail, the others go on
                results.append(Failure(f"submitit job {job.job_id}: {_one_line(exc)}"))
        with contextlib.suppress(OSError):
            (self.folder / "%j").rmdir()  # submitit makes the pattern's own dir too, and leaves it empty
        return results


@dataclass
class RayBackend:
    """One Ray task per pack: ``ray.init(**init)`` (unless Ray is running in this process already),
    ``ray.remote(**remote)``."""

    init: dict[str, Any]
    remote: dict[str, Any]
    name: str = "ray"
    console: bool = False

    def run(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        import ray

        started = not ray.is_initialized()
        if started:
            ray.init(**self.init)
        try:
            remote = ray.remote(**self.remote)(fn)
            refs = [remote.remote(task) for task in tasks]
            results: list[Any] = []
            for ref in refs:
                try:
                    results.append(ray.get(ref))
                except Exception as exc:  # a worker lost or killed: its pack's cells fail, the others go on
                    results.append(Failure(f"ray task: {_one_line(exc)}"))
            return results
        finally:
            if started:
                ray.shutdown()


def _plain(node: Any) -> dict[str, Any]:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)


def backend(conf: Any, sweep_dir: Path) -> Backend:
    """The backend ``conf`` (the launcher's config) names, its settings checked; a ConfigError (before
    anything is submitted or written) for an unknown backend, a missing extra, or SLURM settings the
    cluster cannot take."""
    from rlexp.config.schema import ConfigError

    name = conf.backend
    if name not in BACKENDS:
        close = difflib.get_close_matches(str(name), BACKENDS, n=1)
        guess = f"did you mean hydra.launcher.backend={close[0]}? " if close else ""
        raise ConfigError(
            "hydra.launcher.backend", f"unknown backend {name!r}", f"{guess}use one of: {', '.join(BACKENDS)}"
        )
    module, extra = EXTRAS[name]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            "hydra.launcher.backend", f"{name} needs {module}, which is not installed", f"pip install -e '.[{extra}]'"
        )
    if name == "local":
        return LocalBackend(conf.n_jobs)
    if name == "ray":
        ray = _plain(conf.ray)
        return RayBackend(ray["init"], ray["remote"])
    sub = _plain(conf.submitit)
    parameters: dict[str, Any] = {"name": "rlexp_packed", "timeout_min": sub["timeout_min"]}
    parameters["cpus_per_task"] = sub["cpus_per_task"]
    if name == "slurm":
        check_slurm(sub["partition"], sub["require_partition"])
        parameters.update(mem_gb=sub["mem_gb"], nodes=1, tasks_per_node=1, slurm_setup=list(sub["setup"]))
        parameters["slurm_array_parallelism"] = sub["array_parallelism"]
        if sub["partition"] is not None:
            parameters["slurm_partition"] = sub["partition"]
        if sub["account"] is not None:
            parameters["slurm_account"] = sub["account"]
    return SubmititBackend("slurm" if name == "slurm" else "local", sweep_dir / ".submitit", parameters)


def check_slurm(partition: str | None, required: bool) -> None:
    """What can be checked of SLURM settings before submitting: a partition when the user requires one
    (``require_partition``), SLURM's ``sinfo`` on PATH, the partition among those ``sinfo`` lists, and,
    for ``partition=null``, a default partition (marked ``*``) on the cluster; a ConfigError otherwise."""
    from rlexp.config.schema import ConfigError

    key = "hydra.launcher.submitit.partition"
    if partition is None and required:
        raise ConfigError(key, "null, and hydra.launcher.submitit.require_partition is true", f"set {key}=<name>")
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        raise ConfigError(
            "hydra.launcher.backend",
            "slurm needs SLURM's commands, and sinfo is not on PATH",
            "run the grid on a SLURM login node, or use hydra.launcher.backend=submitit_local",
        )
    try:
        listed = subprocess.run([sinfo, "-h", "-o", "%P"], capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError("hydra.launcher.backend", f"slurm: sinfo fails ({_one_line(exc)})", "check SLURM") from None
    names = [line.strip() for line in listed.stdout.split() if line.strip()]
    default = [n.rstrip("*") for n in names if n.endswith("*")]
    partitions = [n.rstrip("*") for n in names]
    if partition is None and not default:
        raise ConfigError(
            key, "null, and the cluster has no default partition", f"set {key} to one of: {', '.join(partitions)}"
        )
    if partition is not None and partition not in partitions:
        raise ConfigError(key, f"unknown partition {partition!r}", f"use one of: {', '.join(partitions)}")
