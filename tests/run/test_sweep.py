"""One sweep dir, one grid (rlexp/run/sweep.py): a grid's job list as Hydra's basic sweeper makes it, how
two grids differ, and the claim a multirun takes on its sweep dir before it writes anything."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from launching import ROOT, file_hashes
from omegaconf import OmegaConf

from rlexp.config.schema import ConfigError
from rlexp.run.jobs import LOCK, write_json
from rlexp.run.sweep import (
    BASIC_SWEEPER,
    claim_sweep,
    expected_jobs,
    grid_difference,
    grid_jobs,
    release_sweep,
)

OPTUNA = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"


def hydra_node(task: list[str], params: dict[str, str] | None = None, sweeper: str = BASIC_SWEEPER) -> dict:
    """A multirun's ``hydra`` node as ``multirun.yaml`` records it: the sweeper, its params, the command line."""
    return {"sweeper": {"_target_": sweeper, "params": params or {}}, "overrides": {"task": task}}


def test_the_grid_is_every_combination_in_hydras_order_without_the_machines_keys():
    node = hydra_node(["total_steps=600", "seed=0,1", "threads=1", "resume=true"], {"activation": "relu,tanh,elu"})
    expected = [
        ["total_steps=600", f"seed={seed}", f"activation={act}"]
        for act, seed in itertools.product(["relu", "tanh", "elu"], [0, 1])  # params first, the last key fastest
    ]
    jobs = grid_jobs(node)
    assert jobs is not None and sorted(map(sorted, jobs)) == sorted(map(sorted, expected))
    assert [[x for x in job if x.startswith(("activation", "seed"))] for job in jobs] == [
        [f"activation={act}", f"seed={seed}"] for act, seed in itertools.product(["relu", "tanh", "elu"], [0, 1])
    ]
    assert grid_jobs(hydra_node(["seed=0,1"], sweeper=OPTUNA)) is None  # a search picks its jobs as it runs


@pytest.mark.parametrize(
    ("recorded", "current", "said"),
    [
        (["activation=relu,tanh"], ["activation=relu,tanh", "resume=true", "threads=2"], None),
        (["activation=relu,tanh"], ["activation=choice(relu,tanh)"], None),  # the same jobs, written otherwise
        (["seed=0,1"], ["seed=0,1,2"], None),  # extends the grid: its jobs first, in their order
        (["activation=relu,tanh"], ["activation=sigmoid,tanh"], "its job 0 runs activation=relu where this command's "
         "runs activation=sigmoid"),
        (["activation=relu,tanh"], ["activation=tanh,relu"], "its job 0 runs activation=relu where"),
        (["seed=0,1,2"], ["seed=0,1"], "it records 3 jobs; this command's grid has 2"),
        (["total_steps=600", "seed=0,1"], ["seed=0,1"], "its job 0 runs total_steps=600 where this command's runs "
         "no other override"),
    ],
)  # fmt: skip
def test_a_grid_differs_unless_it_runs_the_recorded_jobs_first(recorded, current, said):
    difference = grid_difference(hydra_node(recorded), hydra_node(current))
    assert (difference is None) if said is None else (difference or "").startswith(said), difference


def test_a_search_goes_on_in_a_dir_of_the_same_search_and_no_other():
    search = hydra_node(["total_steps=600"], {"optimizer.lr": "interval(1e-4, 1e-3)"}, OPTUNA)
    more = hydra_node(["total_steps=900"], {"optimizer.lr": "interval(1e-5, 1e-3)"}, OPTUNA)
    assert grid_difference(search, more) is None  # each trial has a dir of its own: the study goes on
    grid = hydra_node(["total_steps=600", "optimizer.lr=1e-4,1e-3"])
    for recorded, current in ((grid, search), (search, grid)):
        said = grid_difference(recorded, current) or ""
        assert said.startswith(f"it records the sweep {recorded['sweeper']['_target_']} ") and OPTUNA in said


def multirun_config(sweep_dir: Path, task: list[str]) -> OmegaConf:
    return OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}, **hydra_node(task)}})


def record_grid(sweep_dir: Path, task: list[str], jobs: int) -> None:
    """A sweep dir as a multirun leaves it: Hydra's record and ``jobs`` job dirs."""
    sweep_dir.mkdir(parents=True)
    OmegaConf.save(multirun_config(sweep_dir, task), sweep_dir / "multirun.yaml")
    for k in range(jobs):
        write_json(sweep_dir / str(k) / "summary.json", {"status": "crashed"})


def test_a_claim_on_a_dir_of_another_grid_is_refused_and_writes_nothing(tmp_path):
    sweep = tmp_path / "sweep"
    record_grid(sweep, ["activation=relu,tanh"], jobs=1)
    before = file_hashes(sweep)
    with pytest.raises(ConfigError, match=r"^config error: hydra.sweep.dir: .* holds jobs of another grid"):
        claim_sweep(multirun_config(sweep, ["activation=sigmoid,tanh"]))
    assert file_hashes(sweep) == before and not (sweep / LOCK).exists()
    claim_sweep(multirun_config(sweep, ["activation=relu,tanh", "resume=true"]))  # the same grid: claimed
    try:
        assert (sweep / LOCK).exists()
    finally:
        release_sweep()
    assert not (sweep / LOCK).exists()


def test_a_file_where_a_jobs_dir_goes_is_refused_before_any_job(tmp_path):
    sweep = tmp_path / "sweep"
    record_grid(sweep, ["activation=relu,tanh"], jobs=1)
    (sweep / "1").write_text("not a job")
    before = file_hashes(sweep)
    with pytest.raises(ConfigError, match=r"sweep/1 is not a directory: job 1's dir cannot be made there; move it"):
        claim_sweep(multirun_config(sweep, ["activation=relu,tanh", "resume=true"]))
    assert file_hashes(sweep) == before and not (sweep / LOCK).exists()


def test_a_claim_on_a_dir_without_jobs_takes_the_new_grid(tmp_path):
    sweep = tmp_path / "sweep"
    record_grid(sweep, ["activation=relu,tanh"], jobs=0)  # e.g. every job refused before it wrote
    claim_sweep(multirun_config(sweep, ["activation=sigmoid"]))
    release_sweep()


def test_a_claim_on_a_held_sweep_dir_names_the_multirun_that_holds_it(tmp_path):
    sweep = tmp_path / "sweep"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from rlexp.run.jobs import hold_dir; "
         "hold_dir(Path(sys.argv[1])); print('held', flush=True); time.sleep(600)", str(sweep)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"in use by pid {holder.pid} .*wait for that multirun to end"):
            claim_sweep(multirun_config(sweep, ["activation=relu,tanh"]))
    finally:
        holder.kill()
        holder.wait()


def test_the_expected_jobs_are_the_recorded_grids(tmp_path):
    sweep = tmp_path / "sweep"
    record_grid(sweep, ["activation=relu,tanh", "logger.progress=off"], jobs=1)
    assert expected_jobs(sweep) == [(sweep / "0", ["activation=relu"]), (sweep / "1", ["activation=tanh"])]
    assert expected_jobs(tmp_path) is None
