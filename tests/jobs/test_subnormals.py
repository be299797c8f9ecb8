"""flush_denormal: a job runs with subnormal floats flushed to zero or with IEEE's gradual underflow (the
default), as its config says, whatever the process did before; flushed, the optimizers' decaying averages
reach 0 without passing through the subnormal numbers (where x86 takes ~50x a normal number's time)."""

from __future__ import annotations

import pytest
import torch
from composing import compose_config

from rlexp.config.schema import RMSpropConfig
from rlexp.optim.optimizers import make_optimizer
from rlexp.train import prepare, run_job

QUIET = ["logger.mode=disabled", "logger.progress=off", "device=cpu", "threads=1", "eval.episodes=0"]
SUBNORMAL = 1e-39  # below float32's smallest normal number, 1.18e-38

FLUSHES = torch.set_flush_denormal(True)  # False where the CPU cannot (x86 without DAZ)
torch.set_flush_denormal(False)
pytestmark = pytest.mark.skipif(not FLUSHES, reason="this CPU cannot flush subnormal floats to zero")


def flushed() -> bool:
    """This thread's mode: True when a subnormal float32 times one comes out 0."""
    return float(torch.tensor([SUBNORMAL]) * 1.0) == 0.0


@pytest.mark.parametrize("before", [False, True])
def test_a_job_sets_the_mode_its_config_names_whatever_the_process_had(before):
    assert compose_config([]).flush_denormal is False  # the default: torch's
    assert compose_config(["+experiment=minatar_dqn"]).flush_denormal is True
    for flush in (True, False):
        torch.set_flush_denormal(before)
        prepare(compose_config([*QUIET, f"flush_denormal={str(flush).lower()}"]))
        assert flushed() is flush


def test_a_job_trains_in_its_mode(tmp_path):
    """The mode holds while the job trains: its summary's config records it, and the process is left in it."""
    for flush in (False, True):
        overrides = [*QUIET, "total_steps=300", "algo.learning_starts=100", f"flush_denormal={str(flush).lower()}"]
        job = run_job(compose_config(overrides), tmp_path / str(flush))
        assert job["status"] == "ok" and job["config"]["flush_denormal"] is flush
        assert flushed() is flush


def test_flushed_averages_of_a_stopped_unit_reach_zero_without_subnormals():
    """RMSprop's averages of a unit whose gradient stopped decay geometrically: through the subnormal numbers
    with IEEE's arithmetic, straight from the smallest normal numbers to 0 when flushed."""
    seen = {}
    for flush in (False, True):
        torch.set_flush_denormal(flush)
        param = torch.nn.Parameter(torch.ones(1, 8))
        cfg = RMSpropConfig(name="rmsprop", lr=1e-3, alpha=0.5, eps=0.01, momentum=0.9, centered=True)
        optimizer = make_optimizer([param], cfg)
        tiny, subnormal = torch.finfo(torch.float32).tiny, False
        for step in range(300):
            param.grad = torch.full((1, 8), 1.0 if step == 0 else 0.0)
            optimizer.step()
            for state in (optimizer.square_avg[0], optimizer.grad_avg[0], optimizer.momentum_buffer[0]):
                subnormal |= bool(((state.abs() > 0) & (state.abs() < tiny)).any())
        assert bool((optimizer.square_avg[0] == 0).all())  # decayed all the way either way
        seen[flush] = subnormal
    assert seen == {False: True, True: False}
