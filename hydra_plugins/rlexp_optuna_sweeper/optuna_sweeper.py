"""A Hydra sweeper that runs an Optuna study over rlexp jobs: hydra-optuna-sweeper's sweeper as it ships
(sampling, batches of ``n_jobs`` trials through the configured launcher, ``study.tell``, resuming a stored
study), with four changes (``_impl.StudySweeper``):

- a job reports its trial: its summary becomes the trial's value (``trial_outcome``: the ``objective`` of
  its members' final returns), and every trial gets user attributes from its job (``status``,
  ``job_dir``; a divergence's ``cause``, ``where``, ``diverged_at_step``, ``diverged_member``,
  ``diverged``; a crash's or refusal's ``error``), set while the trial still runs (a finished trial
  cannot be changed);
- a trial with a diverged member fails (``TrialState.FAIL``), as a result, not an error: its job is
  returned as a value that is no number, which the sweeper records as failed without stopping the
  study (a crashed or refused job fails the trial and stops the study after its batch unless
  ``max_failure_rate`` allows it; the command then exits with code 1 at its end). NaN is not used:
  optuna 2.10 refuses to complete a trial with NaN and the shipped sweeper then tells the failure with
  the value again, which raises and ends the sweep;
- job ``k`` is trial ``k``: the job numbers (``hydra.job.num``, the job dirs) continue the study's trial
  numbers when the study is resumed (the shipped sweeper starts every invocation at job 0, into the dirs
  of the study's first trials), and a seeded sampler is seeded with ``seed + trials so far`` (a resumed
  study's random start-up trials would otherwise repeat the first ones);
- the sweep dir exists before the study's storage is opened in it, and holds ``multirun.yaml`` as
  Hydra's basic sweeper writes it (the searched keys name each job's cell, ``rlexp.config.cells``).
"""

from __future__ import annotations

import math
import sys
from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

OBJECTIVES = ("iqm", "mean")  # of the members' scores: rliable's interquartile mean, or the plain mean
INSTALL = "pip install -e '.[optuna]'"


def trial_outcome(summary: dict[str, Any], objective: str) -> tuple[float | None, dict[str, Any]]:
    """A job's trial: its value (None: the trial fails) and the user attributes that say why.

    The value is ``objective`` (``iqm`` or ``mean``) of the members' scores: each member's ``eval_return``
    (its last evaluation) when every member has one, else their training ``final_return`` (the report's
    rule). A job with a diverged member has no value: ``diverged`` counts them and the earliest one's
    ``cause``, ``where``, ``diverged_at_step`` and ``diverged_member`` (its member index in the job) say
    what happened; the other members' score is not the trial's, since the setting was not stable."""
    from rlexp.report.stats import iqm_fast

    members = summary["members"]
    attrs: dict[str, Any] = {"status": summary["status"], "members": len(members)}
    diverged = [m for m in members if m["status"] == "diverged"]
    if diverged:
        first = min(diverged, key=lambda m: (m["diverged_at_step"] is None, m["diverged_at_step"] or 0))
        divergence = first.get("divergence") or {}
        attrs |= {
            "diverged": len(diverged),
            "cause": divergence.get("cause"),
            "where": divergence.get("where"),
            "diverged_at_step": first["diverged_at_step"],
            "diverged_member": first["member"],
        }
        return None, attrs
    score = "eval_return" if all(m.get("eval_return") is not None for m in members) else "final_return"
    scores = [m.get(score) for m in members]
    if not scores or any(s is None or not math.isfinite(s) for s in scores):
        attrs["error"] = f"a member has no {score}"
        return None, attrs
    value = iqm_fast(scores) if objective == "iqm" else sum(scores) / len(scores)
    attrs["score"] = f"{objective} of {score}"
    return float(value), attrs


def failure_line(attrs: dict[str, Any]) -> str:
    """Why a trial failed, in one line (the sweeper logs it as the failed experiment's return value)."""
    if "diverged" in attrs:
        return (
            f"{attrs['diverged']} of {attrs['members']} members diverged (first: member {attrs['diverged_member']}, "
            f"{attrs['cause']} in {attrs['where']} at env step {attrs['diverged_at_step']})"
        )
    return str(attrs.get("error", attrs["status"]))


class RlexpOptunaSweeper(Sweeper):
    """``hydra/sweeper=rlexp_optuna``: hydra-optuna-sweeper's keys plus ``objective`` (``OBJECTIVES``)."""

    def __init__(self, objective: str = "iqm", **kwargs: Any) -> None:
        from rlexp.config.schema import ConfigError

        try:
            from ._impl import StudySweeper
        except ImportError as err:  # one line, exit code 2, before any dir is made
            problem = f"rlexp_optuna needs hydra-optuna-sweeper and optuna ({err})"
            print(ConfigError("hydra/sweeper", problem, INSTALL), file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        if objective not in OBJECTIVES:
            problem = f"unknown objective {objective!r}"
            print(ConfigError("hydra.sweeper.objective", problem, f"options: {', '.join(OBJECTIVES)}"), file=sys.stderr)
            raise SystemExit(2)
        self.sweeper = StudySweeper(objective=objective, **kwargs)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> None:
        return self.sweeper.sweep(arguments)
