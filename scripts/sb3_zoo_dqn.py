"""Stable-Baselines3's DQN with rl-baselines3-zoo's CartPole-v1 hyperparameters, seed by seed: the
peer beside ``scripts/learning_check.py --preset zoo_dqn`` (the ``bench`` extra installs SB3).

    python scripts/sb3_zoo_dqn.py --seed 0 --seeds 10     # seeds 0-9, one after another

Each seed trains 50k env steps, then plays ``--episodes`` deterministic evaluation episodes on an
environment of its own (seed 10000 + seed), as the zoo evaluates. Prints one JSON line per seed and
the count of final evaluations at or above ``--threshold``.
"""

from __future__ import annotations

import argparse
import json
import time


def train_and_evaluate(seed: int, steps: int, episodes: int) -> dict[str, float]:
    """One SB3 DQN run with the zoo's CartPole-v1 entry; its mean evaluation return and wall time (s)."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    torch.set_num_threads(1)
    start = time.perf_counter()
    model = DQN(
        "MlpPolicy",
        gym.make("CartPole-v1"),
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1000,
        gamma=0.99,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=128,
        exploration_fraction=0.16,
        exploration_final_eps=0.04,
        policy_kwargs={"net_arch": [256, 256]},
        seed=seed,
        device="cpu",
    )
    model.learn(steps)
    env = Monitor(gym.make("CartPole-v1"))
    env.reset(seed=10_000 + seed)
    mean, std = evaluate_policy(model, env, n_eval_episodes=episodes, deterministic=True)
    return {"seed": seed, "eval_return": float(mean), "eval_std": float(std), "wall_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--seeds", type=int, default=10, help="number of seeds (default 10)")
    parser.add_argument("--steps", type=int, default=50_000, help="env steps per seed (default 50k)")
    parser.add_argument("--episodes", type=int, default=10, help="evaluation episodes (default 10)")
    parser.add_argument("--threshold", type=float, default=475.0, help="return counted as solved (default 475)")
    args = parser.parse_args()
    results = []
    for seed in range(args.seed, args.seed + args.seeds):
        results.append(train_and_evaluate(seed, args.steps, args.episodes))
        print(json.dumps(results[-1]), flush=True)
    passed = sum(r["eval_return"] >= args.threshold for r in results)
    print(f"SB3 zoo DQN: final evaluation >= {args.threshold:g} in {passed}/{len(results)} seeds")


if __name__ == "__main__":
    main()
