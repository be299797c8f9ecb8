"""scripts/marl_check.py: rlexp and BenchMARL (in its own venv) on VMAS, side by side.

The comparison itself runs with ``python -m pytest -m slow tests/jobs/test_marl_check.py``; it needs BenchMARL's
venv (``MARL_CHECK_BENCHMARL_PYTHON``, default the script's /work/venvs/benchmarl/bin/python).
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "marl_check.py"
BENCHMARL_PYTHON = os.environ.get("MARL_CHECK_BENCHMARL_PYTHON", "/work/venvs/benchmarl/bin/python")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[1]), "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.mark.parametrize(
    "args, key",
    [
        (["--benchmarl-python", "/nonexistent/python"], "--benchmarl-python"),
        (["--benchmarl-python", sys.executable, "--mappo-frames", "5000"], "--mappo-frames"),
        (["--benchmarl-python", sys.executable, "--rlexp-overrides", "critic.normalization=lyer"], "--rlexp-overrides"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, key):
    done = run(*args, "--out", "out.json", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout.strip().startswith(key) and len(done.stdout.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr and not (tmp_path / "out.json").exists()


def test_summary_gives_each_sides_medians_and_the_probability_of_rlexp_above():
    spec = importlib.util.spec_from_file_location("marl_check", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    ours, theirs = [3.0, -1.0, 2.0], [2.0, 5.0, 0.0, 1.0]
    runs = [
        {"task": "balance", "algo": "maddpg", "side": side, "seed": k, "return_per_agent": v, "wall_s": 1.0 + k,
         "curve": [(6000, v - 1)]}
        for side, values in (("rlexp", ours), ("benchmarl", theirs))
        for k, v in enumerate(values)
    ]  # fmt: skip
    mine, other = script.summarize(runs)
    assert (mine["side"], mine["median_return"], other["median_return"]) == ("rlexp", 2.0, 1.5)
    # of 12 pairs, 5 above (3 > {2, 0, 1}, 2 > {0, 1}) and 1 tie (2 == 2), counted half
    assert mine["p_above_benchmarl"] == 5 / 12 + 0.5 * (1 / 12) and "p_above_benchmarl" not in other
    assert script.summarize(runs[:3])[0].keys() == other.keys()  # rlexp alone: no comparison


@pytest.mark.slow  # one MAPPO batch per side on navigation (~30-60 s)
def test_one_invocation_runs_both_sides_on_the_same_budget(tmp_path):
    if not Path(BENCHMARL_PYTHON).exists():
        pytest.skip(f"no BenchMARL venv at {BENCHMARL_PYTHON} (scripts/marl_check.py --help says how to make one)")
    pytest.importorskip("vmas", reason="pip install -e '.[marl]'")
    args = ["--algos", "mappo", "--tasks", "navigation", "--seeds", "0", "--mappo-frames", "6000"]
    args += ["--critic-layer-norm"]  # both sides' critics
    done = run("--benchmarl-python", BENCHMARL_PYTHON, *args, "--out", "out.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "out.json").read_text())
    assert [r["side"] for r in record["runs"]] == ["rlexp", "benchmarl"]
    for r in record["runs"]:
        assert r["frames"] == 6000 and r["curve"][-1] == [6000, r["return_per_agent"]]
    assert {"benchmarl", "torchrl", "torch", "vmas"} <= set(record["versions"]["benchmarl"])
    assert {"algo.num_steps=600", "critic.normalization=layer"} <= set(record["overrides"]["navigation/mappo"]["rlexp"])
