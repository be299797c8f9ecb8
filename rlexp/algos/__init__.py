"""Algorithm registry: the name in conf/algo/<name>.yaml -> its train function, config schema and
action spaces. An algorithm is one module with ``train(ctx: RunContext) -> None``."""

from __future__ import annotations

from dataclasses import dataclass

from rlexp.algos import dqn, maddpg, mappo, ppo, td3
from rlexp.config import (
    A2CConfig,
    ActorCriticConfig,
    AlgoConfig,
    DDPGConfig,
    DQNConfig,
    MADDPGConfig,
    MAPPOConfig,
    TD3Config,
)
from rlexp.run import Algorithm


@dataclass(frozen=True)
class AlgoSpec:
    train: Algorithm  # train(ctx: RunContext) -> None
    schema: type[AlgoConfig]  # the algo group's structured config
    action_spaces: tuple[str, ...]  # "discrete" and/or "continuous"
    multi_agent: bool = False  # trains the agents of a multi-agent env (env.api pettingzoo, vmas)


ALGOS: dict[str, AlgoSpec] = {
    "dqn": AlgoSpec(dqn.train, DQNConfig, ("discrete",)),
    "ppo": AlgoSpec(ppo.train, ActorCriticConfig, ("discrete", "continuous")),
    "a2c": AlgoSpec(ppo.train, A2CConfig, ("discrete", "continuous")),
    "ddpg": AlgoSpec(td3.train, DDPGConfig, ("continuous",)),
    "td3": AlgoSpec(td3.train, TD3Config, ("continuous",)),
    "maddpg": AlgoSpec(maddpg.train, MADDPGConfig, ("discrete", "continuous"), multi_agent=True),
    "mappo": AlgoSpec(mappo.train, MAPPOConfig, ("discrete", "continuous"), multi_agent=True),
}
