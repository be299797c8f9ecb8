"""rlexp's config composed as ``python -m rlexp.train`` composes it, for the tests, at a fraction of the cost.

Hydra composes a config in two parts (hydra/_internal/config_loader_impl.py): the defaults list, which the
group choices (``activation=tanh``, ``+experiment=nan_hunt``) select, is loaded and merged (about half a
second); then the key overrides (``optimizer.lr=0.1``, ``+env.kwargs.x=1``) are applied to the result in
their order. ``compose_config`` caches the first part per process, by its group choices, and applies the
key overrides with Hydra's own function. tests/compose/test_config.py checks it against ``hydra.compose``.
``writes_after_options`` reads from Hydra's defaults list what the configs after a group's option write into
the group, so a test builds that group's node for every option without composing each (checked there too).

Hydra's own compose is made cheaper in this process, for every compose (``compose_hydra`` too), without changing
what it composes (hydra/_internal/config_repository.py): each compose makes a ``CachingConfigRepository`` that
deep-copies the config repository, the ConfigStore of every registered schema included (60 of its 160 ms), only
to keep ``initialize_sources`` (which rebinds ``sources``) off the shared repository: a shallow copy does that
too. And it loads every config file and schema anew: each is loaded once here, and each load gets its own copy.
Both hold while conf/ and the ConfigStore do not change during the tests (rlexp registers its schemas once,
before any compose): 160 -> 75 ms a compose. And a composition that shares the first entries of its defaults list
with an earlier one merges from that prefix's merged config (test_config checks the result node for node).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import os
import pickle
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir, version
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.config_repository import CachingConfigRepository, ConfigRepository, IConfigRepository
from hydra._internal.defaults_list import create_defaults_list
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.core.singleton import Singleton
from hydra.errors import ConfigCompositionException
from hydra.plugins.config_source import ConfigResult
from omegaconf import DictConfig, OmegaConf, flag_override, open_dict
from omegaconf.errors import OmegaConfBaseException

from rlexp.compose.registry import register

CONF = Path(__file__).resolve().parents[1] / "conf"


def _shallow_delegate(self: CachingConfigRepository, delegate: IConfigRepository) -> None:
    self.delegate = copy.copy(delegate)  # Hydra: copy.deepcopy(delegate)
    self.cache = {}


CachingConfigRepository.__init__ = _shallow_delegate

_LOADED: dict[tuple, bytes] = {}
_load_config = ConfigRepository.load_config


def _load_config_once(self: ConfigRepository, config_path: str) -> ConfigResult | None:
    """A file of conf/ or Hydra's, or one of rlexp's schemas, as Hydra loads it: loaded once per process and
    source list, each call its own copy (unpickled). Other schemas of the ConfigStore (a plugin's) load as
    Hydra loads them: a test may hide their package."""
    key = (tuple((type(s).__name__, s.provider, s.path) for s in self.sources), config_path)
    if key in _LOADED:
        return pickle.loads(_LOADED[key])
    loaded = _load_config(self, config_path)
    if loaded is not None and (not loaded.path.startswith("structured://") or config_path.startswith("schema")):
        _LOADED[key] = pickle.dumps(loaded)
    return loaded


ConfigRepository.load_config = _load_config_once


# a defaults list's prefix (each entry's path, package and role, with the sources) -> Hydra's config merged from
# it, pickled: compositions that share their first entries (Hydra's own, the schema, the first groups) merge only
# the rest. Only prefixes whose every load is cached above or Hydra's own are kept: what they hold cannot change.
_MERGED: dict[tuple, bytes] = {}


def _merge_from_cached_prefix(self: ConfigLoaderImpl, defaults: list, repo: IConfigRepository) -> DictConfig:
    """Hydra's ``_compose_config_from_defaults_list``: each entry's config merged in order, then every remaining
    defaults list removed; from the longest prefix merged before."""
    sources = tuple((type(s).__name__, s.provider, s.path) for s in repo.delegate.sources)
    keys = [(sources, d.config_path, d.package, d.primary, d.is_self) for d in defaults]
    start, cfg = 0, OmegaConf.create()
    for end in range(len(defaults), 0, -1):
        if (merged := _MERGED.get(tuple(keys[:end]))) is not None:
            start, cfg = end, pickle.loads(merged)
            cfg._set_flag("no_deepcopy_set_nodes", None)  # pickled while merging: as a fresh config's
            break
    cacheable = True
    with flag_override(cfg, "no_deepcopy_set_nodes", True):
        for end in range(start, len(defaults)):
            default = defaults[end]
            loaded = self._load_single_config(default=default, repo=repo)
            try:
                cfg.merge_with(loaded.config)
            except OmegaConfBaseException as e:
                raise ConfigCompositionException(  # noqa: B904 (as Hydra raises it)
                    f"In '{default.config_path}': {type(e).__name__} raised while composing config:\n{e}"
                ).with_traceback(sys.exc_info()[2])
            cacheable = cacheable and ((sources, default.config_path) in _LOADED or loaded.provider == "hydra")
            if cacheable:
                _MERGED.setdefault(tuple(keys[: end + 1]), pickle.dumps(cfg))

    def strip_defaults(node: object) -> None:
        if isinstance(node, DictConfig):
            if node._is_missing() or node._is_none():
                return
            with flag_override(node, ["readonly", "struct"], False):
                if node._get_flag("HYDRA_REMOVE_TOP_LEVEL_DEFAULTS"):
                    node._set_flag("HYDRA_REMOVE_TOP_LEVEL_DEFAULTS", None)
                    node.pop("defaults", None)
            for _, value in node.items_ex(resolve=False):
                strip_defaults(value)

    strip_defaults(cfg)
    return cfg


_merge_as_shipped = ConfigLoaderImpl._compose_config_from_defaults_list
ConfigLoaderImpl._compose_config_from_defaults_list = _merge_from_cached_prefix


@contextlib.contextmanager
def merging_as_shipped() -> Iterator[None]:
    """Hydra's own merge of the defaults list for the block, without the cached prefixes (to test them)."""
    ConfigLoaderImpl._compose_config_from_defaults_list = _merge_as_shipped
    try:
        yield
    finally:
        ConfigLoaderImpl._compose_config_from_defaults_list = _merge_from_cached_prefix


@functools.cache
def _hydra_on_conf() -> GlobalHydra:
    """Hydra initialized on conf/ (``initialize_config_dir``: the search path, the plugins), made once."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return Singleton._instances[GlobalHydra]


@contextlib.contextmanager
def _hydra_in_place() -> Iterator[GlobalHydra]:
    """As in ``with initialize_config_dir(conf/)``: the Hydra that initializes made once and put in place for the
    block (Hydra's own state before it put back after)."""
    register()
    gh = _hydra_on_conf()
    before = Singleton._instances.get(GlobalHydra)
    Singleton._instances[GlobalHydra] = gh
    version.setbase("1.3")
    try:
        yield gh
    finally:
        if before is None:
            del Singleton._instances[GlobalHydra]
        else:
            Singleton._instances[GlobalHydra] = before


def compose_hydra(overrides: Sequence[str] = (), return_hydra_config: bool = False) -> DictConfig:
    """``hydra.compose`` of conf/config.yaml, uncached."""
    with _hydra_in_place():
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=return_hydra_config)


def writes_after_options(choices: Sequence[str], groups: Sequence[str]) -> dict[str, list[DictConfig]]:
    """For each group, what the configs Hydra merges after the group's option (an algorithm's yaml, a preset)
    write into the group, in their order, for these group choices: Hydra's own defaults list and loads. The
    group's node composed with any option is that option's schema and name with these merged onto it."""
    with _hydra_in_place() as gh:
        loader = gh.hydra.config_loader
        parsed, repo = loader._parse_overrides_and_create_caching_repo("config", list(choices))
        assert all(_is_choice(o) for o in parsed), choices
        defaults = create_defaults_list(repo, "config", parsed, prepend_hydra=True, skip_missing=False).defaults
        writes: dict[str, list[DictConfig]] = {group: [] for group in groups}
        for default in defaults:
            group = default.package
            if group in groups and default.config_path.startswith((f"{group}/", f"schema/{group}/")):
                writes[group] = []  # the option (its schema, its yaml): what came before it is replaced
                continue
            config = loader._load_single_config(default, repo).config
            for written in groups:
                if isinstance(config, DictConfig) and written in config:
                    writes[written].append(config[written])
        return writes


# a dir the processes of one test session share (tests/conftest.py makes it for the session and its xdist
# workers): a config one worker composed, the other reads instead of composing it again
SHARED = "RLEXP_TESTS_COMPOSED"  # tests/conftest.py sets it


@functools.cache
def _composed(choices: tuple[str, ...], hydra: bool) -> bytes:
    """Hydra's config for these group choices (the ``hydra`` node only when asked: it is most of a copy's cost),
    pickled: each call unpickles its own copy, a quarter of ``copy.deepcopy``'s cost (the configs Hydra's
    launchers hand their workers travel the same way)."""
    shared = os.environ.get(SHARED)
    path = Path(shared) / f"{hashlib.sha256(repr((choices, hydra)).encode()).hexdigest()}.pkl" if shared else None
    if path is not None and path.is_file():
        return path.read_bytes()
    cfg = compose_hydra(choices, return_hydra_config=True)
    if not hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    data = pickle.dumps(cfg)
    if path is not None:  # whole or not at all: written aside, then renamed
        part = path.with_suffix(f".{os.getpid()}.part")
        part.write_bytes(data)
        os.replace(part, path)
    return data


def _is_choice(override: Override) -> bool:
    """A group choice, as Hydra tells one (hydra/_internal/defaults_list.py): its key is a config group (a dir
    of conf/ or one of Hydra's own), its value not a dict."""
    group = override.key_or_group
    return not isinstance(override.value(), dict) and ((CONF / group).is_dir() or group.startswith("hydra/"))


def set_keys(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """Apply key overrides (``optimizer.lr=0.1``, ``+env.kwargs.x=1``) to ``cfg`` in place, as Hydra applies a
    command line's after composing."""
    ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides(list(overrides)), cfg)


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The job's config (no ``hydra`` node) for these command-line overrides, as ``hydra.compose`` gives it."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    keys = [o for o in parsed if not _is_choice(o)]
    hydra = any(o.key_or_group.split(".")[0] == "hydra" for o in keys)
    cfg = pickle.loads(_composed(tuple(o.input_line for o in parsed if _is_choice(o)), hydra))
    ConfigLoaderImpl._apply_overrides_to_config(keys, cfg)  # set_keys' step, on the overrides parsed above
    if hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg
