"""Plugins: code outside rlexp that registers options in rlexp's own registries (docs/extending.md).

A plugin is a module with a function ``register(plugin: Plugin) -> None``. It is found two ways:

- installed: a Python entry point in the group ``rlexp.plugins`` naming the module (``pkg.module``) or
  its function (``pkg.module:register``);
- named: the top-level key ``plugins=[pkg.module, ...]``, imported before the config is validated.

``register`` calls ``plugin.add(group, name, entry, doc)`` once per option: the entry goes into the
registry rlexp's own options of that group live in (``ACTIVATIONS``, ``NORMALIZATIONS``, ...), its schema
into ``SCHEMAS`` and, with its option node, into Hydra's ConfigStore (``registry.store_option``): the
option is then a Hydra option like any other (``activation=softplus``), listed by ``--help`` and the
configuration doc, and the suite's tests parametrized over a registry cover it. ``plugin.instrument``
adds a per-layer instrument. An algorithm's schema may add keys of its own (``algo.<key>``, each with a
default), which exist with that option alone; any other option's schema changes defaults only. An
environment needs no registration: a module that registers its gymnasium id is named by
``env.id=module:EnvId``.

A plugin that fails to import, registers a name that exists, or declares an incomplete entry is one
``ConfigError`` naming the plugin and what is missing, before any work; nothing of it is registered.
Loading is idempotent: a plugin named twice (installed and named) registers once.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import MISSING as REQUIRED
from omegaconf import OmegaConf

from rlexp.algos import ALGOS, AlgoSpec
from rlexp.compose.registry import group_options, store_option
from rlexp.config.schema import (
    ActivationConfig,
    AlgoConfig,
    ClippingConfig,
    ConfigError,
    EnvConfig,
    InitConfig,
    InterventionConfig,
    NetworkConfig,
    NormalizationConfig,
    OptimizerConfig,
    error_line,
)
from rlexp.diagnostics.instruments import HIDDEN_INSTRUMENTS, OWN_INSTRUMENTS
from rlexp.diagnostics.interventions import INTERVENTIONS, Intervention
from rlexp.nn.activations import ACTIVATIONS, Activation
from rlexp.nn.init import INITIALIZERS, Initializer
from rlexp.nn.nets import NORMALIZATIONS, Normalization
from rlexp.nn.networks import NETWORKS, Network
from rlexp.optim.optimizers import OPTIMIZERS, Optimizer
from rlexp.optim.pipeline import CLIPPERS, Clipper

ENTRY_POINTS = "rlexp.plugins"  # the entry-point group an installed plugin declares
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Group:
    """A config group a plugin may add to: the registry of its entries (None: env, whose options are
    values of ``EnvConfig``), the class every entry is, and the group's schema."""

    registry: dict[str, Any] | None
    entry: type
    base: type


GROUPS: dict[str, Group] = {
    "activation": Group(ACTIVATIONS, Activation, ActivationConfig),
    "init": Group(INITIALIZERS, Initializer, InitConfig),
    "normalization": Group(NORMALIZATIONS, Normalization, NormalizationConfig),
    "clipping": Group(CLIPPERS, Clipper, ClippingConfig),
    "optimizer": Group(OPTIMIZERS, Optimizer, OptimizerConfig),
    "network": Group(NETWORKS, Network, NetworkConfig),
    "algo": Group(ALGOS, AlgoSpec, AlgoConfig),
    "intervention": Group(INTERVENTIONS, Intervention, InterventionConfig),
    "env": Group(None, EnvConfig, EnvConfig),
}
ACTION_SPACES = ("discrete", "continuous")


@dataclass(frozen=True)
class Option:
    """One option a plugin adds: its group, name, registry entry, doc, its config node and, for an
    activation, its written-out definition (``reference(x)``, what the suite compares the entry with)."""

    group: str
    name: str
    entry: Any
    doc: str
    schema: type
    node: Any
    reference: Callable[[torch.Tensor], torch.Tensor] | None = None


