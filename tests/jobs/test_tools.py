"""Tests of the tools that read a sweep's files: attempts kept out of W&B, ``rlexp.sync``,
``rlexp.check`` and ``rlexp.replay``. The fault table in docs/grids.md names them.

One small sweep (2 jobs of 2 members, W&B offline) is made once per module; a job of it is then
interrupted and resumed, so that it holds an attempt moved aside. Tests that damage files work on
a copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from launching import ROOT, cli_env, describe, read_jsonl, read_wandb_run, run_cli

from rlexp import check, replay
from rlexp.run.jobs import ASIDE

BUDGET = ["total_steps=600", "algo.learning_starts=200", "logger.log_every=300", "logger.progress=off"]


def run_tool(module: str, args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    """``python -m rlexp.<module> <args>`` in a subprocess (W&B offline, its dirs under tmp)."""
    return subprocess.run(
        [sys.executable, "-m", f"rlexp.{module}", *map(str, args)],
        cwd=ROOT,
        env=cli_env(tmp),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A finished sweep of 2 jobs x 2 members whose job 1 was resumed after an unfinished attempt."""
    tmp = tmp_path_factory.mktemp("sweep")
    root = tmp / "sweep"
    args = ["-m", *BUDGET, "num_seeds=2", "activation=relu,tanh", f"hydra.sweep.dir={root}"]
    first = run_cli(args, tmp / "first")
    assert first.returncode == 0, describe(first)
    (root / "1" / "summary.json").unlink()  # job 1 as a kill leaves it: no job summary
    second = run_cli([*args, "resume=true"], tmp / "second")
    assert second.returncode == 0, describe(second)
    assert (root / "1" / "attempt_1").is_dir() and (root / "1" / "summary.json").exists()
    return root


def test_a_finished_grid_run_again_is_one_line_and_no_stale_table(sweep, tmp_path):
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
    args = ["-m", *BUDGET, "num_seeds=2", f"hydra.sweep.dir={sweep}"]
    again = run_cli([*args, "activation=relu,tanh"], tmp_path / "again")
    assert again.returncode == 2 and again.stdout == "", describe(again)
    assert again.stderr == (
        f"config error: resume: {sweep} holds this grid finished (all 2 jobs): nothing to run; read it with "
        f"python -m rlexp.report {sweep}, or set hydra.sweep.dir to a new directory\n"
    )
    more = run_cli([*args, "activation=relu,tanh,elu"], tmp_path / "more")
    assert more.returncode == 2 and more.stdout == "", describe(more)
    assert more.stderr.startswith(f"config error: resume: {sweep} holds 2 finished jobs of this grid's 3; pass resume")
    assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == before


def test_two_sweeps_of_the_same_cells_never_share_a_wandb_group(sweep, tmp_path):
    """Each member run is grouped <sweep>/<cell> and tagged sweep:<sweep>: the module's sweep by its dir's
    default name, another of the same cells at another learning rate by the name it is given."""
    other = tmp_path / "other"
    args = ["-m", *BUDGET, "activation=relu,tanh", "optimizer.lr=1e-4", "logger.sweep=lr_small"]
    done = run_cli([*args, f"hydra.sweep.dir={other}"], tmp_path)
    assert done.returncode == 0, describe(done)
    default = f"sweep-{hashlib.sha1(str(sweep.resolve()).encode()).hexdigest()[:6]}"
    for root, name in ((sweep, default), (other, "lr_small")):
        for job, cell in (("0", "activation=relu"), ("1", "activation=tanh")):
            run = read_wandb_run(root / job / "seed_0")
            assert run["group"] == f"{name}/{cell}" and f"sweep:{name}" in run["tags"], run["group"]
            assert run["config"]["logger"]["sweep"] == name and run["config"]["cell"] == cell


def current_runs(root: Path) -> list[Path]:
    """The offline runs of the latest attempts: <job>/seed_<k>/wandb/offline-run-*."""
    return sorted(root.glob("*/seed_*/wandb/offline-run-*"))


