"""Learning check: train a population of seeds and count the members that reach a return threshold.

    python scripts/learning_check.py                       # defaults: DQN CartPole 50k, 10 seeds
    python scripts/learning_check.py --seed 10             # ... seeds 10-19
    python scripts/learning_check.py --preset cleanrl_dqn  # CleanRL's settings, 500k steps
    python scripts/learning_check.py --preset zoo_dqn      # rl-baselines3-zoo's settings, 50k steps
    python scripts/learning_check.py --preset cleanrl_ppo  # PPO, CleanRL's settings, 100k steps
    python scripts/learning_check.py --preset td3_pendulum # TD3 on Pendulum-v1, 20k steps, >= -250
    python scripts/learning_check.py --preset sac_pendulum # SAC on Pendulum-v1, 20k steps, eval >= -250
    python scripts/learning_check.py --preset muzero_lite  # MuZero-lite CartPole, 50k steps, eval >= 475
    python scripts/learning_check.py --overrides activation=tanh init=he
    python scripts/learning_check.py --preset minatar_dqn  # DQN, MinAtar Breakout, 1M steps, median >= 11.1
    python scripts/learning_check.py --preset minatar_dqn --run-dir outputs/learning_check/minatar --resume

Three criteria, all reported: "reach" — the mean return of the member's last 10 training episodes
is >= --threshold at some log step within the budget (the first such step is printed); "final" — it
is >= --threshold at the end; "eval" — the member's final evaluation (eval_return: the mean of
eval.episodes greedy episodes on evaluation's own environments, at the end of the run) is >=
--threshold; "median" — the median over the members of that final evaluation is >= --threshold.
--criterion picks the one that decides the exit code (1 when fewer than --min-pass members pass, or
for "median" when the median falls short). Results go to <run dir>/learning_check.json.

minatar_dqn: the MinAtar paper's DQN (Young & Tian 2019, +experiment=minatar_dqn) on MinAtar Breakout
for 1M steps, evaluated every 50k steps; it passes when the median final evaluation return reaches
11.1, the 10-episode evaluation at 1M frames of MinAtar's own examples/dqn.py run with the paper's
settings (the paper gives its curves as figures only; docs/benchmarks.md). It saves a checkpoint
(with the replay) every 100k steps, so a stopped check goes on from there with --run-dir and --resume
(rlexp's ``resume=true``); its wall_s is then the last invocation's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESETS = {  # name -> (overrides, deciding criterion, threshold)
    "default": ([], "reach", 475.0),
    "cleanrl_dqn": (["+experiment=cleanrl_dqn"], "final", 475.0),
    "zoo_dqn": (["+experiment=zoo_dqn"], "eval", 475.0),
    "cleanrl_ppo": (["+experiment=cleanrl_ppo"], "reach", 475.0),
    "zoo_ppo": (["+experiment=zoo_ppo"], "reach", 475.0),
    "td3_pendulum": (["+experiment=td3_pendulum"], "final", -250.0),
    "sac_pendulum": (["+experiment=sac_pendulum"], "eval", -250.0),
    "muzero_lite": (["algo=muzero_lite", "total_steps=50000"], "eval", 475.0),
    "minatar_dqn": (  # MinAtar's dqn.py at 1M frames; hours: checkpoints to go on from
        ["+experiment=minatar_dqn", "checkpoint.every=100000", "checkpoint.replay=true"],
        "median",
        11.1,
    ),
}


def first_reach(metrics_file: Path, threshold: float) -> int | None:
    """The first logged step at which episode/return_last10 >= threshold, or None."""
    for line in metrics_file.read_text().splitlines():
        record = json.loads(line)
        value = record.get("episode/return_last10")
        if isinstance(value, (int, float)) and value >= threshold:
            return record["step"]
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default")
    parser.add_argument("--seeds", type=int, default=10, help="population size (seeds S..S+N-1)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed S")
    parser.add_argument("--threshold", type=float, help="return a member must reach (default: the preset's)")
    parser.add_argument("--min-pass", type=int, default=8, help="members that must pass")
    parser.add_argument("--criterion", choices=["reach", "final", "eval", "median"], help="default: the preset's")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "learning_check")
    parser.add_argument("--overrides", nargs="*", default=[], help="extra Hydra overrides")
    parser.add_argument("--run-dir", type=Path, help="the job dir (default: a new one under --out)")
    parser.add_argument("--resume", action="store_true", help="go on with --run-dir's job from its last checkpoint")
    args = parser.parse_args()
    if args.run_dir is not None:
        args.run_dir = args.run_dir.resolve()  # the job runs from the project's root
    if args.resume and (args.run_dir is None or not args.run_dir.is_dir()):
        print(f"--resume: --run-dir {args.run_dir} is not a job dir; give the dir of the check to go on with")
        return 2

    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = args.run_dir or args.out / f"{args.preset}-seed{args.seed}-{stamp}-{os.getpid()}"
    overrides, criterion, threshold = PRESETS[args.preset]
    criterion = args.criterion or criterion
    args.threshold = threshold if args.threshold is None else args.threshold
    command = [
        sys.executable,
        "-m",
        "rlexp.train",
        *overrides,
        *args.overrides,
        f"num_seeds={args.seeds}",
        f"seed={args.seed}",
        "logger.mode=disabled",
        f"hydra.run.dir={run_dir}",
        *(["resume=true"] if args.resume else []),
    ]
    print(" ".join(command), flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "WANDB_SILENT": "true"})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        print(f"the job stopped (exit {done.returncode}); go on with: --run-dir {run_dir} --resume")
        return 1

    job = json.loads((run_dir / "summary.json").read_text())
    returns = [m["final_return"] for m in job["members"]]
    evals = [m.get("eval_return") for m in job["members"]]
    reached = [first_reach(run_dir / f"seed_{m['member']}" / "metrics.jsonl", args.threshold) for m in job["members"]]
    passed_final = sum(r is not None and r >= args.threshold for r in returns)
    passed_reach = sum(s is not None for s in reached)
    passed_eval = sum(r is not None and r >= args.threshold for r in evals)
    finite = sorted(r for r in evals if r is not None)
    median_eval = statistics.median(finite) if finite else None
    result = {
        "preset": args.preset,
        "overrides": args.overrides,
        "seeds": args.seeds,
        "seed": args.seed,
        "threshold": args.threshold,
        "criterion": criterion,
        "passed_reach": passed_reach,
        "passed_final": passed_final,
        "passed_eval": passed_eval,
        "median_eval": median_eval,
        "first_reach_step": reached,
        "final_returns": returns,
        "eval_returns": evals,
        "wall_s": round(wall, 1),  # this invocation's (with --resume: since the last checkpoint)
        "resumed": args.resume,
        "command": " ".join(command[1:]),
    }
    (run_dir / "learning_check.json").write_text(json.dumps(result, indent=2) + "\n")
    fmt = lambda xs: ", ".join("-" if x is None else f"{x:.0f}" for x in xs)  # noqa: E731
    print(
        f"reach: {passed_reach}/{args.seeds} members had a last-10 mean >= {args.threshold} "
        f"(first at steps: {fmt(reached)})"
    )
    print(f"final: {passed_final}/{args.seeds} members end >= {args.threshold} (final returns: {fmt(returns)})")
    print(f"eval: {passed_eval}/{args.seeds} members' last evaluation >= {args.threshold} (returns: {fmt(evals)})")
    print(f"median of the last evaluations: {median_eval} (threshold {args.threshold})")
    print(f"wall {wall:.0f} s; decided by {criterion}")
    if criterion == "median":
        return 0 if median_eval is not None and median_eval >= args.threshold else 1
    passed = {"reach": passed_reach, "final": passed_final, "eval": passed_eval}[criterion]
    return 0 if passed >= args.min_pass else 1


if __name__ == "__main__":
    sys.exit(main())
