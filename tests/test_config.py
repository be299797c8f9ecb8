"""The configuration layer: presets never lock their groups, the schemas come from the registries,
one list of non-cell keys, the --help text and docs/configuration.md generated from the schemas."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from rlexp.build import validate
from rlexp.config import NON_CELL_KEYS, Config, field_help
from rlexp.config_doc import markdown
from rlexp.grad import CLIPPERS
from rlexp.optim import OPTIMIZERS
from rlexp.registry import DOC, SCHEMAS, group_options, register

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
STABILITY_GROUPS = ("activation", "init", "normalization", "clipping", "optimizer")


# the top-level presets (each nested nan_hunt/<change> is nan_hunt with one change: tests/test_presets.py)
PRESETS = [p.stem for p in sorted((CONF / "experiment").glob("*.yaml"))]


@pytest.mark.parametrize("group", STABILITY_GROUPS)
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_with_every_stability_option(preset, group):
    """A preset sets keys of its groups; every option of those groups still composes and validates."""
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for option in group_options(group):
            cfg = compose(config_name="config", overrides=[f"+experiment={preset}", f"{group}={option}"])
            assert cfg[group].name == option
            validate(cfg)


@pytest.mark.parametrize("group", sorted(SCHEMAS))
def test_every_option_schema_of_a_group_has_the_same_keys(group):
    keys = {tuple(f.name for f in fields(schema)) for schema in SCHEMAS[group].values()}
    assert len(keys) == 1, keys


@pytest.mark.parametrize("group", sorted(SCHEMAS))
def test_every_key_says_what_it_does(group):
    for schema in SCHEMAS[group].values():
        assert all(field_help(schema, f.name) for f in fields(schema)), schema.__name__


def test_the_schemas_come_from_the_registries():
    assert SCHEMAS["clipping"] == {name: entry.schema for name, entry in CLIPPERS.items()}
    assert SCHEMAS["optimizer"] == {name: entry.schema for name, entry in OPTIMIZERS.items()}


def test_register_is_idempotent_and_stores_every_schema():
    register()
    register()
    store = ConfigStore.instance()
    for group, options in SCHEMAS.items():
        assert set(store.list(f"schema/{group}")) == {f"{option}.yaml" for option in options}


def test_option_yamls_hold_no_value_their_schema_holds():
    """Each default is written once: an option yaml names its schema and option, nothing else
    (an algorithm's yaml also sets other groups' keys: its learning rate, its env count)."""
    for group in ("clipping", "optimizer", "network", "divergence", "env", "algo"):
        for option in group_options(group):
            raw = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"))
            raw.pop("defaults")
            own = raw.pop("algo") if group == "algo" else raw
            assert set(own) == ({"id"} if group == "env" else {"name"}), (group, option, own)


def test_the_top_level_config_holds_no_values():
    raw = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"))
    assert set(raw) == {"defaults", "hydra"}


def test_non_cell_keys_are_hydras_exclusions():
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", return_hydra_config=True)
    assert list(cfg.hydra.job.config.override_dirname.exclude_keys) == list(NON_CELL_KEYS)


def test_help_lists_the_groups_and_keys():
    proc = subprocess.run(
        [sys.executable, "-m", "rlexp.train", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    for group in SCHEMAS:
        assert f"{group}: {', '.join(group_options(group))}\n" in text, group
    assert "activation: elu, gelu, " in text
    assert "nan_hunt/tanh" in text
    for f in fields(Config):
        if f.name not in SCHEMAS:
            assert f"\n{f.name}" in text, f.name
    assert DOC in text
    assert "schema/" not in text and "hydra/" not in text


def test_configuration_doc_is_generated_from_the_schemas():
    assert (ROOT / DOC).read_text() == markdown(), f"regenerate it: python -m rlexp.config_doc > {DOC}"
