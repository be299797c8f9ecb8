"""docs/extending.md's examples, run as they are written: a preset of one's own, an environment named
``module:EnvId``, a plugin named by ``plugins=[...]`` and the example plugin installed (its entry point on
the path), with a grid over its options against rlexp's own, packed and alone, and a grid over its
algorithm's own key, packed and alone, one job evaluated from its checkpoint and one interrupted and
resumed. And a plugin that cannot be registered: one line, exit code 2, nothing written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from launching import ROOT, cli_env, describe, job_dirs, read_json, read_jsonl, run_cli
from test_checkpoints import assert_same_job, metrics

pytestmark = pytest.mark.heavy  # the guide's sessions as written: CI runs them (-m heavy), not the default suite

DOC = ROOT / "docs" / "extending.md"
EXAMPLE = ROOT / "examples" / "rlexp_plugin_example"


def doc_blocks() -> list[str]:
    """The doc's shell sessions (its ```bash blocks), in order."""
    return re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)


def installed(tmp: Path) -> Path:
    """``pip install -e examples/rlexp_plugin_example`` emulated: a dist-info holding its entry points (from
    its pyproject.toml) in a dir the session's ``PYTHONPATH`` holds, beside the package's own dir."""
    import tomllib

    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    site = tmp / "site"
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)  # a later session installs it again
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    points = project["entry-points"]["rlexp.plugins"]
    (info / "entry_points.txt").write_text("[rlexp.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()))
    return site


def run_block(block: str, tmp: Path) -> subprocess.CompletedProcess:
    """A doc block as a bash script in ``tmp`` (``examples`` linked there), its ``python`` this interpreter
    with this worktree's rlexp first; a ``pip install`` line is emulated (``installed``)."""
    bin_dir = tmp / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        shim = f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{ROOT}" exec {sys.executable} "$@"\n'
        (bin_dir / "python").write_text(shim)
        (bin_dir / "python").chmod(0o755)
        (tmp / "examples").symlink_to(ROOT / "examples")
    env = cli_env(tmp)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env.pop("PYTHONPATH", None)
    lines = []
    for line in block.splitlines():
        if line.startswith("pip install -e examples/rlexp_plugin_example"):
            env["PYTHONPATH"] = f"{installed(tmp)}:{EXAMPLE}"
        else:
            lines.append(line)
    script = "set -e\n" + "\n".join(lines)
    return subprocess.run(["bash", "-c", script], cwd=tmp, env=env, capture_output=True, text=True, timeout=600)


def outputs(proc: subprocess.CompletedProcess, word: str) -> list[Path]:
    """The dirs a session's runs named (``outputs: <dir>``, ``sweep: <dir>``)."""
    return [Path(m) for m in re.findall(rf"^{word}: (\S+)$", proc.stdout, re.M)]


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("extending")
    blocks = doc_blocks()
    assert len(blocks) == 5, "docs/extending.md: a preset, an env, a named plugin, the installed example, its algorithm"
    runs = [run_block(block, tmp) for block in blocks]
    for proc in runs:
        assert proc.returncode == 0, describe(proc)
    return tmp, runs


def summary(run_dir: Path) -> dict:
    return read_json(run_dir / "summary.json")


def test_a_preset_of_ones_own_applies(sessions):
    tmp, runs = sessions
    (run,) = outputs(runs[0], "outputs")
    job = summary(tmp / run)
    assert job["config"]["activation"]["name"] == "tanh" and job["config"]["init"]["name"] == "orthogonal"
    assert job["config"]["total_steps"] == 1000 and job["counts"]["ok"] == 1


def test_an_environment_named_module_colon_id_trains_a_population(sessions):
    tmp, runs = sessions
    (run,) = outputs(runs[1], "outputs")
    job = summary(tmp / run)
    assert job["config"]["env"]["id"] == "myenvs:MyCartPole-v0"
    assert job["counts"]["ok"] == 2
    for k in range(2):
        member = read_json(tmp / run / f"seed_{k}" / "summary.json")
        assert member["steps"] == 1000 and member["status"] == "ok"


def test_a_named_plugin_adds_an_activation_and_an_instrument(sessions):
    tmp, runs = sessions
    (run,) = outputs(runs[2], "outputs")
    job = summary(tmp / run)
    assert job["config"]["activation"]["name"] == "square_relu" and job["config"]["plugins"] == ["myplugin"]
    records = read_jsonl(tmp / run / "seed_0" / "metrics.jsonl")
    instrumented = [r for r in records if "act_max/q.0" in r]
    assert instrumented, "the plugin's instrument is in the record"
    for r in instrumented:  # relu(x)^2 >= 0, and its largest output is the layer's max
        assert r["act_max/q.0"] >= 0 and r["act_max/q.0"] >= r["act_mean/q.0"]


def test_the_installed_plugin_shows_in_help_and_trains_packed_and_alone(sessions):
    tmp, runs = sessions
    proc = runs[3]
    assert re.search(r"^normalization: .*\n .*\blayer_weight\b", proc.stdout, re.M), proc.stdout[:2000]
    packed, alone = outputs(proc, "sweep")
    assert "rlexp_packed: 4 jobs" in proc.stdout
    cells = {}
    for job_dir in job_dirs(tmp / packed):
        job = summary(job_dir)
        assert job["counts"]["ok"] == 1, job_dir
        assert job["config"]["env"]["id"] == "rlexp_plugin_example.envs:Corridor-v0"
        assert (
            job["cell"] == f"activation={job['choices']['activation']},normalization={job['choices']['normalization']}"
        )
        cells[job["choices"]["activation"], job["choices"]["normalization"]] = job_dir
    assert set(cells) == {(a, n) for a in ("softplus", "relu") for n in ("layer_weight", "layer")}
    # a job alone computes what the same cell computes packed: its metrics bitwise (timings aside)
    for job_dir in job_dirs(tmp / alone):
        choices = summary(job_dir)["choices"]
        mine = read_jsonl(job_dir / "seed_0" / "metrics.jsonl")
        theirs = read_jsonl(cells[choices["activation"], choices["normalization"]] / "seed_0" / "metrics.jsonl")
        strip = [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in (*mine, *theirs)]
        assert json.dumps(strip[: len(mine)]) == json.dumps(strip[len(mine) :]), choices
        assert any("act_absmax/q.0" in r for r in mine), "the plugin's instrument is in the record"


def test_the_plugins_algorithm_trains_a_grid_over_its_own_key_packed_as_alone(sessions):
    tmp, runs = sessions
    proc = runs[4]
    assert "rlexp_packed: 2 jobs in 1 packs" in proc.stdout, proc.stdout[:2000]  # one population of two members
    packed, alone = (tmp / "sarsa" / "packed", tmp / "sarsa" / "alone")
    for num, target_epsilon in enumerate((0.0, 0.2)):
        job = summary(alone / str(num))
        assert job["counts"]["ok"] == 1 and job["choices"]["algo"] == "expected_sarsa"
        assert job["config"]["algo"]["target_epsilon"] == target_epsilon and job["config"]["optimizer"]["lr"] == 1e-3
        assert metrics(alone / str(num) / "seed_0") == metrics(packed / str(num) / "seed_0")  # bitwise, perf/ aside
    records = metrics(alone / "0" / "seed_0")
    assert records[-1]["step"] == 600 and records[-1]["train/updates"] > 0
    assert any("act_absmax/q.0" in r for r in records), "the plugin's instrument reads the algorithm's network"
    assert metrics(alone / "0" / "seed_0") != metrics(alone / "1" / "seed_0"), "algo.target_epsilon is read"


SARSA_CELL = (  # the doc's second grid's job 1
    "algo=expected_sarsa algo.target_epsilon=0.2 env=corridor total_steps=600 algo.learning_starts=200 "
    "logger.log_every=300 logger.progress=off logger.mode=disabled checkpoint.every=300 checkpoint.replay=true"
)
CUT_AND_RESUMED = """
import sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
from composing import compose_config
from rlexp.compose.plugins import load_plugins
from rlexp.train import run_job

load_plugins()  # the installed example
overrides, job = sys.argv[2].split(), Path(sys.argv[3])
try:
    run_job(compose_config([*overrides, "debug.crash_at_step=450"]), job)
except RuntimeError as err:
    print(err)
run_job(compose_config([*overrides, "resume=true"]), job)
"""


def test_the_plugins_algorithm_resumed_from_its_checkpoint_ends_bitwise_as_uninterrupted(sessions):
    """The doc's job interrupted after its checkpoint at step 300 and continued from it (one process, as
    tests/jobs/test_checkpoints.py runs them) ends as the doc's uninterrupted job: every metrics record,
    the member summary and every tensor of the final checkpoint."""
    tmp, _ = sessions
    cut = tmp / "sarsa" / "cut"
    env = cli_env(tmp, PYTHONPATH=f"{installed(tmp)}:{EXAMPLE}:{ROOT}")
    args = [sys.executable, "-c", CUT_AND_RESUMED, str(ROOT / "tests"), SARSA_CELL, str(cut)]
    proc = subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "debug.crash_at_step=450: a forced crash" in proc.stdout, describe(proc)
    assert summary(cut)["resumed"] == {"from_step": 300, "replay_restored": True, "as_uninterrupted": True}
    assert_same_job(tmp / "sarsa" / "alone" / "1", cut, 1)


def test_a_plugin_that_fails_to_import_is_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "brokenplugin.py").write_text("import not_a_module_anywhere\n")
    run_dir = tmp_path / "run"
    proc = run_cli(["plugins=[brokenplugin]", f"hydra.run.dir={run_dir}"], tmp_path / "cli", PYTHONPATH=str(tmp_path))
    assert proc.returncode == 2, describe(proc)
    assert proc.stdout == "" and proc.stderr.splitlines() == [
        "config error: plugins: plugin brokenplugin fails to import (ModuleNotFoundError: No module named "
        "'not_a_module_anywhere'); install it or put it on PYTHONPATH"
    ]
    assert not run_dir.exists()


