"""rlexp vs BenchMARL on VMAS navigation and balance: equal env-step budget, equal seeds, alternating.

BenchMARL pulls TorchRL, whose wheels want another torch than rlexp's: it lives in a venv of its own,
never in rlexp's interpreter, and this script runs it there as a subprocess (``--benchmarl-python``,
default /work/venvs/benchmarl/bin/python). One way to make it (the venv sees the main interpreter's
torch, so pip keeps it):

    python -m venv --system-site-packages /work/venvs/benchmarl
    /work/venvs/benchmarl/bin/pip install "torch==$(python -c 'import torch; print(torch.__version__)')" benchmarl

Then:

    python scripts/marl_check.py --algos mappo maddpg --tasks navigation balance --seeds 0 1 2 \
        --mappo-frames 120000 --maddpg-frames 30000 --out marl_check.json

Both sides run with BenchMARL's yaml defaults (experiment, algorithm, VMAS task, MLP), read from the
venv at the start; rlexp gets the overrides that set the same (``rlexp_overrides``; the differences
that remain are listed in docs/marl.md). Each (task, algorithm, seed) runs rlexp and BenchMARL, rlexp
first for an even seed, BenchMARL first for an odd one; each trains on the algorithm's frame budget
(environment steps: BenchMARL's ``max_n_frames``, rlexp's ``total_steps``) and is evaluated every
``--eval-every`` frames and at the end on ``--eval-episodes`` deterministic episodes. Returns are per
agent: BenchMARL logs each episode's reward summed over steps and averaged over agents, rlexp the
team's (summed over agents), divided here by the number of agents. The JSON holds both sides' final
returns and evaluation curves, P(an rlexp seed ends above a BenchMARL seed), wall times (start-up
included), the settings and the versions.
``--sides rlexp`` (or ``benchmarl``) runs one side alone: BenchMARL's returns repeat exactly for a seed,
so a change on rlexp's side can be measured against an earlier invocation's BenchMARL runs.
``--critic-layer-norm`` puts a LayerNorm after each hidden linear layer of the critic, before its
activation, on both sides (rlexp's ``critic.normalization=layer``; BenchMARL's critic MLP with
``norm_class=LayerNorm``). ``--rlexp-overrides`` appends Hydra overrides to rlexp's side alone, after
the matched settings; they are checked before any run and recorded with the others.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from rlexp.cli import check_command_line
from rlexp.compose.registry import CONF_DIR
from rlexp.config.schema import ConfigError
from rlexp.report.stats import poi_fast

AGENTS = {"navigation": 3, "balance": 4}  # as BenchMARL's task yaml sets them (VMAS's own: 4 and 3)
BENCHMARL_PYTHON = "/work/venvs/benchmarl/bin/python"  # where this machine keeps it; --benchmarl-python
BATCH = 6000  # BenchMARL's frames per batch (on- and off-policy): budgets and evaluations are multiples

# Run in BenchMARL's venv: its yaml defaults (experiment, algorithm, task, MLP) as one JSON object.
BENCHMARL_SETTINGS = r"""
import json, sys
from benchmarl.algorithms import MaddpgConfig, MappoConfig
from benchmarl.environments import VmasTask
from benchmarl.experiment import ExperimentConfig
from benchmarl.models.mlp import MlpConfig
task, algo = sys.argv[1:3]
algorithm = {"mappo": MappoConfig, "maddpg": MaddpgConfig}[algo].get_from_yaml()
mlp = MlpConfig.get_from_yaml()
print(json.dumps({
    "experiment": vars(ExperimentConfig.get_from_yaml()),
    "algorithm": vars(algorithm),
    "task": dict(getattr(VmasTask, task.upper()).get_from_yaml().config),
    "model": {"num_cells": list(mlp.num_cells), "activation": mlp.activation_class.__name__,
              "layer": mlp.layer_class.__name__, "norm": str(mlp.norm_class)},
}, default=str))
"""

# Run in BenchMARL's venv: one experiment with its yaml defaults but the budget; its last evaluation.
BENCHMARL_RUN = r"""
import glob, json, os, sys, time
import torch
from benchmarl.algorithms import MaddpgConfig, MappoConfig
from benchmarl.environments import VmasTask
from benchmarl.experiment import Experiment, ExperimentConfig
from benchmarl.models.mlp import MlpConfig

