"""Per-member random streams for the hot path (exploration, replay sampling).

Each member draws from its own torch.Generator, seeded from the member's seed, in blocks: one loop
over members per block, one array slice per draw. Member k's numbers depend on its seed alone,
never on the population around it. The pool lives on the host (numpy), where the per-step decisions
are made; draws that feed the device are moved there by the caller.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def member_generator(member_seed: int, purpose: int) -> torch.Generator:
    """A CPU generator for one member and purpose (0 = weights, 1 = environments, 2 = stream,
    3 = evaluation environments, 4 = evaluation stream, 5 = task shifts, 10+ = networks,
    100+ = interventions' fresh draws)."""
    state = np.random.SeedSequence([member_seed, purpose]).generate_state(1, dtype=np.uint64)[0]
    seed = int(state >> np.uint64(1))  # uint64 >> uint64: NumPy 1.x refuses uint64 >> int
    return torch.Generator().manual_seed(seed)


class MemberStreams:
    """Uniform [0, 1) numbers, float64, one independent stream per member (``purpose`` 2: training's,
    4: evaluation's)."""

    def __init__(self, member_seeds: list[int], block: int = 65_536, purpose: int = 2) -> None:
        self.generators = [member_generator(s, purpose) for s in member_seeds]
        self.block = block
        self.pool = np.empty((len(member_seeds), 0))
        self.pos = 0

    def uniform(self, n: int) -> np.ndarray:
        """The next ``n`` numbers of every member's stream: [P, n] float64."""
        if self.pos + n > self.pool.shape[1]:
            size = max(self.block, n)
            rows = [torch.rand(size, generator=g, dtype=torch.float64) for g in self.generators]
            self.pool = torch.stack(rows).numpy()
            self.pos = 0
        out = self.pool[:, self.pos : self.pos + n]
        self.pos += n
        return out

    def state_dict(self) -> dict[str, Any]:
        """The generators' states [P, S] uint8, the numbers drawn and not used yet [P, n] and the position."""
        return {"generators": torch.stack([g.get_state() for g in self.generators]), "pool": self.pool, "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for generator, generator_state in zip(self.generators, state["generators"]):
            generator.set_state(generator_state.clone())
        self.pool = state["pool"].numpy().copy()
        self.pos = int(state["pos"])
