"""The plugin loader's refusals, in process: a plugin that cannot be registered is one ConfigError naming it
and what is missing, and nothing of it is registered (docs/extending.md#refusals). Each plugin here is a
module written to a tmp dir; a refused one leaves the registries as they were."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass

import pytest
from composing import compose_config
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlexp.compose.plugins import LOADED, load_plugins, plugins_on_command_line
from rlexp.compose.registry import CODE_OPTIONS, SCHEMAS, job_config, own_key_fix
from rlexp.compose.validate import validate
from rlexp.config.schema import Config, ConfigError, DQNConfig
from rlexp.diagnostics.instruments import HIDDEN_INSTRUMENTS
from rlexp.nn.activations import ACTIVATIONS

HEAD = """\
import torch
from dataclasses import dataclass
from rlexp.algos import AlgoSpec, dqn
from rlexp.config.schema import ActivationConfig, DQNConfig, InitConfig
from rlexp.nn.activations import Activation

RELU = Activation(ActivationConfig, lambda cfg: torch.relu, lambda cfg: 1.0)
"""

BAD = {
    "import": ("import not_a_module_anywhere\n", "fails to import (ModuleNotFoundError: No module named"),
    "no_register": ("X = 1\n", "has no function register(plugin); define register in"),
    "taken": (
        "def register(plugin):\n    plugin.add('activation', 'relu', RELU, 'relu again')\n",
        "registers activation=relu, which exists already; give it another name",
    ),
    "twice": (
        "def register(plugin):\n    plugin.add('activation', 'a1', RELU, 'one')\n"
        "    plugin.add('activation', 'a1', RELU, 'two')\n",
        "registers activation=a1, which exists already",
    ),
    "no_doc": (
        "def register(plugin):\n    plugin.add('activation', 'a2', RELU, '')\n",
        "declares activation=a2 without its doc; give one line saying what it is",
    ),
    "wrong_entry": (
        "def register(plugin):\n    plugin.add('activation', 'a3', {'function': torch.relu}, 'a dict')\n",
        "declares activation=a3 as a dict; declare a rlexp.nn.activations.Activation",
    ),
    "other_schema": (
        "def register(plugin):\n"
        "    plugin.add('activation', 'a4', Activation(InitConfig, RELU.function, RELU.gain), 'x')\n",
        "declares activation=a4 with schema <class 'rlexp.config.schema.InitConfig'>; use ActivationConfig",
    ),
    "new_key": (
        "@dataclass\nclass Mine(ActivationConfig):\n    beta: float = 1.0\n\n"
        "def register(plugin):\n    plugin.add('activation', 'a5', Activation(Mine, RELU.function, RELU.gain), 'x')\n",
        "declares activation=a5 with keys beta that ActivationConfig lacks; an option changes its group's defaults",
    ),
    "no_gain": (
        "def register(plugin):\n    plugin.add('activation', 'a6', Activation(ActivationConfig, RELU.function), 'x')\n",
        "fails in register (TypeError: Activation.__init__() missing 1 required positional argument: 'gain')",
    ),
    "spec_missing_a_fact": (
        "def register(plugin):\n    plugin.add('algo', 'my_dqn', AlgoSpec(dqn.train, dqn.build, DQNConfig,"
        " ('discrete',), dqn.check, networks=1, replay=None, roles=(), member_keys=()), 'x')\n",
        "fails in register (TypeError: AlgoSpec.__init__() missing 1 required positional argument: 'recurrent')",
    ),
    "spec_bad_spaces": (
        "def register(plugin):\n    plugin.add('algo', 'my_dqn', AlgoSpec(dqn.train, dqn.build, DQNConfig, ('pixels',),"
        " dqn.check, networks=1, replay=None, roles=(), recurrent=False, member_keys=()), 'x')\n",
        "declares algo=my_dqn with action_spaces ('pixels',); give some of discrete, continuous",
    ),
    "algo_key_without_default": (
        "from omegaconf import MISSING\n\n@dataclass\nclass Mine(DQNConfig):\n    beta: float = MISSING\n\n"
        "def register(plugin):\n    plugin.add('algo', 'my_dqn', AlgoSpec(dqn.train, dqn.build, Mine, ('discrete',),"
        " dqn.check, networks=1, replay=None, roles=(), recurrent=False, member_keys=()), 'x')\n",
        "declares algo=my_dqn with the key beta without a default; give it a default",
    ),
    "unknown_group": (
        "def register(plugin):\n    plugin.add('activations', 'a7', RELU, 'x')\n",
        "adds to an unknown group 'activations'; use one of: activation, init,",
    ),
    "instrument_taken": (
        "def register(plugin):\n    plugin.add('activation', 'a8', RELU, 'x')\n"
        "    plugin.instrument('dormant', lambda units: units.mean((1, 2)))\n",
        "registers the instrument dormant, which exists already",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_plugin_that_cannot_be_registered_is_one_line_naming_it(case, tmp_path, monkeypatch):
    body, expected = BAD[case]
    module = f"bad_plugin_{case}"
    (tmp_path / f"{module}.py").write_text(HEAD + textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    before = ({g: dict(o) for g, o in SCHEMAS.items()}, dict(ACTIVATIONS), dict(HIDDEN_INSTRUMENTS))
    try:
        with pytest.raises(ConfigError) as refused:
            load_plugins([module])
    finally:
        sys.modules.pop(module, None)
    line = str(refused.value)
    assert "\n" not in line and refused.value.key == "plugins"
    assert line.startswith(f"config error: plugins: plugin {module} "), line
    assert expected in line, line
    assert before == ({g: dict(o) for g, o in SCHEMAS.items()}, dict(ACTIVATIONS), dict(HIDDEN_INSTRUMENTS))
    assert module not in LOADED and all(
        module not in {o.source for o in opts.values()} for opts in CODE_OPTIONS.values()
    )


def test_a_name_that_is_no_module_is_refused():
    with pytest.raises(ConfigError, match=r"plugins: 'a b' is not a module name; write plugins=\[pkg.module,...\]"):
        load_plugins(["a b"])


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["activation=tanh"], []),
        (["plugins=[a.b,c]", "activation=x"], ["a.b", "c"]),
        (["+plugins=[a]"], ["a"]),
        (["plugins=one", "plugins=[two]"], ["two"]),  # the last, as Hydra applies them
        (["plugins=[a"], []),  # Hydra's grammar refuses it, and names it
    ],
)
def test_the_plugins_a_command_line_names(argv, expected):
    assert plugins_on_command_line(argv) == expected


@dataclass
class OwnKeyConfig(DQNConfig):
    """An algorithm's schema with a key of its own, as a plugin's may have."""

    beta: float = 1.0


def test_a_saved_config_with_an_algorithms_own_key_comes_back_typed_by_its_schema(monkeypatch):
    """rlexp.evaluate and rlexp.replay read a job's saved config through ``job_config``: the algo block typed
    by its option's schema, so its own keys fit (``Config``'s ``AlgoConfig`` alone refuses them)."""
    monkeypatch.setitem(SCHEMAS["algo"], "own_key_algo", OwnKeyConfig)
    saved = {"algo": {"name": "own_key_algo", "beta": 2.5, "gamma": 0.9}, "total_steps": 100}
    with pytest.raises(OmegaConfBaseException, match="beta"):
        OmegaConf.merge(OmegaConf.structured(Config), saved)
    cfg = job_config(saved)
    assert OmegaConf.get_type(cfg.algo) is OwnKeyConfig
    assert (cfg.algo.beta, cfg.algo.gamma, cfg.algo.batch_size, cfg.total_steps) == (2.5, 0.9, 128, 100)
    assert OmegaConf.get_type(job_config({"algo": {"name": "dqn"}}).algo) is DQNConfig
    fix = "it is a key of algo=own_key_algo alone: pick that algorithm or remove the key"
    assert (own_key_fix("beta"), own_key_fix("gamma"), own_key_fix("nothing")) == (fix, None, None)
    with pytest.raises(ConfigError) as refused:  # set with another algorithm: the line names the one that has it
        validate(compose_config(["algo=dqn", "+algo.beta=2"]))
    assert str(refused.value) == f"config error: algo.beta: unknown key (algo.beta=2); {fix}"