def test_the_suites_registry_tests_cover_an_installed_plugins_options(tmp_path):
    """With the example plugin installed, the suite's tests parametrized over the registries run on its
    options too: tests/nn/test_registries.py on its activation and normalization (against the activation's
    declared definition and torch.nn twins of its layers), tests/algos/test_algo_specs.py on its algorithm's
    spec and tests/compose/test_options.py on its algorithm option."""
    env = cli_env(tmp_path, PYTHONPATH=f"{installed(tmp_path)}:{EXAMPLE}:{ROOT}")
    env.pop("RLEXP_TESTS_COMPOSED", None)  # a session of its own
    args = ["-m", "pytest", "-q", "-n0", "-p", "no:cacheprovider", "tests/nn/test_registries.py"]
    args += ["tests/algos/test_algo_specs.py", "tests/compose/test_options.py"]
    proc = subprocess.run(
        [sys.executable, *args, "-k", "softplus or layer_weight or expected_sarsa", "-rA"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, describe(proc)
    passed = re.findall(r"^PASSED (\S+)", proc.stdout, re.M)
    assert (
        "tests/nn/test_registries.py::test_population_equals_torch_nn_twins_per_member[softplus-layer_weight]" in passed
    )
    assert "tests/nn/test_registries.py::test_written_backward_is_autograd_bit_for_bit[softplus-layer]" in passed
    assert "tests/nn/test_registries.py::test_instruments_and_divergence_location[relu-layer_weight]" in passed
    specs = {t for t in passed if t.startswith("tests/algos/test_algo_specs.py::") and t.endswith("[expected_sarsa]")}
    assert len(specs) == 3, passed  # its replay, its roles, network=lstm refused (it is not recurrent)
    assert "tests/compose/test_options.py::test_every_option_composes_and_validates[algo=expected_sarsa]" in passed
