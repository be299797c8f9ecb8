"""Config groups and their schemas, built from the implementation registries, and ``register()``.

A config group maps one-to-one onto a registry whose entries carry ``.schema``, the dataclass of the
option's config: ``SCHEMAS[group][option]``. ``register()`` stores every schema in Hydra's
ConfigStore (``schema/<group>/<option>``, which each ``conf/<group>/<option>.yaml`` names) and
registers rlexp's resolvers; the entry point and the tests call it before composing a config.

An option registered from code (a plugin's: ``rlexp.compose.plugins``) has no yaml: ``store_option``
stores its schema and its option node in the ConfigStore, where Hydra finds it beside conf/'s, and
``CODE_OPTIONS`` keeps what the help and the configuration doc say of it.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING as REQUIRED
from omegaconf import OmegaConf

from rlexp.algos import ALGOS
from rlexp.config.schema import (
    NON_CELL_KEYS,
    AlgoConfig,
    Config,
    DivergenceConfig,
    EnvConfig,
    field_help,
)
from rlexp.diagnostics.interventions import INTERVENTIONS
from rlexp.nn.activations import ACTIVATIONS
from rlexp.nn.init import INITIALIZERS
from rlexp.nn.nets import NORMALIZATIONS
from rlexp.nn.networks import NETWORKS
from rlexp.optim.optimizers import OPTIMIZERS
from rlexp.optim.pipeline import CLIPPERS
from rlexp.run.jobs import hydra_subdir

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
_REGISTERED = False  # register() has run in this process (storing ~50 schemas again costs ~0.4 s)
DOC = "docs/configuration.md"


def _schemas(registry: Mapping[str, Any]) -> dict[str, type]:
    """option -> schema of a registry whose entries carry ``.schema``."""
    return {name: entry.schema for name, entry in registry.items()}


# group -> option -> schema; the five stability groups first, in the order a grid names them
SCHEMAS: dict[str, dict[str, type]] = {
    "activation": _schemas(ACTIVATIONS),
    "init": _schemas(INITIALIZERS),
    "normalization": _schemas(NORMALIZATIONS),
    "clipping": _schemas(CLIPPERS),
    "optimizer": _schemas(OPTIMIZERS),
    "network": _schemas(NETWORKS),
    "algo": _schemas(ALGOS),
    "env": {"base": EnvConfig},  # one schema for every environment: conf/env/<name>.yaml sets its id
    "divergence": {"on": DivergenceConfig, "off": DivergenceConfig},
    "intervention": _schemas(INTERVENTIONS),
}


@dataclass(frozen=True)
class CodeOption:
    """An option registered from code: what it is (the yaml comment of conf/'s options) and who registered it."""

    doc: str
    source: str  # the plugin that registered it


# group -> option -> CodeOption: the options registered from code, in their order
CODE_OPTIONS: dict[str, dict[str, CodeOption]] = {}


def store_option(group: str, option: str, schema: type, node: Any, doc: str, source: str) -> None:
    """Register ``group=option`` from code: its schema (``schema/<group>/<option>``) and its option node
    (``node``: the config the option composes, in the group's package or, for ``algo``, the global one, as
    its yaml would be) in Hydra's ConfigStore, the schema in ``SCHEMAS``, ``doc`` in ``CODE_OPTIONS``."""
    store = ConfigStore.instance()
    store.store(group=f"schema/{group}", name=option, node=schema, provider=source)
    package = "_global_" if group == "algo" else None
    store.store(group=group, name=option, node=node, package=package, provider=source)
    if group != "env":  # every env option has the one schema (SCHEMAS["env"]["base"])
        SCHEMAS[group][option] = schema
    CODE_OPTIONS.setdefault(group, {})[option] = CodeOption(doc, source)


def own_key_fix(key: str) -> str | None:
    """The fix of ``algo.<key>`` set with an algorithm that lacks it, when ``key`` is a plugin algorithm's own
    key (its schema's, not ``AlgoConfig``'s); else None."""
    owners = [f"algo={name}" for name, schema in SCHEMAS["algo"].items() if key in schema.__dataclass_fields__]
    if not owners or key in AlgoConfig.__dataclass_fields__:
        return None
    return f"it is a key of {' or '.join(owners)} alone: pick that algorithm or remove the key"


def job_config(config: Mapping[str, Any]) -> Any:
    """A job's saved config (a dict, as summary.json and checkpoints hold it) as a structured ``Config``
    (DictConfig), its algo block typed by its option's schema, so a plugin algorithm's own keys fit (the
    job's plugins loaded first)."""
    schema = SCHEMAS["algo"].get(str((config.get("algo") or {}).get("name")))
    typed = {"algo": OmegaConf.structured(schema)} if schema is not None else {}
    return OmegaConf.merge(OmegaConf.structured(Config), typed, config)


def register() -> None:
    """Store the schemas in Hydra's ConfigStore and register rlexp's resolvers (idempotent):
    ``rlexp.hydra_subdir`` (hydra.output_subdir), ``rlexp.non_cell_keys`` (the keys Hydra leaves
    out of a job's override_dirname, its cell) and ``rlexp.help`` (the --help text)."""
    global _REGISTERED
    if _REGISTERED:
        return
    store = ConfigStore.instance()
    store.store(name="schema", node=Config)
    for group, options in SCHEMAS.items():
        for option, schema in options.items():
            store.store(group=f"schema/{group}", name=option, node=schema)
    resolvers = {
        "rlexp.hydra_subdir": hydra_subdir,
        "rlexp.non_cell_keys": lambda: list(NON_CELL_KEYS),
        "rlexp.help": lambda: help_text().replace("$", "$$"),  # Hydra reads the help as a string.Template
    }
    for name, resolver in resolvers.items():
        OmegaConf.register_new_resolver(name, resolver, replace=True)
    _REGISTERED = True


def format_default(value: Any) -> str:
    """A default as the command line writes it (null, true, [64, 64], 0.001)."""
    if value == REQUIRED:
        return "(required)"
    return value if isinstance(value, str) else json.dumps(value)


def group_options(group: str, code: bool = True) -> list[str]:
    """The options of a config group: its yamls (experiment: the presets, nested ones as dir/name) and,
    with ``code``, those registered from code (``CODE_OPTIONS``)."""
    root = CONF_DIR / group
    yamls = sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))
    return yamls + (sorted(CODE_OPTIONS.get(group, {})) if code else [])


