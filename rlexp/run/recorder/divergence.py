"""Divergence tracking: which members diverged, when, why and where.

It holds the population's ``Health`` (the pipelines mark members whose update turned non-finite), runs
the explosion checks on instrument records (``divergence=on``: |Q| beyond its bound, or the gradient
norm beyond ``divergence.grad_norm_bound``, on ``divergence.patience`` consecutive records), marks
members whose observations are non-finite, keeps where each divergence was born (``locate``), each
member's recent finite instrument records (which instrument moved first) and multi-agent action
collapses, and gives a member's summary its divergence entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlexp.config.schema import DivergenceConfig
from rlexp.config.state import PerMember
from rlexp.diagnostics.instruments import Explosions, InstrumentHistory, Stats
from rlexp.optim.pipeline import CAUSES, Health, UpdateStats

Located = tuple[str, str, str]  # (cause, where, detail) of a member's divergence
Locate = Callable[[int, str], Located]  # (member, cause as the pipeline saw it) -> where it was born


class DivergenceTracker:
    """Per-member health and divergence records of one population; its state: health, explosion
    strikes, instrument histories and divergence records."""

    def __init__(self, cfg: DivergenceConfig, members: int, device: torch.device, gamma: float | np.ndarray) -> None:
        """``gamma``: the discount of the value bound, one per member ([P, 1]) when the members differ."""
        self.cfg = cfg
        self.members = members
        self.device = device
        if isinstance(gamma, np.ndarray):  # [P] float32 of the float64 1 - gamma, as the scalar path rounds it
            self._q_denominator: float | torch.Tensor = torch.tensor(
                np.maximum(1.0 - gamma[:, 0], 1e-12), dtype=torch.float32, device=device
            )
        else:
            self._q_denominator = max(1.0 - gamma, 1e-12)
        self.health = Health(members, device)
        self.explosions = Explosions(members, cfg.patience, device)
        self.histories = [InstrumentHistory() for _ in range(members)]  # each member's recent finite records
        self.records: dict[int, dict[str, Any]] = {}  # member -> {cause, where, detail}
        self.collapses: dict[int, dict[str, Any]] = {}  # member -> the agent that collapsed, when, what moved first

    def newly_diverged(self, newly: torch.Tensor) -> list[tuple[int, str]]:
        """(member, cause) for each member in the [P] mask ``newly`` (one host read)."""
        if not bool(newly.any()):
            return []
        causes = self.health.cause.tolist()
        return [(k, CAUSES[causes[k]]) for k in newly.nonzero().flatten().tolist()]

    def record(self, member: int, cause: str, where: str, detail: str) -> None:
        """Member ``member``'s divergence: its cause, where it was born and a line of detail."""
        self.records[member] = {"cause": cause, "where": where, "detail": detail}

    def locate(self, update: UpdateStats, locate: Locate) -> None:
        """Record where each member ``update`` just marked diverged had its divergence born."""
        if update.newly_diverged is not None:
            for member, cause in self.newly_diverged(update.newly_diverged):
                self.record(member, *locate(member, cause))

    def check_observations(self, obs: np.ndarray, step: int) -> None:
        """Mark members whose observations [P, E, obs] hold a non-finite value."""
        if np.isfinite(obs).all():  # the common case, in one pass
            return
        finite = np.isfinite(obs.reshape(self.members, -1)).all(1)
        if not finite.all():
            ok = torch.from_numpy(finite).to(self.health.alive.device)
            newly = self.health.mark(ok, CAUSES.index("nonfinite_obs"), step)
            for member, _ in self.newly_diverged(newly):
                bad = int((~np.isfinite(obs[member])).sum())
                self.record(member, "nonfinite_obs", "env.obs", f"{bad} non-finite observation values")

    def check_explosions(
        self,
        record: Stats,
        step: int,
        grad_norm: torch.Tensor,
        q_abs_max: torch.Tensor,
        reward_scale: torch.Tensor | np.ndarray,
        output_layer: str,
    ) -> None:
        """The explosion checks of one instrument record (nothing with ``divergence=off``): the bound of
        |Q| (``q_abs_max`` [P], the output layer's) is ``q_bound_factor * reward_scale / (1 - gamma)``
        with ``reward_scale`` [P] the largest |reward|; ``grad_norm`` [P] the largest gradient norm."""
        scale = torch.as_tensor(reward_scale, dtype=torch.float32, device=self.device)  # [P]
        q_bound = self.cfg.q_bound_factor * scale / self._q_denominator  # [P]
        div = self.cfg
        if div.name == "off":
            return
        value, gradient = self.explosions.check(q_abs_max, q_bound, grad_norm, div.grad_norm_bound)
        cause = torch.where(value, CAUSES.index("value_explosion"), CAUSES.index("grad_explosion"))
        newly = self.health.mark(~(value | gradient), cause, step)
        for member, cause_name in self.newly_diverged(newly):
            if cause_name == "value_explosion":
                detail = (
                    f"|Q| {q_abs_max[member].item():.4g} > bound {float(q_bound[member]):.4g} on "
                    f"{div.patience} consecutive records"
                )
                self.record(member, cause_name, f"{output_layer}.output", detail)
            else:
                layers = {k.split("/", 1)[1]: v[member].item() for k, v in record.items() if k.startswith("grad_norm/")}
                worst = max(layers, key=layers.get) if layers else "gradient"
                detail = (
                    f"gradient norm {grad_norm[member].item():.4g} > bound {div.grad_norm_bound:.4g} on "
                    f"{div.patience} consecutive records; largest in {worst}"
                )
                self.record(member, cause_name, worst, detail)

    def collapsed(self, member: int, collapse: dict[str, Any]) -> None:
        """Member ``member``'s multi-agent action collapse (``rlexp.diagnostics.collapse``)."""
        self.collapses[member] = {**collapse, "first_moved": self.histories[member].first_moved()}

    def summary(self, member: int, cause: str) -> dict[str, Any]:
        """The ``divergence`` entry of a diverged member's summary (the pipeline's ``cause`` unless located)."""
        located = self.records.get(member, {"cause": cause, "where": None, "detail": None})
        return {
            **located,
            "last_finite": self.histories[member].last(),
            "first_moved": self.histories[member].first_moved(),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "health": self.health.state_dict(),
            "explosions": self.explosions.state_dict(),
            "histories": PerMember([history.state_dict() for history in self.histories]),
            "records": PerMember([self.records.get(k) for k in range(self.members)]),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.health.load_state_dict(state["health"])
        self.explosions.load_state_dict(state["explosions"])
        for history, saved in zip(self.histories, state["histories"]):
            history.load_state_dict(saved)
        self.records = {k: d for k, d in enumerate(state["records"]) if d is not None}
