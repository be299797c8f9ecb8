"""rlexp/cli.py: the command line checked before Hydra makes a dir (a refusal names the key, the value
and the fix; good sweeps and Hydra's own options pass)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlexp.cli import check_command_line, job_overrides, needs_whole_check
from rlexp.config.schema import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


# command line -> words of its one refusal line (in process: rlexp.cli.check_command_line, as the CLI runs it)
COMMAND_LINE_REFUSALS = {
    "+total_step=1000": ["config error: total_step: ", "did you mean total_steps=1000?"],
    "algo.gama=0.9": ["config error: algo.gama: ", "did you mean algo.gamma=0.9?"],
    "algo=dqnn": ["config error: algo: unknown option 'dqnn'", "did you mean algo=dqn?", "a2c, ddpg, dqn, maddpg"],
    "+experiment=nan_hunt/tahn": ["config error: experiment: ", "did you mean experiment=nan_hunt/tanh"],
    "hydra/launcher=rlexp_jobli": ["config error: hydra/launcher: ", "did you mean hydra/launcher=rlexp_joblib"],
    "algo.double=maybe": ["config error: algo.double: 'maybe' is not true or false", "(default false)"],
    "network.hidden=abc": ["config error: network.hidden: 'abc' is not a list", "(default [64, 64])"],
    "optimizer.lr=abc": ["config error: optimizer.lr: 'abc' is not a number"],
    "activation=relu)": ["config error: activation: cannot parse 'activation=relu)'"],
    "activation=relu,tanh": ["config error: activation: ", "add -m"],
    "total_steps=0": ["config error: total_steps: 0 is out of range"],
    "-m activation=relu,tanh total_steps=0": ["config error: total_steps: 0 is out of range"],
    "+experiment=stability_grid_small clipping=none,globl_norm": ["did you mean clipping=global_norm?"],
    # the field's other names, another case, a group's key given at the top level
    "init=kaiming": ["config error: init: unknown option 'kaiming'", "did you mean init=he?"],
    "init=Glorot_Uniform": ["did you mean init=xavier_uniform?"],
    "normalization=LayerNorm": ["did you mean normalization=layer?"],
    "normalization=batchnorm": ["did you mean normalization=batch?"],
    "activation=ReLU": ["did you mean activation=relu?"],
    "lr=1e-3": ["config error: lr: unknown key (lr=1e-3)", "did you mean optimizer.lr=1e-3"],
    "gamma=0.9": ["did you mean algo.gamma=0.9?"],
}


@pytest.mark.parametrize("argv", sorted(COMMAND_LINE_REFUSALS))
def test_command_line_refusal_names_key_value_and_fix(argv):
    with pytest.raises(ConfigError) as err:
        check_command_line(argv.split(), CONF)
    line = str(err.value)
    assert "\n" not in line
    for word in COMMAND_LINE_REFUSALS[argv]:
        assert word in line, (word, line)


def test_command_line_check_passes_good_sweeps_and_leaves_hydras_options():
    check_command_line(["-m", "activation=relu,tanh", "init=xavier,he"], CONF)
    check_command_line(["+experiment=stability_grid_small", "hydra/launcher=rlexp_joblib"], CONF)
    check_command_line(["--cfg", "job", "activation=rleu"], CONF)  # Hydra answers --cfg (and --help) itself
    # a sweep of more than PRODUCT_LIMIT jobs is checked value by value: every value appears once
    lists = [[f"a={i}" for i in range(9)], [f"b={i}" for i in range(9)]]
    jobs = job_overrides([f"a={','.join(str(i) for i in range(9))}", f"b={','.join(str(i) for i in range(9))}"])
    assert len(jobs) == 17 and {j[0] for j in jobs} == set(lists[0]) and {j[1] for j in jobs} == set(lists[1])
    assert len(job_overrides(["a=1,2", "b=1,2,3", "c=4"])) == 6
    # a plain single run is composed once, by Hydra (ConfigCheck); what may be a multirun is checked whole first
    assert not needs_whole_check(["total_steps=300", "activation=tanh", "network.hidden=[8,8]"])
    for argv in (["-m", "seed=0"], ["activation=relu,tanh"], ["+experiment=nan_hunt"], ["hydra.mode=MULTIRUN"]):
        assert needs_whole_check(argv), argv
