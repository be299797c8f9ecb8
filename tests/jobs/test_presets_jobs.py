"""Preset jobs: nan_hunt really diverges and is located, with tanh it does not; scripts/bench.py's smoke
run writes consistent figures."""

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from composing import compose_config, compose_hydra
from launching import run_cli

from rlexp.train import run_job

ROOT = Path(__file__).resolve().parents[2]


def _short(preset, tmp_path):
    cfg = compose_config(
        [f"+experiment={preset}", "total_steps=3000", "num_seeds=2", "logger.mode=disabled", "logger.progress=off"]
    )
    return run_job(cfg, tmp_path)


def test_nan_hunt_really_diverges_and_is_located(tmp_path):
    job = _short("nan_hunt", tmp_path)
    assert job["counts"]["diverged"] == 2
    for member in job["members"]:
        div = member["divergence"]
        assert member["diverged_at_step"] > 1000  # after learning starts (algo.learning_starts)
        assert div["cause"] in ("nonfinite_loss", "nonfinite_grad", "nonfinite_param")
        assert div["where"] and div["where"] != "unknown" and div["detail"]
    assert job["members"][0]["steps"] < 3000  # every member diverged: the job ended early


def test_nan_hunt_with_tanh_does_not_diverge(tmp_path):
    job = _short("nan_hunt/tanh", tmp_path)
    assert job["counts"] == {"ok": 2, "diverged": 0, "crashed": 0}


FINDINGS = sorted(p.stem for p in (ROOT / "conf" / "experiment" / "finding").glob("*.yaml"))
TINY = ["total_steps=400", "algo.learning_starts=100", "num_seeds=2", "logger.log_every=200", "logger.mode=disabled"]


