"""Whole-config checks of rlexp/compose/validate.py: image observations need a convolutional torso and
the reverse; resources (open files, replay memory) are refused before any work, naming the largest
population or replay that fits; an environment's spaces read once per env config."""

from __future__ import annotations

import resource

import pytest
from composing import compose_config

from rlexp.compose import validate as build
from rlexp.compose.validate import FILES_RESERVED, validate
from rlexp.config.schema import ConfigError
from rlexp.envs.gym import make_env

TINY = ["logger.mode=disabled", "logger.progress=off", "device=cpu", "threads=1", "eval.episodes=1", "eval.every=0"]


def test_image_env_needs_a_convolutional_torso_and_the_reverse():
    """env=minatar_* with network=mlp, and network=cnn on CartPole: one ConfigError naming network."""
    from rlexp.compose.validate import validate
    from rlexp.config.schema import ConfigError

    pytest.importorskip("minatar", reason="pip install -e '.[minatar]'")
    with pytest.raises(ConfigError, match="network=mlp cannot read MinAtar/Breakout-v0's image") as err:
        validate(compose_config(TINY + ["env=minatar_breakout"]))
    assert err.value.key == "network"
    with pytest.raises(ConfigError, match=r"network=cnn needs image observations \[C, H, W\]"):
        validate(compose_config(TINY + ["network=cnn"]))
    with pytest.raises(ConfigError, match="does not fit the 1x1 map") as err:
        validate(compose_config(TINY + ["env=minatar_breakout", "network=nature_cnn"]))
    assert err.value.key == "network.conv[1]"


def test_the_largest_population_named_fits_and_one_more_does_not(monkeypatch):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    monkeypatch.setattr(build.resource, "getrlimit", lambda which: (300, hard))
    for mode, per_member in (("offline", 2), ("disabled", 1)):
        fits = (300 - FILES_RESERVED) // per_member
        validate(compose_config([f"num_seeds={fits}", f"logger.mode={mode}"]))
        with pytest.raises(ConfigError, match=f"num_seeds: {fits + 1} needs .* the largest that fits is {fits};"):
            validate(compose_config([f"num_seeds={fits + 1}", f"logger.mode={mode}"]))


def test_a_replay_memory_beyond_the_available_memory_is_refused_naming_the_largest_that_fits(monkeypatch):
    with pytest.raises(ConfigError, match=r"^config error: algo.buffer_size: 1000000000000 with num_seeds=1 needs ~"):
        validate(compose_config(["algo.buffer_size=1000000000000"]))  # 44 TB of replay
    monkeypatch.setattr(build, "available_memory", lambda device: 2**30)
    with pytest.raises(ConfigError, match=r"the largest that fits is (\d+); lower algo.buffer_size") as refused:
        validate(compose_config(["algo.buffer_size=100000000"]))
    fits = int(refused.value.args[0].split("the largest that fits is ")[1].split(";")[0])
    row = (2 * 4 + 1 + 2) * 4  # CartPole: obs | next_obs | action | reward | terminated, float32
    assert fits * row < 2**30 < (fits + 2) * row + 2**20  # about all of it, nothing more
    validate(compose_config([f"algo.buffer_size={fits}"]))
    with pytest.raises(ConfigError, match="algo.buffer_size"):
        validate(compose_config([f"algo.buffer_size={fits + 1}"]))


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["network.hidden=[100000,100000]"], "network.hidden"),
        (["network.hidden=[100000,100000]", "num_seeds=64", "algo.buffer_size=100000000"], "network.hidden"),
        (["algo=sac", "env=pendulum", "actor.hidden=[100000,100000]"], "actor.hidden"),
        (["algo=sac", "env=pendulum", "network.hidden=[100000,100000]", "critic.hidden=[64]"], "network.hidden"),
    ],
)
def test_networks_beyond_the_available_memory_are_refused_naming_their_size(monkeypatch, overrides, key):
    monkeypatch.setattr(build, "available_memory", lambda device: 2**30)
    with pytest.raises(ConfigError, match=rf"^config error: {key}: \[100000, 100000\]: one member's networks, .*"
                       rf"need ~\d+\.\d GiB of memory \(1.0 GiB available\); lower {key}$"):  # fmt: skip
        validate(compose_config(overrides))


