"""rlexp vs Stable-Baselines3 on gymnasium's MuJoCo tasks: TD3 and SAC, side by side in one invocation.

    python scripts/mujoco_check.py                                   # TD3, SAC x Hopper, HalfCheetah; 100k, 5 seeds
    python scripts/mujoco_check.py --algos td3 --envs hopper --seeds 2 --steps 20000

Both sides take rl-baselines3-zoo's hyperparameters, read from the installed ``rl_zoo3`` package's
hyperparams/<algo>.yml (its MuJoCo entries name the v4 tasks; the v5 tasks here are the same robots),
over SB3's own defaults for what an entry leaves out. For each (algorithm, env), in turn: rlexp trains
the seeds 0..N-1 as one population (one process, ``threads=1``), and SB3 trains each seed in a process
of its own (one torch thread) as it ships; which side goes first alternates from one pair to the
next. Equal budget (``--steps`` env steps per seed, the zoo's ``learning_starts`` of uniform random
actions included) and, per seed, a final evaluation of 10 deterministic episodes (rlexp: evaluation's
own environments; SB3: ``evaluate_policy`` on an environment seeded 10000 + seed).

Writes --out (default outputs/mujoco_check.json): per pair, both sides' per-seed final evaluation
returns, their medians, SB3's spread (min, max), wall times (rlexp: the population's process; SB3:
each seed's process and their sum), the settings and commands, and versions. Needs the ``bench`` and
``mujoco`` extras and rl_zoo3 (``pip install rl_zoo3``, only its hyperparams files are read).
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENVS = {"hopper": "Hopper-v5", "halfcheetah": "HalfCheetah-v5", "walker2d": "Walker2d-v5", "ant": "Ant-v5"}
NET_ARCH = {"td3": [400, 300], "sac": [256, 256]}  # SB3's MlpPolicy defaults
EVAL_EPISODES = 10


def zoo_entry(algo: str, env_id: str) -> dict[str, Any]:
    """rl-baselines3-zoo's hyperparameters for ``env_id`` (its v4 entry for a v5 task)."""
    import yaml

    spec = importlib.util.find_spec("rl_zoo3")  # located, not imported (its imports need more packages)
    if spec is None or spec.origin is None:
        sys.exit("mujoco_check.py: rl_zoo3 is not installed (its hyperparams files are read): pip install rl_zoo3")
    entries = yaml.safe_load((Path(spec.origin).parent / "hyperparams" / f"{algo}.yml").read_text())
    return dict(entries.get(env_id) or entries[env_id.replace("-v5", "-v4")])


def sb3_settings(algo: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The zoo entry over SB3's defaults: learning_rate, buffer_size, ... and net_arch, noise_std (TD3)."""
    import inspect

    from stable_baselines3 import SAC, TD3

    defaults = inspect.signature({"td3": TD3, "sac": SAC}[algo].__init__).parameters
    keys = ("learning_rate", "buffer_size", "learning_starts", "batch_size", "tau", "gamma", "train_freq")
    settings = {k: entry.get(k, defaults[k].default) for k in (*keys, "gradient_steps")}
    policy_kwargs = entry.get("policy_kwargs", "dict()")
    call = ast.parse(policy_kwargs, mode="eval").body  # "dict(net_arch=[400, 300])"
    kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    settings["net_arch"] = kwargs.get("net_arch", NET_ARCH[algo])
    if algo == "td3":
        settings |= {k: defaults[k].default for k in ("policy_delay", "target_policy_noise", "target_noise_clip")}
        settings["noise_std"] = entry.get("noise_std", 0.0) if entry.get("noise_type") == "normal" else 0.0
    return settings


def rlexp_overrides(algo: str, env: str, s: dict[str, Any]) -> list[str]:
    """rlexp's overrides for the same settings (ReLU, torch's default init, Adam, no clipping)."""
    hidden = ",".join(str(w) for w in s["net_arch"])
    overrides = [
        f"algo={algo}",
        f"env={env}",
        "activation=relu",
        "init=default",
        "normalization=none",
        "clipping=none",
        "optimizer=adam",
        f"optimizer.lr={s['learning_rate']}",
        f"network.hidden=[{hidden}]",
        f"algo.buffer_size={s['buffer_size']}",
        f"algo.batch_size={s['batch_size']}",
        f"algo.learning_starts={s['learning_starts']}",
        f"algo.gamma={s['gamma']}",
        f"algo.tau={s['tau']}",
        f"algo.train_frequency={s['train_freq']}",
        f"algo.gradient_steps={s['gradient_steps']}",
    ]
    if algo == "td3":  # noise scales: fractions of the half action range, 1 on these tasks
        overrides += [
            f"algo.exploration_noise={s['noise_std']}",
            f"algo.policy_delay={s['policy_delay']}",
            f"algo.target_noise={s['target_policy_noise']}",
            f"algo.target_noise_clip={s['target_noise_clip']}",
        ]
    return overrides


def sb3_train(algo: str, env_id: str, seed: int, steps: int, settings: dict[str, Any]) -> dict[str, float]:
    """One SB3 run as it ships (one torch thread), then its final evaluation (the child process's work)."""
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(1)
    kwargs = {k: v for k, v in settings.items() if k not in ("net_arch", "noise_std")}
    env = gym.make(env_id)
    if algo == "td3" and settings["noise_std"] > 0:
        n = env.action_space.shape[0]
        kwargs["action_noise"] = NormalActionNoise(np.zeros(n), settings["noise_std"] * np.ones(n))
    model = {"td3": TD3, "sac": SAC}[algo](
        "MlpPolicy", env, policy_kwargs={"net_arch": settings["net_arch"]}, seed=seed, device="cpu", **kwargs
    )
    model.learn(steps)
    eval_env = Monitor(gym.make(env_id))
    eval_env.reset(seed=10_000 + seed)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
    return {"eval_return": float(mean)}


def run(command: list[str]) -> tuple[str, float]:
    """Run a child process; returns (its stdout, wall seconds launch to exit)."""
    start = time.perf_counter()
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"mujoco_check.py: {' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout, wall


def rlexp_side(overrides: list[str], seeds: int, steps: int, run_dir: Path) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "rlexp.train",
        *overrides,
        f"total_steps={steps}",
        f"num_seeds={seeds}",
        "seed=0",
        "threads=1",
        "eval.every=0",
        f"eval.episodes={EVAL_EPISODES}",
        "logger.mode=disabled",
        "logger.progress=off",
        f"hydra.run.dir={run_dir}",
    ]
    _, wall = run(command)
    members = json.loads((run_dir / "summary.json").read_text())["members"]
    return {
        "returns": [m.get("eval_return") for m in members],
        "status": [m["status"] for m in members],
        "wall_s": round(wall, 1),
        "command": " ".join(command[1:]),
    }


