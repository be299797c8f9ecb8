"""Tests of the command line as a process: bad-input errors, the output contract of a real
run (files, console, W&B offline runs read back), W&B mode selection, multiruns and progress output.
(Composition and the same refusals in process: tests/compose/test_options.py.)

Everything that trains runs ``python -m rlexp.train`` in a subprocess with a tiny budget, W&B offline
or disabled (never the network), and every output under pytest's tmp_path. Subprocesses that do not
depend on each other run concurrently to keep the file fast on a small machine.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from launching import (
    CONF,
    Launch,
    describe,
    message_lines,
    read_jsonl,
    read_wandb_run,
    run_cli,
    wandb_run_dir,
)
from omegaconf import OmegaConf

from rlexp.cli import check_command_line
from rlexp.config.cells import cell_name
from rlexp.config.schema import NON_CELL_KEYS, ConfigError

GROUPS = (
    "activation",
    "init",
    "normalization",
    "clipping",
    "optimizer",
    "network",
    "algo",
    "env",
    "divergence",
    "intervention",
)
# A tiny budget (the rest of DQN's defaults are small too) whose cell stays short: rlexp cuts W&B
# groups to 128 characters, and the tests compare the group with the whole cell.
TOTAL_STEPS, LEARNING_STARTS, LOG_EVERY, TRAIN_FREQUENCY = 300, 100, 100, 10
BUDGET = [
    f"total_steps={TOTAL_STEPS}",
    f"algo.learning_starts={LEARNING_STARTS}",
    f"logger.log_every={LOG_EVERY}",
    f"algo.train_frequency={TRAIN_FREQUENCY}",
]


def expected_cell(overrides: Sequence[str]) -> str:
    """A single run's cell: its overrides in their order minus NON_CELL_KEYS, Hydra's and those of its length
    and logging, then its env (the default, cartpole)."""
    length = ("total_steps", "algo.learning_starts", "eval.", "logger.", "diagnostics.")
    kept = [o for o in overrides if not o.startswith(("hydra.", *length)) and o.split("=", 1)[0] not in NON_CELL_KEYS]
    return ",".join([*kept, "env=cartpole"])


def table_rows(stdout: str) -> dict[int, list[str]]:
    """Rows of the console summary table: seed -> the row's cells (box-drawing characters removed)."""
    rows: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        tokens = re.sub(r"[\u2500-\u257f|]", " ", line).split()
        if len(tokens) >= 3 and tokens[0].isdigit() and tokens[1] in ("ok", "diverged", "crashed"):
            rows[int(tokens[0])] = tokens
    return rows


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


# ====================================================================== bad input cases
# case -> (command line, key named first on the error line, other words the line must contain)
HYDRA_REFUSALS = {
    "misspelled_option": (["activation=rleu"], "activation", ["'rleu'", "did you mean activation=relu"]),
    "misspelled_key": (["total_step=1000"], "total_step", ["total_step=1000", "did you mean total_steps=1000?"]),
    "wrong_type_int": (["total_steps=abc"], "total_steps", ["'abc'", "an integer", "default 50000"]),
    "sweep_with_a_misspelled_option": (["-m", "activation=relu,tnh"], "activation", ["did you mean activation=tanh"]),
    "non_ascii_unquoted": (["logger.project=naïve"], "logger.project", ["ASCII", "\"logger.project='naïve'\""]),
}
# the cases run as processes: a single run's composition (Hydra's refusal, then the same line rlexp.cli.
# check_command_line gives in process for the others), the non-ASCII argv, and a multirun's check before Hydra
HYDRA_REFUSALS_AS_PROCESSES = ("misspelled_key", "non_ascii_unquoted", "sweep_with_a_misspelled_option")