def test_an_envs_spaces_are_read_once_per_env_config_and_a_failure_is_not_kept(monkeypatch):
    made = []

    def counted(env_cfg):
        made.append(env_cfg.id)
        return make_env(env_cfg)

    monkeypatch.setattr(build, "ENV_SPACES", {})
    monkeypatch.setattr(build, "make_env", counted)
    pendulum = ["algo=td3", "env=pendulum"]
    validate(compose_config(pendulum))
    validate(compose_config([*pendulum, "optimizer.lr=0.1", "num_seeds=3"]))  # another cell, the same env
    assert made == ["Pendulum-v1"]
    validate(compose_config([*pendulum, "+env.kwargs.g=3.0"]))  # another env config: made anew
    assert made == ["Pendulum-v1"] * 2
    env = make_env(compose_config(pendulum).env)  # what validation read is what the env has
    spaces = build.env_spaces(compose_config(pendulum).env)
    assert (spaces.obs_shape, spaces.obs_space, spaces.kind) == (env.observation_space.shape, "Box", "continuous")
    assert (spaces.action_dim, spaces.frames, spaces.stack) == (env.action_space.shape[0], False, 1)
    env.close()

    def refused(env_cfg):
        made.append(env_cfg.id)
        raise ConfigError("env.id", "cannot be made", "a fix")

    monkeypatch.setattr(build, "make_env", refused)
    for _ in range(2):  # raised each time, never kept as spaces
        with pytest.raises(ConfigError, match="cannot be made"):
            validate(compose_config([*pendulum, "env.max_episode_steps=50"]))
    assert made == ["Pendulum-v1"] * 2 + ["Pendulum-v1"] * 2


@pytest.mark.parametrize("name", ["a/b", "x#y", "q?", "100%", "c:d", "back\\slash", "p" * 129, ""])
@pytest.mark.parametrize("key", ["logger.project", "logger.entity"])
def test_a_name_wandb_refuses_is_refused_before_any_work(key, name):
    """A W&B project or entity W&B would refuse once training started is one ConfigError naming the key;
    W&B's own settings refuse the same project names and take the one that passes."""
    wandb = pytest.importorskip("wandb")
    with pytest.raises(ConfigError, match="is not a name W&B accepts; use 1 to 128 characters") as err:
        validate(compose_config(TINY + [f"{key}='{name}'"]))
    assert err.value.key == key
    if name:  # W&B's settings take an empty project as unset
        with pytest.raises(Exception, match="Invalid project name"):
            wandb.Settings(project=name)
    fine = "my-project_1.v2 (x)"
    validate(compose_config(TINY + [f"{key}='{fine}'"]))
    assert wandb.Settings(project=fine).project == fine


@pytest.mark.parametrize("algo,env", [("dqn", "pendulum"), ("td3", "cartpole")])
def test_an_algorithm_refused_for_an_action_space_is_offered_only_ones_that_fit(algo, env):
    """The refusal names the algorithms that handle the env's actions, single-agent ones for a gymnasium
    env, and each of them is then taken."""
    with pytest.raises(ConfigError, match=f"algo={algo} cannot handle") as err:
        validate(compose_config(TINY + [f"algo={algo}", f"env={env}"]))
    offered = str(err.value).split("; use ")[1].split(" or ")
    assert offered and "algo=maddpg" not in offered and "algo=mappo" not in offered
    for option in offered:
        validate(compose_config(TINY + [option, f"env={env}"]))


@pytest.mark.parametrize("name", ["a/b", "lr small", "x:y", "s" * 49, ""])
def test_a_sweep_name_outside_its_characters_is_refused(name):
    with pytest.raises(ConfigError, match=r"^config error: logger.sweep: .* is not a sweep name; use 1 to 48"):
        validate(compose_config(TINY + [f"logger.sweep='{name}'"]))
    validate(compose_config([*TINY, "logger.sweep=lr_small-2.b"]))
    assert len(f"sweep:{'s' * 48}") <= 64  # the tag W&B takes
