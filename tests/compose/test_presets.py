"""The experiment presets: nan_hunt's single changes (``+experiment=nan_hunt/<change>``) change one thing
each and its baseline is the documented setting; the stability grids and the launcher presets compose as
documented (their jobs are in tests/jobs/)."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import pytest
from composing import compose_config, compose_hydra
from launching import CONF
from omegaconf import OmegaConf, open_dict

from rlexp.compose.validate import validate

ROOT = Path(__file__).resolve().parents[2]
CHANGES = sorted(p.stem for p in (ROOT / "conf" / "experiment" / "nan_hunt").glob("*.yaml"))
# what each single change is expected to alter in the composed config (dotted key -> value); every option
# of a group has the group's keys, so a change of option alters only the values that differ
EXPECTED = {
    "none": {},
    "tanh": {"activation.name": "tanh"},
    "elu": {"activation.name": "elu"},
    "clip_global_norm": {"clipping.name": "global_norm"},
    "clip_per_tensor": {"clipping.name": "per_tensor", "clipping.max_norm": 5.0},
    # (from init=default, whose bias is PyTorch's own (null), to a scheme with a constant bias 0)
    "init_he": {"init.name": "he", "init.bias": 0.0},
    "init_xavier": {"init.name": "xavier", "init.gain": 1.0, "init.bias": 0.0},
    "init_orthogonal": {"init.name": "orthogonal", "init.bias": 0.0},
    "wn_eps": {"normalization.eps": 1e-8},
    "target_network": {"algo.target_network": True},
    "lr_1e-3": {"optimizer.lr": 1e-3},
    "layer_norm": {"normalization.name": "layer", "normalization.eps": 1e-5},
}


def flat(cfg) -> dict:
    out = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value

    walk(OmegaConf.to_container(cfg), "")
    return out


def test_every_change_is_documented_here():
    assert set(CHANGES) == set(EXPECTED)


@pytest.mark.parametrize("change", CHANGES)
def test_nan_hunt_change_alters_exactly_its_key(change):
    base = flat(compose_config(["+experiment=nan_hunt"]))
    cfg = compose_config([f"+experiment=nan_hunt/{change}"])
    validate(cfg)
    changed = flat(cfg)
    keys = set(base) | set(changed)
    diff = {k: changed.get(k) for k in keys if base.get(k, "<absent>") != changed.get(k, "<absent>")}
    assert diff == EXPECTED[change]


def test_nan_hunt_baseline_is_the_documented_setting():
    cfg = flat(compose_config(["+experiment=nan_hunt"]))
    assert cfg["normalization.name"] == "weight" and cfg["normalization.eps"] == 0.0
    assert cfg["regularization.l1"] == 0.005 and cfg["optimizer.name"] == "sgd" and cfg["optimizer.lr"] == 0.01
    assert cfg["algo.target_network"] is False and cfg["activation.name"] == "relu"


SMALL_CELLS = sorted(itertools.product(["relu", "tanh"], ["none", "global_norm"]))
SEEDS = 2  # the small grid's population


FULL_GRID = {
    "activation": ["relu", "elu", "tanh", "softsign"],
    "init": ["xavier", "he", "orthogonal"],
    "normalization": ["none", "batch", "layer", "weight"],
    "clipping": ["none", "global_norm"],
    "optimizer": ["adam", "rmsprop"],
}
RAY_INSTALLED = importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is not None


# ====================================================================== presets compose
def test_stability_grid_preset_is_the_canonical_grid():
    cfg = compose_hydra(["+experiment=stability_grid"], return_hydra_config=True)
    assert cfg.hydra.mode.name == "MULTIRUN"
    assert cfg.hydra.sweep.dir == "outputs/grids/stability_grid"
    params = {k: str(v).split(",") for k, v in cfg.hydra.sweeper.params.items()}
    assert params == FULL_GRID
    assert len(list(itertools.product(*params.values()))) == 192
    for group, opts in params.items():
        assert all((CONF / group / f"{o}.yaml").is_file() for o in opts), group
    assert (cfg.num_seeds, cfg.total_steps, cfg.algo.name, cfg.env.id) == (8, 50_000, "dqn", "CartPole-v1")


def test_small_grid_preset_is_a_few_cells_with_a_tiny_budget():
    cfg = compose_hydra(["+experiment=stability_grid_small"], return_hydra_config=True)
    assert cfg.hydra.mode.name == "MULTIRUN"
    assert cfg.hydra.sweep.dir == "outputs/grids/stability_grid_small"
    params = {k: str(v).split(",") for k, v in cfg.hydra.sweeper.params.items()}
    assert sorted(itertools.product(params["activation"], params["clipping"])) == SMALL_CELLS
    assert (cfg.num_seeds, cfg.total_steps, cfg.algo.learning_starts) == (SEEDS, 2000, 200)


FINDINGS = sorted(p.stem for p in (CONF / "experiment" / "finding").glob("*.yaml"))


@pytest.mark.parametrize("name", FINDINGS)
def test_finding_preset_is_a_packed_multirun_documented_on_the_findings_page(name):
    """Each finding: a multirun of its own, packed, in outputs/findings/<name>, valid, its header citing
    the published claim and pointing at docs/findings.md, which gives its command."""
    cfg = compose_hydra([f"+experiment=finding/{name}"], return_hydra_config=True)
    assert cfg.hydra.mode.name == "MULTIRUN"
    assert cfg.hydra.sweep.dir == f"outputs/findings/{name}"
    assert cfg.hydra.launcher._target_.endswith(".PackedLauncher")
    assert len(cfg.hydra.sweeper.params) >= 1
    with open_dict(cfg):
        del cfg["hydra"]
    validate(cfg)  # the job's config
    header = (CONF / "experiment" / "finding" / f"{name}.yaml").read_text().split("defaults:")[0]
    assert "Finding:" in header and "docs/findings.md" in header
    assert any(str(year) in header for year in range(2010, 2026))  # the claim's citation
    assert f"python -m rlexp.train +experiment=finding/{name}" in header
    assert f"+experiment=finding/{name}" in (ROOT / "docs" / "findings.md").read_text()


def test_resume_does_not_change_the_cell():
    cfg = compose_hydra(["resume=true"], return_hydra_config=True)
    assert cfg.resume is True
    assert "resume" in cfg.hydra.job.config.override_dirname.exclude_keys


@pytest.mark.parametrize(
    "preset, target, keys",
    [
        ("rlexp_joblib", "JoblibLauncher", {"n_jobs": -1, "prefer": "processes"}),
        ("rlexp_packed", "PackedLauncher", {"n_jobs": -1, "max_members": 96}),
        ("rlexp_submitit_local", "LocalLauncher", {"timeout_min": 60}),
        ("rlexp_slurm", "SlurmLauncher", {"partition": None, "cpus_per_task": 2, "mem_gb": 4, "array_parallelism": 64}),
        pytest.param(
            "rlexp_ray",
            "RayLauncher",
            {},
            marks=pytest.mark.skipif(
                not RAY_INSTALLED,
                reason="hydra-ray-launcher is not installed here (its own extra: pip install -e '.[ray]')",
            ),
        ),
    ],
)
def test_launcher_preset_composes_on_the_plugin(preset, target, keys):
    launcher = compose_hydra(
        ["+experiment=stability_grid", f"hydra/launcher={preset}"], return_hydra_config=True
    ).hydra.launcher
    assert launcher._target_.endswith(f".{target}")
    assert {k: launcher[k] for k in keys} == keys