# case -> (overrides, key named first on the error line, other words the line must contain)
BAD_VALUES = {
    "lr_negative": (["optimizer.lr=-1"], "optimizer.lr", ["-1"]),
    "lr_zero": (["optimizer.lr=0"], "optimizer.lr", []),
    "num_seeds_zero": (["num_seeds=0"], "num_seeds", []),
    "threads_below_minus_one": (["threads=-2"], "threads", ["-2", "-1 = by population size"]),
    "threads_beyond_the_cores": (["threads=999"], "threads", ["999", f"at most {len(os.sched_getaffinity(0))}"]),
    "network_without_hidden_layers": (["network.hidden=[]"], "network.hidden", ["needs at least one hidden layer"]),
    "tau_zero": (["algo.tau=0"], "algo.tau", []),
    "tau_above_one": (["algo.tau=1.5"], "algo.tau", ["1.5"]),
    "muzero_lite_continuous_actions": (["algo=muzero_lite", "env=pendulum"], "algo", ["continuous action space"]),
    "env_id_typo": (["env.id=CartPole-v9"], "env.id", ["CartPole-v9", "CartPole-v1"]),
    "continuous_env_with_dqn": (["env.id=Pendulum-v1", "algo=dqn"], "algo", ["dqn", "cannot handle", "continuous"]),
    "batch_above_buffer": (["algo.batch_size=2000", "algo.buffer_size=1000"], "algo.batch_size", ["algo.buffer_size"]),
    "learning_starts_at_total": (
        ["total_steps=400", "algo.learning_starts=400"],
        "algo.learning_starts",
        ["total_steps"],
    ),
    "cuda_without_cuda": (["device=cuda"], "device", ["CUDA"]),
    "logger_mode_bogus": (["logger.mode=bogus"], "logger.mode", ["bogus"]),
    "eval_episodes_negative": (["eval.episodes=-1"], "eval.episodes", ["-1"]),
    "redo_tau_above_one": (["intervention=redo", "intervention.tau=1.5"], "intervention.tau", ["1.5", "(0, 1]"]),
    "pbt_fraction_above_half": (["pbt.fraction=0.6"], "pbt.fraction", ["0.6", "(0, 0.5]"]),
    "pbt_factor_not_positive": (["pbt.factors=[0.8,0.0]"], "pbt.factors", ["[0.8, 0.0]", "factors > 0"]),
    "pbt_interval_negative": (["pbt.interval=-1"], "pbt.interval", ["-1", "0 = off"]),
    "pbt_hyperparameter_not_per_member": (
        ["num_seeds=2", "pbt.interval=1000", "pbt.hyperparameters=[algo.gamma]"],
        "pbt.hyperparameters",
        ["'algo.gamma'", "optimizer.lr, algo.exploration_fraction"],
    ),
    "reset_beyond_the_network": (
        ["intervention=reset", "intervention.layers=4"],
        "intervention.layers",
        ["4", "[1, 3]", "3 linear layers"],
    ),
}
# a case also runs as the CLI, as a process: every case takes the same path (rlexp.cli.ConfigCheck, before
# Hydra makes a dir), which the others' tests (tests/compose/test_options.py, the same table) take in process
BAD_VALUES_AS_PROCESSES = ("lr_negative",)


# ====================================================================== the runs that train
SINGLE_LR = 0.005  # not any yaml's default: it must come from the command line
SINGLE_OVERRIDES = [*BUDGET, f"optimizer.lr={SINGLE_LR}", "num_seeds=2", "logger.mode=offline"]
SWEEP = ["activation=relu,tanh", "init=xavier,he"]
RERUN_OVERRIDES = ["num_seeds=1", *BUDGET]
# W&B mode: the single run's explicit logger.mode=offline beats $WANDB_MODE=disabled, which alone (the rerun's
# two runs) disables W&B
ENV_DISABLED = {"WANDB_MODE": "disabled"}


def _run_specs(base: Path) -> dict[str, tuple]:
    """fixture name -> (args, tmp, env) of each CLI run that trains."""
    return {
        "single_run": (
            [*SINGLE_OVERRIDES, f"hydra.run.dir={base / 'single_run' / 'run'}"],
            base / "single_run",
            ENV_DISABLED,
        ),
        "multi_run": (
            ["-m", *SWEEP, *BUDGET, "logger.mode=offline", f"hydra.sweep.dir={base / 'multi_run' / 'multi'}"],
            base / "multi_run",
            {},
        ),
        # the first of two runs into the same run dir
        "rerun_run": (
            [*RERUN_OVERRIDES, f"hydra.run.dir={base / 'rerun_run' / 'run'}"],
            base / "rerun_run",
            ENV_DISABLED,
        ),
    }


