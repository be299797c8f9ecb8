"""An environment family whose extra is missing (MinAtar, Atari, VMAS, MuJoCo) is refused in one line that
names its key and its install command."""

from __future__ import annotations

import re
import sys

import pytest
from composing import compose_config

from rlexp.compose import validate as validate_module
from rlexp.compose.validate import validate
from rlexp.config.schema import ConfigError
from rlexp.envs.gym import make_env

TINY = ["logger.mode=disabled", "logger.progress=off", "device=cpu", "threads=1", "eval.episodes=1", "eval.every=0"]


@pytest.mark.parametrize(
    ("module", "env", "extra"), [("minatar", "minatar_breakout", "minatar"), ("ale_py", "atari_pong", "atari")]
)
def test_missing_extra_names_its_install_command(monkeypatch, module, env, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as without the package
    if module == "minatar":
        monkeypatch.setitem(sys.modules, "minatar.gym", None)
    with pytest.raises(ConfigError, match=re.escape(f"pip install -e '.[{extra}]'")) as err:
        validate(compose_config(TINY + [f"env={env}", "network=cnn"]))
    assert err.value.key == "env.id"


def test_a_missing_extra_names_the_install_command(monkeypatch):
    for module in ("pettingzoo", "mpe2"):  # the other packages of the marl extra: VMAS alone is missing
        pytest.importorskip(module, reason="pip install -e '.[marl]'")
    from rlexp.envs import marl as marl_envs

    real = marl_envs.importlib.import_module

    def without_vmas(name, *args):
        if name == "vmas":
            raise ModuleNotFoundError("No module named 'vmas'", name="vmas")
        return real(name, *args)

    monkeypatch.setattr(marl_envs.importlib, "import_module", without_vmas)
    with pytest.raises(ConfigError) as err:
        validate(compose_config(["algo=maddpg", "env=vmas_balance"]))
    assert "pip install -e '.[marl]'" in str(err.value)


def test_a_missing_mujoco_is_one_line_naming_the_extra(monkeypatch):
    """gymnasium's MuJoCo modules imported anew with ``import mujoco`` failing, as without the extra (in a
    process that has not made the env yet: no spaces read before)."""
    monkeypatch.setattr(validate_module, "ENV_SPACES", {})
    monkeypatch.setitem(sys.modules, "mujoco", None)
    for name in [m for m in sys.modules if m.startswith("gymnasium.envs.mujoco")]:
        monkeypatch.delitem(sys.modules, name)
    cfg = compose_config(["algo=sac", "env=hopper"])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.key == "env.id"
    assert "pip install -e '.[mujoco]'" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError):
        make_env(cfg.env)
