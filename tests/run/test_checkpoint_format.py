"""Checkpoint pieces (rlexp/run/checkpoint.py): splitting the population's state per member and stacking
it back is the identity; an environment whose state is not captured exactly starts new episodes."""

from __future__ import annotations

import numpy as np
import torch

from rlexp.config.state import PerMember, Shared
from rlexp.run.checkpoint import split, stack


# ====================================================================== the pieces
def test_split_then_stack_gives_the_population_state_back_bit_for_bit():
    state = {
        "w": torch.randn(3, 4, 5),  # [P, ...]: split
        "count": np.arange(3, dtype=np.int64),  # [P] array: split
        "notes": PerMember([{"a": 1.5}, None, {"b": [1, 2]}]),  # Python values per member
        "rows": PerMember([{"m": torch.full((2,), float(k))} for k in range(3)]),  # dicts per member: listed
        "rng": Shared(torch.arange(7, dtype=torch.uint8)),  # a tensor of the population's
        "pos": 11,
        "part": {"alive": torch.ones(3, dtype=torch.bool), "total": 4, "inner": {"x": np.zeros((3, 2))}},  # nested
    }
    own, shared = split(state, 3)
    assert set(own[1]) == {"w", "count", "notes", "rows", "part"} and set(shared) == {"rng", "pos", "part"}
    assert set(own[1]["part"]) == {"alive", "inner"} and shared["part"] == {"total": 4, "inner": {}}
    back = stack(own, shared)
    assert torch.equal(back["w"], state["w"]) and torch.equal(back["count"], torch.arange(3))
    assert back["notes"] == list(state["notes"]) and torch.equal(back["rng"], state["rng"].value) and back["pos"] == 11
    assert isinstance(back["rows"], list) and all(
        torch.equal(r["m"], torch.full((2,), float(k))) for k, r in enumerate(back["rows"])
    )
    part = back["part"]
    assert torch.equal(part["alive"], state["part"]["alive"]) and part["total"] == 4
    assert torch.equal(part["inner"]["x"], torch.zeros(3, 2, dtype=torch.float64))


def test_environments_not_captured_exactly_start_new_episodes(monkeypatch):
    import rlexp.envs.gym
    from rlexp.config.schema import EnvConfig
    from rlexp.envs.gym import PopulationEnv

    env = PopulationEnv(EnvConfig(id="CartPole-v1", num_envs=2), [0, 1])
    env.reset()
    for _ in range(30):
        env.step(np.zeros((2, 2), dtype=np.int64))
    state = stack(*split(env.state_dict(), 2))
    exact = PopulationEnv(EnvConfig(id="CartPole-v1", num_envs=2), [0, 1])
    exact.load_state_dict(state)
    assert not exact.restarted and np.array_equal(exact.observations(), env.observations())
    monkeypatch.setattr(rlexp.envs.gym, "exact_state", lambda env: False)  # as Box2D or MuJoCo would be
    fresh = PopulationEnv(EnvConfig(id="CartPole-v1", num_envs=2), [0, 1])
    fresh.load_state_dict(state)
    assert fresh.restarted
    assert not fresh._ep_length.any()  # new episodes, the interrupted ones dropped
    assert np.array_equal(fresh.episode_count, env.episode_count)  # the episodes that ended are kept