@pytest.fixture(scope="module", autouse=True)
def runs(request, tmp_path_factory):
    """Starts, in the background and as soon as the module starts, every CLI run a selected test
    needs, so they overlap with the in-process tests; each test's fixture waits for its run.
    The bad-input calls (short: they stop before training) run two at a time alongside."""
    wanted = {name for item in request.session.items for name in getattr(item, "fixturenames", ())}
    base = tmp_path_factory.mktemp("runs")
    launches = {
        name: (Launch(args, tmp, **env), tmp) for name, (args, tmp, env) in _run_specs(base).items() if name in wanted
    }
    pool = ThreadPoolExecutor(max_workers=2)
    bad = {}
    if "bad_runs" in wanted:
        cases = {k: HYDRA_REFUSALS[k][0] for k in HYDRA_REFUSALS_AS_PROCESSES}
        cases |= {k: BAD_VALUES[k][0] for k in BAD_VALUES_AS_PROCESSES}
        for k, args in cases.items():
            tmp = base / "bad" / k
            dirs = [f"hydra.run.dir={tmp / 'run'}", f"hydra.sweep.dir={tmp / 'run'}"]
            bad[k] = (pool.submit(run_cli, [*args, *dirs], tmp), tmp)
    try:
        yield {**launches, "bad": bad}
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for launch, _ in launches.values():
            launch.stop()


def finished(runs, name: str) -> tuple:
    """Wait for a background run; (process, its dir)."""
    launch, base = runs[name]
    return launch.result(), base


@pytest.fixture(scope="module")
def multi_run(runs):
    return finished(runs, "multi_run")


@pytest.fixture(scope="module")
def rerun_run(runs):
    return finished(runs, "rerun_run")


# ====================================================================== 2./3. bad input on the CLI
@pytest.fixture(scope="module")
def bad_runs(runs):
    """Every bad-input invocation (started with the module): case -> (process, its run dir)."""
    return {k: (future.result(), base / "run") for k, (future, base) in runs["bad"].items()}


def assert_no_training(run_dir: Path) -> None:
    """A refused command line writes nothing: not even Hydra's run dir with its .hydra/ record."""
    assert not run_dir.exists(), sorted(str(p) for p in run_dir.rglob("*"))


def assert_names(line: str, key: str, words: Sequence[str]) -> None:
    assert line.startswith(f"config error: {key}: "), line
    for word in words:
        assert word in line, (word, line)


def assert_refused(proc: subprocess.CompletedProcess, run_dir: Path, key: str, words: Sequence[str]) -> None:
    """A CLI refusal: exit code 2, one line on stderr naming the key (and these words), no traceback, no dir."""
    assert proc.returncode == 2, describe(proc)
    assert "Traceback" not in proc.stdout + proc.stderr, describe(proc)
    lines = message_lines(proc)
    assert len(lines) == 1 and lines[0] in proc.stderr.splitlines(), describe(proc)
    assert_names(lines[0], key, words)
    assert_no_training(run_dir)


@pytest.mark.parametrize("case", HYDRA_REFUSALS_AS_PROCESSES)
def test_hydras_refusals_are_one_line_with_the_fix(bad_runs, case):
    _, key, words = HYDRA_REFUSALS[case]
    assert_refused(*bad_runs[case], key, words)


@pytest.mark.parametrize("case", sorted(set(HYDRA_REFUSALS) - set(HYDRA_REFUSALS_AS_PROCESSES)))
def test_hydras_other_refusals_are_the_line_the_cli_prints(case):
    """The line a refused single run prints (rlexp.train.refuse_or_pass), in process."""
    args, key, words = HYDRA_REFUSALS[case]
    with pytest.raises(ConfigError) as refused:
        check_command_line(args, CONF)
    assert "\n" not in str(refused.value)
    assert_names(str(refused.value), key, words)


@pytest.mark.parametrize("case", BAD_VALUES_AS_PROCESSES)
def test_bad_value_ends_the_cli_with_its_line_and_writes_nothing(bad_runs, case):
    _, key, words = BAD_VALUES[case]
    assert_refused(*bad_runs[case], key, words)


