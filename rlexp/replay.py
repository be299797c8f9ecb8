"""``python -m rlexp.replay <run dir> seed=<k> | member=<i> [anomaly=true] [out=<dir>]``: replay one member.

The job's population is trained again, of its original shape (every member, the job's config from its
``summary.json``, the torch threads it ran with), so member k's arithmetic is bit for bit the
original's (batched kernels may round a member differently in a population of another size). Only
member k's files are kept, in ``<run dir>/replay_seed_<seed>/`` (``replay_seed_<seed>_<n>/`` for the n-th
replay of that seed: none overwrites another; or ``out``, which must hold no earlier replay), and the
replay stops at the member's divergence:

- ``metrics.jsonl`` and ``summary.json``: as the original's (the instruments at their original
  ``diagnostics.every`` cadence, the divergence checks on the same records), so the records are
  bitwise the original's up to the divergence (``perf/`` aside);
- ``instruments.jsonl``: every instrument at every update, one line each
  (``{"step", "update", <instrument>: value, ...}``): the climb to the divergence at full resolution;
- ``anomaly.txt`` (``anomaly=true``): a second pass runs the divergence's env step under
  ``torch.autograd.detect_anomaly`` for member k alone (``MemberAnomaly``): the backward function
  whose output first holds a non-finite value of member k's, and the forward call that made it.

Instruments only read: they change neither training's arithmetic nor its random streams. The
replay prints the member's divergence (step, cause, place) and whether it reproduces the original's.
Exit code 0 when it reproduces, 1 when it differs, 2 for bad input.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from rlexp.compose.plugins import load_plugins
from rlexp.compose.registry import job_config
from rlexp.config.schema import ConfigError
from rlexp.diagnostics.instruments import resolve
from rlexp.run.context import Algorithm, RunContext
from rlexp.run.jobs import inspect_job
from rlexp.run.recorder import Job, Recorder

OUTPUTS = ("summary.json", "metrics.jsonl", "instruments.jsonl", "anomaly.txt")  # a replay dir's files
KEYS = {"seed": "the member's seed", "member": "the member's index", "anomaly": "true|false", "out": "a dir"}


class MemberAnomaly:
    """``torch.autograd.detect_anomaly`` for one member of a population: while active, forward calls
    keep their tracebacks (anomaly mode without its NaN check) and every ``backward`` hooks its graph's
    functions; the first function whose inputs' gradients are finite for member ``member`` and whose
    outputs are not is ``found``: (its name, the traceback of the forward call that made it). Other
    members' non-finite values (a population on the brink has several) are not looked at."""

    def __init__(self, member: int, members: int) -> None:
        self.member, self.members = member, members
        self.found: tuple[str, list[str]] | None = None
        self._handles: list[Any] = []

    def _finite(self, grads: tuple[torch.Tensor | None, ...]) -> bool:
        """Member ``member``'s part ([P, ...] tensors: row ``member``; others: all) of ``grads`` is finite."""
        for g in grads:
            if g is not None:
                mine = g[self.member] if g.dim() and g.shape[0] == self.members else g
                if not bool(torch.isfinite(mine).all()):
                    return False
        return True

    def _hook(self, node: Any) -> Callable[..., None]:
        def check(grad_inputs: tuple[torch.Tensor | None, ...], grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            if self.found is None and self._finite(grad_outputs) and not self._finite(grad_inputs):
                self.found = (node.name(), list(node.metadata.get("traceback_", [])))

        return check

    def _hook_graph(self, root: Any) -> None:
        seen, stack = set(), [root]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            self._handles.append(node.register_hook(self._hook(node)))
            stack.extend(child for child, _ in node.next_functions)

    def __enter__(self) -> MemberAnomaly:
        with warnings.catch_warnings():  # its note that anomaly mode is slow
            warnings.filterwarnings("ignore", "Anomaly Detection has been enabled")
            self._anomaly = torch.autograd.detect_anomaly(check_nan=False)
        self._anomaly.__enter__()
        self._backward = backward = torch.Tensor.backward

        def hooked(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            if tensor.grad_fn is not None:
                self._hook_graph(tensor.grad_fn)
            backward(tensor, *args, **kwargs)

        torch.Tensor.backward = hooked
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.Tensor.backward = self._backward
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._anomaly.__exit__(*exc)


class ReplayRecorder(Recorder):
    """The recorder of a replay: instruments at every update (member ``member``'s written to
    ``instruments.jsonl``), the original's cadence for everything else; the steps end once the member
    is finished; with ``anomaly_step`` they end after that env step, which runs under ``anomaly``."""

    def __init__(self, *args: Any, member: int, anomaly_step: int | None = None) -> None:
        super().__init__(*args)
        self.member = member
        self.anomaly_step = anomaly_step
        self.anomaly = MemberAnomaly(member, self.members)
        self.instruments_file: Any = None

    def diagnose(self, update: int) -> bool:
        return True

    def record_instruments(
        self,
        record: dict[str, torch.Tensor],
        step: int,
        grad_norm: torch.Tensor,
        q_abs_max: torch.Tensor,
        reward_scale: Any,
        output_layer: str,
        update: int,
        histograms: Any = None,
    ) -> None:
        diverged_at = int(self.health.diverged_at[self.member])  # -1 while alive
        if self.instruments_file is not None and (diverged_at < 0 or diverged_at == step):  # up to the divergence
            computed = resolve(record)  # every update's record is written here, the deferred ranks too
            names = list(computed)
            values = torch.stack([computed[n] for n in names])[:, self.member].tolist()  # one host read
            line = {"step": step, "update": update}
            line.update({n: v if math.isfinite(v) else str(v) for n, v in zip(names, values)})  # strict JSON
            self.instruments_file.write(json.dumps(line) + "\n")
        if super().diagnose(update):  # the original's record: its checks and its metrics
            super().record_instruments(
                record, step, grad_norm, q_abs_max, reward_scale, output_layer, update, histograms
            )

    def steps(self) -> Iterator[int]:
        for step in super().steps():
            if self.member_done[self.member]:
                return
            if step != self.anomaly_step:
                yield step
                continue
            with self.anomaly:
                yield step
            return


def load_job(run_dir: Path) -> dict[str, Any]:
    """The job summary of ``run_dir``; a ConfigError when it is not a dir or holds no finished job."""
    if not run_dir.is_dir():
        raise ConfigError("run dir", f"{run_dir} is not a directory", "pass the dir of a finished job")
    job, problem = inspect_job(run_dir)
    if job is None:
        why = problem or "it holds no finished job (no summary.json, or crashed)"
        raise ConfigError("run dir", f"{run_dir}: {why}", "pass the dir of a finished job (its summary.json)")
    return job


def replay_config(job: dict[str, Any]) -> DictConfig:
    """The job's config, as the replay runs it: W&B off, no progress bar, the threads the job ran with."""
    load_plugins(job["config"].get("plugins") or ())  # the job's plugins: its options' schemas
    cfg = job_config(job["config"])
    cfg.logger.mode = "disabled"
    cfg.logger.progress = "off"
    if isinstance(job.get("threads"), int):
        cfg.threads = job["threads"]
    return cfg


def run_replay(
    cfg: DictConfig,
    train: Algorithm,
    device: torch.device,
    member: int,
    work_dir: Path,
    anomaly_step: int | None = None,
) -> tuple[ReplayRecorder, str | None]:
    """Train the population of ``cfg`` with ``train`` until member ``member`` is finished, its files (and
    every other member's) under ``work_dir/seed_<k>``; returns the recorder and the error training raised."""
    ctx = RunContext.create(OmegaConf.to_object(cfg), device)
    ctx.recorder = recorder = ReplayRecorder(
        ctx.cfg, ctx.env, ctx.seeds, device, ctx.obs_norm, ctx.reward_norm, ctx.evaluator,
        member=member, anomaly_step=anomaly_step,
    )  # fmt: skip
    error = None
    recorder.open([Job(work_dir, "replay", [], OmegaConf.to_container(cfg, resolve=True), cfg.num_seeds)])
    recorder.instruments_file = open(work_dir / f"seed_{member}" / "instruments.jsonl", "w")
    try:
        train(ctx)
    except Exception as exc:
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    finally:
        recorder.instruments_file.close()
        ctx.env.close()
        recorder.close(error)
    return recorder, error


def anomaly_pass(cfg: DictConfig, train: Algorithm, device: torch.device, member: int, step: int, out_dir: Path) -> str:
    """Replay again up to env step ``step``, which runs under ``MemberAnomaly``; writes ``anomaly.txt``
    (the backward function and its forward call's traceback) and returns a one-line finding."""
    with tempfile.TemporaryDirectory(dir=out_dir) as work:
        recorder, error = run_replay(cfg, train, device, member, Path(work), anomaly_step=step)
    if error is not None:
        return f"detect_anomaly at step {step}: the training raised {error}"
    if recorder.anomaly.found is None:
        finding = f"detect_anomaly at step {step}: no backward function gave member {member} a non-finite gradient"
        (out_dir / "anomaly.txt").write_text(finding + "\n")
        return finding
    name, trace = recorder.anomaly.found
    lines = [line.strip() for frame in trace for line in frame.splitlines() if line.strip()]
    ours = [n for n, line in enumerate(lines) if line.startswith("File ") and "/rlexp/" in line]
    made = f"{lines[ours[-1]]}: {lines[ours[-1] + 1]}" if ours and ours[-1] + 1 < len(lines) else "(no traceback)"
    finding = f"detect_anomaly at step {step}: {name} gave member {member}'s first non-finite gradient; forward: {made}"
    (out_dir / "anomaly.txt").write_text(f"{finding}\n\nTraceback of the forward call:\n{''.join(trace)}")
    return finding


def compare_metrics(original: Path, replayed: Path) -> tuple[int, str | None]:
    """(records compared, the first difference or None) between two metrics.jsonl files, ``perf/``
    keys aside, over the replay's records."""
    ours = [json.loads(line) for line in replayed.read_text().splitlines()]
    theirs = [json.loads(line) for line in original.read_text().splitlines()]
    for n, (a, b) in enumerate(zip(ours, theirs)):
        a = {k: v for k, v in a.items() if not k.startswith("perf/")}
        b = {k: v for k, v in b.items() if not k.startswith("perf/")}
        if a != b:
            key = next((k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)), "?")
            return n, f"record {n + 1} (step {b.get('step')}): {key} {b.get(key)!r} in the original, {a.get(key)!r}"
    if len(ours) > len(theirs):
        return len(theirs), f"the replay has {len(ours) - len(theirs)} records more"
    return len(ours), None


def describe(member: dict[str, Any]) -> str:
    """'diverged at step s: cause in where (detail)' or 'did not diverge (status)'."""
    div = member.get("divergence")
    if not div:
        return f"did not diverge ({member['status']}, {member['steps']} steps)"
    return f"diverged at step {member['diverged_at_step']}: {div['cause']} in {div['where']} ({div['detail']})"


def parse(argv: list[str]) -> tuple[Path, dict[str, str]]:
    """(the run dir, {key: value}) of the command line; a ConfigError naming a bad argument."""
    usage = "python -m rlexp.replay <run dir> seed=<k> | member=<i> [anomaly=true] [out=<dir>]"
    if not argv or "=" in argv[0]:
        raise ConfigError("run dir", "missing", f"usage: {usage}")
    options = {}
    for arg in argv[1:]:
        key, sep, value = arg.partition("=")
        if not sep or key not in KEYS:
            raise ConfigError(key, f"unknown argument {arg!r}", f"usage: {usage}")
        options[key] = value
    if ("seed" in options) == ("member" in options):
        given = "both seed and member" if "seed" in options else "neither seed nor member"
        raise ConfigError("seed", f"{given} given", "give one of seed=<k>, member=<i>")
    return Path(argv[0]), options


def member_index(job: dict[str, Any], options: dict[str, str]) -> int:
    """The member index that ``seed=`` or ``member=`` names; a ConfigError when it names none."""
    key = "seed" if "seed" in options else "member"
    first, count = job["seed"], job["num_seeds"]
    fits = f"a seed of {first}..{first + count - 1}" if key == "seed" else f"a member of 0..{count - 1}"
    try:
        index = int(options[key]) - (first if key == "seed" else 0)
    except ValueError:
        index = -1
    if not 0 <= index < count:
        raise ConfigError(key, f"{options[key]!r} is not {fits} (the job's)", f"set {key} to {fits}")
    return index


def holds_replay(path: Path) -> bool:
    """True when ``path`` holds a replay's files."""
    return any((path / name).exists() for name in OUTPUTS)


def replay_dir(run_dir: Path, seed: int, out: str | None) -> Path:
    """Where a replay of ``seed`` keeps its files: ``out``, refused (ConfigError) when it holds an earlier
    replay's; else ``<run dir>/replay_seed_<seed>/``, or when that holds an earlier replay, the first
    ``replay_seed_<seed>_<n>/`` (n = 2, 3, …) that holds none: no replay overwrites another."""
    if out is not None:
        if holds_replay(Path(out)):
            raise ConfigError("out", f"{out} holds an earlier replay", "set out to another directory, or remove it")
        return Path(out)
    path, n = run_dir / f"replay_seed_{seed}", 1
    while holds_replay(path):
        n += 1
        path = run_dir / f"replay_seed_{seed}_{n}"
    return path


def main(argv: list[str] | None = None) -> int:
    from rlexp.train import prepare  # the entry point's: imports the algorithms, registers the config

    args = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(args):  # usage, as every command gives it: plain text, exit 0
        print(__doc__.replace("``", ""))
        return 0
    try:
        run_dir, options = parse(args)
        job = load_job(run_dir)
        member = member_index(job, options)
        anomaly = options.get("anomaly", "false").lower()
        if anomaly not in ("true", "false"):
            raise ConfigError("anomaly", f"{options['anomaly']!r} is not true or false", "set anomaly=true or false")
        seed = job["seed"] + member
        out_dir = replay_dir(run_dir, seed, options.get("out"))
        cfg = replay_config(job)
        train, device = prepare(cfg)  # the entry point's validation and process state
        out_dir.mkdir(parents=True, exist_ok=True)
    except (ConfigError, OSError) as err:
        print(err if isinstance(err, ConfigError) else f"replay: {err}", file=sys.stderr)
        return 2
    original = job["members"][member]
    print(f"replay: seed {seed} (member {member} of {job['num_seeds']}) of {run_dir}", flush=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as work:
        recorder, error = run_replay(cfg, train, device, member, Path(work))
        for path in (Path(work) / f"seed_{member}").iterdir():
            shutil.move(path, out_dir / path.name)
    if error is not None:
        print(f"replay: the training raised {error}", file=sys.stderr)
        return 1
    replayed = recorder.member_summaries[member]
    print(f"replay: {describe(replayed)}")
    same = all(replayed.get(k) == original.get(k) for k in ("status", "diverged_at_step", "steps")) and all(
        (replayed.get("divergence") or {}).get(k) == (original.get("divergence") or {}).get(k)
        for k in ("cause", "where")
    )
    records, difference = compare_metrics(run_dir / f"seed_{member}" / "metrics.jsonl", out_dir / "metrics.jsonl")
    if same and difference is None:
        print(f"replay: reproduced; metrics.jsonl bitwise the original's in all {records} records (perf/ aside)")
    else:
        print(f"replay: differs from the original, which {describe(original)}")
        if difference:
            print(f"replay: metrics.jsonl equal in {records} records, then {difference}")
    step = replayed.get("diverged_at_step")
    if anomaly == "true" and step is not None:
        print(f"replay: {anomaly_pass(cfg, train, device, member, step, out_dir)}", flush=True)
    print(f"replay: files in {out_dir}")
    return 0 if same and difference is None else 1


if __name__ == "__main__":
    sys.exit(main())
