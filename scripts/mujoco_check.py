"""rlexp vs Stable-Baselines3 on gymnasium's MuJoCo tasks: TD3 and SAC, side by side in one invocation.

    python scripts/mujoco_check.py --jobs 2                          # TD3, SAC x Hopper, HalfCheetah; 100k, 5 seeds
    python scripts/mujoco_check.py --jobs 2 --resume                 # go on after an interruption
    python scripts/mujoco_check.py --algos td3 --envs hopper --seeds 2 --steps 20000
    python scripts/mujoco_check.py --algos td3 --first-seed 3 --seeds 2 --out outputs/mujoco_check_3.json  # seeds 3, 4

Both sides take rl-baselines3-zoo's hyperparameters, read from the installed ``rl_zoo3`` package's
hyperparams/<algo>.yml (its MuJoCo entries name the v4 tasks; the v5 tasks here are the same robots),
over SB3's own defaults for what an entry leaves out. For each (algorithm, env), rlexp trains the
seeds S..S+N-1 (``--first-seed`` S, default 0; ``--seeds`` N) as one population (one process,
``threads=1``; member k takes seed S + k), and SB3 trains each seed in a process of its own (one
torch thread) as it ships; which side is queued first alternates from one pair to the next, and
``--jobs`` processes run at once (each side's processes share the machine alike).
Equal budget (``--steps`` env steps per seed, the zoo's ``learning_starts`` of uniform random
actions included) and, per seed, a final evaluation of 10 deterministic episodes (rlexp: evaluation's
own environments; SB3: ``evaluate_policy`` on an environment seeded 10000 + seed).

Each finished process leaves its record (returns, wall time, command) in the folder named as --out
without its suffix; ``--resume`` keeps those and runs the rest, so a long comparison can be stopped
and continued. --out (default outputs/mujoco_check.json), rewritten after every process: per pair,
both sides' per-seed final evaluation returns, their medians, SB3's spread (min, max), wall times
(rlexp: the population's process; SB3: each seed's process and their sum), the settings and
commands, and versions; a pair with processes still to run lists them as ``pending``. Needs the
``bench`` and ``mujoco`` extras and rl_zoo3 (``pip install --no-deps rl_zoo3``: only its
hyperparams files are read, and its own requirements would replace the ``optuna`` extra's optuna).
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENVS = {"hopper": "Hopper-v5", "halfcheetah": "HalfCheetah-v5", "walker2d": "Walker2d-v5", "ant": "Ant-v5"}
NET_ARCH = {"td3": [400, 300], "sac": [256, 256]}  # SB3's MlpPolicy defaults
EVAL_EPISODES = 10


def pair_line(r: dict[str, Any]) -> str:
    """A finished pair's returns, medians and wall times on one line."""
    fmt = lambda xs: ", ".join("-" if x is None else f"{x:.0f}" for x in xs)  # noqa: E731
    mine, theirs = r["rlexp"], r["sb3"]
    median = "-" if mine["median"] is None else f"{mine['median']:.0f}"
    return (
        f"{r['algo']} {r['env']}: rlexp {fmt(mine['returns'])} (median {median}, {mine['wall_s']:.0f} s)"
        f" | SB3 {fmt(theirs['returns'])} (median {theirs['median']:.0f}, {theirs['wall_s_total']:.0f} s)"
    )


def refuse(line: str) -> None:
    """Bad input: one line naming the option, the value and the fix; exit code 2, nothing written."""
    print(line)
    raise SystemExit(2)


