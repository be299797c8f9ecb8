"""Algorithm registry: the name in conf/algo/<name>.yaml -> its train function, config schema and
action spaces. An algorithm is one module with ``train(ctx: RunContext) -> None``."""

from __future__ import annotations

from dataclasses import dataclass

from rlexp.algos import dqn, maddpg, mappo, muzero_lite, ppo, sac, td3
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
from rlexp.run.context import Algorithm


@dataclass(frozen=True)
class AlgoSpec:
    train: Algorithm  # train(ctx: RunContext) -> None
    schema: type[AlgoConfig]  # the algo group's structured config
    action_spaces: tuple[str, ...]  # "discrete" and/or "continuous"
    # config keys whose values may differ between the members of one population (rlexp.config.members; a pack
    # of cells differing only in these, rlexp.run.pack); () = none: cells are packed only when equal
    member_keys: tuple[str, ...] = ()
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


ALGOS: dict[str, AlgoSpec] = {
    "dqn": AlgoSpec(dqn.train, DQNConfig, ("discrete",), CONTEXT_KEYS + DQN_KEYS, pbt_keys=DQN_PBT_KEYS),
    "ppo": AlgoSpec(ppo.train, ActorCriticConfig, ("discrete", "continuous"), CONTEXT_KEYS + PPO_KEYS),
    "a2c": AlgoSpec(ppo.train, A2CConfig, ("discrete", "continuous"), CONTEXT_KEYS + PPO_KEYS),
    "ddpg": AlgoSpec(td3.train, DDPGConfig, ("continuous",), CONTEXT_KEYS + TD3_KEYS, pbt_keys=TD3_PBT_KEYS),
    "td3": AlgoSpec(td3.train, TD3Config, ("continuous",), CONTEXT_KEYS + TD3_KEYS, pbt_keys=TD3_PBT_KEYS),
    "sac": AlgoSpec(sac.train, SACConfig, ("continuous",), CONTEXT_KEYS + SAC_KEYS),
    "muzero_lite": AlgoSpec(muzero_lite.train, MuZeroLiteConfig, ("discrete",), CONTEXT_KEYS),
    "maddpg": AlgoSpec(maddpg.train, MADDPGConfig, ("discrete", "continuous"), multi_agent=True),
    "mappo": AlgoSpec(mappo.train, MAPPOConfig, ("discrete", "continuous"), multi_agent=True),
}
