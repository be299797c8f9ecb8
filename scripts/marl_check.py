"""rlexp vs BenchMARL on VMAS navigation and balance: equal env-step budget, equal seeds, alternating.

BenchMARL pulls TorchRL, whose wheels want another torch than rlexp's: it lives in a venv of its own,
never in rlexp's interpreter, and this script runs it there as a subprocess. One way to make it
(the venv sees the main interpreter's torch, so pip keeps it):

    python -m venv --system-site-packages /path/to/venvs/benchmarl
    /path/to/venvs/benchmarl/bin/pip install "torch==2.13.0" benchmarl   # check first with --dry-run

Then:

    python scripts/marl_check.py --benchmarl-python /path/to/venvs/benchmarl/bin/python \
        --algos mappo --tasks navigation balance --seeds 0 1 2 --frames 60000 --out marl_check.json

Each (task, algorithm, seed) runs rlexp then BenchMARL, the order alternating from one seed to the
next; each side trains on ``--frames`` environment steps (BenchMARL's ``max_n_frames``; rlexp's
``total_steps`` per member with ``env.num_envs`` environments) and is evaluated at the end on
``--eval-episodes`` episodes of ``--max-steps`` steps. Returns are compared per agent: BenchMARL logs
each agent's episode reward averaged over agents, rlexp the sum over agents (divided here by the
number of agents). The JSON holds both sides' returns and wall times, and the versions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

AGENTS = {"navigation": 4, "balance": 3}  # the scenarios' default agent counts (as both sides use them)

BENCHMARL_RUN = r"""
import glob, json, os, sys, time
import torch
from benchmarl.algorithms import MaddpgConfig, MappoConfig
from benchmarl.environments import VmasTask
from benchmarl.experiment import Experiment, ExperimentConfig
from benchmarl.models.mlp import MlpConfig

task_name, algo, seed, frames, envs, max_steps, episodes, out = sys.argv[1:9]
torch.set_num_threads(1)
config = ExperimentConfig.get_from_yaml()
config.max_n_frames = int(frames)
config.on_policy_n_envs_per_worker = config.off_policy_n_envs_per_worker = int(envs)
config.on_policy_collected_frames_per_batch = config.off_policy_collected_frames_per_batch = int(envs) * 100
config.evaluation_episodes = int(episodes)
config.loggers = ["csv"]
config.create_json = False
config.save_folder = out
config.checkpoint_interval = 0
config.sampling_device = config.train_device = "cpu"
config.render = False
iterations = max(1, int(frames) // config.on_policy_collected_frames_per_batch)
config.evaluation_interval = iterations * config.on_policy_collected_frames_per_batch
task = getattr(VmasTask, task_name.upper()).get_from_yaml()
task.config["max_steps"] = int(max_steps)
algorithm = {"mappo": MappoConfig, "maddpg": MaddpgConfig}[algo].get_from_yaml()
start = time.perf_counter()
experiment = Experiment(
    task=task,
    algorithm_config=algorithm,
    model_config=MlpConfig.get_from_yaml(),
    critic_model_config=MlpConfig.get_from_yaml(),
    seed=int(seed),
    config=config,
)
experiment.run()
wall = time.perf_counter() - start
files = sorted(glob.glob(os.path.join(out, "**", "*eval*reward*episode_reward_mean*.csv"), recursive=True))
last = None
for line in open(files[-1]).read().splitlines() if files else []:
    last = float(line.split(",")[-1])
print(json.dumps({"return_per_agent": last, "wall_s": wall}))
"""


def run_rlexp(task: str, algo: str, seed: int, args: argparse.Namespace) -> dict:
    """One rlexp job (a population of one member) in a temporary dir; its final evaluation per agent."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable, "-m", "rlexp.train", f"algo={algo}", f"env=vmas_{task}", f"seed={seed}",
            f"total_steps={args.frames}", f"env.num_envs={args.envs}", f"env.max_episode_steps={args.max_steps}",
            f"eval.episodes={args.eval_episodes}", "eval.every=0", "logger.mode=disabled", "logger.progress=off",
            f"hydra.run.dir={out}",
        ]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        wall = time.perf_counter() - start
        member = json.loads((Path(out) / "seed_0" / "summary.json").read_text())
    return {"return_per_agent": member["eval_return"] / AGENTS[task], "wall_s": wall}


def run_benchmarl(task: str, algo: str, seed: int, args: argparse.Namespace) -> dict:
    """One BenchMARL experiment in its venv; its final evaluation (episode reward, mean over agents)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            args.benchmarl_python, "-c", BENCHMARL_RUN, task, algo, str(seed), str(args.frames), str(args.envs),
            str(args.max_steps), str(args.eval_episodes), out,
        ]  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - start
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"return_per_agent": result["return_per_agent"], "wall_s": wall}


def versions(python: str) -> dict[str, str]:
    """rlexp's side's package versions, and BenchMARL's venv's."""
    ours = {name: metadata.version(name) for name in ("torch", "vmas")}
    code = "import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in "
    code += "('benchmarl', 'torchrl', 'tensordict', 'torch', 'vmas')}))"
    theirs = json.loads(subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout)
    return {"rlexp": ours, "benchmarl": theirs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmarl-python", required=True, help="the python of BenchMARL's venv")
    parser.add_argument("--algos", nargs="+", default=["mappo", "maddpg"], choices=["mappo", "maddpg"])
    parser.add_argument("--tasks", nargs="+", default=["navigation", "balance"], choices=sorted(AGENTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--frames", type=int, default=60_000, help="env steps per run, both sides")
    parser.add_argument("--envs", type=int, default=10, help="vectorized environments, both sides")
    parser.add_argument("--max-steps", type=int, default=100, help="episode length")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--out", default="marl_check.json")
    args = parser.parse_args()
    if not Path(args.benchmarl_python).exists():
        print(
            f"--benchmarl-python: {args.benchmarl_python} does not exist; see this script's docstring", file=sys.stderr
        )
        raise SystemExit(2)
    record = {"settings": vars(args), "versions": versions(args.benchmarl_python), "runs": []}
    for task in args.tasks:
        for algo in args.algos:
            for i, seed in enumerate(args.seeds):
                sides = [("rlexp", run_rlexp), ("benchmarl", run_benchmarl)]
                for side, run in sides if i % 2 == 0 else sides[::-1]:  # alternate who goes first
                    result = run(task, algo, seed, args)
                    record["runs"].append({"task": task, "algo": algo, "seed": seed, "side": side, **result})
                    print(json.dumps(record["runs"][-1]), flush=True)
                    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
