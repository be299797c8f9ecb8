"""Every algorithm's facts live on its ``AlgoSpec`` (rlexp/algos/__init__.py), and the rest of rlexp
reads them there: validation, the memory estimate, network=lstm, interventions' layers, packing, PBT.
These tests hold the specs to the code they describe, for every registered algorithm: an installed plugin's
too (tests/jobs/test_extending.py runs them with the example plugin's ``expected_sarsa``)."""

from __future__ import annotations

import ast
import dataclasses
import inspect

import pytest
import torch
from composing import compose_config

from rlexp.algos import ALGOS, AlgoSpec
from rlexp.compose.validate import memory_per_member, validate
from rlexp.config.schema import ConfigError
from rlexp.data.buffers import FrameStackReplay, ReplayBuffer, SequenceReplay

FACTS = {
    "train",
    "build",
    "schema",
    "action_spaces",
    "check",
    "networks",
    "replay",
    "roles",
    "recurrent",
    "member_keys",
}
BUFFERS = {"ReplayBuffer", "FrameStackReplay", "SequenceReplay"}


def test_an_algorithms_facts_have_no_defaults():
    """A spec that forgets a fact is a TypeError when the registry is imported, never a silent default."""
    required = {f.name for f in dataclasses.fields(AlgoSpec) if f.default is dataclasses.MISSING}
    assert required == FACTS


def constructed(module: object) -> set[str]:
    """The buffer classes a module's code constructs (calls by name)."""
    tree = ast.parse(inspect.getsource(module))
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)} & BUFFERS


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_the_replay_a_spec_names_is_the_one_its_algorithm_fills(name):
    spec = ALGOS[name]
    built = constructed(inspect.getmodule(spec.train))
    if spec.replay is None:
        assert built == set()
        return
    assert built == {spec.replay.buffer.__name__} | ({"FrameStackReplay"} if spec.replay.frame_stacks else set())


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_the_roles_a_spec_names_are_the_ones_its_algorithm_builds(name):
    """``roles`` decides which overrides validation checks (``intervention.layers`` against actor.hidden,
    critic.hidden): the roles its code hands ``ctx.make_net`` (common.Actor builds the actor's)."""
    spec = ALGOS[name]
    source = inspect.getsource(inspect.getmodule(spec.train))
    roles = {r for r in ("actor", "critic") if f'role="{r}"' in source}
    if "Actor.build(" in source:
        roles.add("actor")
    assert roles == set(spec.roles)


@pytest.mark.parametrize(
    ("buffer", "args", "kwargs"),
    [
        (ReplayBuffer, (3, 50, 6, torch.device("cpu")), {}),
        (ReplayBuffer, (3, 50, 6, torch.device("cpu")), {"action_dim": 4}),
        (ReplayBuffer, (3, 50, 36, torch.device("cpu")), {"frames": True}),
        (FrameStackReplay, (3, 50, 4 * 36, torch.device("cpu"), 4, 5), {}),
        (SequenceReplay, (3, 53, 4, 6, torch.device("cpu")), {}),
    ],
)
def test_a_buffers_member_bytes_are_what_it_allocates(buffer, args, kwargs):
    memory = buffer(*args, **kwargs)
    held = memory.data.nbytes + (memory.frames.nbytes if memory.frames is not None else 0)
    held += memory.prev.nbytes if isinstance(memory, FrameStackReplay) else 0
    if buffer is FrameStackReplay:
        members, capacity, obs_dim, _, stack, num_envs = args
        expected = buffer.member_bytes(capacity, obs_dim, 0, True, stack, num_envs)
    elif buffer is SequenceReplay:
        members, capacity, num_envs, obs_dim, _ = args
        expected = buffer.member_bytes(capacity, obs_dim, num_envs=num_envs)
    else:
        members, capacity, obs_dim, _ = args
        expected = buffer.member_bytes(capacity, obs_dim, kwargs.get("action_dim", 0), kwargs.get("frames", False))
    assert held == members * expected


def test_the_memory_estimate_reads_the_spec():
    """TD3 stores the action vector and trains three networks; PPO keeps no replay."""
    td3 = compose_config(["algo=td3", "env=pendulum", "algo.buffer_size=1000"])
    replay, _ = memory_per_member(td3, 3, 1)
    assert replay == ReplayBuffer.member_bytes(1000, 3, 1)
    ppo = compose_config(["algo=ppo"])
    assert memory_per_member(ppo, 4, 2)[0] == 0


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_network_lstm_is_refused_unless_the_spec_says_recurrent(name):
    env = {"discrete": "cartpole", "continuous": "pendulum"}[ALGOS[name].action_spaces[0]]
    overrides = [f"algo={name}", "network=lstm", "total_steps=100000"]
    overrides += ["env=simple_spread"] if ALGOS[name].multi_agent else [f"env={env}"]
    cfg = compose_config(overrides)
    if ALGOS[name].recurrent:
        validate(cfg)
    else:
        with pytest.raises(ConfigError, match="network=lstm"):
            validate(cfg)
