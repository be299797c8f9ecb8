"""rlexp's config composed as ``python -m rlexp.train`` composes it, for the tests, at a fraction of the cost.

Hydra composes a config in two parts (hydra/_internal/config_loader_impl.py): the defaults list, which the
group choices (``activation=tanh``, ``+experiment=nan_hunt``) select, is loaded and merged (about half a
second); then the key overrides (``optimizer.lr=0.1``, ``+env.kwargs.x=1``) are applied to the result in
their order. ``compose_config`` caches the first part per process, by its group choices, and applies the
key overrides with Hydra's own function. tests/compose/test_config.py checks it against ``hydra.compose``.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, open_dict

from rlexp.compose.registry import register

CONF = Path(__file__).resolve().parents[1] / "conf"


def compose_hydra(overrides: Sequence[str] = (), return_hydra_config: bool = False) -> DictConfig:
    """``hydra.compose`` of conf/config.yaml, uncached."""
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=return_hydra_config)


@functools.cache
def _composed(choices: tuple[str, ...], hydra: bool) -> DictConfig:
    """Hydra's config for these group choices (the ``hydra`` node only when asked: it is most of a copy's cost)."""
    cfg = compose_hydra(choices, return_hydra_config=True)
    if not hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def _is_choice(override: Override) -> bool:
    """A group choice, as Hydra tells one (hydra/_internal/defaults_list.py): its key is a config group (a dir
    of conf/ or one of Hydra's own), its value not a dict."""
    group = override.key_or_group
    return not isinstance(override.value(), dict) and ((CONF / group).is_dir() or group.startswith("hydra/"))


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The job's config (no ``hydra`` node) for these command-line overrides, as ``hydra.compose`` gives it."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    keys = [o for o in parsed if not _is_choice(o)]
    hydra = any(o.key_or_group.split(".")[0] == "hydra" for o in keys)
    cfg = copy.deepcopy(_composed(tuple(o.input_line for o in parsed if _is_choice(o)), hydra))
    ConfigLoaderImpl._apply_overrides_to_config(keys, cfg)
    if hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg
