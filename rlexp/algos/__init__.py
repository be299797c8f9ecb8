"""Algorithm registry: the name in conf/algo/<name>.yaml -> its ``AlgoSpec``, every fact about it that
the rest of rlexp reads. An algorithm is one module with ``train(ctx: RunContext) -> None``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from omegaconf import DictConfig

from rlexp.algos import dqn, maddpg, mappo, muzero_lite, ppo, sac, td3
from rlexp.algos.common import check_actor_critic, check_replay
from rlexp.config.schema import (
    A2CConfig,
    ActorCriticConfig,
    AlgoConfig,
    DDPGConfig,
    DQNConfig,
    MADDPGConfig,
    MAPPOConfig,
    MuZeroLiteConfig,
    SACConfig,
    TD3Config,
)
from rlexp.data.buffers import ReplayBuffer, SequenceReplay
from rlexp.run.context import Algorithm, RunContext
from rlexp.run.evaluation import Networks


@dataclass(frozen=True)
class Replay:
    """How an algorithm keeps what it learns from: the buffer class (its ``member_bytes`` sizes the
    memory estimate) and how a row holds the action."""

    buffer: type[ReplayBuffer]  # ReplayBuffer or SequenceReplay
    actions: Literal["index", "vector"]  # one column (a discrete action), or the action vector's length
    frame_stacks: bool = False  # observations that stack frames keep each frame once (FrameStackReplay)


@dataclass(frozen=True)
class AlgoSpec:
    """Every fact about an algorithm that the rest of rlexp reads: adding an algorithm is its module, its
    yaml, its config keys and one of these. Only the last two fields have defaults."""

    train: Algorithm  # train(ctx: RunContext) -> None
    build: Callable[[RunContext], Networks]  # its networks and deterministic policy, untrained (rlexp.evaluate)
    schema: type[AlgoConfig]  # the algo group's structured config
    action_spaces: tuple[str, ...]  # "discrete" and/or "continuous"
    check: Callable[[DictConfig], None]  # the combinations it needs beyond each key's domain (ConfigError)
    networks: int  # networks trained per member (the memory estimate; targets are counted per parameter)
    replay: Replay | None  # its replay memory; None: on-policy rollouts
    roles: tuple[str, ...]  # the network roles whose overrides (actor.*, critic.*) it applies; (): network.* alone
    recurrent: bool  # trains network=lstm
    # config keys whose values may differ between the members of one population (rlexp.config.members; a pack
    # of cells differing only in these, rlexp.run.pack); () = none: cells are packed only when equal
    member_keys: tuple[str, ...]
    multi_agent: bool = False  # trains the agents of a multi-agent env (env.api pettingzoo, vmas)
    # keys population-based training may vary per member at run time (rlexp.run.pbt); () = no PBT
    pbt_keys: tuple[str, ...] = ()


# every algorithm that builds its networks and pipelines through the context (rlexp.run.context)
CONTEXT_KEYS = ("init", "clipping", "optimizer", "regularization.l1", "regularization.l2", "regularization.l2_init")
CONTEXT_KEYS += ("intervention.tau", "intervention.shrink", "intervention.perturb", "intervention.layers")
DQN_KEYS = ("algo.gamma", "algo.tau", "algo.target_update_period", "algo.start_e", "algo.end_e")
DQN_KEYS += ("algo.exploration_fraction",)
PPO_KEYS = ("algo.gamma", "algo.gae_lambda")
TD3_KEYS = ("algo.gamma", "algo.tau")
SAC_KEYS = TD3_KEYS  # read as TD3 reads them
DQN_PBT_KEYS = ("optimizer.lr", "algo.exploration_fraction")
TD3_PBT_KEYS = ("optimizer.lr",)


TRANSITIONS = Replay(ReplayBuffer, "vector")
ACTOR_CRITIC = ("actor", "critic")

PPO = AlgoSpec(
    ppo.train,
    ppo.build,
    ActorCriticConfig,
    ("discrete", "continuous"),
    check_actor_critic,
    networks=2,
    replay=None,
    roles=ACTOR_CRITIC,
    recurrent=True,
    member_keys=CONTEXT_KEYS + PPO_KEYS,
)
TD3 = AlgoSpec(
    td3.train,
    td3.build,
    TD3Config,
    ("continuous",),
    check_replay,
    networks=3,
    replay=TRANSITIONS,
    roles=ACTOR_CRITIC,
    recurrent=False,
    member_keys=CONTEXT_KEYS + TD3_KEYS,
    pbt_keys=TD3_PBT_KEYS,
)

ALGOS: dict[str, AlgoSpec] = {
    "dqn": AlgoSpec(
        dqn.train,
        dqn.build,
        DQNConfig,
        ("discrete",),
        dqn.check,
        networks=1,
        replay=Replay(ReplayBuffer, "index", frame_stacks=True),
        roles=(),
        recurrent=False,
        member_keys=CONTEXT_KEYS + DQN_KEYS,
        pbt_keys=DQN_PBT_KEYS,
    ),
    "ppo": PPO,
    "a2c": dataclasses.replace(PPO, schema=A2CConfig),  # PPO's code: one epoch, one minibatch
    "ddpg": dataclasses.replace(TD3, schema=DDPGConfig, networks=2),  # TD3's code: one critic
    "td3": TD3,
    "sac": AlgoSpec(
        sac.train,
        sac.build,
        SACConfig,
        ("continuous",),
        sac.check,
        networks=3,
        replay=TRANSITIONS,
        roles=ACTOR_CRITIC,
        recurrent=False,
        member_keys=CONTEXT_KEYS + SAC_KEYS,
    ),
    "muzero_lite": AlgoSpec(
        muzero_lite.train,
        muzero_lite.build,
        MuZeroLiteConfig,
        ("discrete",),
        muzero_lite.check,
        networks=3,
        replay=Replay(SequenceReplay, "index"),
        roles=(),
        recurrent=False,
        member_keys=CONTEXT_KEYS,
    ),
    "maddpg": AlgoSpec(
        maddpg.train,
        maddpg.build,
        MADDPGConfig,
        ("discrete", "continuous"),
        check_replay,
        networks=4,
        replay=TRANSITIONS,
        roles=ACTOR_CRITIC,
        recurrent=False,
        member_keys=(),
        multi_agent=True,
    ),
    "mappo": AlgoSpec(
        mappo.train,
        mappo.build,
        MAPPOConfig,
        ("discrete", "continuous"),
        check_actor_critic,
        networks=2,
        replay=None,
        roles=ACTOR_CRITIC,
        recurrent=False,
        member_keys=(),
        multi_agent=True,
    ),
}
