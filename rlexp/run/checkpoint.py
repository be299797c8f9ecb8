"""Checkpoints: everything a job needs to continue, one file per member (``seed_<k>/checkpoint.pt``).

This module keeps the file format only. Every part with state is ``Stateful``
(``rlexp.config.state``): its ``state_dict()`` gives its state and its ``load_state_dict(state)`` takes
it back, each implemented beside the attributes the part owns. A checkpoint gathers the parts' state
dicts as one flat dict ``{"<part>/<name>": value}`` and splits it per member: a tensor or array with a
leading member dimension [P, ...] and a ``PerMember`` list go entry by entry into the members' files,
a nested dict is split the same way (its shared entries, if any, in every file), and anything else
(counters, a stream's position, a ``Shared`` tensor) belongs to the population and goes into every
file. Loading stacks the members' files back into the population's state, bit for bit, and hands
each part the entries under its name. A file holds tensors, numbers, strings, lists and dicts only:
``torch.load(path, weights_only=True)`` reads it. Files are written atomically (a temporary file, then
a rename). A file of another format (``FORMAT``: the layout of its keys) is refused in one line. A
population of several jobs' members (a pack's cells) writes each job's files as that job would
(``PopulationCheckpoints``).

Parts (``RunContext.checkpoint_state``): the run context's ``torch_rng/`` (torch's global generator),
``env/``, ``streams/``, ``obs_norm/``, ``reward_norm/``, ``evaluator/`` and ``recorder/``, and what the
algorithm hands over: ``<object>/`` for its networks, pipelines (each member's optimizer state),
interventions and, with ``checkpoint.replay``, its replay buffer; ``loop/<name>`` for its loop's
variables. docs/outputs.md#checkpoint lists what each holds.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlexp.config.schema import ConfigError, error_line
from rlexp.config.state import PLAIN, PerMember, Shared, Stateful
from rlexp.run.jobs import config_difference, space_checked

FORMAT = "rlexp-checkpoint/4"
FILE = "checkpoint.pt"
KEYS = ("member", "members", "step", "replay", "config", "state", "shared")  # besides format
# keys that may differ between the job that wrote a checkpoint and the one continuing from it
CONTINUE_IGNORES = ("debug.crash_at_step",)
Loop = Callable[[], dict[str, Any]]  # the algorithm's loop variables, read when a checkpoint is written


class CheckpointError(Exception):
    """A checkpoint that cannot be read: ``<file>: <what is wrong>`` (the file relative to the job dir)."""


# ---------------------------------------------------------------- values in files
def _plain(value: Any) -> Any:
    """``value`` as what ``torch.load(weights_only=True)`` reads: CPU tensors, numbers, strings, lists, dicts."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone(memory_format=torch.contiguous_format)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value)).clone()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, deque)):
        return [_plain(v) for v in value]
    if isinstance(value, PLAIN):
        return value
    raise TypeError(f"a checkpoint cannot hold {type(value).__name__}")