# ====================================================================== 4./7. a real run
@pytest.fixture(scope="module")
def single_run(runs):
    proc, base = finished(runs, "single_run")
    assert proc.returncode == 0, describe(proc)
    run_dir = base / "run"
    job = json.loads((run_dir / "summary.json").read_text())
    return {"proc": proc, "dir": run_dir, "overrides": SINGLE_OVERRIDES, "job": job}


def test_run_job_summary(single_run):
    job, run_dir = single_run["job"], single_run["dir"]
    assert job["status"] == "ok"
    assert job["cell"] == expected_cell(single_run["overrides"])
    assert "num_seeds" not in job["cell"] and "logger.mode" not in job["cell"]
    assert [m["seed"] for m in job["members"]] == [0, 1]
    assert [m["member"] for m in job["members"]] == [0, 1]
    assert job["counts"] == {"ok": 2, "diverged": 0, "crashed": 0}
    assert job["error"] is None
    # the recorded config is Hydra's composed config, with the overrides applied
    hydra_cfg = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=True)
    assert job["config"] == hydra_cfg
    assert job["config"]["optimizer"]["lr"] == SINGLE_LR
    assert job["config"]["total_steps"] == TOTAL_STEPS
    # one choice per config group, consistent with the config's names
    assert set(job["choices"]) == set(GROUPS)
    for group, option in job["choices"].items():
        if group == "env":
            assert job["config"]["env"]["id"] == OmegaConf.load(CONF / "env" / f"{option}.yaml").id
        else:
            assert job["config"][group]["name"] == option


def test_run_member_files(single_run):
    job, run_dir = single_run["job"], single_run["dir"]
    for k, member in enumerate(job["members"]):
        seed_dir = run_dir / f"seed_{k}"
        summary = json.loads((seed_dir / "summary.json").read_text())
        assert summary == member
        assert summary["status"] == "ok"
        assert summary["seed"] == k
        assert summary["steps"] == TOTAL_STEPS
        assert summary["diverged_at_step"] is None and summary["divergence"] is None
        assert summary["wall_s"] > 0
        rows = read_jsonl(seed_dir / "metrics.jsonl")
        assert [r["step"] for r in rows] == list(range(LOG_EVERY, TOTAL_STEPS + 1, LOG_EVERY))
        for name in ("episode/return_last10", "perf/steps_per_s", "train/updates"):
            assert all(name in r for r in rows), name
        assert all(r["perf/steps_per_s"] > 0 for r in rows)
        # no update before learning_starts; updates afterwards, reported with their loss
        assert all(r["train/updates"] == 0 for r in rows if r["step"] <= LEARNING_STARTS)
        assert rows[-1]["train/updates"] > 0
        assert all("train/loss" in r and math.isfinite(r["train/loss"]) for r in rows if r["step"] > LEARNING_STARTS)
        assert rows[-1]["episode/return_last10"] == pytest.approx(summary["final_return"])
        assert rows[-1]["episode/count"] == summary["episodes"]
    # members are seeded differently: their metric streams differ
    m0, m1 = (read_jsonl(run_dir / f"seed_{k}" / "metrics.jsonl") for k in (0, 1))
    assert [r.get("train/loss") for r in m0] != [r.get("train/loss") for r in m1]


def test_run_ends_with_its_outputs_and_the_sync_command(single_run):
    run_dir = single_run["dir"]
    tail = single_run["proc"].stdout.splitlines()[-3:]
    assert tail[0] == f"outputs: {run_dir}"
    assert tail[1].endswith(f"wandb sync {run_dir}/seed_*/wandb/offline-run-*")
    assert f"python -m rlexp.sync {run_dir}" in tail[2]
    assert datetime.fromisoformat(single_run["job"]["first_step_at"]).tzinfo is not None  # ISO 8601, UTC


def test_run_console_summary_table(single_run):
    stdout, job = single_run["proc"].stdout, single_run["job"]
    rows = table_rows(stdout)
    assert sorted(rows) == [0, 1], stdout
    for member in job["members"]:
        row = rows[member["seed"]]
        assert row[1] == member["status"]
        assert str(member["steps"]) in row[2:]
        assert str(member["episodes"]) in row[2:]
    assert job["env"] in stdout


