"""Ctrl-C and SIGTERM during a job (rlexp/run/jobs.py's DeferredInterrupts), in this process: acted on
between env steps, the third at once; one noted before the clean-up is raised after it."""

from __future__ import annotations

import signal

import pytest

from rlexp.run.jobs import (
    DeferredInterrupts,
)


def test_ctrl_c_while_training_is_acted_on_between_env_steps_and_a_third_stops_at_once():
    """In this process (the main thread, Python's handler in place): while training, the first two
    SIGINTs only ask the job to stop (the recorder raises at its next env step), the third raises at
    once; while stopping, one is held until ``restore``."""
    interrupts = DeferredInterrupts()
    try:
        assert interrupts._installed and not interrupts.stop_requested()
        interrupts.training = True
        for _ in range(2):
            signal.raise_signal(signal.SIGINT)  # the handler runs before the next line
            assert interrupts.stop_requested() and not interrupts.stopping
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert interrupts.stopping
        signal.raise_signal(signal.SIGINT)  # held
        assert interrupts.deferred
    finally:
        with pytest.raises(KeyboardInterrupt):
            interrupts.restore(raise_deferred=True)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_that_training_ended_before_acting_on_is_raised_after_the_clean_up():
    interrupts = DeferredInterrupts()
    interrupts.training = True
    try:
        signal.raise_signal(signal.SIGINT)
        interrupts.stopping = True  # the runner's clean-up starts
    finally:
        with pytest.raises(KeyboardInterrupt):
            interrupts.restore(raise_deferred=True)
    quiet = DeferredInterrupts()
    quiet.restore(raise_deferred=True)  # nothing noted: nothing raised
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigterm_is_handled_as_a_ctrl_c_and_named_terminated():
    """SIGTERM while training asks the job to stop as a Ctrl-C does, and the interruption it raises is
    ``Terminated`` (a KeyboardInterrupt, so every path that cleans up after one does after it too);
    ``restore`` puts the default SIGTERM disposition back."""
    from rlexp.run.jobs import Terminated

    interrupts = DeferredInterrupts()
    try:
        assert signal.getsignal(signal.SIGTERM) == interrupts._handle
        interrupts.training = True
        signal.raise_signal(signal.SIGTERM)
        stop = interrupts.stop_requested()
        assert isinstance(stop, Terminated) and isinstance(stop, KeyboardInterrupt) and str(stop) == "SIGTERM"
        interrupts.stopping = True
    finally:
        with pytest.raises(Terminated):
            interrupts.restore(raise_deferred=True)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