def split(state: dict[str, Any], members: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The population's ``state`` as each member's entries and the shared ones. A nested dict is split
    the same way and leaves its shared part (a dict, maybe empty) in the shared entries, which is how
    ``stack`` tells it from a ``PerMember`` list of dicts."""
    own: list[dict[str, Any]] = [{} for _ in range(members)]
    shared: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, Shared):
            shared[key] = _plain(value.value)
        elif isinstance(value, dict):
            nested, shared[key] = split(value, members)
            for k in range(members):
                own[k][key] = nested[k]
        elif isinstance(value, PerMember) or (isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim >= 1):
            assert len(value) == members, f"{key}: {len(value)} entries for {members} members"
            if isinstance(value, np.ndarray):  # member k's entry of a [P] array stays a (0-dim) tensor
                value = torch.from_numpy(np.ascontiguousarray(value))
            for k in range(members):
                own[k][key] = _plain(value[k])
        else:
            shared[key] = _plain(value)
    return own, shared


def stack(own: list[dict[str, Any]], shared: dict[str, Any]) -> dict[str, Any]:
    """The population's state from each member's entries (tensors stacked, others listed, nested dicts
    stacked the same way) and the shared ones: ``split``'s inverse."""
    state = dict(shared)
    for key in own[0]:
        values = [entries[key] for entries in own]
        if isinstance(shared.get(key), dict):  # a nested dict of the population's
            state[key] = stack(values, shared[key])
        elif all(isinstance(v, torch.Tensor) for v in values):
            state[key] = torch.stack(values)
        else:
            state[key] = values
    return state


def _put(target: torch.Tensor | np.ndarray, value: torch.Tensor) -> None:
    """Copy ``value`` into ``target`` in place (views of it see the change)."""
    if isinstance(target, torch.Tensor):
        with torch.no_grad():
            target.copy_(value.to(target.device))
    else:
        target[...] = value.numpy()


def _prefixed(state: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}


def gather(parts: dict[str, Stateful]) -> dict[str, Any]:
    """The parts' state dicts as one flat dict ``{"<part>/<name>": value}``."""
    return {f"{part}/{name}": value for part, obj in parts.items() for name, value in obj.state_dict().items()}


# ---------------------------------------------------------------- parts of no module of their own
class TorchGenerator:
    """torch's global generator as a part (``torch_rng/``): the population's, in every file."""

    def state_dict(self) -> dict[str, Any]:
        return {"state": Shared(torch.get_rng_state())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["state"])


class LoopState:
    """An algorithm's loop variables as a part (``loop/``): ``read()`` gives them by name at each
    checkpoint; restoring copies arrays and tensors into the current ones in place (so a view [P, ...]
    of a [T, P, ...] array is restored into its array) and keeps the others as saved, in ``restored``."""

    def __init__(self, read: Loop) -> None:
        self.read = read
        self.restored: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return self.read()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.restored = {}
        for name, current in self.read().items():
            value = state[name]
            if isinstance(current, (torch.Tensor, np.ndarray)):
                _put(current, value)
                value = current
            self.restored[name] = value


# ---------------------------------------------------------------- a job's checkpoints
class Checkpoints:
    """A job's checkpoints: where they go (``<job dir>/seed_<k>/checkpoint.pt``), what they hold, and
    the state a continued job starts from (``saved``)."""

    def __init__(self, out_dir: Path, config: dict[str, Any], replay: bool) -> None:
        self.dir = out_dir
        self.members = int(config.get("num_seeds", 0))  # the job's member count
        self.config = config  # the job's resolved config, kept in every file
        self.replay = replay
        self.saved: dict[str, Any] | None = None  # the population's flat state, when continuing
        self.files: tuple[list[dict[str, Any]], dict[str, Any]] | None = None  # read, not stacked (``read``)
        self.step = 0  # the env step (per member) of the checkpoint continued from

    def path(self, member: int) -> Path:
        return self.dir / f"seed_{member}" / FILE

    # ---- writing
    def save(self, step: int, parts: dict[str, Stateful], members: int) -> None:
        """Write each of the ``members``' files of the ``parts``' state at env step ``step``."""
        self.write(step, *split(gather(parts), members))

    def write(self, step: int, own: list[dict[str, Any]], shared: dict[str, Any]) -> None:
        """Write the job's members' files at env step ``step``: member k's ``own[k]`` entries and the
        population's ``shared`` ones."""
        config = json.dumps(self.config)
        members = len(own)
        for k in range(members):
            content = {
                "format": FORMAT,
                "member": k,
                "members": members,
                "step": step,
                "replay": self.replay,
                "config": config,
                "state": own[k],
                "shared": shared,
            }
            path = self.path(k)
            with space_checked(path):  # torch's writer says 'unexpected pos', ENOSPC only in its chain
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{FILE}.")
                try:
                    with os.fdopen(fd, "wb") as f:
                        torch.save(content, f)
                    os.replace(tmp, path)
                except BaseException:
                    Path(tmp).unlink(missing_ok=True)
                    raise

    # ---- reading
    def load(self, members: int) -> int | None:
        """Read the members' files into ``saved``; the step they were written at, or None when there is
        no checkpoint. CheckpointError for a file that is missing (while another member's exists), cut
        off, not a checkpoint, or at another step; ConfigError when they were written with another config."""
        if self.read(members) is None:
            return None
        self.saved = stack(*self.files)
        self.files = None
        return self.step

    def read(self, members: int) -> int | None:
        """``load`` without stacking: the files' entries stay in ``files`` (each member's, the shared ones)."""
        paths = [self.path(k) for k in range(members)]
        if not any(p.exists() for p in paths):
            return None
        found = next(p for p in paths if p.exists())
        first = read(found, self.dir)
        differs = config_difference(json.loads(first["config"]), self.config, CONTINUE_IGNORES)
        if differs is not None:
            key, old, new = differs
            raise ConfigError(
                key,
                f"{found} was written by a job with {key}={old!r}, this run has {new!r}",
                "resume with the config it was started with, or start the job in a new directory",
            )
        contents = [read(p, self.dir) for p in paths]
        for k, content in enumerate(contents):
            name = self.path(k).relative_to(self.dir)
            if content["member"] != k or content["members"] != members:
                written = f"member {content['member']} of {content['members']}"
                raise CheckpointError(f"{name}: {written}, not member {k} of {members}")
            if content["step"] != first["step"]:
                raise CheckpointError(f"{name}: written at step {content['step']}, another member's at {first['step']}")
        self.files = ([c["state"] for c in contents], first["shared"])
        self.step = first["step"]
        return self.step

    def restore(self, parts: dict[str, Stateful]) -> None:
        """Hand each part its entries of ``saved`` (``<part>/<name>`` as ``<name>``), in order."""
        for part, obj in parts.items():
            obj.load_state_dict(_prefixed(self.saved, f"{part}/"))


class PopulationCheckpoints:
    """The checkpoints of a population whose members are one job's or, packed, several jobs' (a pack's
    cells, in member order): each job's members write their own ``seed_<j>/checkpoint.pt`` (member j of
    the job's count, the job's config) as that job alone would, with the population's shared entries.
    ``RunContext.checkpoint_state`` uses it as a job's ``Checkpoints``."""

    def __init__(self, jobs: list[Checkpoints]) -> None:
        """``jobs``: each job's checkpoints; when continuing, each ``read`` at the same step."""
        self.jobs = jobs
        self.policy_only = False
        self.saved: dict[str, Any] | None = None  # the population's flat state, when continuing
        self.step = 0
        read = [job.files for job in jobs if job.files is not None]
        if read:
            assert len(read) == len(jobs) and len({job.step for job in jobs}) == 1, "jobs continue from one step"
            self.saved = stack([own for files in read for own in files[0]], read[0][1])
            self.step = jobs[0].step
            for job in jobs:
                job.files = None

    def save(self, step: int, parts: dict[str, Stateful], members: int) -> None:
        """Write each job's members' files of the ``parts``' state at env step ``step``."""
        own, shared = split(gather(parts), members)
        first = 0
        for job in self.jobs:
            size = job.members
            job.write(step, own[first : first + size], shared)
            first += size
        assert first == members, f"{members} members, the jobs have {first}"

    def restore(self, parts: dict[str, Stateful]) -> None:
        """Hand each part its entries of ``saved`` (``<part>/<name>`` as ``<name>``), in order."""
        for part, obj in parts.items():
            obj.load_state_dict(_prefixed(self.saved, f"{part}/"))


def read(path: Path, job_dir: Path) -> dict[str, Any]:
    """One checkpoint file's content; CheckpointError (``<file>: <what is wrong>``) when it is missing,
    cut off or not a checkpoint; ConfigError for a checkpoint of another format (refused, nothing moved)."""
    name = path.relative_to(job_dir) if path.is_relative_to(job_dir) else path
    try:
        content = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise CheckpointError(f"{name}: missing") from None
    except Exception as exc:  # cut off, garbage, a pickle of something else
        raise CheckpointError(f"{name}: not a readable checkpoint ({error_line(exc)})") from None
    written = content.get("format") if isinstance(content, dict) else None
    if isinstance(written, str) and written.startswith("rlexp-checkpoint/") and written != FORMAT:
        raise ConfigError(
            "resume",
            f"{path} is a checkpoint of format {written!r}, this rlexp reads {FORMAT!r}",
            "start the job afresh without resume=true (its files are moved aside), or in a new directory",
        )
    if written != FORMAT:
        raise CheckpointError(f"{name}: not an rlexp checkpoint (no format {FORMAT!r})")
    missing = [key for key in KEYS if key not in content]
    if missing:
        raise CheckpointError(f"{name}: missing key {', '.join(missing)}")
    return content
