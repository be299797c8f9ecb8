"""Metrics accumulation: each update's per-member statistics, kept on the device between log steps.

An algorithm's ``record_update`` adds one update's [P] statistics (summed for their mean, maxed for the
``_max`` ones); ``note`` keeps a latest value (epsilon, lr); ``record_instruments`` keeps the latest
instrument record. ``take()`` reads it all once per log step, as columns of one value per member.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlexp.diagnostics.instruments import Stats, resolve
from rlexp.optim.pipeline import UpdateStats


class UpdateMetrics:
    """The train/ metrics of one population between two log steps; its state: the update count, the
    notes and the latest instrument record."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._sums: torch.Tensor | None = None  # [K, P] sums of the mean statistics
        self._maxs: torch.Tensor | None = None  # [K', P] maxima
        self._sum_keys: list[str] = []
        self._max_keys: list[str] = []
        self._updates = 0  # updates since the latest log step
        self.updates_total = 0  # updates up to the latest log step
        self.notes: dict[str, Any] = {}  # name -> a float, or a [P] / [P, 1] array
        self.instruments: Stats = {}  # the latest instrument record ([P] each, some deferred)
        self.counts: dict[str, torch.Tensor] = {}  # cumulative per-member counts [P] (interventions), host

    def add(self, updates: UpdateStats | dict[str, UpdateStats], stats: dict[str, torch.Tensor]) -> None:
        """Accumulate one update: ``updates`` one pipeline's results or several by name prefix, ``stats``
        more [P] statistics (those ending in ``_max`` maxed too)."""
        if isinstance(updates, UpdateStats):
            updates = {"": updates}
        means: dict[str, torch.Tensor] = {}
        maxes: dict[str, torch.Tensor] = {}
        for prefix, update in updates.items():
            means.update(
                {
                    f"{prefix}loss": update.loss,
                    f"{prefix}grad_norm": update.grad_norm_pre_clip,
                    f"{prefix}grad_norm_post_clip": update.grad_norm_post_clip,
                }
            )
            maxes[f"{prefix}grad_norm_max"] = update.grad_norm_pre_clip
        means.update(stats)
        maxes.update({k: v for k, v in stats.items() if k.endswith("_max")})
        mean_values = torch.stack(list(means.values()))  # [K, P]
        max_values = torch.stack(list(maxes.values()))
        if self._sums is None or self._updates == 0:
            self._sum_keys, self._max_keys = list(means), list(maxes)
            self._sums, self._maxs = mean_values.clone(), max_values.clone()
        else:
            self._sums += mean_values
            self._maxs = torch.maximum(self._maxs, max_values)
        self._updates += 1

    def note(self, **scalars: Any) -> None:
        """Remember the latest value of scalars: a float for every member, or a [P] / [P, 1] array."""
        self.notes.update(scalars)

    def noted(self, k: int) -> dict[str, float]:
        """Member k's train/ value of each note."""
        return {
            f"train/{name}": float(value.reshape(-1)[k]) if isinstance(value, np.ndarray) else value
            for name, value in self.notes.items()
        }

    def take(self) -> dict[str, list[float]]:
        """The interval's train/ means and maxima ([P] lists; none without an update) and restart it."""
        if self._updates == 0:
            return {}
        sums = (self._sums / self._updates).tolist()
        maxs = self._maxs.tolist()
        train = {f"train/{k}": v for k, v in zip(self._sum_keys, sums)}
        train.update({f"train/{k}": v for k, v in zip(self._max_keys, maxs)})
        self.updates_total += self._updates
        self._updates = 0
        return train

    def take_instruments(self) -> dict[str, list[float]]:
        """The latest instrument record, its deferred instruments computed ([P] lists, one host read)."""
        if not self.instruments:
            return {}
        self.instruments = resolve(self.instruments)
        names = list(self.instruments)
        rows = torch.stack([self.instruments[n] for n in names]).tolist()
        return dict(zip(names, rows))

    def state_dict(self) -> dict[str, Any]:
        """The update count, the notes and the latest instrument record (computed: a checkpoint follows
        the log record that resolved it)."""
        return {"updates_total": self.updates_total, "notes": dict(self.notes), "instruments": dict(self.instruments)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates_total = state["updates_total"]
        self.notes = {
            name: value.numpy().copy() if isinstance(value, torch.Tensor) else value
            for name, value in state["notes"].items()
        }
        self.instruments = {name: value.to(self.device) for name, value in state["instruments"].items()}
