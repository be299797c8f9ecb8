"""Algorithm registry: the name in conf/algo/<name>.yaml -> its train function and action spaces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Tuple

from rlexp.algos import dqn, ppo, td3

if TYPE_CHECKING:
    from rlexp.trainer import Trainer


@dataclass(frozen=True)
class AlgoSpec:
    train: Callable[["Trainer"], None]
    action_spaces: Tuple[str, ...]  # "discrete" and/or "continuous"


ALGOS: Dict[str, AlgoSpec] = {
    "dqn": AlgoSpec(dqn.train, ("discrete",)),
    "ppo": AlgoSpec(ppo.train, ("discrete", "continuous")),
    "a2c": AlgoSpec(ppo.train, ("discrete", "continuous")),
    "ddpg": AlgoSpec(td3.train, ("continuous",)),
    "td3": AlgoSpec(td3.train, ("continuous",)),
}