task_name, algo, seed, frames, episodes, every, threads, critic_layer_norm, out = sys.argv[1:10]
torch.set_num_threads(int(threads))
config = ExperimentConfig.get_from_yaml()
config.max_n_frames = int(frames)
config.evaluation_episodes = int(episodes)
config.loggers = ["csv"]
config.create_json = False
config.save_folder = out
config.checkpoint_interval = 0
config.render = False
config.evaluation_interval = int(every)  # and after the first iteration
batch = config.on_policy_collected_frames_per_batch if algo == "mappo" else config.off_policy_collected_frames_per_batch
algorithm = {"mappo": MappoConfig, "maddpg": MaddpgConfig}[algo].get_from_yaml()
critic = MlpConfig.get_from_yaml()
if critic_layer_norm == "1":  # TorchRL's MLP: linear, norm, activation
    critic.norm_class = torch.nn.LayerNorm
    critic.norm_kwargs = [{"normalized_shape": n} for n in critic.num_cells]
start = time.perf_counter()
experiment = Experiment(
    task=getattr(VmasTask, task_name.upper()).get_from_yaml(),
    algorithm_config=algorithm,
    model_config=MlpConfig.get_from_yaml(),
    critic_model_config=critic,
    seed=int(seed),
    config=config,
)
experiment.run()
wall = time.perf_counter() - start
name = "eval_reward_episode_reward_mean.csv"  # per episode: the sum over steps, averaged over agents
rows = [line.split(",") for f in glob.glob(os.path.join(out, "**", name), recursive=True) for line in open(f)]
curve = sorted(((int(row[0]) + 1) * batch, float(row[-1])) for row in rows)  # (iteration, value) rows
print(json.dumps({"return_per_agent": curve[-1][1], "curve": curve, "frames": experiment.total_frames, "wall_s": wall}))
"""


def benchmarl_settings(python: str, task: str, algo: str) -> dict:
    """BenchMARL's yaml defaults for ``algo`` on VMAS ``task``, read in its venv."""
    done = subprocess.run([python, "-c", BENCHMARL_SETTINGS, task, algo], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def rlexp_overrides(task: str, algo: str, bm: dict, frames: int) -> list[str]:
    """rlexp's overrides that set ``algo`` as BenchMARL's defaults ``bm`` set it (the differences that
    remain: docs/marl.md)."""
    exp, alg, model = bm["experiment"], bm["algorithm"], bm["model"]
    assert exp["on_policy_collected_frames_per_batch"] == exp["off_policy_collected_frames_per_batch"] == BATCH
    task_kwargs = {k: v for k, v in bm["task"].items() if k != "max_steps"}  # the scenario's arguments
    assert task_kwargs["n_agents"] == AGENTS[task], bm["task"]
    scenario = [f"+env.kwargs.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in task_kwargs.items()]
    assert model["activation"] == "Tanh" and model["layer"] == "Linear" and model["norm"] == "None", model
    clip = (
        ["clipping=global_norm", f"clipping.max_norm={exp['clip_grad_val']}"]
        if exp["clip_grad_norm"]
        else ["clipping=value", f"clipping.clip_value={exp['clip_grad_val']}"]
    )
    common = [
        f"algo={algo}", f"env=vmas_{task}", *scenario,
        f"env.max_episode_steps={bm['task']['max_steps']}",
        "env.timeout_terminal=true",  # TorchRL's VMAS wrapper marks the step limit terminated: no bootstrap
        f"algo.gamma={exp['gamma']}", f"optimizer.lr={exp['lr']}",
        f"optimizer.eps={exp['adam_eps']}", *clip, f"network.hidden=[{','.join(map(str, model['num_cells']))}]",
        "activation=tanh", "init=default",
        "actor.last_layer_gain=null",  # PyTorch's output layer, as TorchRL's MLP (rlexp's actor takes 0.01)
    ]  # fmt: skip
    if algo == "mappo":
        envs, batch = exp["on_policy_n_envs_per_worker"], exp["on_policy_collected_frames_per_batch"]
        # BenchMARL trains on_policy_n_minibatch_iters passes over the batch, each of batch / minibatch_size
        # minibatches drawn without replacement: epochs, in rlexp's words
        minibatches, rest = divmod(batch, exp["on_policy_minibatch_size"])
        assert alg["loss_critic_type"] == "l2" and rest == 0 and not alg["minibatch_advantage"], alg
        # the policy: a tanh-squashed normal whose scale the network outputs through softplus(s + b) + min_std,
        # b such that s = 0 gives init_std ("biased_softplus_{init_std}" or "..._{init_std}_{min_std}")
        assert alg["use_tanh_normal"] and alg["scale_mapping"].startswith("biased_softplus_"), alg
        init_std, min_std, *_ = [*map(float, alg["scale_mapping"].split("_")[2:]), 0.01]  # tensordict's min_val
        return common + [
            f"env.num_envs={envs}", f"algo.num_steps={batch // envs}", f"algo.num_minibatches={minibatches}",
            f"algo.update_epochs={exp['on_policy_n_minibatch_iters']}",
            f"algo.gae_lambda={alg['lmbda']}", f"algo.clip_coef={alg['clip_epsilon']}",
            f"algo.ent_coef={alg['entropy_coef']}",
            f"algo.vf_coef={2 * alg['critic_coef']}",  # TorchRL's l2 is (v - R)^2, rlexp's value loss 0.5 (v - R)^2
            "algo.clip_vloss=false", "algo.norm_adv=false",  # ClipPPOLoss as BenchMARL makes it
            "algo.continuous_policy=tanh_normal", f"algo.init_std={init_std}", f"algo.min_std={min_std}",
            f"algo.share_parameters={str(exp['share_policy_params']).lower()}",
            "algo.agent_index=false",  # BenchMARL's shared policy sees the agent's observation alone
            f"algo.shared_value={str(alg['share_param_critic']).lower()}",  # one value for every agent
        ]  # fmt: skip
    # MADDPG: BenchMARL's Gaussian noise sigma falls linearly from eps_init to eps_end over a third of the
    # frames, stepped after each batch by the batch's frames; rlexp's the same (exploration_anneal_every)
    third = exp["exploration_anneal_frames"] or frames // 3
    assert alg["loss_function"] == "l2" and alg["delay_value"] and exp["off_policy_init_random_frames"] == 0
    # rlexp shares the actor and the critic together (one Q for every agent, as BenchMARL's shared critic)
    assert exp["share_policy_params"] == alg["share_param_critic"], (exp["share_policy_params"], alg)
    return common + [
        f"algo.share_parameters={str(exp['share_policy_params']).lower()}",
        f"env.num_envs={exp['off_policy_n_envs_per_worker']}",
        f"algo.train_frequency={exp['off_policy_collected_frames_per_batch']}",
        f"algo.gradient_steps={exp['off_policy_n_optimizer_steps']}",
        f"algo.batch_size={exp['off_policy_train_batch_size']}",
        f"algo.buffer_size={min(exp['off_policy_memory_size'], frames)}",  # neither side's replay fills up
        f"algo.tau={exp['polyak_tau']}",
        "algo.target_actor=false",  # TorchRL's DDPGLoss: a target critic (delay_value), no target actor
        "algo.actor_first=true",  # ... and both losses from one forward: the actor's sees the critic before its step
        "algo.learning_starts=0",
        f"algo.exploration_noise={exp['exploration_eps_init']}",
        f"algo.exploration_noise_end={exp['exploration_eps_end']}",
        f"algo.exploration_anneal_steps={third}",
        f"algo.exploration_anneal_every={exp['off_policy_collected_frames_per_batch']}",
    ]


def run_rlexp(task: str, algo: str, seed: int, frames: int, args: argparse.Namespace, overrides: list[str]) -> dict:
    """One rlexp job (a population of one member) in a temporary dir; its evaluations per agent."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable, "-m", "rlexp.train", *overrides, f"seed={seed}", f"total_steps={frames}",
            f"eval.episodes={args.eval_episodes}", f"eval.every={args.eval_every}", "logger.mode=disabled",
            "logger.progress=off", f"threads={args.threads}", f"hydra.run.dir={out}",
        ]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        wall = time.perf_counter() - start
        member = json.loads((Path(out) / "seed_0" / "summary.json").read_text())
        lines = [json.loads(line) for line in (Path(out) / "seed_0" / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], r["eval/return"] / AGENTS[task]) for r in lines if "eval/return" in r]
    ret = member["eval_return"] / AGENTS[task]
    return {"return_per_agent": ret, "curve": curve, "frames": member["steps"], "wall_s": wall}


def run_benchmarl(task: str, algo: str, seed: int, frames: int, args: argparse.Namespace) -> dict:
    """One BenchMARL experiment in its venv; its evaluations (episode reward, mean over agents)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            args.benchmarl_python, "-c", BENCHMARL_RUN, task, algo, str(seed), str(frames), str(args.eval_episodes),
            str(args.eval_every), str(args.threads), str(int(args.critic_layer_norm)), out,
        ]  # fmt: skip
        start = time.perf_counter()
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - start
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "wall_s": wall}