def zoo_entry(algo: str, env_id: str) -> dict[str, Any]:
    """rl-baselines3-zoo's hyperparameters for ``env_id`` (its v4 entry for a v5 task)."""
    import yaml

    spec = importlib.util.find_spec("rl_zoo3")  # located, not imported (its imports need more packages)
    if spec is None or spec.origin is None:
        refuse("rl_zoo3: not installed (its hyperparams files are read); pip install --no-deps rl_zoo3")
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
    """rlexp's overrides for the same settings (ReLU, torch's default init, the actor's output layer
    included, Adam, no clipping)."""
    hidden = ",".join(str(w) for w in s["net_arch"])
    overrides = [
        f"algo={algo}",
        f"env={env}",
        "activation=relu",
        "init=default",
        "actor.last_layer_gain=null",  # the scheme's output layer, as SB3's (rlexp's actor takes 0.01 by default)
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
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout, wall


@dataclass
class Unit:
    """One process of the comparison: rlexp's population of every seed, or one SB3 seed. Its result
    (``result``: the JSON it leaves on disk when it has finished) makes a later ``--resume`` skip it."""

    pair: str  # "<algo>_<env>"
    side: str  # "rlexp" or "sb3"
    seed: int | None  # SB3's seed; None for rlexp's population
    command: list[str]
    result: Path

    @property
    def label(self) -> str:
        return self.side if self.seed is None else f"{self.side} seed {self.seed}"

    def done(self) -> dict[str, Any] | None:
        """The finished unit's record, or None."""
        return json.loads(self.result.read_text()) if self.result.exists() else None

    def execute(self) -> dict[str, Any]:
        """Run it (rlexp's job dir made anew) and write its record."""
        record: dict[str, Any] = {"command": " ".join(self.command[1:])}
        if self.side == "rlexp":
            run_dir = self.result.parent / "rlexp"
            shutil.rmtree(run_dir, ignore_errors=True)  # an earlier, unfinished attempt
            _, wall = run([*self.command, f"hydra.run.dir={run_dir}"])
            members = json.loads((run_dir / "summary.json").read_text())["members"]
            record |= {"returns": [m.get("eval_return") for m in members], "status": [m["status"] for m in members]}
        else:
            out, wall = run(self.command)
            record["return"] = json.loads(out.strip().splitlines()[-1])["eval_return"]
        record["wall_s"] = round(wall, 1)
        self.result.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.result.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        tmp.replace(self.result)  # whole or absent: a killed run leaves no half record
        return record


def rlexp_command(overrides: list[str], seeds: range, steps: int) -> list[str]:
    """rlexp's population of ``seeds`` (member k: seed seeds.start + k) in one process on one thread
    (its run dir added when run)."""
    return [
        sys.executable,
        "-m",
        "rlexp.train",
        *overrides,
        f"total_steps={steps}",
        f"num_seeds={len(seeds)}",
        f"seed={seeds.start}",
        "threads=1",
        "eval.every=0",
        f"eval.episodes={EVAL_EPISODES}",
        "logger.mode=disabled",
        "logger.progress=off",
    ]


def sb3_command(algo: str, env_id: str, seed: int, steps: int, learning_starts: int) -> list[str]:
    """One SB3 seed in a process of its own (this script's internal ``--sb3`` mode)."""
    script = str(Path(__file__).resolve())
    return [sys.executable, script, "--sb3", algo, env_id, str(seed), str(steps), str(learning_starts)]


def pair_result(algo: str, env_id: str, order: tuple[str, str], settings: dict[str, Any], units: list[Unit]) -> dict:
    """One (algorithm, env)'s entry of the report from its units' records (``pending`` while any is missing)."""
    records = [u.done() for u in units]
    result: dict[str, Any] = {"algo": algo, "env": env_id, "order": list(order), "settings": settings}
    if any(r is None for r in records):
        return result | {"pending": [u.label for u, r in zip(units, records) if r is None]}
    rlexp, sb3 = records[0], records[1:]
    mine = [r for r in rlexp["returns"] if r is not None]
    theirs = [r["return"] for r in sb3]
    walls = [r["wall_s"] for r in sb3]
    result["rlexp"] = rlexp | {"median": statistics.median(mine) if mine else None}
    result["sb3"] = {
        "returns": theirs,
        "median": statistics.median(theirs),
        "spread": [min(theirs), max(theirs)],
        "wall_s": walls,
        "wall_s_total": round(sum(walls), 1),
        "commands": [r["command"] for r in sb3],
    }
    return result


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
    parser.add_argument("--seeds", type=int, default=5, help="N: seeds S..S+N-1 on both sides (default 5)")
    parser.add_argument("--first-seed", type=int, default=0, help="S, the first seed (default 0)")
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per seed (default 100k)")
    parser.add_argument("--learning-starts", type=int, help="both sides' random steps (default: the zoo's, 10k)")
    parser.add_argument("--jobs", type=int, default=1, help="processes at once, one torch thread each (default 1)")
    parser.add_argument("--resume", action="store_true", help="keep the finished processes' records; run the rest")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "mujoco_check.json")
    parser.add_argument("--sb3", nargs=5, help=argparse.SUPPRESS)  # internal: algo env_id seed steps learning_starts
    args = parser.parse_args()
    if args.sb3:
        algo, env_id, seed, steps, starts = args.sb3
        settings = sb3_settings(algo, zoo_entry(algo, env_id)) | {"learning_starts": int(starts)}
        print(json.dumps(sb3_train(algo, env_id, int(seed), int(steps), settings)))
        return 0
    for key, least in (("seeds", 1), ("steps", 1), ("jobs", 1), ("first_seed", 0)):
        if getattr(args, key) < least:
            refuse(f"--{key.replace('_', '-')}: {getattr(args, key)} is below {least}; give a value >= {least}")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    work = args.out.resolve().with_suffix("")  # the processes' records and rlexp's job dirs
    if work.exists() and any(work.iterdir()) and not args.resume:
        refuse(f"--out: {work} holds an earlier invocation's records; add --resume to go on with it, or remove it")

    pairs: dict[str, tuple] = {}  # name -> pair_result's arguments
    units: list[Unit] = []
    for i, (algo, env) in enumerate((a, e) for a in args.algos for e in args.envs):
        env_id = ENVS[env]
        settings = sb3_settings(algo, zoo_entry(algo, env_id))
        if args.learning_starts is not None:
            settings["learning_starts"] = args.learning_starts
        if settings["learning_starts"] >= args.steps:
            refuse(
                f"--steps: {args.steps} leaves no update after {settings['learning_starts']} random steps; "
                "give more steps or a smaller --learning-starts"
            )
        name = f"{algo}_{env}"
        command = rlexp_command(rlexp_overrides(algo, env, settings), seeds, args.steps)
        mine = Unit(name, "rlexp", None, command, work / name / "rlexp.json")
        starts = settings["learning_starts"]
        theirs = [
            Unit(name, "sb3", k, sb3_command(algo, env_id, k, args.steps, starts), work / name / f"sb3_seed{k}.json")
            for k in seeds
        ]
        order = ("rlexp", "sb3") if i % 2 == 0 else ("sb3", "rlexp")  # which side starts alternates
        pair_units = [mine, *theirs]
        pairs[name] = (algo, env_id, order, settings, pair_units)
        units += pair_units if order[0] == "rlexp" else [*theirs, mine]
        for unit in pair_units:
            record = unit.done()
            if record is not None and record["command"] != " ".join(unit.command[1:]):
                refuse(f"--resume: {unit.result} was run as `{record['command']}`; remove it to run it as now")

    def report() -> dict[str, dict[str, Any]]:
        """Write the report as it stands (finished pairs in full, the others with what is pending)."""
        results = {name: pair_result(*pair) for name, pair in pairs.items()}
        doc = {
            "steps": args.steps,
            "seeds": list(seeds),
            "eval_episodes": EVAL_EPISODES,
            "jobs": args.jobs,
            "machine": {"cpus": os.cpu_count(), "load": list(os.getloadavg())},
            "versions": versions(),
            "results": list(results.values()),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
        return results

    todo = [u for u in units if u.done() is None]
    print(f"mujoco_check.py: {len(todo)} of {len(units)} processes to run, {args.jobs} at once; records in {work}")
    lock = threading.Lock()

    def execute(unit: Unit) -> None:
        print(f"{unit.pair}: {unit.label} ...", flush=True)
        unit.execute()
        with lock:
            result = report()[unit.pair]
        if "pending" not in result:  # the pair's last process
            print(pair_line(result), flush=True)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(execute, u) for u in todo]
        failed = [err for err in (f.exception() for f in futures) if err is not None]
    report()
    print(f"wrote {args.out}")
    if failed:
        print(f"mujoco_check.py: {len(failed)} processes failed; the first:\n{failed[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
