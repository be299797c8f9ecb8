"""The Optuna sweeper (hydra_plugins/rlexp_optuna_sweeper), in process: a trial's value from its job's
summary, a diverged trial failed with its earliest cause, each job reported to its trial, the preset's
per-member search, a range outside its key's domain refused, the line a missing extra gives."""

from __future__ import annotations

import importlib
import sys

import pytest
from composing import compose_config, compose_hydra
from launching import CONF

from hydra_plugins.rlexp_optuna_sweeper import optuna_sweeper
from hydra_plugins.rlexp_optuna_sweeper.optuna_sweeper import RlexpOptunaSweeper, trial_outcome
from rlexp.algos import ALGOS
from rlexp.cli import check_command_line
from rlexp.config.schema import ConfigError
from rlexp.run.pack import Cell, plan_packs

INSTALL = "pip install -e '.[optuna]'"


def member(k: int, status: str = "ok", eval_return: float | None = None, final: float = 9.0, step=None, cause=None):
    return {
        "status": status,
        "member": k,
        "eval_return": eval_return,
        "final_return": final,
        "diverged_at_step": step,
        "divergence": {"cause": cause, "where": "q.1"} if cause else None,
    }


def interquartile_mean(xs: list[float]) -> float:
    """rliable's IQM written out: drop the lowest and the highest quarter (floor), average the rest."""
    xs = sorted(xs)
    cut = len(xs) // 4
    kept = xs[cut : len(xs) - cut]
    return sum(kept) / len(kept)


# ====================================================================== a trial's value and its failure
def test_a_trials_value_is_the_objective_of_its_members_final_evaluation():
    returns = [500.0, 12.0, 230.5, 97.25, 311.0]
    summary = {"status": "ok", "members": [member(k, eval_return=r) for k, r in enumerate(returns)]}
    value, attrs = trial_outcome(summary, "iqm")
    assert value == interquartile_mean(returns)
    assert attrs == {"status": "ok", "members": 5, "score": "iqm of eval_return"}
    assert trial_outcome(summary, "mean")[0] == sum(returns) / len(returns)
    # without an evaluation for every member, the training returns (the report's rule)
    summary["members"][2]["eval_return"] = None
    finals = [float(9 + k) for k in range(5)]
    for m, final in zip(summary["members"], finals):
        m["final_return"] = final
    value, attrs = trial_outcome(summary, "iqm")
    assert (value, attrs["score"]) == (interquartile_mean(finals), "iqm of final_return")


def test_a_trial_with_a_diverged_member_fails_with_the_earliest_cause():
    members = [
        member(0, eval_return=500.0),
        member(1, "diverged", 20.0, step=3200, cause="value_explosion"),
        member(2, "diverged", None, step=1100, cause="nonfinite_grad"),
    ]
    value, attrs = trial_outcome({"status": "diverged", "members": members}, "iqm")
    assert value is None
    assert attrs == {
        "status": "diverged",
        "members": 3,
        "diverged": 2,
        "cause": "nonfinite_grad",
        "where": "q.1",
        "diverged_at_step": 1100,
        "diverged_member": 2,
    }
    assert (
        optuna_sweeper.failure_line(attrs)
        == "2 of 3 members diverged (first: member 2, nonfinite_grad in q.1 at env step 1100)"
    )


def test_each_job_is_reported_to_its_running_trial(tmp_path):
    """StudySweeper.report: a value, a failure line for a divergence, the error of a crash or a refusal."""
    optuna = pytest.importorskip("optuna", reason=INSTALL)
    from hydra.core.utils import JobReturn, JobStatus
    from omegaconf import OmegaConf

    from hydra_plugins.rlexp_optuna_sweeper._impl import StudySweeper

    shipped = dict(sampler=None, direction="maximize", storage=None, study_name=None, n_trials=4, n_jobs=4)
    shipped |= dict(max_failure_rate=1.0, search_space=None, custom_search_space=None, params=None)
    sweeper = StudySweeper(objective="mean", **shipped)
    study = optuna.create_study(direction="maximize")

    def job(k: int, status: JobStatus, value) -> JobReturn:
        (tmp_path / str(k)).mkdir(exist_ok=True)
        hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(tmp_path / str(k))}}})
        return JobReturn(status=status, _return_value=value, hydra_cfg=hydra_cfg)

    ok = {"status": "ok", "members": [member(0, eval_return=200.0), member(1, eval_return=100.0)]}
    bad = [member(0, eval_return=9.0), member(1, "diverged", None, step=7, cause="c")]
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "summary.json").write_text("{}")  # a crash leaves its summary; a refusal nothing
    returns = [
        job(0, JobStatus.COMPLETED, ok),
        job(1, JobStatus.COMPLETED, {"status": "diverged", "members": bad}),
        job(2, JobStatus.FAILED, RuntimeError("boom")),
        job(3, JobStatus.FAILED, RuntimeError("config error: x: bad")),
    ]
    trials = [study.ask() for _ in returns]
    for trial, ret in zip(trials, returns):
        sweeper.report(trial, ret)
    assert returns[0].return_value == 150.0
    assert returns[1].return_value == "1 of 2 members diverged (first: member 1, c in q.1 at env step 7)"
    attrs = [study.trials[k].user_attrs for k in range(4)]
    assert [a["job_dir"] for a in attrs] == [str(tmp_path / str(k)) for k in range(4)]
    assert [a["status"] for a in attrs] == ["ok", "diverged", "crashed", "refused"]
    assert (attrs[1]["cause"], attrs[1]["diverged_at_step"]) == ("c", 7)
    assert (attrs[2]["error"], attrs[3]["error"]) == ("boom", "config error: x: bad")
    assert sweeper.crashed == ["trial 2: boom", "trial 3: config error: x: bad"]


