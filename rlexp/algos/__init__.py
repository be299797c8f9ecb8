"""Algorithm registry: the name in conf/algo/<name>.yaml -> its train function, config schema and
action spaces. An algorithm is one module with ``train(ctx: RunContext) -> None``."""

from __future__ import annotations

from dataclasses import dataclass

from rlexp.algos import dqn, muzero_lite, ppo, td3
from rlexp.config import (
    A2CConfig,
    ActorCriticConfig,
    AlgoConfig,
    DDPGConfig,
    DQNConfig,
    MuZeroLiteConfig,
    TD3Config,
)
from rlexp.run import Algorithm


@dataclass(frozen=True)
class AlgoSpec:
    train: Algorithm  # train(ctx: RunContext) -> None
    schema: type[AlgoConfig]  # the algo group's structured config
    action_spaces: tuple[str, ...]  # "discrete" and/or "continuous"


ALGOS: dict[str, AlgoSpec] = {
    "dqn": AlgoSpec(dqn.train, DQNConfig, ("discrete",)),
    "ppo": AlgoSpec(ppo.train, ActorCriticConfig, ("discrete", "continuous")),
    "a2c": AlgoSpec(ppo.train, A2CConfig, ("discrete", "continuous")),
    "ddpg": AlgoSpec(td3.train, DDPGConfig, ("continuous",)),
    "td3": AlgoSpec(td3.train, TD3Config, ("continuous",)),
    "muzero_lite": AlgoSpec(muzero_lite.train, MuZeroLiteConfig, ("discrete",)),
}
