"""The packed launcher's parts (hydra_plugins/rlexp_packed_launcher), in process: a job's config composed
once per structure equals Hydra's own composition of it; each backend's settings checked before anything
is submitted, a refusal naming the key, the value and the fix."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from composing import _hydra_on_conf, compose_hydra
from omegaconf import OmegaConf

from hydra_plugins.rlexp_packed_launcher.backends import backend
from hydra_plugins.rlexp_packed_launcher.composer import SweepComposer
from hydra_plugins.rlexp_packed_launcher.config import PackedLauncherConf
from rlexp.config.schema import ConfigError


def test_a_job_config_from_its_structure_equals_hydras_composition():
    """Group sweeps (one structure each), value sweeps of scalars and lists, a key added: every job's config,
    handed out fresh or as the kept copy its structure's jobs share, is Hydra's, unresolved and resolved."""
    master = compose_hydra(["+experiment=stability_grid_small", "hydra.sweep.dir=/tmp/grid"], return_hydra_config=True)
    loader = _hydra_on_conf().hydra.config_loader
    composer = SweepComposer(loader)
    jobs = [
        [
            "+experiment=stability_grid_small",
            f"activation={a}",
            f"optimizer.lr={lr}",
            f"seed={s}",
            f"network.hidden={h}",
        ]
        + (["+env.kwargs.extra=1"] if s == 8 else [])
        for a in ("relu", "tanh")
        for lr in (0.01, 0.001)
        for s in (0, 8)
        for h in ("[32,32]", "[16]")
    ]
    for num, overrides in enumerate(jobs):
        spec = composer.spec(master, overrides, num)
        ours = composer.config(master, spec, fresh=num % 3 == 0)
        hydras = loader.load_sweep_config(master, overrides)
        hydras.hydra.job.id, hydras.hydra.job.num = f"{hydras.hydra.job.name}_{num}", num
        assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(hydras), overrides
        task = [k for k in ours if k != "hydra"]
        assert {k: OmegaConf.select(ours, k) for k in task} == {k: OmegaConf.select(hydras, k) for k in task}
        assert OmegaConf.is_struct(ours) and OmegaConf.is_struct(hydras)
    assert len(composer.structures) == 2  # one per activation: the rest are values applied to a copy


def conf(**keys) -> PackedLauncherConf:
    launcher = OmegaConf.structured(PackedLauncherConf)
    for key, value in keys.items():
        OmegaConf.update(launcher, key, value)
    return launcher


def refusal(launcher, tmp_path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        backend(launcher, tmp_path)
    return str(err.value)


def test_an_unknown_backend_is_refused_naming_the_options(tmp_path):
    line = refusal(conf(backend="slrum"), tmp_path)
    assert line == (
        "config error: hydra.launcher.backend: unknown backend 'slrum'; did you mean hydra.launcher.backend=slurm? "
        "use one of: local, submitit_local, slurm, ray"
    )


@pytest.mark.parametrize("name,module,extra", [("submitit_local", "submitit", "submitit"), ("ray", "ray", "ray")])
def test_a_backend_without_its_extra_names_the_extra(tmp_path, monkeypatch, name, module, extra):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: None if m == module else find_spec(m, *a))
    line = refusal(conf(backend=name), tmp_path)
    assert line == f"config error: hydra.launcher.backend: {name} needs {module}, which is not installed; " + (
        f"pip install -e '.[{extra}]'"
    )


def fake_sinfo(tmp_path: Path, monkeypatch, partitions: str | None) -> None:
    """PATH holding only a ``sinfo`` that lists ``partitions`` (None: no sinfo at all)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if partitions is not None:
        script = bin_dir / "sinfo"
        script.write_text(f"#!/bin/sh\nprintf '{partitions}'\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


def test_slurm_settings_are_checked_before_submitting(tmp_path, monkeypatch):
    key = "hydra.launcher.submitit.partition"
    required = refusal(conf(backend="slurm", **{"submitit.require_partition": True}), tmp_path)
    assert (
        required
        == f"config error: {key}: null, and hydra.launcher.submitit.require_partition is true; set {key}=<name>"
    )
    fake_sinfo(tmp_path, monkeypatch, None)
    assert refusal(conf(backend="slurm"), tmp_path) == (
        "config error: hydra.launcher.backend: slurm needs SLURM's commands, and sinfo is not on PATH; "
        "run the grid on a SLURM login node, or use hydra.launcher.backend=submitit_local"
    )


def test_slurm_partitions_are_those_sinfo_lists(tmp_path, monkeypatch):
    key = "hydra.launcher.submitit.partition"
    fake_sinfo(tmp_path, monkeypatch, "debug*\\ngpu\\n")
    chosen = backend(conf(backend="slurm", **{"submitit.partition": "gpu", "submitit.account": "lab"}), tmp_path)
    assert (chosen.name, chosen.cluster, chosen.folder) == ("submitit", "slurm", tmp_path / ".submitit")
    assert chosen.parameters["slurm_partition"] == "gpu" and chosen.parameters["slurm_account"] == "lab"
    assert "slurm_partition" not in backend(conf(backend="slurm"), tmp_path).parameters  # the default: debug
    assert refusal(conf(backend="slurm", **{"submitit.partition": "cpu"}), tmp_path) == (
        f"config error: {key}: unknown partition 'cpu'; use one of: debug, gpu"
    )
    (tmp_path / "bin" / "sinfo").write_text("#!/bin/sh\nprintf 'a\\nb\\n'\n")
    assert refusal(conf(backend="slurm"), tmp_path) == (
        f"config error: {key}: null, and the cluster has no default partition; set {key} to one of: a, b"
    )


def test_the_local_backend_and_submitits_local_executor_take_their_settings(tmp_path):
    assert (backend(conf(n_jobs=3), tmp_path).name, backend(conf(n_jobs=3), tmp_path).n_jobs) == ("local", 3)
    local = backend(conf(backend="submitit_local", **{"submitit.timeout_min": 5}), tmp_path)
    assert (local.name, local.cluster) == ("submitit", "local")  # (Hydra's plugin scan reloads the module's classes)
    assert local.parameters == {"name": "rlexp_packed", "timeout_min": 5, "cpus_per_task": 2}