# ====================================================================== attempts stay out of W&B
def test_an_aside_attempts_runs_are_renamed_out_of_the_sync_glob(sweep, tmp_path):
    wandb_dir = sweep / "1" / "attempt_1" / "seed_0" / "wandb"
    aside = sorted(p.name for p in wandb_dir.iterdir() if not p.is_symlink())
    assert any(name.startswith(f"{ASIDE}offline-run-") for name in aside), aside
    assert not any(name.startswith("offline-run-") for name in aside), aside
    assert os.readlink(wandb_dir / "latest-run").startswith(ASIDE) and (wandb_dir / "latest-run").is_dir()
    # the documented glob, even recursively, matches the 4 runs of the latest attempts only
    recursive = sorted(sweep.glob("**/offline-run-*"))
    assert recursive == current_runs(sweep) and len(recursive) == 4, recursive
    # and wandb sync, given the aside attempt's wandb dir, syncs nothing
    proc = subprocess.run(
        [sys.executable, "-m", "wandb", "sync", "--dry-run", str(wandb_dir)],
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "No runs to sync" in proc.stdout + proc.stderr, describe(proc)


def test_sync_uploads_exactly_the_runs_of_finished_jobs(sweep, tmp_path):
    root = tmp_path / "sweep"
    shutil.copytree(sweep, root, symlinks=True)
    shutil.copytree(root / "0", root / "2", symlinks=True)
    (root / "2" / "summary.json").unlink()  # an unfinished job: skipped, named
    proc = run_tool("sync", [root, "--dry-run"], tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert f"skipped: {root / '2'}: not finished" in proc.stdout, describe(proc)
    assert "sync: 4 W&B runs of 2 finished jobs" in proc.stdout, describe(proc)
    listed = re.findall(r"(\S+/run-\w+\.wandb)", proc.stderr + proc.stdout)
    expected = {str(next(run.glob("run-*.wandb"))) for run in current_runs(sweep)}
    assert {str(sweep / Path(p).relative_to(root)) for p in listed} == expected, describe(proc)


def test_sync_refuses_a_path_that_is_not_a_directory(tmp_path):
    proc = run_tool("sync", [tmp_path / "nowhere"], tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", describe(proc)
    line = f"sync: {tmp_path / 'nowhere'} is not a directory; pass a sweep dir or a job's run dir"
    assert proc.stderr.strip() == line, describe(proc)


# ====================================================================== rlexp.check
def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    obj = json.loads(path.read_text())
    change(obj)
    path.write_text(json.dumps(obj))


def keep_lines(path: Path, lines: slice) -> None:
    path.write_text("".join(path.read_text().splitlines(keepends=True)[lines]))


def cut(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def replace_in(path: Path, old: str, new: str) -> None:
    path.write_text(path.read_text().replace(old, new))


def wandb_log(member_dir: Path) -> Path:
    return next(next(member_dir.glob("wandb/offline-run-*")).glob("run-*.wandb"))


# case -> (how the sweep copy is damaged, the file named, what the line says is wrong)
DAMAGES: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "summary_cut": (lambda r: cut(r / "0" / "summary.json"), "0/summary.json", "not JSON ("),
    "summary_key": (lambda r: edit_json(r / "0" / "summary.json", lambda o: o.pop("cell")), "0/summary.json",
                    "missing key cell"),
    "counts": (lambda r: edit_json(r / "1" / "summary.json", lambda o: o["counts"].update(ok=1)), "1/summary.json",
               "counts {'ok': 1,"),
    "member_differs": (lambda r: edit_json(r / "0" / "seed_1" / "summary.json", lambda o: o.update(episodes=0)),
                       "0/seed_1/summary.json", "differs from the job's record of member 1"),
    "member_missing": (lambda r: (r / "1" / "seed_0" / "summary.json").unlink(), "1/seed_0/summary.json", "missing"),
    "metrics_line": (lambda r: (r / "0" / "seed_0" / "metrics.jsonl").write_text('{"st\n{"step": 600}\n'),
                     "0/seed_0/metrics.jsonl", "line 1 is not JSON"),
    "metrics_tail": (lambda r: cut(r / "0" / "seed_1" / "metrics.jsonl", 0.9), "0/seed_1/metrics.jsonl",
                     "last line cut off"),
    "metrics_short": (lambda r: keep_lines(r / "1" / "seed_1" / "metrics.jsonl", slice(0, 1)),
                      "1/seed_1/metrics.jsonl", "ends at step 300, the member's summary says steps 600"),
    "wandb_unfinished": (lambda r: cut(wandb_log(r / "0" / "seed_0"), 0.6), "0/seed_0/wandb/offline-run-",
                         "no exit record (the run never finished)"),
    "wandb_missing": (lambda r: shutil.rmtree(next((r / "1" / "seed_1").glob("wandb/offline-run-*"))),
                      "1/seed_1/wandb", "0 W&B runs, expected 1"),
    "unfinished": (lambda r: (r / "1" / "summary.json").unlink(), "1", "unfinished (no summary.json)"),
    "never_started": (lambda r: shutil.rmtree(r / "1"), "1", "never started (job 1 of the grid: "),
    "another_grids_job": (lambda r: replace_in(r / "1" / ".hydra" / "overrides.yaml", "=tanh", "=softsign"), "1",
                          "ran activation=softsign where the grid's job 1 runs activation=tanh"),
    "attempt_run": (lambda r: [p.rename(p.with_name(p.name.removeprefix(ASIDE)))
                               for p in (r / "1" / "attempt_1").glob(f"seed_0/wandb/{ASIDE}*")],
                    "1/attempt_1/seed_0/wandb/offline-run-", "an attempt moved aside with a run under the sync glob"),
}  # fmt: skip


def test_check_passes_an_intact_sweep(sweep, capsys):
    assert check.main([str(sweep)]) == 0
    assert capsys.readouterr().out == "check: 2 jobs, 2 finished and intact; 0 problems\n"


@pytest.mark.parametrize("case", sorted(DAMAGES))
def test_check_names_each_damaged_file_in_one_line(sweep, tmp_path, capsys, case):
    damage, file, what = DAMAGES[case]
    root = tmp_path / "sweep"
    shutil.copytree(sweep, root, symlinks=True)
    damage(root)
    assert check.main([str(root)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[1].startswith("check: 2 jobs, ") and lines[1].endswith("; 1 problems"), lines
    named, said = lines[0].split(": ", 1) if ": " in lines[0] else (lines[0], "")
    assert named.startswith(str(root / file)) and said.startswith(what), lines


def test_check_names_a_job_dir_that_is_no_job_of_the_grid(sweep, tmp_path, capsys):
    root = tmp_path / "sweep"
    shutil.copytree(sweep, root, symlinks=True)
    shutil.copytree(root / "0", root / "2", symlinks=True)  # a job no multirun of this grid makes
    assert check.main([str(root)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{root / '2'}: no job of the grid {root / 'multirun.yaml'} records",
        "check: 3 jobs, 2 finished and intact; 1 problems",
    ]


def test_check_refuses_a_path_that_is_not_a_sweep(tmp_path):
    proc = run_tool("check", [tmp_path], tmp_path / "home")
    assert proc.returncode == 2 and proc.stdout == "", describe(proc)
    assert proc.stderr.strip() == f"check: {tmp_path} holds no job dir; pass a sweep dir or a job's run dir"


# ====================================================================== rlexp.replay
def without_perf(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith("perf/")}


def test_replay_reproduces_a_members_divergence_bit_for_bit(tmp_path):
    """nan_hunt's 8 members, 1200 steps: the first member to go NaN, replayed alone from the run dir,
    diverges at the same step with the same cause and place, its metrics bitwise the original's, and
    instruments.jsonl holds every update, equal to the original's records where it took them."""
    run_dir = tmp_path / "run"
    first = run_cli(["+experiment=nan_hunt", "total_steps=1200", "logger.mode=disabled", "logger.progress=off",
                     f"hydra.run.dir={run_dir}"], tmp_path / "first")  # fmt: skip
    assert first.returncode == 0, describe(first)
    job = json.loads((run_dir / "summary.json").read_text())
    diverged = [m for m in job["members"] if m["status"] == "diverged"]
    assert diverged, job["counts"]
    original = min(diverged, key=lambda m: m["diverged_at_step"])
    seed, s, div = original["seed"], original["diverged_at_step"], original["divergence"]

    proc = run_tool("replay", [run_dir, f"seed={seed}", "anomaly=true"], tmp_path / "replay")
    assert proc.returncode == 0, describe(proc)
    out = run_dir / f"replay_seed_{seed}"
    assert f"replay: diverged at step {s}: {div['cause']} in {div['where']} ({div['detail']})" in proc.stdout
    assert "replay: reproduced; metrics.jsonl bitwise the original's" in proc.stdout, describe(proc)
    assert sorted(p.name for p in out.iterdir()) == [
        "anomaly.txt",
        "instruments.jsonl",
        "metrics.jsonl",
        "summary.json",
    ]
    replayed = json.loads((out / "summary.json").read_text())
    assert (replayed["diverged_at_step"], replayed["divergence"]["cause"], replayed["divergence"]["where"]) == (
        s, div["cause"], div["where"])  # fmt: skip

    theirs = read_jsonl(run_dir / f"seed_{original['member']}" / "metrics.jsonl")
    ours = read_jsonl(out / "metrics.jsonl")
    assert ours[-1]["step"] >= s and len(ours) == len(theirs)
    assert [without_perf(r) for r in ours] == [without_perf(r) for r in theirs]

    # every update up to the divergence; the original's records (every diagnostics.every) among them
    every = job["config"]["diagnostics"]["every"]
    lines = read_jsonl(out / "instruments.jsonl")
    assert [line["update"] for line in lines] == list(range(len(lines))) and lines[-1]["step"] == s
    assert any(v in ("nan", "inf", "-inf") for v in lines[-1].values()), lines[-1]
    for record in theirs[:-1]:  # log steps before the divergence: their latest record is the original's
        kept = [line for line in lines if line["update"] % every == 0 and line["step"] <= record["step"]]
        names = [k for k in kept[-1] if k not in ("step", "update")] if kept else []
        assert all(record[k] == kept[-1][k] for k in names), record["step"]
    finding = next(line for line in proc.stdout.splitlines() if "detect_anomaly" in line)
    assert finding.startswith(f"replay: detect_anomaly at step {s}: "), finding
    assert f"Backward0 gave member {original['member']}'s first non-finite gradient; forward: File" in finding
    assert "/rlexp/" in finding and (out / "anomaly.txt").read_text().startswith(finding.removeprefix("replay: "))


def test_replay_refuses_a_seed_outside_the_job_in_one_line(sweep, capsys):
    assert replay.main([str(sweep / "0"), "seed=5"]) == 2
    out, err = capsys.readouterr()
    assert (
        out == "" and err == "config error: seed: '5' is not a seed of 0..1 (the job's); set seed to a seed of 0..1\n"
    )
    assert not (sweep / "0" / "replay_seed_5").exists()
