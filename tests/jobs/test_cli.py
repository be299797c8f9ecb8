"""Tests of the command line: config composition, bad-input errors, the output contract of a real
run (files, console, W&B offline runs read back), W&B mode selection, multiruns and progress output.

Everything that trains runs ``python -m rlexp.train`` in a subprocess with a tiny budget, W&B offline
or disabled (never the network), and every output under pytest's tmp_path. Subprocesses that do not
depend on each other run concurrently to keep the file fast on a small machine.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch
from composing import compose_config
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlexp.algos import ALGOS
from rlexp.cli import ConfigCheck, check_command_line, job_overrides, needs_whole_check
from rlexp.compose.registry import SCHEMAS
from rlexp.compose.validate import validate
from rlexp.config.cells import cell_name, job_settings, swept_keys
from rlexp.config.schema import NON_CELL_KEYS, ConfigError, EnvConfig
from rlexp.envs.gym import check_env_id
from rlexp.envs.marl import is_multi_agent
from rlexp.run.wandb_files import read_records as read_wandb_records
from rlexp.run.wandb_files import run_dirs

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
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
HINT = "Set the environment variable HYDRA_FULL_ERROR"
TIMEOUT = 600


# ====================================================================== helpers
def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def needs_box2d(env_id: str) -> bool:
    """Whether a gymnasium id's entry point is a Box2D world (an id of an optional family, MinAtar or
    ALE, is not: it is registered only once its package is imported)."""
    return env_id in gym.registry and "box2d" in str(gym.spec(env_id).entry_point).lower()


BOX2D_INSTALLED = importlib.util.find_spec("Box2D") is not None


def cli_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess: W&B offline and silent, its dirs under tmp, no forced TTY."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "HYDRA_FULL_ERROR", "WANDB_MODE")
    }
    wandb_home = tmp / "wandb_home"
    env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_CONFIG_DIR=str(wandb_home / "config"),
        WANDB_CACHE_DIR=str(wandb_home / "cache"),
        WANDB_DATA_DIR=str(wandb_home / "data"),
        WANDB_ARTIFACT_DIR=str(wandb_home / "artifacts"),
        COLUMNS="200",
        PYTHONFAULTHANDLER="1",  # a fatal signal (a hung run aborted) prints every thread's stack
    )
    env.update(extra)
    return env


def run_cli(args: Sequence[str], tmp: Path, **env: str) -> subprocess.CompletedProcess:
    tmp.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "rlexp.train", *args],
        cwd=ROOT,
        env=cli_env(tmp, **env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


class Launch:
    """A CLI subprocess started in the background (output to files); result() waits for it."""

    def __init__(self, args: Sequence[str], tmp: Path, **env: str) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.args = [sys.executable, "-m", "rlexp.train", *args]
        self.stdout, self.stderr = tmp / "stdout.txt", tmp / "stderr.txt"
        with open(self.stdout, "w") as out, open(self.stderr, "w") as err:
            self.proc = subprocess.Popen(
                self.args, cwd=ROOT, env=cli_env(tmp, **env), stdout=out, stderr=err, stdin=subprocess.DEVNULL
            )

    def result(self) -> subprocess.CompletedProcess:
        """Its exit code and output; a process still running after TIMEOUT is aborted (SIGABRT: the
        fault handler writes every thread's stack to its stderr) and the test fails showing them."""
        try:
            code = self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            code = self.proc.wait(timeout=60)
            proc = subprocess.CompletedProcess(self.args, code, self.stdout.read_text(), self.stderr.read_text())
            pytest.fail(f"still running after {TIMEOUT} s, aborted\n{describe(proc)}")
        return subprocess.CompletedProcess(self.args, code, self.stdout.read_text(), self.stderr.read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def describe(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def expected_cell(overrides: Sequence[str]) -> str:
    """A single run's cell: its overrides in their order minus NON_CELL_KEYS and Hydra's, or 'all'."""
    kept = [o for o in overrides if not o.startswith("hydra.") and o.split("=", 1)[0] not in NON_CELL_KEYS]
    return ",".join(kept) or "all"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def message_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """Non-blank lines of stdout and stderr, without Hydra's HYDRA_FULL_ERROR hint."""
    return [ln for ln in (proc.stdout + "\n" + proc.stderr).splitlines() if ln.strip() and HINT not in ln]


def table_rows(stdout: str) -> dict[int, list[str]]:
    """Rows of the console summary table: seed -> the row's cells (box-drawing characters removed)."""
    rows: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        tokens = re.sub(r"[\u2500-\u257f|]", " ", line).split()
        if len(tokens) >= 3 and tokens[0].isdigit() and tokens[1] in ("ok", "diverged", "crashed"):
            rows[int(tokens[0])] = tokens
    return rows


def _items(items) -> dict[str, Any]:
    return {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items}


def wandb_run_dir(member_dir: Path) -> Path:
    runs = run_dirs(member_dir)
    assert len(runs) == 1, f"expected one offline W&B run under {member_dir}, found {runs}"
    return runs[0]


def read_wandb_run(member_dir: Path) -> dict[str, Any]:
    """The run record (config, group, tags), history rows, merged summary and exit code of a member's run."""
    files = sorted(wandb_run_dir(member_dir).glob("run-*.wandb"))
    assert len(files) == 1, files
    run, history, histograms, summary, exit_code, metrics = None, [], [], {}, None, {}
    for record in read_wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "metric":  # wandb.define_metric
            metric = record.metric
            kinds = {f.name for f, v in metric.summary.ListFields() if v} if metric.HasField("summary") else set()
            metrics[metric.name or metric.glob_name] = (metric.step_metric, kinds)
        elif kind == "history":
            row = _items(record.history.item)
            logged = [key for key in row if not key.startswith("_") and key != "env_step"]
            # rows of W&B histograms only (hist/...) are W&B's alone: metrics.jsonl has no such rows
            (histograms if logged and all(key.startswith("hist/") for key in logged) else history).append(row)
        elif kind == "summary":
            summary.update(_items(record.summary.update))
        elif kind == "exit":
            exit_code = record.exit.exit_code
    assert run is not None, f"no run record in {files[0]}"
    return {
        "config": _items(run.config.update),
        "group": run.run_group,
        "name": run.display_name,
        "job_type": run.job_type,
        "metrics": metrics,
        "tags": list(run.tags),
        "project": run.project,
        "history": history,
        "histograms": histograms,
        "summary": summary,
        "exit_code": exit_code,
    }


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


# ====================================================================== bad input cases
# case -> (command line, key named first on the error line, other words the line must contain)
HYDRA_REFUSALS = {
    "misspelled_option": (["activation=rleu"], "activation", ["'rleu'", "did you mean activation=relu"]),
    "misspelled_key": (["total_step=1000"], "total_step", ["total_step=1000", "did you mean total_steps=1000?"]),
    "wrong_type_int": (["total_steps=abc"], "total_steps", ["'abc'", "an integer", "default 50000"]),
    "sweep_with_a_misspelled_option": (["-m", "activation=relu,tnh"], "activation", ["did you mean activation=tanh"]),
}

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
# the cases also run as the CLI, as processes: every case takes the same path (rlexp.cli.ConfigCheck, before
# Hydra makes a dir), which the others' tests take in process
BAD_VALUES_AS_PROCESSES = ("lr_negative", "env_id_typo", "batch_above_buffer")


# ====================================================================== the runs that train
SINGLE_LR = 0.005  # not any yaml's default: it must come from the command line
SINGLE_OVERRIDES = [*BUDGET, f"optimizer.lr={SINGLE_LR}", "num_seeds=2", "logger.mode=offline"]
SWEEP = ["activation=relu,tanh", "init=xavier,he"]
RERUN_OVERRIDES = ["num_seeds=1", *BUDGET, "logger.mode=disabled"]


def _run_specs(base: Path) -> dict[str, tuple]:
    """fixture name -> (args, tmp, env) of each CLI run that trains."""
    return {
        "single_run": ([*SINGLE_OVERRIDES, f"hydra.run.dir={base / 'single_run' / 'run'}"], base / "single_run", {}),
        "multi_run": (
            ["-m", *SWEEP, *BUDGET, "logger.mode=offline", f"hydra.sweep.dir={base / 'multi_run' / 'multi'}"],
            base / "multi_run",
            {},
        ),
        # W&B mode: $WANDB_MODE=disabled alone, and overridden by an explicit logger.mode=offline
        "env_disabled_run": (
            ["num_seeds=1", *BUDGET, f"hydra.run.dir={base / 'env_disabled_run' / 'run'}"],
            base / "env_disabled_run",
            {"WANDB_MODE": "disabled"},
        ),
        "explicit_offline_run": (
            ["num_seeds=1", *BUDGET, "logger.mode=offline", f"hydra.run.dir={base / 'explicit_offline_run' / 'run'}"],
            base / "explicit_offline_run",
            {"WANDB_MODE": "disabled"},
        ),
        # the first of two runs into the same run dir
        "rerun_run": ([*RERUN_OVERRIDES, f"hydra.run.dir={base / 'rerun_run' / 'run'}"], base / "rerun_run", {}),
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
        cases = {k: v[0] for k, v in HYDRA_REFUSALS.items()} | {k: BAD_VALUES[k][0] for k in BAD_VALUES_AS_PROCESSES}
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
def env_disabled_run(runs):
    return finished(runs, "env_disabled_run")


@pytest.fixture(scope="module")
def explicit_offline_run(runs):
    return finished(runs, "explicit_offline_run")


@pytest.fixture(scope="module")
def rerun_run(runs):
    return finished(runs, "rerun_run")


# ====================================================================== 1. composition
ALL_OPTIONS = [(g, o) for g in GROUPS for o in options(g)]


def test_the_entry_point_imports_without_collections_and_leaves_the_collector_on(tmp_path):
    """`python -m rlexp.train` imports torch and Hydra with the garbage collector off (start-up speed),
    then freezes what the imports made and turns the collector back on, whatever the run does next."""
    probe = (
        "import gc, runpy, sys\n"
        "sys.argv = ['rlexp.train', '--help']\n"
        "try:\n    runpy.run_module('rlexp.train', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('probe', gc.isenabled(), gc.get_freeze_count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT
    )
    _, enabled, frozen = out.stdout.strip().splitlines()[-1].split()
    assert enabled == "True"
    assert int(frozen) > 100_000  # torch's and Hydra's objects, out of every later collection's way


def test_every_group_has_options():
    for group in GROUPS:
        assert options(group), f"conf/{group}/ has no option"


def partners(group: str, option: str, cfg: Any) -> list[str]:
    """The overrides that make an option valid with the defaults: an algorithm with an env of its kind
    of actions or agents, a torso with its kind of observations, an env with an algorithm (and torso)
    that handles it."""
    if group == "algo" and ALGOS[option].multi_agent:
        return ["env=simple_spread"]
    if group == "algo" and "discrete" not in ALGOS[option].action_spaces:
        return ["env=pendulum"]
    if group == "network":
        return {"mlp": [], "lstm": ["algo=ppo"], "cnn": ["env=minatar_breakout"], "nature_cnn": ["env=atari_breakout"]}[
            option
        ]
    if group != "env":
        return []
    if is_multi_agent(cfg.env):
        return ["algo=maddpg"]
    if cfg.env.id.startswith("MinAtar/"):
        return ["network=cnn"]
    if cfg.env.id.startswith("ALE/"):  # a smaller replay than the default's 100k frame stacks
        return ["network=nature_cnn", "algo.buffer_size=1000"]
    if not needs_box2d(cfg.env.id) and isinstance(gym.make(cfg.env.id).action_space, gym.spaces.Box):
        return ["algo=td3"]
    return []


@pytest.mark.parametrize("group,option", ALL_OPTIONS, ids=[f"{g}={o}" for g, o in ALL_OPTIONS])
def test_every_option_composes_and_validates(group, option):
    cfg = compose_config([f"{group}={option}"])
    if with_partners := partners(group, option, cfg):
        cfg = compose_config([f"{group}={option}", *with_partners])
    if not is_multi_agent(cfg.env):
        try:
            check_env_id(cfg.env.id)  # registers an optional family's ids (MinAtar, ALE)
        except ConfigError as err:
            pytest.skip(str(err))  # its extra is missing: the line names the install command
    node = cfg[group]
    if group == "env":
        assert OmegaConf.get_type(node) is EnvConfig
        if not is_multi_agent(node):
            assert node.id in gym.registry, f"conf/env/{option}.yaml: {node.id} is not a registered gymnasium id"
            if needs_box2d(node.id) and not BOX2D_INSTALLED:
                pytest.skip("needs box2d (its error is tested in test_box2d_env_without_box2d_names_the_extra)")
    else:
        assert node.name == option, f"conf/{group}/{option}.yaml names {node.name!r}"
        # the yaml is backed by its option's schema, so Hydra refuses unknown keys and wrong types
        assert OmegaConf.get_type(node) is SCHEMAS[group][option]
    validate(cfg)  # raises ConfigError on a bad value


def test_box2d_env_without_box2d_names_the_extra():
    envs = [compose_config([f"env={o}"]).env for o in options("env")]
    box2d_options = [o for o, e in zip(options("env"), envs) if not is_multi_agent(e) and needs_box2d(e.id)]
    if not box2d_options:
        pytest.skip("no box2d environment in conf/env")
    if BOX2D_INSTALLED:
        pytest.skip("box2d is installed")
    for option in box2d_options:
        cfg = compose_config([f"env={option}"])
        with pytest.raises(ConfigError, match=re.escape("rlexp[box2d]")) as err:
            validate(cfg)
        assert err.value.key == "env.id"
        assert cfg.env.id in str(err.value)


@pytest.mark.parametrize("algo", options("algo"))
def test_the_algorithms_lr_applies_to_every_optimizer(algo):
    """README: each algorithm sets optimizer.lr for whichever optimizer is chosen; the command line wins."""
    algo_lr = OmegaConf.load(CONF / "algo" / f"{algo}.yaml").optimizer.lr
    for option in options("optimizer"):
        assert compose_config([f"algo={algo}", f"optimizer={option}"]).optimizer.lr == algo_lr, option
    assert compose_config([f"algo={algo}", "optimizer.lr=0.123"]).optimizer.lr == 0.123


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_experiment_preset_composes_and_applies(preset):
    raw = OmegaConf.to_container(OmegaConf.load(CONF / "experiment" / f"{preset}.yaml"))
    defaults = raw.pop("defaults", [])
    cfg = compose_config([f"+experiment={preset}"])
    validate(cfg)
    for entry in defaults:
        for key, option in entry.items():
            group = key.replace("override", "").strip().lstrip("/")
            if group.startswith("hydra/"):  # the sweeper or launcher: not in the job's config
                continue
            if group == "env":
                assert cfg.env.id == OmegaConf.load(CONF / "env" / f"{option}.yaml").id
            else:
                assert cfg[group].name == option
    for key, value in flatten(raw).items():
        if key.startswith("hydra."):  # the launcher's and sweeper's settings are not in the job's config
            continue
        assert OmegaConf.to_container(OmegaConf.create({"v": OmegaConf.select(cfg, key)}))["v"] == value, key


@pytest.mark.parametrize("override", ["+optimizer.betaa=1", "+totl_steps=10"])
def test_appended_unknown_key_is_refused(override):
    key = override[1:].split("=")[0]
    with pytest.raises((HydraException, OmegaConfBaseException, ConfigError)) as err:
        validate(compose_config([override]))
    assert key.split(".")[-1] in str(err.value)


# ====================================================================== 2./3. bad input on the CLI
@pytest.fixture(scope="module")
def bad_runs(runs):
    """Every bad-input invocation (started with the module): case -> (process, its run dir)."""
    return {k: (future.result(), base / "run") for k, (future, base) in runs["bad"].items()}


def assert_no_training(run_dir: Path) -> None:
    """A refused command line writes nothing: not even Hydra's run dir with its .hydra/ record."""
    assert not run_dir.exists(), sorted(str(p) for p in run_dir.rglob("*"))


def assert_refused(proc: subprocess.CompletedProcess, run_dir: Path, key: str, words: Sequence[str]) -> None:
    """A CLI refusal: exit code 2, one line on stderr naming the key (and these words), no traceback, no dir."""
    assert proc.returncode == 2, describe(proc)
    assert "Traceback" not in proc.stdout + proc.stderr, describe(proc)
    lines = message_lines(proc)
    assert len(lines) == 1 and lines[0] in proc.stderr.splitlines(), describe(proc)
    assert lines[0].startswith(f"config error: {key}: "), lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert_no_training(run_dir)


@pytest.mark.parametrize("case", sorted(HYDRA_REFUSALS))
def test_hydras_refusals_are_one_line_with_the_fix(bad_runs, case):
    _, key, words = HYDRA_REFUSALS[case]
    assert_refused(*bad_runs[case], key, words)


# command line -> words of its one refusal line (in process: rlexp.cli.check_command_line, as the CLI runs it)
COMMAND_LINE_REFUSALS = {
    "+total_step=1000": ["config error: total_step: ", "did you mean total_steps=1000?"],
    "algo.gama=0.9": ["config error: algo.gama: ", "did you mean algo.gamma=0.9?"],
    "algo=dqnn": ["config error: algo: unknown option 'dqnn'", "did you mean algo=dqn?", "a2c, ddpg, dqn, maddpg"],
    "+experiment=nan_hunt/tahn": ["config error: experiment: ", "did you mean experiment=nan_hunt/tanh"],
    "hydra/launcher=rlexp_jobli": ["config error: hydra/launcher: ", "did you mean hydra/launcher=rlexp_joblib"],
    "algo.double=maybe": ["config error: algo.double: 'maybe' is not true or false", "(default false)"],
    "network.hidden=abc": ["config error: network.hidden: 'abc' is not a list", "(default [64, 64])"],
    "optimizer.lr=abc": ["config error: optimizer.lr: 'abc' is not a number"],
    "activation=relu)": ["config error: activation: cannot parse 'activation=relu)'"],
    "activation=relu,tanh": ["config error: activation: ", "add -m"],
    "total_steps=0": ["config error: total_steps: 0 is out of range"],
    "-m activation=relu,tanh total_steps=0": ["config error: total_steps: 0 is out of range"],
    "+experiment=stability_grid_small clipping=none,globl_norm": ["did you mean clipping=global_norm?"],
}


@pytest.mark.parametrize("argv", sorted(COMMAND_LINE_REFUSALS))
def test_command_line_refusal_names_key_value_and_fix(argv):
    with pytest.raises(ConfigError) as err:
        check_command_line(argv.split(), CONF)
    line = str(err.value)
    assert "\n" not in line
    for word in COMMAND_LINE_REFUSALS[argv]:
        assert word in line, (word, line)


def test_a_cell_is_named_by_what_the_sweep_varies():
    sweep = ["activation=relu,tanh", "total_steps=300", "+experiment=nan_hunt/tanh,nan_hunt/elu"]
    sweep += ["network.hidden=[64,64]", "seed=0,8", "env=cartpole,acrobot"]  # seeds and the env (a task): no cell
    keys = swept_keys(sweep, {"clipping": "none,global_norm", "init": "he"})
    assert keys == ["activation", "experiment", "clipping"]
    job = ["activation=tanh", "total_steps=300", "+experiment=nan_hunt/elu", "network.hidden=[64,64]", "seed=8"]
    choices = {"activation": "tanh", "clipping": "none", "init": "he", "env": "acrobot", "hydra/launcher": "basic"}
    assert cell_name(job_settings(choices, job), keys) == "activation=tanh,experiment=nan_hunt/elu,clipping=none"
    assert cell_name({"activation": "tanh"}, []) == "all"


def test_command_line_check_passes_good_sweeps_and_leaves_hydras_options():
    check_command_line(["-m", "activation=relu,tanh", "init=xavier,he"], CONF)
    check_command_line(["+experiment=stability_grid_small", "hydra/launcher=rlexp_joblib"], CONF)
    check_command_line(["--cfg", "job", "activation=rleu"], CONF)  # Hydra answers --cfg (and --help) itself
    # a sweep of more than PRODUCT_LIMIT jobs is checked value by value: every value appears once
    lists = [[f"a={i}" for i in range(9)], [f"b={i}" for i in range(9)]]
    jobs = job_overrides([f"a={','.join(str(i) for i in range(9))}", f"b={','.join(str(i) for i in range(9))}"])
    assert len(jobs) == 17 and {j[0] for j in jobs} == set(lists[0]) and {j[1] for j in jobs} == set(lists[1])
    assert len(job_overrides(["a=1,2", "b=1,2,3", "c=4"])) == 6
    # a plain single run is composed once, by Hydra (ConfigCheck); what may be a multirun is checked whole first
    assert not needs_whole_check(["total_steps=300", "activation=tanh", "network.hidden=[8,8]"])
    for argv in (["-m", "seed=0"], ["activation=relu,tanh"], ["+experiment=nan_hunt"], ["hydra.mode=MULTIRUN"]):
        assert needs_whole_check(argv), argv


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_value_is_one_line_naming_the_key(case, capsys):
    """As the CLI checks a single run's composed config: one line on stderr and exit code 2."""
    if case == "cuda_without_cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    overrides, key, words = BAD_VALUES[case]
    with pytest.raises(SystemExit) as exited:
        ConfigCheck().on_run_start(compose_config(overrides))
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, (out, err)
    line = err.splitlines()[0]
    assert line.startswith(f"config error: {key}: "), line
    for word in words:
        assert word in line, (word, line)


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
def test_wandb_mode_from_environment(env_disabled_run):
    proc, base = env_disabled_run
    assert proc.returncode == 0, describe(proc)
    member = base / "run" / "seed_0"
    assert not (member / "wandb").exists()
    assert [r["step"] for r in read_jsonl(member / "metrics.jsonl")][-1] == TOTAL_STEPS
    assert json.loads((base / "run" / "summary.json").read_text())["status"] == "ok"


def test_explicit_logger_mode_beats_wandb_mode(explicit_offline_run):
    proc, base = explicit_offline_run
    assert proc.returncode == 0, describe(proc)
    member = base / "run" / "seed_0"
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
        # each job's W&B run is its own, grouped under that job's cell
        wb = read_wandb_run(job_dir / "seed_0")
        assert wb["group"] == job["cell"] and wb["name"] == f"{job['cell']}/seed=0"
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
    second = run_cli([*RERUN_OVERRIDES, "seed=7", f"hydra.run.dir={run_dir}"], base)
    assert second.returncode == 0, describe(second)
    # the first attempt's files are kept aside (a finished run dir is refused: tests/test_grid.py)
    assert json.loads((run_dir / "attempt_1" / "seed_0" / "summary.json").read_text())["seed"] == 0
    summary = json.loads((run_dir / "seed_0" / "summary.json").read_text())
    assert summary["seed"] == 7  # the second run's
    rows = read_jsonl(run_dir / "seed_0" / "metrics.jsonl")
    # one record per log step, and they are the second run's: the last one gives its final return
    assert [r["step"] for r in rows] == list(range(LOG_EVERY, TOTAL_STEPS + 1, LOG_EVERY))
    assert rows[-1]["episode/return_last10"] == pytest.approx(summary["final_return"])