def sb3_side(algo: str, env_id: str, seeds: int, steps: int, learning_starts: int) -> dict[str, Any]:
    returns, walls = [], []
    for seed in range(seeds):
        command = [sys.executable, str(Path(__file__).resolve()), "--sb3", algo, env_id, str(seed), str(steps)]
        command.append(str(learning_starts))
        out, wall = run(command)
        returns.append(json.loads(out.strip().splitlines()[-1])["eval_return"])
        walls.append(round(wall, 1))
    return {"returns": returns, "wall_s": walls, "wall_s_total": round(sum(walls), 1)}


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("torch", "gymnasium", "mujoco", "stable-baselines3", "rl_zoo3", "rlexp"):
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = None
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", choices=("td3", "sac"), default=["td3", "sac"])
    parser.add_argument("--envs", nargs="+", choices=sorted(ENVS), default=["hopper", "halfcheetah"])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 on both sides (default 5)")
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per seed (default 100k)")
    parser.add_argument("--learning-starts", type=int, help="both sides' random steps (default: the zoo's, 10k)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "mujoco_check.json")
    parser.add_argument("--sb3", nargs=5, help=argparse.SUPPRESS)  # internal: algo env_id seed steps learning_starts
    args = parser.parse_args()
    if args.sb3:
        algo, env_id, seed, steps, starts = args.sb3
        settings = sb3_settings(algo, zoo_entry(algo, env_id)) | {"learning_starts": int(starts)}
        print(json.dumps(sb3_train(algo, env_id, int(seed), int(steps), settings)))
        return 0

    results = []
    run_root = args.out.parent / f"mujoco_check-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for i, (algo, env) in enumerate((a, e) for a in args.algos for e in args.envs):
        env_id = ENVS[env]
        settings = sb3_settings(algo, zoo_entry(algo, env_id))
        if args.learning_starts is not None:
            settings["learning_starts"] = args.learning_starts
        overrides = rlexp_overrides(algo, env, settings)
        sides: dict[str, Any] = {}
        order = ("rlexp", "sb3") if i % 2 == 0 else ("sb3", "rlexp")
        for side in order:
            print(f"{algo} {env_id}: {side} ...", flush=True)
            if side == "rlexp":
                sides[side] = rlexp_side(overrides, args.seeds, args.steps, run_root / f"{algo}_{env}")
            else:
                sides[side] = sb3_side(algo, env_id, args.seeds, args.steps, settings["learning_starts"])
        finite = {k: [r for r in v["returns"] if r is not None] for k, v in sides.items()}
        result = {
            "algo": algo,
            "env": env_id,
            "order": list(order),
            "settings": settings,
            "rlexp": sides["rlexp"] | {"median": statistics.median(finite["rlexp"]) if finite["rlexp"] else None},
            "sb3": sides["sb3"]
            | {"median": statistics.median(finite["sb3"]), "spread": [min(finite["sb3"]), max(finite["sb3"])]},
        }
        results.append(result)
        fmt = lambda xs: ", ".join("-" if x is None else f"{x:.0f}" for x in xs)  # noqa: E731
        print(
            f"{algo} {env_id}: rlexp {fmt(sides['rlexp']['returns'])} (median {result['rlexp']['median']:.0f}, "
            f"{sides['rlexp']['wall_s']:.0f} s) | SB3 {fmt(sides['sb3']['returns'])} (median "
            f"{result['sb3']['median']:.0f}, {sides['sb3']['wall_s_total']:.0f} s)",
            flush=True,
        )
    report = {
        "steps": args.steps,
        "seeds": args.seeds,
        "eval_episodes": EVAL_EPISODES,
        "machine": {"cpus": os.cpu_count(), "load": list(os.getloadavg())},
        "versions": versions(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
