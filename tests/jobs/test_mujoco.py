"""gymnasium's MuJoCo tasks (env=halfcheetah, hopper, walker2d, ant; the ``mujoco`` extra).

Smoke runs: each continuous-action algorithm family (TD3, DDPG, SAC, PPO) trains a population of two
on one of the presets for a few hundred steps, its members healthy and with finite losses; without
MuJoCo installed they skip with the install command. (A missing extra: tests/envs/test_extras.py.)
"""

from __future__ import annotations

import json
import math

import pytest
from composing import compose_config

from rlexp.train import run_job

QUIET = ["logger.mode=disabled", "logger.progress=off", "device=cpu", "threads=1"]
SMOKE = {  # algo -> (env preset, its gymnasium id, the algorithm's tiny budget)
    "td3": ("halfcheetah", "HalfCheetah-v5", ["total_steps=120", "algo.learning_starts=60", "algo.batch_size=16"]),
    "ddpg": ("hopper", "Hopper-v5", ["total_steps=120", "algo.learning_starts=60", "algo.batch_size=16"]),
    "sac": ("walker2d", "Walker2d-v5", ["total_steps=120", "algo.learning_starts=60", "algo.batch_size=16"]),
    "ppo": ("hopper", "Hopper-v5", ["total_steps=128", "algo.num_steps=32", "env.num_envs=2", "obs_norm.enabled=true"]),
}


@pytest.mark.parametrize("algo", sorted(SMOKE))
def test_each_algorithm_family_runs_on_a_mujoco_preset(algo, tmp_path, monkeypatch):
    pytest.importorskip("mujoco", reason="pip install -e '.[mujoco]'")
    monkeypatch.chdir(tmp_path)  # MuJoCo 4 writes HalfCheetah's deprecation warnings to ./MUJOCO_LOG.TXT
    preset, env_id, budget = SMOKE[algo]
    overrides = [f"algo={algo}", f"env={preset}", *budget, "num_seeds=2", "network.hidden=[16,16]"]
    cfg = compose_config([*overrides, "logger.log_every=60", "eval.episodes=0", *QUIET])
    assert cfg.env.id == env_id
    job = run_job(cfg, tmp_path)
    assert job["counts"]["ok"] == 2
    records = [json.loads(line) for line in (tmp_path / "seed_1" / "metrics.jsonl").read_text().splitlines()]
    losses = [r[key] for r in records for key in ("train/critic_loss", "train/loss") if key in r]
    assert losses and all(math.isfinite(v) for v in losses)
