"""Per-member values of a population whose members differ in hyperparameters.

A population's members share everything that fixes the networks' shapes and the loop (algorithm,
environment, activation, normalization, sizes, steps); they may differ in their seed and in the
per-member keys its algorithm declares (``AlgoSpec.member_keys``: init, clipping, optimizer, ...).
A value given as one config stands for every member; a list gives one per member. Members whose
values agree run as one group, so a population whose members are all equal computes exactly what
it computed with one config.
"""

from __future__ import annotations

from typing import Any, TypeVar

from rlexp.config.schema import ConfigError

T = TypeVar("T")


def member_runs(values: T | list[T], members: int) -> list[tuple[int, int, T]]:
    """Maximal runs of equal consecutive per-member values: [(a, b, value)] with members a..b-1
    holding ``value``; one run (0, members, value) for a single value or a list of equal ones."""
    if not isinstance(values, list):
        return [(0, members, values)]
    if len(values) != members:
        raise ValueError(f"member_runs: {len(values)} values for {members} members")
    runs: list[tuple[int, int, T]] = []
    for k, value in enumerate(values):
        if runs and runs[-1][2] == value:
            runs[-1] = (runs[-1][0], k + 1, value)
        else:
            runs.append((k, k + 1, value))
    return runs


def require_same(values: Any, field: str, key: str) -> None:
    """ConfigError at ``key`` unless every per-member config in ``values`` (a list; a single config
    passes) has the same ``field``: a value the population shares."""
    if isinstance(values, list) and len({repr(getattr(v, field)) for v in values}) > 1:
        raise ConfigError(key, "differs between the members of one population", "give every member the same value")
