"""The step loop's schedule: env steps, log steps and what happens at them, in order.

``Schedule.steps()`` is the iterator an algorithm's loop runs on (``ctx.recorder.steps()``). Before each
vector step it raises what ``stop_requested()`` gives (a Ctrl-C's or a SIGTERM's interruption) and runs
``before_step`` (``debug.crash_at_step``); after a vector step that crosses a multiple of
``logger.log_every`` (or reaches ``total_steps``) it runs ``at_log_step``'s events in their order (the
recorder's: evaluation, a PBT round, the log record), then writes a checkpoint when one is due (the first
log step at or after each multiple of ``checkpoint.every``, and the last), and ends the loop early once
``finished()`` (every member finished).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np


@dataclass
class LogStep:
    """One log step, handed to each event in turn; an event may leave what later ones read."""

    step: int  # env steps per member
    previous: int  # the previous log step's (0, or the checkpoint's a continued job starts from)
    evaluated: np.ndarray | None = None  # [P] bool: the members evaluated at this log step, if any
    extra: dict[int, dict[str, Any]] = field(default_factory=dict)  # member -> a PBT round's metrics


def _never() -> bool:
    return False


def _no_stop() -> BaseException | None:
    return None


class Schedule:
    """When things happen in a job's step loop; its state: the latest log step."""

    def __init__(self, total_steps: int, per_step: int, log_every: int, checkpoint_every: int) -> None:
        """``per_step``: env steps per member of one vector step (the environments per member);
        ``checkpoint_every``: env steps between checkpoints (0: none but ``checkpoint`` at the end)."""
        self.total_steps = total_steps
        self.per_step = per_step
        self.log_every = log_every
        self.checkpoint_every = checkpoint_every
        self.last_log_step = 0  # the env step of the latest log step
        self.first_step_at: str | None = None  # ISO 8601 UTC time of the first env step
        self.stop_requested: Callable[[], BaseException | None] = _no_stop  # a Ctrl-C or SIGTERM: stop
        self.before_step: list[Callable[[int], None]] = []  # called with the coming step; may raise
        self.at_log_step: list[Callable[[LogStep], None]] = []  # the events of a log step, in order
        self.checkpoint: Callable[[int], None] | None = None  # writes a checkpoint at an env step
        self.finished: Callable[[], bool] = _never  # every member is finished: the loop ends

    def is_log_step(self, step: int) -> bool:
        """True when the vector step that reached ``step`` crossed a multiple of ``log_every`` or the end."""
        return step // self.log_every > (step - self.per_step) // self.log_every or step >= self.total_steps

    def checkpoint_due(self, step: int, previous: int, last: bool) -> bool:
        """True when log step ``step`` (after ``previous``) is the job's ``last`` or the first at or after a
        multiple of ``checkpoint_every``."""
        return last or (self.checkpoint_every > 0 and step // self.checkpoint_every > previous // self.checkpoint_every)

    def steps(self) -> Iterator[int]:
        """Env steps per member after each vector step, from the latest log step to ``total_steps``."""
        step = self.last_log_step
        self.first_step_at = datetime.now(timezone.utc).isoformat()
        while step < self.total_steps:
            if (stop := self.stop_requested()) is not None:  # a Ctrl-C or SIGTERM, acted on between env steps
                raise stop
            for check in self.before_step:
                check(step + self.per_step)
            step += self.per_step
            yield step
            if self.is_log_step(step):
                log = LogStep(step, self.last_log_step)
                for event in self.at_log_step:
                    event(log)
                self.last_log_step = step
                finished = self.finished()
                last = step >= self.total_steps or finished
                if self.checkpoint is not None and self.checkpoint_due(step, log.previous, last):
                    self.checkpoint(step)
                if finished:
                    return

    def state_dict(self) -> dict[str, Any]:
        return {"last_log_step": self.last_log_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_log_step = int(state["last_log_step"])