def test_run_wandb_offline_runs_read_back(single_run):
    job, run_dir = single_run["job"], single_run["dir"]
    expected_tags = {f"{g}:{o}" for g, o in job["choices"].items()}
    assert "activation:relu" in expected_tags
    for k, member in enumerate(job["members"]):
        seed_dir = run_dir / f"seed_{k}"
        wb = read_wandb_run(seed_dir)
        # config: the resolved config plus the member's own seed
        config = {key: v for key, v in wb["config"].items() if key != "_wandb"}
        assert config["optimizer"]["lr"] == SINGLE_LR
        assert config["seed"] == member["seed"] == k
        assert config["member"] == k
        assert config["cell"] == job["cell"] and config["choices"] == job["choices"]
        rest = {key: v for key, v in config.items() if key not in ("seed", "member", "cell", "choices")}
        assert rest == {key: v for key, v in job["config"].items() if key != "seed"}
        # group = the job's cell, name <cell>/seed=<k>, job type the algorithm; tags = group:option per config group
        assert wb["group"] == job["cell"] == expected_cell(single_run["overrides"])
        assert wb["name"] == f"{job['cell']}/seed={member['seed']}"
        assert wb["job_type"] == job["config"]["algo"]["name"] == "dqn"
        assert set(wb["tags"]) == expected_tags
        # every chart against env_step; the summary keeps the last and the best evaluation return
        assert wb["metrics"]["*"] == ("env_step", set())
        assert wb["metrics"]["eval/return"] == ("env_step", {"last", "max"})
        assert wb["project"] == job["config"]["logger"]["project"]
        # history = metrics.jsonl, step for step
        rows = read_jsonl(seed_dir / "metrics.jsonl")
        assert len(wb["history"]) == len(rows)
        for hist, row in zip(wb["history"], rows):
            assert hist["_step"] == hist.pop("env_step") == row["step"]
            logged = {key: v for key, v in hist.items() if not key.startswith("_")}
            assert set(logged) == set(row) - {"step"}
            for key, value in logged.items():
                assert same_value(value, row[key]), (k, row["step"], key, value, row[key])
        # summary: the member's summary and the last metrics; the run ended cleanly
        for key, value in member.items():
            if value is not None:
                assert same_value(wb["summary"][key], value), key
        assert same_value(wb["summary"]["episode/return_last10"], rows[-1]["episode/return_last10"])
        evals = [row["eval/return"] for row in rows if "eval/return" in row]
        assert evals and wb["summary"]["eval/return"] == {"last": evals[-1], "max": max(evals)}
        assert wb["exit_code"] == 0
        # the installed packages: once per job, in member 0's run
        assert (wandb_run_dir(seed_dir) / "files" / "requirements.txt").is_file() == (k == 0)
        # gradient and activation histograms went to W&B (the first update is one that records them)
        hist_keys = {key for row in wb["histograms"] for key in row if key.startswith("hist/")}
        for name in ("hist/grad/q.0.weight", "hist/activation/q.0"):
            assert any(key.startswith(name) for key in hist_keys), (name, hist_keys)


def test_non_tty_progress_is_plain_lines(single_run):
    stdout, job = single_run["proc"].stdout, single_run["job"]
    assert "\x1b" not in stdout and "\r" not in stdout, repr(stdout[:500])
    progress = re.compile(r"^\[(?P<cell>.+)\] step (?P<step>\d+)/(?P<total>\d+)\b")
    matches = [m for m in map(progress.match, stdout.splitlines()) if m]
    assert len(matches) >= 2, stdout
    assert {m["cell"] for m in matches} == {job["cell"]}
    assert {int(m["total"]) for m in matches} == {TOTAL_STEPS}
    steps = [int(m["step"]) for m in matches]
    assert steps == sorted(set(steps)) and steps[-1] == TOTAL_STEPS


# ====================================================================== 5. WANDB_MODE
def test_wandb_mode_from_environment(rerun_run):
    """$WANDB_MODE=disabled, no logger.mode: no W&B run (either run into the rerun's dir)."""
    proc, base = rerun_run
    assert proc.returncode == 0, describe(proc)
    member = base / "run" / "seed_0"
    assert not (member / "wandb").exists()
    assert [r["step"] for r in read_jsonl(member / "metrics.jsonl")][-1] == TOTAL_STEPS
    assert json.loads((base / "run" / "summary.json").read_text())["status"] == "ok"


