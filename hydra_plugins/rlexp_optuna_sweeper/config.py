"""The sweeper's config node, ``hydra/sweeper=rlexp_optuna``: hydra-optuna-sweeper's own node plus ``objective``.

Without the optuna extra the node only names the sweeper, which then says what to install; nothing here
imports optuna, so rlexp runs without it until a command uses this sweeper.
"""

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore

TARGET = "hydra_plugins.rlexp_optuna_sweeper.optuna_sweeper.RlexpOptunaSweeper"

try:
    from hydra_plugins.hydra_optuna_sweeper.config import OptunaSweeperConf
except ImportError:  # the optuna extra is missing
    node: Any = {"_target_": TARGET}
else:

    @dataclass
    class RlexpOptunaSweeperConf(OptunaSweeperConf):
        _target_: str = TARGET
        objective: str = "iqm"  # a trial's value: iqm | mean of its members' final returns (optuna_sweeper.py)

    node = RlexpOptunaSweeperConf

ConfigStore.instance().store(group="hydra/sweeper", name="rlexp_optuna", node=node, provider="rlexp")