@pytest.mark.heavy
@pytest.mark.parametrize("name", FINDINGS)
def test_finding_runs_as_written_at_a_tiny_budget(name, tmp_path):
    """Each finding's command as docs/findings.md gives it, at a tiny budget: every cell of its grid trains
    and writes its summary. A swept key with more than two values keeps its first (the grids' 192 cells
    would take minutes even tiny)."""
    sweep = tmp_path / "sweep"
    params = compose_hydra([f"+experiment=finding/{name}"], return_hydra_config=True).hydra.sweeper.params
    values = {key: str(v).split(",") for key, v in params.items()}
    values = {key: v if len(v) <= 2 else v[:1] for key, v in values.items()}
    narrowed = [f"{key}={','.join(v)}" for key, v in values.items() if len(v) == 1]
    args = [f"+experiment=finding/{name}", *TINY, *narrowed, "logger.progress=off", f"hydra.sweep.dir={sweep}"]
    proc = run_cli(args, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    expected = math.prod(len(v) for v in values.values())
    summaries = sorted(sweep.glob("*/summary.json"))
    assert len(summaries) == expected
    for path in summaries:
        job = json.loads(path.read_text())
        assert job["counts"]["crashed"] == 0 and sum(job["counts"].values()) == 2


@pytest.mark.heavy
def test_bench_smoke_writes_consistent_figures(tmp_path):
    """A tiny run of every section but packing (two grids of 24 jobs, minutes even tiny): each figure is
    measured, and each ratio is the one of its medians."""
    out = tmp_path / "bench.json"
    steps = 1500
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench.py"),
            "--steps",
            str(steps),
            "--ppo-steps",
            "1024",
            "--minatar-steps",
            "300",
            "--repeats",
            "1",
            "--populations",
            "1",
            "16",
            "--only",
            "dqn_vs_sb3",
            "population",
            "diagnostics",
            "startup",
            "ppo_vs_sb3",
            "minatar_vs_sb3",
            "minatar_population",
            "minatar_floor",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    bench = json.loads(out.read_text())
    medians, samples = bench["medians_s"], bench["samples_s"]
    assert set(medians) == {
        "dqn_rlexp",
        "dqn_rlexp_loop",
        "dqn_sb3",
        "population_p1",
        "population_p16",
        "diagnostics_default",
        "diagnostics_off",
        "startup_to_first_step",
        "startup_process",
        "ppo_rlexp",
        "ppo_rlexp_loop",
        "ppo_sb3",
        "minatar_rlexp",
        "minatar_rlexp_loop",
        "minatar_sb3",
        "minatar_p1",
        "minatar_p8",
        "minatar_update",
        "minatar_floor",
    }
    assert all(v > 0 for v in medians.values())
    assert all(samples[name] == [value] for name, value in medians.items())  # one repeat: the median is it
    ratios = bench["ratios"]
    assert ratios["dqn_speedup_vs_sb3"] == pytest.approx(medians["dqn_sb3"] / medians["dqn_rlexp"])
    assert ratios["per_seed_throughput_p16_vs_p1"] == pytest.approx(
        16 * medians["population_p1"] / medians["population_p16"]
    )
    assert ratios["diagnostics_overhead"] == pytest.approx(
        medians["diagnostics_default"] / medians["diagnostics_off"] - 1.0
    )
    assert ratios["startup_to_first_step_s"] == pytest.approx(medians["startup_to_first_step"])
    assert ratios["ppo_speedup_vs_sb3"] == pytest.approx(medians["ppo_sb3"] / medians["ppo_rlexp"])
    assert ratios["minatar_dqn_speedup_vs_sb3"] == pytest.approx(medians["minatar_sb3"] / medians["minatar_rlexp"])
    assert ratios["minatar_per_seed_p8_vs_p1"] == pytest.approx(8 * medians["minatar_p1"] / medians["minatar_p8"])
    assert ratios["minatar_update_over_floor"] == pytest.approx(medians["minatar_update"] / medians["minatar_floor"])
    assert set(bench["targets"]) == set(ratios) == set(bench["passed"]) == set(bench["ratios_per_round_median"])
    samples, rounds = bench["samples_s"], bench["settings"]["repeats"]
    per_round = [samples["ppo_sb3"][r] / samples["ppo_rlexp"][r] for r in range(rounds)]
    assert bench["ratios_per_round_median"]["ppo_speedup_vs_sb3"] == pytest.approx(statistics.median(per_round))
    assert ratios["packed_grid_speedup"] is None and bench["passed"]["packed_grid_speedup"] is None  # not measured
    assert ratios["sac_mujoco_speedup_vs_sb3"] is None  # optional: measured only with --only
    assert ratios["sac_update_over_floor"] is None and bench["targets"]["sac_update_over_floor"] is None  # no target
    assert ratios["td3_mujoco_per_seed_p5_vs_p1"] is None
    for name, value in ratios.items():
        if value is None:
            assert bench["passed"][name] is None
            continue
        target = bench["targets"][name]
        assert bench["passed"][name] == (value >= target["value"] if target["op"] == ">=" else value <= target["value"])
    # whole-process times hold the loop and the start-up: the first env step comes after launch, before exit
    assert medians["dqn_rlexp_loop"] < medians["dqn_rlexp"] and medians["ppo_rlexp_loop"] < medians["ppo_rlexp"]
    assert 0 < medians["startup_to_first_step"] < medians["startup_process"]
    assert set(bench["peak_rss_mb"]) == {"1", "16"} and all(v > 0 for v in bench["peak_rss_mb"].values())
    assert bench["throughput"]["16"]["per_seed_steps_per_s"] == pytest.approx(steps / medians["population_p16"])
    settings = bench["settings"]
    assert (settings["steps"], settings["ppo_steps"], settings["repeats"], settings["populations"]) == (
        steps,
        1024,
        1,
        [1, 16],
    )
    assert bench["versions"]["stable_baselines3"] and bench["versions"]["torch"] and bench["machine"]["cpus"] >= 1
    assert len(bench["machine"]["load_average_start"]) == 3 and len(bench["machine"]["load_average_end"]) == 3