def test_explicit_logger_mode_beats_wandb_mode(single_run):
    """The single run: logger.mode=offline under $WANDB_MODE=disabled."""
    member = single_run["dir"] / "seed_0"
    wb = read_wandb_run(member)
    assert len(wb["history"]) == len(read_jsonl(member / "metrics.jsonl")) == TOTAL_STEPS // LOG_EVERY
    assert wb["exit_code"] == 0


# ====================================================================== 6. multirun
def test_multirun_sweeps_every_combination(multi_run):
    proc, base = multi_run
    assert proc.returncode == 0, describe(proc)
    sweep_dir = base / "multi"
    jobs = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir())
    assert jobs == ["0", "1", "2", "3"]
    seen, cells = [], set()
    for name in jobs:
        job_dir = sweep_dir / name
        job = json.loads((job_dir / "summary.json").read_text())
        assert job["status"] == "ok"
        combo = (job["choices"]["activation"], job["choices"]["init"])
        seen.append(combo)
        assert job["config"]["activation"]["name"] == combo[0]
        assert job["config"]["init"]["name"] == combo[1]
        # the cell: the settings the sweep varies, not its constant overrides (the report's cell)
        assert job["cell"] == f"activation={combo[0]},init={combo[1]}"
        cells.add(job["cell"])
        member = json.loads((job_dir / "seed_0" / "summary.json").read_text())
        assert member["steps"] == TOTAL_STEPS
        # each job's W&B run is its own, grouped under the sweep's name and that job's cell
        wb = read_wandb_run(job_dir / "seed_0")
        sweep = job["config"]["logger"]["sweep"]
        assert sweep.startswith("multi-") and wb["group"] == f"{sweep}/{job['cell']}"
        assert wb["name"] == f"{job['cell']}/seed=0"
        assert f"activation:{combo[0]}" in wb["tags"] and f"init:{combo[1]}" in wb["tags"]
        assert wb["exit_code"] == 0
        # the sweep's closing table: one row per job with its cell and status counts
        row = f"{name}\\s+{re.escape(job['cell'])}\\s+1\\s+0\\s+0\\s+{member['eval_return']:.1f}\\s+1\\s"  # IQM of one
        assert re.search(rf"^{row}", proc.stdout, re.M), proc.stdout
    assert sorted(seen) == sorted(itertools.product(["relu", "tanh"], ["xavier", "he"]))
    assert len(cells) == 4
    # the report names the same cells
    from rlexp.report.main import cell_keys, load_job, sweep_order, varying_keys

    report_jobs = [load_job(sweep_dir / name, sweep_dir) for name in jobs]
    keys = cell_keys(report_jobs, varying_keys(report_jobs, sweep_order(sweep_dir)))
    assert {cell_name(j.settings, keys) for j in report_jobs} == cells
    tail = proc.stdout.splitlines()[-3:]
    assert tail[0] == f"next: python -m rlexp.report {sweep_dir}"
    assert tail[1].endswith(f"wandb sync {sweep_dir}/*/seed_*/wandb/offline-run-*")


# ====================================================================== a run dir used twice
def test_rerun_into_same_dir_rewrites_metrics(rerun_run):
    first, base = rerun_run
    assert first.returncode == 0, describe(first)
    run_dir = base / "run"
    (run_dir / "summary.json").unlink()  # as if the first run had been killed before its end
    second = run_cli([*RERUN_OVERRIDES, "seed=7", f"hydra.run.dir={run_dir}"], base, **ENV_DISABLED)
    assert second.returncode == 0, describe(second)
    # the first attempt's files are kept aside (a finished run dir is refused: tests/jobs/test_grid.py)
    assert json.loads((run_dir / "attempt_1" / "seed_0" / "summary.json").read_text())["seed"] == 0
    summary = json.loads((run_dir / "seed_0" / "summary.json").read_text())
    assert summary["seed"] == 7  # the second run's
    rows = read_jsonl(run_dir / "seed_0" / "metrics.jsonl")
    # one record per log step, and they are the second run's: the last one gives its final return
    assert [r["step"] for r in rows] == list(range(LOG_EVERY, TOTAL_STEPS + 1, LOG_EVERY))
    assert rows[-1]["episode/return_last10"] == pytest.approx(summary["final_return"])
