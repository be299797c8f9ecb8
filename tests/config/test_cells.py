"""A grid cell's name (rlexp/config/cells.py): what the sweep varies, nothing else."""

from __future__ import annotations

from rlexp.config.cells import cell_name, job_settings, single_cell, swept_keys


def test_a_cell_is_named_by_what_the_sweep_varies():
    sweep = ["activation=relu,tanh", "total_steps=300", "+experiment=nan_hunt/tanh,nan_hunt/elu"]
    sweep += ["network.hidden=[64,64]", "seed=0,8", "env=cartpole,acrobot"]  # seeds and the env (a task): no cell
    keys = swept_keys(sweep, {"clipping": "none,global_norm", "init": "he"})
    assert keys == ["activation", "experiment", "clipping"]
    job = ["activation=tanh", "total_steps=300", "+experiment=nan_hunt/elu", "network.hidden=[64,64]", "seed=8"]
    choices = {"activation": "tanh", "clipping": "none", "init": "he", "env": "acrobot", "hydra/launcher": "basic"}
    assert cell_name(job_settings(choices, job), keys) == "activation=tanh,experiment=nan_hunt/elu,clipping=none"
    assert cell_name({"activation": "tanh"}, []) == "all"


def test_the_machine_the_console_and_storage_name_no_cell():
    overrides = [
        "activation=tanh",
        "threads=2",
        "logger.mode=offline",
        "checkpoint.every=1000",
        "checkpoint.replay=true",
    ]
    settings = job_settings({}, overrides)
    assert settings == {"activation": "tanh"}
    assert swept_keys(["checkpoint.replay=true,false", "device=cpu,cuda", "init=he,orthogonal"], None) == ["init"]


def test_a_single_run_is_named_by_its_choices_and_its_env_never_its_length():
    choices = {"activation": "relu", "algo": "td3", "env": "pendulum", "experiment": "nan_hunt"}
    overrides = ["algo=td3", "env=pendulum", "total_steps=3000", "algo.learning_starts=1000", "logger.log_every=10",
                 "eval.episodes=3", "optimizer.lr=1e-3", "+experiment=nan_hunt", "seed=4", "threads=1"]  # fmt: skip
    assert single_cell(choices, overrides) == "algo=td3,optimizer.lr=1e-3,experiment=nan_hunt,env=pendulum"
    assert single_cell({"env": "cartpole"}, []) == "env=cartpole"  # the default run
    assert single_cell({"env": "cartpole"}, ["env.id=Acrobot-v1"]) == "env.id=Acrobot-v1"