def versions(python: str) -> dict[str, str]:
    """rlexp's side's package versions, and BenchMARL's venv's."""
    ours = {name: metadata.version(name) for name in ("torch", "vmas")}
    code = "import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in "
    code += "('benchmarl', 'torchrl', 'tensordict', 'torch', 'vmas')}))"
    theirs = json.loads(subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout)
    return {"rlexp": ours, "benchmarl": theirs}


def summarize(runs: list[dict]) -> list[dict]:
    """Per (task, algorithm, side): every seed's final return per agent and wall time, and their medians;
    rlexp's row, when BenchMARL's side ran too, also P(an rlexp seed ends above a BenchMARL seed)."""
    rows = []
    for key in dict.fromkeys((r["task"], r["algo"], r["side"]) for r in runs):
        mine = [r for r in runs if (r["task"], r["algo"], r["side"]) == key]
        returns, walls = [r["return_per_agent"] for r in mine], [r["wall_s"] for r in mine]
        first = [r["curve"][0][1] for r in mine]  # after the first batch
        rows.append(
            dict(zip(("task", "algo", "side"), key))
            | {"seeds": [r["seed"] for r in mine], "returns": returns, "median_return": statistics.median(returns)}
            | {"first_eval": first, "median_first_eval": statistics.median(first)}
            | {"wall_s": walls, "median_wall_s": statistics.median(walls)}
        )
    for row in rows:
        other = [r for r in rows if (r["task"], r["algo"], r["side"]) == (row["task"], row["algo"], "benchmarl")]
        if row["side"] == "rlexp" and other:
            mine, theirs = np.array(row["returns"])[:, None], np.array(other[0]["returns"])[:, None]  # [seeds, 1 task]
            row["p_above_benchmarl"] = poi_fast(mine, theirs)  # ties count half: rliable's improvement
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmarl-python", default=BENCHMARL_PYTHON, help="the python of BenchMARL's venv")
    parser.add_argument("--algos", nargs="+", default=["mappo", "maddpg"], choices=["mappo", "maddpg"])
    parser.add_argument("--tasks", nargs="+", default=["navigation", "balance"], choices=sorted(AGENTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--mappo-frames", type=int, default=120_000, help="env steps per MAPPO run, both sides")
    parser.add_argument("--maddpg-frames", type=int, default=30_000, help="env steps per MADDPG run, both sides")
    parser.add_argument("--eval-every", type=int, default=6000, help="env steps between evaluations, both sides")
    parser.add_argument("--eval-episodes", type=int, default=10, help="episodes per evaluation, both sides")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each side")
    parser.add_argument(
        "--sides", nargs="+", default=["rlexp", "benchmarl"], choices=["rlexp", "benchmarl"], help="the sides run"
    )
    parser.add_argument(
        "--critic-layer-norm", action="store_true", help="both sides' critics: LayerNorm before each hidden activation"
    )
    parser.add_argument(
        "--rlexp-overrides", nargs="*", default=[], metavar="KEY=VALUE",
        help="Hydra overrides appended to rlexp's side alone, after the matched settings (default: none)",
    )  # fmt: skip
    parser.add_argument("--out", default="marl_check.json")
    args = parser.parse_args()
    if not Path(args.benchmarl_python).exists():
        print(f"--benchmarl-python: {args.benchmarl_python} does not exist; make the venv as --help says")
        raise SystemExit(2)
    for key in ("mappo_frames", "maddpg_frames", "eval_every"):
        value = getattr(args, key)
        if value <= 0 or value % BATCH:
            flag = "--" + key.replace("_", "-")
            print(f"{flag}: {value} is not a positive multiple of {BATCH} (BenchMARL's frames per batch)")
            raise SystemExit(2)

    cells = [(task, algo) for task in args.tasks for algo in args.algos]
    try:  # the overrides on each cell's own choices, before any run (none given: nothing to check)
        for task, algo in cells if args.rlexp_overrides else []:
            check_command_line([f"algo={algo}", f"env=vmas_{task}", *args.rlexp_overrides], CONF_DIR)
    except ConfigError as err:
        print(f"--rlexp-overrides: {err}")
        raise SystemExit(2) from None

    def frames(algo: str) -> int:
        return getattr(args, f"{algo}_frames")

    record = {"settings": vars(args), "versions": versions(args.benchmarl_python), "overrides": {}, "runs": []}
    for task, algo in cells:
        bm = benchmarl_settings(args.benchmarl_python, task, algo)
        overrides = rlexp_overrides(task, algo, bm, frames(algo))
        overrides += ["critic.normalization=layer"] * args.critic_layer_norm + args.rlexp_overrides
        record["overrides"][f"{task}/{algo}"] = {"benchmarl": bm, "rlexp": overrides}
    for seed in args.seeds:  # seed by seed: a cut-short invocation has every cell's first seeds
        for task, algo in cells:
            for side in ("rlexp", "benchmarl") if seed % 2 == 0 else ("benchmarl", "rlexp"):  # the first alternates
                if side not in args.sides:
                    continue
                if side == "rlexp":
                    overrides = record["overrides"][f"{task}/{algo}"]["rlexp"]
                    result = run_rlexp(task, algo, seed, frames(algo), args, overrides)
                else:
                    result = run_benchmarl(task, algo, seed, frames(algo), args)
                record["runs"].append({"task": task, "algo": algo, "seed": seed, "side": side, **result})
                print(json.dumps({k: v for k, v in record["runs"][-1].items() if k != "curve"}), flush=True)
                record["summary"] = summarize(record["runs"])
                Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    for row in record["summary"]:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