def help_text() -> str:
    """``python -m rlexp.train --help``: the groups with their options, the top-level keys, the docs."""
    lines = [
        "rlexp: deep-RL training stability. Train one config (a population of num_seeds members), or sweep:",
        "  python -m rlexp.train [group=option ...] [key=value ...]",
        "  python -m rlexp.train -m activation=relu,tanh init=xavier,he",
        "",
        "== Groups (group=option): what each picks, then its options ==",
    ]
    for group in SCHEMAS:
        lines += [f"{group}: {field_help(Config, group)}", f"    {', '.join(group_options(group))}"]
    lines += [
        "",
        "== Presets (+experiment=name) ==",
        textwrap.fill(", ".join(group_options("experiment")), 110),
        "",
        "== Top-level keys (key=value; a.b=value inside a block) ==",
    ]
    top = [f for f in fields(Config) if f.name not in SCHEMAS]
    width = max(len(f.name) for f in top) + 2
    config = Config()
    for f in top:
        value = getattr(config, f.name)
        block = is_dataclass(value)
        name, default = (f"{f.name}.*", "") if block else (f.name, f" (default {format_default(value)})")
        lines.append(f"{name:<{width}}: {field_help(Config, f.name)}{default}")
    lines += [
        "",
        f"Every group, option and key with its meaning and default: {DOC}",
        "Hydra's own options: --hydra-help",
        "",
    ]
    return "\n".join(lines)