class PluginError(Exception):
    """A plugin's declaration that rlexp refuses: what is wrong and the fix (the loader names the plugin)."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}; {fix}")
        self.problem, self.fix = problem, fix


class Plugin:
    """What a plugin's ``register(plugin)`` is handed: ``add`` and ``instrument`` declare its options."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.options: list[Option] = []
        self.instruments: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}

    def add(
        self,
        group: str,
        name: str,
        entry: Any,
        doc: str,
        *,
        keys: Mapping[str, Any] | None = None,
        reference: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """Declare ``group=name``: ``entry`` is what rlexp's own options of the group are (an ``Activation``,
        a ``Normalization``, an ``AlgoSpec``, ...; env: an ``EnvConfig`` with its id and keys); ``doc`` one
        line saying what it is; ``keys`` (algo) the other groups' keys it sets, as an algo yaml does
        (``{"optimizer": {"lr": 1e-3}}``; its own keys are its schema's fields); ``reference`` (activation) its
        written-out definition."""
        if group not in GROUPS:
            raise PluginError(f"adds to an unknown group {group!r}", f"use one of: {', '.join(GROUPS)}")
        option = f"{group}={name}"
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise PluginError(f"names an option {name!r}", "use letters, digits and _ (a Hydra option name)")
        taken = [o.name for o in self.options if o.group == group]
        if name in group_options(group) or name in taken or name in (GROUPS[group].registry or {}):
            raise PluginError(f"registers {option}, which exists already", "give it another name")
        if not isinstance(doc, str) or not doc.strip() or "\n" in doc:
            raise PluginError(f"declares {option} without its doc", "give one line saying what it is")
        kind = GROUPS[group].entry
        if not isinstance(entry, kind):
            got = type(entry).__name__
            raise PluginError(f"declares {option} as a {got}", f"declare a {kind.__module__}.{kind.__name__}")
        schema = kind if group == "env" else entry.schema
        _check_schema(option, schema, GROUPS[group].base, own_keys=group == "algo")
        if group == "algo":
            _check_algo(option, entry)
        if reference is not None and group != "activation":
            raise PluginError(f"gives {option} a reference", "only an activation has one")
        if keys and group != "algo":
            raise PluginError(f"gives {option} keys", "its schema's defaults are its values (only algo sets others)")
        self.options.append(Option(group, name, entry, doc.strip(), schema, _node(group, name, entry, keys), reference))

    def instrument(self, name: str, function: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Declare an instrument of every hidden layer: ``function(units)`` maps a layer's output [P, N, H]
        to [P] (one value per member), written as ``<name>/<net>.<layer>`` at each instrument record."""
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise PluginError(f"names an instrument {name!r}", "use letters, digits and _")
        if name in OWN_INSTRUMENTS or name in HIDDEN_INSTRUMENTS or name in self.instruments:
            raise PluginError(f"registers the instrument {name}, which exists already", "give it another name")
        if not callable(function):
            raise PluginError(
                f"declares the instrument {name} without a function", "give a function of a layer's units"
            )
        self.instruments[name] = function


def _check_schema(option: str, schema: Any, base: type, own_keys: bool) -> None:
    """An option's schema is its group's, or a subclass that changes defaults; with ``own_keys`` (an
    algorithm) it may add keys, each with a default."""
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema) and issubclass(schema, base)):
        raise PluginError(
            f"declares {option} with schema {schema!r}", f"use {base.__name__} or a dataclass deriving from it"
        )
    inherited = {f.name for f in dataclasses.fields(base)}
    added = [f for f in dataclasses.fields(schema) if f.name not in inherited]
    if added and not own_keys:
        raise PluginError(
            f"declares {option} with keys {', '.join(sorted(f.name for f in added))} that {base.__name__} lacks",
            "an option changes its group's defaults, never its keys (only an algorithm adds its own)",
        )
    for f in added:  # a key without a value would stop every job of the option that does not set it
        if f.default in (dataclasses.MISSING, REQUIRED) and f.default_factory is dataclasses.MISSING:
            raise PluginError(f"declares {option} with the key {f.name} without a default", "give it a default")


def _check_algo(option: str, spec: AlgoSpec) -> None:
    """The facts of an algorithm's spec that its dataclass cannot check by itself."""
    for fact in ("train", "build", "check"):
        if not callable(getattr(spec, fact)):
            raise PluginError(f"declares {option} whose spec's {fact} is not a function", f"give {fact} a function")
    spaces = tuple(spec.action_spaces)
    if not spaces or not set(spaces) <= set(ACTION_SPACES):
        raise PluginError(
            f"declares {option} with action_spaces {spaces!r}", f"give some of {', '.join(ACTION_SPACES)}"
        )


def _node(group: str, name: str, entry: Any, keys: Mapping[str, Any] | None) -> Any:
    """The config ``group=name`` composes, as its yaml would hold it."""
    if group == "env":
        return OmegaConf.structured(entry)
    node = OmegaConf.structured(entry.schema(name=name))
    if group != "algo":
        return node
    return OmegaConf.merge({"algo": node}, dict(keys or {}))


# ---------------------------------------------------------------- loading
LOADED: set[str] = set()  # the plugins registered in this process (by their module or entry point's value)
_ENTRY_POINTS_LOADED = False


def _refuse(plugin: str, problem: str, fix: str) -> ConfigError:
    return ConfigError("plugins", f"plugin {plugin} {problem}", fix)


def _import(plugin: str, target: str) -> Callable[[Plugin], None]:
    """The ``register`` function ``target`` names (``pkg.module`` or ``pkg.module:function``)."""
    module_name, _, function = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # the plugin's own code: any error while importing it refuses it
        raise _refuse(plugin, f"fails to import ({error_line(err)})", "install it or put it on PYTHONPATH") from None
    register = getattr(module, function or "register", None)
    if not callable(register):
        name = function or "register"
        raise _refuse(plugin, f"has no function {name}(plugin)", f"define {name} in {module_name}")
    return register


def _register(plugin: str, module: str, register: Callable[[Plugin], None]) -> None:
    """Run the ``register`` of ``plugin`` (its ``module``) and, when every declaration holds, put its options
    in the registries."""
    declared = Plugin(module)
    try:
        register(declared)
    except PluginError as err:
        raise _refuse(plugin, err.problem, err.fix) from None
    except Exception as err:  # e.g. a spec built without one of its facts: TypeError, missing argument
        fix = "declare every entry whole (docs/extending.md)"
        raise _refuse(plugin, f"fails in register ({error_line(err)})", fix) from None
    for option in declared.options:
        registry = GROUPS[option.group].registry
        if registry is not None:
            registry[option.name] = option.entry
        store_option(option.group, option.name, option.schema, option.node, option.doc, module)
        if option.reference is not None:
            REFERENCES[option.name] = option.reference
    HIDDEN_INSTRUMENTS.update(declared.instruments)
    LOADED.add(module)


# activation -> its written-out definition, declared by the plugin that registered it (tests/definitions.py)
REFERENCES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}


def installed_plugins() -> list[importlib.metadata.EntryPoint]:
    """The entry points of the installed plugins (group ``rlexp.plugins``)."""
    return sorted(importlib.metadata.entry_points(group=ENTRY_POINTS), key=lambda ep: ep.name)


def load_plugins(names: Iterable[str] = ()) -> None:
    """Register the installed plugins (once per process) and the modules ``names`` (the ``plugins`` key),
    each once; a ConfigError naming the plugin on the first that cannot be registered."""
    global _ENTRY_POINTS_LOADED
    if not _ENTRY_POINTS_LOADED:
        for ep in installed_plugins():
            module = ep.value.partition(":")[0].strip()
            if module not in LOADED:
                label = f"{module} (entry point {ep.name})"
                _register(label, module, _import(label, ep.value.strip()))
        _ENTRY_POINTS_LOADED = True
    for name in names:
        name = str(name)
        if not NAME.fullmatch(name.replace(".", "_")):
            raise ConfigError("plugins", f"{name!r} is not a module name", "write plugins=[pkg.module,...]")
        if name not in LOADED:
            _register(name, name, _import(name, name))


def plugins_on_command_line(overrides: Iterable[str]) -> list[str]:
    """The modules a command line's ``plugins=[...]`` override names (its last), read before Hydra composes
    the config, whose options they may add; [] when there is none or it does not parse (Hydra names that)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [line for line in overrides if line.partition("=")[0].lstrip("+~") == "plugins"]
    if not lines:
        return []
    try:
        value = OverridesParser.create().parse_overrides(lines[-1:])[0].value()
    except Exception:  # Hydra's grammar refuses it: check_command_line names it
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]