# ====================================================================== the preset
def test_preset_searches_per_member_keys_so_a_batch_is_one_pack(tmp_path):
    cfg = compose_hydra(["+experiment=optuna_dqn", f"hydra.sweep.dir={tmp_path}"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("rlexp_optuna_sweeper.optuna_sweeper.RlexpOptunaSweeper")
    assert (sweeper.direction, sweeper.study_name, sweeper.objective) == ("maximize", "optuna_dqn", "iqm")
    assert sweeper.storage == f"sqlite:///{tmp_path}/optuna.db"
    assert cfg.hydra.launcher._target_.endswith("PackedLauncher")
    assert (cfg.algo.name, cfg.env.id, cfg.clipping.name, cfg.algo.target_update) == (
        "dqn",
        "CartPole-v1",
        "global_norm",
        "hard",
    )
    searched = sorted(sweeper.params)
    assert searched == ["algo.target_update_period", "clipping.max_norm", "optimizer.lr"]
    member_keys = ALGOS["dqn"].member_keys
    assert all(any(k == m or k.startswith(f"{m}.") for m in member_keys) for k in searched)
    # two trials of a batch, as the sweeper's overrides make them: one pack
    trials = [
        ["optimizer.lr=0.0003", "algo.target_update_period=17", "clipping.max_norm=0.4"],
        ["optimizer.lr=0.02", "algo.target_update_period=900", "clipping.max_norm=60.0"],
    ]
    cells = [Cell(compose_config(["+experiment=optuna_dqn", *t]), tmp_path / str(k)) for k, t in enumerate(trials)]
    assert [len(p) for p in plan_packs(cells, lambda algo: ALGOS[algo].member_keys, 96)] == [2]


def test_a_range_outside_its_keys_domain_is_refused_before_any_work():
    check_command_line(["+experiment=optuna_dqn"], CONF)  # the preset's own ranges fit (both ends of each)
    for search, line in [
        ("optimizer.lr=tag(log, interval(-1.0, 0.1))", "config error: optimizer.lr: -1.0 is out of range"),
        ("algo.target_update_period=int(interval(0, 10))", "config error: algo.target_update_period: 0 is out of"),
    ]:
        with pytest.raises(ConfigError) as err:
            check_command_line(["+experiment=optuna_dqn", search], CONF)  # as the CLI runs it, before Hydra
        assert str(err.value).startswith(line)


def test_without_optuna_the_sweeper_names_the_extra(monkeypatch, capsys):
    """The extra missing: rlexp and its plugins import (the sweeper's node names only the sweeper); the
    sweeper, once a command uses it, refuses in one line with the install command."""
    config = importlib.import_module("hydra_plugins.rlexp_optuna_sweeper.config")
    for name in [m for m in sys.modules if m == "optuna" or m.startswith(("optuna.", "hydra_plugins.hydra_optuna"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "hydra_plugins.rlexp_optuna_sweeper._impl", raising=False)
    for name in ("optuna", "hydra_plugins.hydra_optuna_sweeper"):
        monkeypatch.setitem(sys.modules, name, None)  # importing it raises ImportError
    try:
        assert importlib.reload(config).node == {"_target_": config.TARGET}
        preset = compose_hydra(["+experiment=optuna_dqn"], return_hydra_config=True)
        assert preset.hydra.sweeper.sampler.seed == 0  # the preset composes
        with pytest.raises(SystemExit) as stop:
            RlexpOptunaSweeper(objective="iqm", n_trials=2)
    finally:
        monkeypatch.undo()
        importlib.reload(config)  # the plugin's node again, for the other tests of this process
    assert stop.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: hydra/sweeper: rlexp_optuna needs"), lines
    assert lines[0].endswith(INSTALL)
