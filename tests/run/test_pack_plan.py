"""Packing plans (rlexp/run/pack.py): pack keys separate shapes and loops, not per-member keys; packs
bounded in members; the largest work first."""

from __future__ import annotations

from pathlib import Path

import pytest
from composing import compose_config

from rlexp.algos import ALGOS
from rlexp.config.schema import ConfigError
from rlexp.run.pack import Cell, pack_key, pack_work, plan_packs

BUDGET = ["total_steps=600", "algo.learning_starts=200", "logger.log_every=300", "logger.progress=off"]
DQN = ["algo=dqn", "env=cartpole", "num_seeds=2", "algo.target_update_period=16", *BUDGET]


def member_keys(algo: str) -> tuple[str, ...]:
    return ALGOS[algo].member_keys


def cells_of(root: Path, base: list[str], variants: list[list[str]], mode: str = "disabled") -> list[Cell]:
    return [
        Cell(compose_config([*base, *v, f"logger.mode={mode}"]), root / str(i), ",".join(v) or "default")
        for i, v in enumerate(variants)
    ]


def test_pack_key_separates_shapes_and_loops_not_per_member_keys():
    base = compose_config(DQN)
    same = [["optimizer=rmsprop"], ["init=he", "clipping=agc"], ["seed=7", "num_seeds=3"], ["algo.gamma=0.9"]]
    different = [["normalization=layer"], ["activation=tanh"], ["network.hidden=[32,32]"], ["total_steps=900"]]
    key = pack_key(base, member_keys("dqn"))
    assert all(pack_key(compose_config([*DQN, *v]), member_keys("dqn")) == key for v in same)
    assert all(pack_key(compose_config([*DQN, *v]), member_keys("dqn")) != key for v in different)
    # an algorithm without per-member keys packs only equal cells
    assert pack_key(compose_config([*DQN, "init=he"]), ()) != pack_key(base, ())


def test_plan_packs_bounds_members_and_refuses_below_one(tmp_path):
    cells = cells_of(tmp_path, DQN, [["init=he"], ["init=xavier"], ["init=orthogonal"], ["activation=tanh"]])
    packs = plan_packs(cells, member_keys, 4)
    assert sorted(len(p) for p in packs) == [1, 1, 2]  # 3 relu cells of 2 members: 2 + 1; tanh alone
    with pytest.raises(ConfigError, match="max_members"):
        plan_packs(cells, member_keys, 0)


def test_plan_packs_queues_the_largest_work_first(tmp_path):
    variants = [["init=he"], ["normalization=layer"], ["normalization=layer", "init=he"], ["total_steps=1200"]]
    cells = cells_of(tmp_path, DQN, variants)
    packs = plan_packs(cells, member_keys, 64)
    # 2 cells x layer norm (7 components), 1 cell x 2x the steps, 1 cell (5 components each)
    assert [[c.out_dir.name for c in p] for p in packs] == [["1", "2"], ["3"], ["0"]]
    assert [pack_work(p) for p in packs] == [4 * 600 * 7, 2 * 1200 * 5, 2 * 600 * 5]
