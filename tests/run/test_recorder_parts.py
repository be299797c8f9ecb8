"""The recorder's parts alone (rlexp/run/recorder/): the schedule's events at log steps and its
checkpoints, fault injection's members and step, the metrics' means and maxima, and each part's state
through a checkpoint's split and stack."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlexp.config.schema import DebugConfig, InjectConfig
from rlexp.optim.pipeline import UpdateStats
from rlexp.run.checkpoint import split, stack
from rlexp.run.recorder.faults import FaultInjector
from rlexp.run.recorder.metrics import UpdateMetrics
from rlexp.run.recorder.schedule import LogStep, Schedule


def run_schedule(schedule: Schedule) -> tuple[list[int], list[tuple], list[int]]:
    """(the steps yielded, the events (name, step, previous) in order, the checkpoints' steps)."""
    events: list[tuple] = []
    checkpoints: list[int] = []
    schedule.at_log_step += [
        lambda log: events.append(("first", log.step, log.previous)),
        lambda log: events.append(("second", log.step, log.previous)),
    ]
    schedule.checkpoint = checkpoints.append
    return list(schedule.steps()), events, checkpoints


def test_the_schedule_runs_its_events_in_order_at_each_log_step_and_checkpoints_when_due():
    # 4 env steps per vector step, a log step at each multiple of 10 crossed, checkpoints every 25
    steps, events, checkpoints = run_schedule(Schedule(total_steps=48, per_step=4, log_every=10, checkpoint_every=25))
    assert steps == list(range(4, 49, 4))
    logs = [12, 20, 32, 40, 48]  # the first vector step at or after each multiple of 10, and the last
    previous = [0, *logs[:-1]]
    assert events == [(name, s, p) for s, p in zip(logs, previous) for name in ("first", "second")]
    assert checkpoints == [32, 48]  # the first log step at or after 25, and the last


def test_the_schedule_ends_once_finished_and_continues_after_a_restored_log_step():
    schedule = Schedule(total_steps=100, per_step=10, log_every=20, checkpoint_every=0)
    schedule.finished = lambda: schedule.last_log_step >= 40
    steps, events, checkpoints = run_schedule(schedule)
    assert steps == [10, 20, 30, 40] and checkpoints == [40]  # every=0: only the last log step's
    continued = Schedule(total_steps=100, per_step=10, log_every=20, checkpoint_every=0)
    continued.load_state_dict(schedule.state_dict())
    steps, events, _ = run_schedule(continued)
    assert steps == [50, 60, 70, 80, 90, 100] and events[0] == ("first", 60, 40)


def test_the_schedule_stops_between_env_steps_when_asked_and_hands_events_what_earlier_ones_left():
    schedule = Schedule(total_steps=100, per_step=10, log_every=20, checkpoint_every=0)
    seen: list[dict] = []

    def first(log: LogStep) -> None:
        log.extra = {0: {"pbt/round": log.step}}

    schedule.at_log_step += [first, lambda log: seen.append(log.extra)]
    asked = iter([None, None, None, KeyboardInterrupt()])  # the interruption to raise, once one came
    schedule.stop_requested = lambda: next(asked)
    yielded = []
    with pytest.raises(KeyboardInterrupt):
        for step in schedule.steps():
            yielded.append(step)
    assert yielded == [10, 20, 30] and seen == [{0: {"pbt/round": 20}}]


def injector(what: str, member: int, step: int, crash_at: int = -1) -> FaultInjector:
    return FaultInjector(DebugConfig(InjectConfig(member, step, what), crash_at), members=5)


def test_fault_injection_poisons_its_member_of_each_job_once_at_or_after_its_step():
    faults = injector("grad", member=1, step=30)
    assert faults.rows == [1]
    faults.rows = faults.rows_of([0, 1, 0, 1, 2])  # a pack: cells of 2, 2 and 1 members
    assert faults.rows == [1, 3]
    grads = [torch.zeros(5, 2, 3)]
    assert not faults.due("param", 40)
    faults.poison_grad(grads, 20)  # before its step
    assert torch.isfinite(grads[0]).all()
    faults.poison_grad(grads, 35)
    poisoned = ~torch.isfinite(grads[0])
    assert poisoned.sum() == 2 and poisoned[1, 0, 0] and poisoned[3, 0, 0]
    faults.poison_grad([g := torch.zeros(5, 2, 3)], 40)  # once only
    assert torch.isfinite(g).all()
    continued = injector("grad", member=1, step=30)
    continued.load_state_dict(faults.state_dict())
    assert not continued.due("grad", 50)  # a continued job does not inject again


def test_fault_injection_poisons_observations_and_crashes_at_its_step():
    faults = injector("obs", member=2, step=10, crash_at=25)
    obs = np.zeros((5, 3, 4))
    faults.poison_obs(obs, 10)
    assert np.isnan(obs[2]).all() and np.isfinite(np.delete(obs, 2, axis=0)).all()
    faults.crash(24)
    with pytest.raises(RuntimeError, match="debug.crash_at_step=25"):
        faults.crash(28)


def test_metrics_average_and_max_each_member_over_a_log_interval():
    metrics = UpdateMetrics(torch.device("cpu"))
    assert metrics.take() == {}
    for loss, q in ([1.0, 4.0], [0.5, 9.0]), ([3.0, 2.0], [2.5, 1.0]):
        update = UpdateStats(torch.tensor(loss), torch.tensor(loss) * 2, torch.tensor(loss))
        metrics.add(update, {"q_max": torch.tensor(q)})
    train = metrics.take()
    assert train["train/loss"] == [2.0, 3.0] and train["train/grad_norm_max"] == [6.0, 8.0]
    assert train["train/q_max"] == [2.5, 9.0]  # a statistic ending in _max: its largest value
    assert metrics.updates_total == 2 and metrics.take() == {}  # the interval restarts


def test_a_parts_state_goes_through_a_checkpoints_split_and_stack():
    metrics = UpdateMetrics(torch.device("cpu"))
    metrics.note(epsilon=0.5, lr=np.array([[0.1], [0.2], [0.3]]))
    metrics.instruments = {"srank/q.0": torch.tensor([1.0, 2.0, 3.0])}
    own, shared = split(metrics.state_dict(), 3)
    assert own[1]["notes"]["lr"].item() == 0.2 and shared["notes"] == {"epsilon": 0.5}
    back = UpdateMetrics(torch.device("cpu"))
    back.load_state_dict(stack(own, shared))
    assert back.notes["epsilon"] == 0.5 and np.array_equal(back.notes["lr"], metrics.notes["lr"])
    assert torch.equal(back.instruments["srank/q.0"], metrics.instruments["srank/q.0"])
