"""Every option of every config group composes and validates; the algorithms' lr reaches every optimizer;
experiment presets apply; an appended unknown key or a bad value is refused in one line naming the key
(in process, rlexp/compose/validate.py; the same refusals as processes are in tests/jobs/test_cli.py)."""

from __future__ import annotations

import importlib.util
import os
import re
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
from rlexp.cli import ConfigCheck
from rlexp.compose.registry import SCHEMAS, group_options
from rlexp.compose.validate import validate
from rlexp.config.schema import ConfigError, EnvConfig
from rlexp.envs.gym import check_env_id
from rlexp.envs.marl import is_multi_agent

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


# ====================================================================== helpers
def options(group: str) -> list[str]:
    """The group's options: conf/'s yamls and those the installed plugins register."""
    return group_options(group)


def needs_box2d(env_id: str) -> bool:
    """Whether a gymnasium id's entry point is a Box2D world (an id of an optional family, MinAtar or
    ALE, is not: it is registered only once its package is imported)."""
    return env_id in gym.registry and "box2d" in str(gym.spec(env_id).entry_point).lower()


BOX2D_INSTALLED = importlib.util.find_spec("Box2D") is not None


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


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
    "shift_kind_unknown": (["env.shift.kind=permute_rewards"], "env.shift.kind", ["permute_rewards", "permute_obs"]),
    "shift_every_zero": (["env.shift.kind=permute_obs", "env.shift.every=0"], "env.shift.every", ["0", ">= 1"]),
    "shift_actions_of_a_continuous_env": (
        ["algo=td3", "env=pendulum", "env.shift.kind=permute_actions"],
        "env.shift.kind",
        ["permute_actions needs discrete actions", "Pendulum-v1", "env.shift.kind=permute_obs"],
    ),
    "shift_obs_of_stacked_frames": (
        ["env=atari_pong", "network=nature_cnn", "env.shift.kind=permute_obs"],
        "env.shift.kind",
        ["stacked frames", "env.shift.kind=permute_actions or none"],
    ),
    "shift_on_a_multi_agent_env": (
        ["algo=maddpg", "env=simple_spread", "env.shift.kind=permute_obs"],
        "env.shift.kind",
        ["permute_obs", "multi-agent", "set it to none"],
    ),
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


# ====================================================================== 1. composition
ALL_OPTIONS = [(g, o) for g in GROUPS for o in options(g)]


def test_every_group_has_options():
    for group in GROUPS:
        assert options(group), f"conf/{group}/ has no option"


def partners(group: str, option: str) -> list[str]:
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
    env = compose_config([f"env={option}"]).env
    if is_multi_agent(env):
        return ["algo=maddpg"]
    if env.id.startswith("MinAtar/"):
        return ["network=cnn"]
    if env.id.startswith("ALE/"):  # a smaller replay than the default's 100k frame stacks
        return ["network=nature_cnn", "algo.buffer_size=1000"]
    if not needs_box2d(env.id) and isinstance(gym.make(env.id).action_space, gym.spaces.Box):
        return ["algo=td3"]
    return []


@pytest.mark.parametrize("group,option", ALL_OPTIONS, ids=[f"{g}={o}" for g, o in ALL_OPTIONS])
def test_every_option_composes_and_validates(group, option):
    cfg = compose_config(sorted([f"{group}={option}", *partners(group, option)]))
    if not is_multi_agent(cfg.env):
        try:
            check_env_id(cfg.env.id)  # registers an optional family's ids (MinAtar, ALE)
        except ConfigError as err:
            pytest.skip(str(err))  # its extra is missing: the line names the install command
    node = cfg[group]
    if group == "env":
        assert OmegaConf.get_type(node) is EnvConfig
        if not is_multi_agent(node):
            env_id = node.id.rpartition(":")[2]  # module:EnvId: the module is imported (check_env_id)
            assert env_id in gym.registry, f"conf/env/{option}.yaml: {node.id} is not a registered gymnasium id"
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
        with pytest.raises(ConfigError, match=re.escape("pip install -e '.[box2d]'")) as err:
            validate(cfg)
        assert err.value.key == "env.id"
        assert cfg.env.id in str(err.value)


@pytest.mark.parametrize("algo", group_options("algo", code=False))  # the yamls' lr
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
