"""Activations (rlexp/nn/activations.py) against their definitions (tests/definitions.py), with their
configured slope and alpha."""

from __future__ import annotations

import pytest
import torch
from definitions import ref_activation
from omegaconf import OmegaConf

from rlexp.config.schema import (
    ActivationConfig,
)
from rlexp.nn.activations import ACTIVATIONS


def structured(cls, **kw):
    """A config node as Hydra hands it to the code (a structured DictConfig)."""
    return OmegaConf.structured(cls(**kw))


ACT_NAMES = sorted(ACTIVATIONS)


def activation_config(name: str, **kw) -> ActivationConfig:
    """The structured config of an activation, from its registry entry's schema."""
    return structured(ACTIVATIONS[name].schema, name=name, **kw)


def make_activation(cfg: ActivationConfig):
    return ACTIVATIONS[cfg.name].function(cfg)


# ---------------------------------------------------------------- activations
@pytest.mark.parametrize("name", ACT_NAMES)
def test_activation_registry_matches_definitions(name):
    x = torch.linspace(-4.0, 4.0, 41, dtype=torch.float64)
    torch.testing.assert_close(make_activation(activation_config(name))(x), ref_activation(name, x))


def test_activation_functions_use_configured_slope_and_alpha():
    x = torch.linspace(-3.0, 3.0, 25, dtype=torch.float64)
    leaky = make_activation(activation_config("leaky_relu", negative_slope=0.2))
    elu = make_activation(activation_config("elu", alpha=0.5))
    torch.testing.assert_close(leaky(x), ref_activation("leaky_relu", x, slope=0.2))
    torch.testing.assert_close(elu(x), ref_activation("elu", x, alpha=0.5))
    # the configured parameters matter (not the library defaults)
    assert not torch.allclose(leaky(x), ref_activation("leaky_relu", x, slope=0.01))
    assert not torch.allclose(elu(x), ref_activation("elu", x, alpha=1.0))
