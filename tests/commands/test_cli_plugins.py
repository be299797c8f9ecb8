"""A launcher or sweeper whose Hydra plugin (an extra) is missing: one line naming the option and the extra."""

from __future__ import annotations

import importlib.util

import pytest
from hydra.errors import ConfigCompositionException
from launching import describe, message_lines, run_cli

from rlexp.cli import translate


@pytest.mark.parametrize(
    ("group", "option", "base", "extra"),
    [
        ("launcher", "rlexp_joblib", "joblib", "joblib"),
        ("launcher", "rlexp_slurm", "submitit_slurm", "submitit"),
        ("launcher", "rlexp_submitit_local", "submitit_local", "submitit"),
        ("launcher", "rlexp_ray", "ray", "ray"),
        ("sweeper", "rlexp_optuna", "optuna", "optuna"),
    ],
)
def test_a_missing_hydra_plugin_names_its_extra(group, option, base, extra):
    err = ConfigCompositionException(f"In 'hydra/{group}/{option}': Could not load 'hydra/{group}/{base}'.")
    refusal = translate(err, [f"hydra/{group}={option}"], lambda key: None)
    assert str(refusal) == (
        f"config error: hydra/{group}: {option} needs Hydra's {base} {group} plugin, which is not installed; "
        f"pip install -e '.[{extra}]'"
    )


@pytest.mark.skipif(
    importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is not None, reason="the ray extra is installed"
)
def test_the_ray_launcher_without_its_extra_is_one_line_and_writes_nothing(tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "hydra/launcher=rlexp_ray",
        "activation=relu,tanh",
        "logger.mode=disabled",
        f"hydra.sweep.dir={sweep}",
    ]
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 2 and message_lines(proc) == [
        "config error: hydra/launcher: rlexp_ray needs Hydra's ray launcher plugin, which is not installed; "
        "pip install -e '.[ray]'"
    ], describe(proc)
    assert not sweep.exists()
