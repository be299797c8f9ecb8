"""The run context's reading of hyperparameters that may differ between members (``RunContext.hyper``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from composing import compose_config
from omegaconf import OmegaConf

from rlexp.run.context import RunContext


def context(gammas: list[float]) -> RunContext:
    """A DQN population of ``len(gammas)`` members, member k with discount ``gammas[k]``."""
    cfg = OmegaConf.to_object(compose_config(["logger.mode=disabled", f"num_seeds={len(gammas)}"]))
    members = [dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, gamma=g)) for g in gammas]
    return RunContext.create(cfg, torch.device("cpu"), members, [cfg.seed + k for k in range(len(gammas))])


def test_a_shared_hyperparameter_is_the_configs_own_value():
    ctx = context([0.9, 0.9, 0.9])
    for form in ("tensor", "array", "runs"):
        value = ctx.hyper("algo.gamma", form)
        assert type(value) is float and value == 0.9


def test_per_member_values_come_in_the_form_asked_for():
    ctx = context([0.9, 0.9, 0.99])
    tensor = ctx.hyper("algo.gamma")
    assert tensor.shape == (3, 1) and tensor.dtype == torch.float32
    assert torch.equal(tensor[:, 0], torch.tensor([0.9, 0.9, 0.99]))
    assert ctx.hyper("algo.gamma", dtype=torch.float64)[2, 0].item() == 0.99
    array = ctx.hyper("algo.gamma", "array")
    assert array.dtype == np.float64 and array[:, 0].tolist() == [0.9, 0.9, 0.99]
    assert ctx.hyper("algo.gamma", "runs") == [(0, 2, 0.9), (2, 3, 0.99)]
    with pytest.raises(ValueError, match="form"):
        ctx.hyper("algo.gamma", "list")
