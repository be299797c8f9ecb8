"""MADDPG vs a uniformly random policy on mpe2's simple_spread_v3, on one evaluation protocol.

    python scripts/spread_check.py --steps 25000 --seeds 3 --episodes 100 --out spread_check.json

Trains ``algo=maddpg env=simple_spread`` (its defaults: the MADDPG paper's lr 1e-2, gamma 0.95, tau
0.01 and logits penalty 1e-3) as one population of ``--seeds`` members (seeds 0..S-1) for ``--steps``
env steps each, then plays the random policy through rlexp's own ``Evaluator`` on the same evaluation
episodes (every member's ``--episodes`` environments reset from its evaluation seeds, one episode
each, 25 steps, 3 agents, local_ratio 0.5). Returns are the team's (summed over agents, as rlexp
logs them). The JSON holds each member's two returns and their medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlexp.compose.registry import register
from rlexp.config.schema import ObsNormConfig
from rlexp.envs.normalize import ObsNormalizer
from rlexp.run.evaluation import Evaluator

CONF = Path(__file__).resolve().parents[1] / "conf"


def random_returns(seeds: int, episodes: int) -> list[float]:
    """Each member's mean team return of a uniformly random policy on its evaluation episodes."""
    overrides = ["algo=maddpg", "env=simple_spread", f"eval.episodes={episodes}"]
    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=overrides))  # as rlexp.train types it
    members = list(range(seeds))
    evaluator = Evaluator(cfg, members, ObsNormalizer(ObsNormConfig(), seeds, 1))
    agents = evaluator.env.agents
    rng = np.random.default_rng(0)

    def policy(obs: np.ndarray) -> list[np.ndarray]:
        return [rng.integers(a.action_dim, size=obs.shape[:2]) for a in agents]

    returns = evaluator.run(policy, np.ones(seeds, dtype=bool)).returns  # [P, N]
    evaluator.close()
    return [float(r) for r in returns.mean(1)]


def maddpg_returns(seeds: int, steps: int, episodes: int) -> list[float]:
    """Each member's final evaluation (mean team return over ``episodes``) after ``steps`` env steps."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable, "-m", "rlexp.train", "algo=maddpg", "env=simple_spread", f"num_seeds={seeds}",
            f"total_steps={steps}", f"eval.episodes={episodes}", "eval.every=0", "logger.mode=disabled",
            "logger.progress=off", f"hydra.run.dir={out}",
        ]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True)
        return [json.loads((Path(out) / f"seed_{k}" / "summary.json").read_text())["eval_return"] for k in range(seeds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=25_000, help="MADDPG's env steps per member")
    parser.add_argument("--seeds", type=int, default=3, help="members (seeds 0..S-1)")
    parser.add_argument("--episodes", type=int, default=100, help="evaluation episodes per member")
    parser.add_argument("--out", default="spread_check.json")
    args = parser.parse_args()
    record = {"settings": vars(args), "random": random_returns(args.seeds, args.episodes)}
    record["maddpg"] = maddpg_returns(args.seeds, args.steps, args.episodes)
    for side in ("random", "maddpg"):
        record[f"{side}_median"] = statistics.median(record[side])
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
