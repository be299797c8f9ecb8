"""Benchmarks, measured side by side in one invocation (alternating A/B, medians of repeats).

    python scripts/bench.py                       # every section, the full settings (long)
    python scripts/bench.py --quick               # about a minute: see below
    python scripts/bench.py --only dqn_vs_sb3 ppo_vs_sb3 --repeats 3
    python scripts/bench.py --steps 1500 --ppo-steps 1024 --repeats 1 --populations 1 16  # a smoke run

Sections (--only picks a subset); every measurement is a fresh process, 1 torch thread, CartPole-v1,
evaluation off (eval.episodes=0: the SB3 baselines do not evaluate; every section measures training):

  dqn_vs_sb3   rlexp DQN (population of 1) vs Stable-Baselines3 DQN with the same hyperparameters:
               CleanRL's dqn.py settings (+experiment=cleanrl_dqn) plus SB3's fixed choices, Huber loss
               (delta 1) and the gradient's global norm clipped to 10. The figure is the WHOLE-process
               wall time (launch to exit, start-up included) of both; rlexp's loop-only wall time too.
  population   rlexp DQN (the settings above) at num_seeds = P for each of --populations: the loop's
               wall time, env steps/s per seed and for the population, and the process's peak RSS.
               --threads sets their torch threads (default -1: rlexp chooses by population size, one
               thread per 8 members at most the cores; 1 for one thread).
  diagnostics  rlexp DQN, the default config: instruments at their default rate vs diagnostics.every=0
               (explosion checks off in both, so both do the same work); loop wall time.
  startup      rlexp DQN, the default config, W&B offline (its default mode): from just before the
               process is launched to its first env step (2000 steps, learning_starts 1000).
  packing      a 24-cell slice of the stability grid (activation relu, tanh x its 12 init x clipping x
               optimizer cells, 8 seeds each; --pack-steps env steps per member) through
               hydra/launcher=rlexp_joblib (24 populations of 8) and hydra/launcher=rlexp_packed (2 packs
               of 96), both with n_jobs=2, whole-process wall time; then per-member throughput vs pack
               size: one shape's 12 cells x s seeds as one pack (P = 12 s for each of --pack-populations
               divisible by 12; P = 1 is one cell, one seed), env steps/s per member from the loop's time.
  ppo_vs_sb3   rlexp PPO (+experiment=cleanrl_ppo algo.anneal_lr=false) vs SB3 PPO with the same
               settings (4 DummyVecEnv envs x 128 steps, 4 epochs of 128-sample minibatches, clipped
               value loss, Adam eps 1e-5); whole-process wall time of both.
  minatar_vs_sb3  rlexp DQN on MinAtar Breakout (+experiment=minatar_dqn: network=cnn, centered
               RMSProp, one update of 32 per step, target every 1000 steps) vs SB3 DQN on the same
               environment (MinAtar/Breakout-v0 as [C, 10, 10] uint8) with MinAtar's network as its
               features extractor (conv 16 3x3 -> 128 -> actions) and the same settings (SB3's gradient
               clipping set out of reach: max_grad_norm 1e10); whole-process wall time of both.

  minatar_population  rlexp DQN on MinAtar Breakout (the settings above) at num_seeds = 1 and 8, one torch
               thread each: the loop's wall time; the figure is env steps/s per seed at P = 8 over P = 1's.
  minatar_floor  the MinAtar DQN update (a batch of 32 through dqn_loss and the gradient pipeline, one
               member, one thread, a new random batch each update) timed in a fresh process against
               its arithmetic floor: the update's FLOPs (online and target forward, weight and input
               gradients) at the rate torch.bmm reaches there on the network's largest layer, both
               measured in the same process.

Optional sections, only with --only (they need the mujoco extra; the first two take minutes a round):

  sac_mujoco_vs_sb3  rlexp SAC (population of 1) vs SB3 SAC on Hopper-v5 with rl-baselines3-zoo's
               settings (SB3's defaults: Adam 3e-4, batch 256, 256-256 ReLU, tau 0.005, alpha tuned;
               learning_starts 10000, scaled as DQN's below), --mujoco-steps env steps (default 5k);
               whole-process wall time of both.
  td3_mujoco_population  rlexp TD3 on Hopper-v5 (256-256, learning_starts as above) at num_seeds = 1
               and 5, one torch thread each: env steps/s per seed at P = 5 over P = 1's.
  sac_floor    rlexp's SAC update as the training loop runs it, with sac_mujoco_vs_sb3's settings (Hopper-v5,
               256-256 ReLU, batch 256, Adam, alpha tuned; one member, one thread), against its arithmetic
               floor. The update's time: the loop wall time (summary.json wall_s) of a 1200-step run with
               updates (240 random steps, then one update a step) minus that of the same run without
               (algo.learning_starts=1199: one update, at the last step), over the difference of their
               update counts (train/updates in metrics.jsonl). So it holds the gradient step (alpha's,
               the critics' and the actor's pipeline steps, the targets' EMA) and the work the loop adds
               per update: the replay sample, the noise draws, the records (and every diagnostics.every
               updates the instruments), acting through the policy instead of at random: what the SB3
               comparison pays per update. The floor, in a fresh process (bench.py --floor 1 --floor-update
               sac): the update's matmul FLOPs (sac_update_flops, from sac.build's layer shapes) at the
               rate torch.bmm reaches there on the largest layer ([256 x 256] . [256 x 256]).

Defaults: DQN 50k steps, PPO 100k steps, MinAtar 20k steps, populations 1 4 16 64, 5 repeats. --quick:
DQN 10k steps, PPO 10k steps, MinAtar 5k steps, populations 1 16, 1 repeat (MinAtar's learning_starts:
steps // 5, at most 5000). When DQN's steps are under 5x learning_starts (10000 for
the CleanRL settings, 1000 for the default config) learning_starts becomes steps // 5, for rlexp and
SB3 alike, so that both still learn and do the same work.

Ratios (targets): dqn_speedup_vs_sb3 = sb3 / rlexp (>= 1.8); per_seed_throughput_p16_vs_p1 = the
population's env steps/s at P=16 over P=1's, i.e. 16 x wall(P=1) / wall(P=16) (>= 4);
diagnostics_overhead = default / off - 1 (<= 0.10); startup_to_first_step_s (<= 2.5 s);
ppo_speedup_vs_sb3 = sb3 / rlexp (>= 1.5); packed_grid_speedup = unpacked / packed (>= 2.5: the grid's
75 minutes to 30); sac_mujoco_speedup_vs_sb3 = sb3 / rlexp (>= 1.8); minatar_dqn_speedup_vs_sb3 = sb3 / rlexp
(>= 1.5); minatar_per_seed_p8_vs_p1 = 8 x wall(P=1) / wall(P=8) (>= 3); td3_mujoco_per_seed_p5_vs_p1 =
5 x wall(P=1) / wall(P=5) (>= 1); minatar_update_over_floor = the update's time / its floor (<= 3);
sac_update_over_floor = SAC's update time / its floor (no target: informational).

Besides each case, medians_s holds dqn_rlexp_loop and ppo_rlexp_loop (rlexp's loop-only wall time,
from summary.json), startup_process (the start-up runs, launch to exit), minatar_floor (the floor
beside the update's time) and sac_update (the SAC update's time from each round's sac_loop and
sac_loop_idle). Peak RSS: the largest over the repeats, per population.

Prints a table and writes bench.json (date, machine and load, versions, settings, commands, medians,
every sample, peak RSS, throughput, the floor measurements, sac_floor's update counts, ratios, targets) to
the repo root unless --out says otherwise.
The SB3 sections need stable-baselines3: pip install -e ".[bench]".
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = (
    "dqn_vs_sb3",
    "population",
    "diagnostics",
    "startup",
    "ppo_vs_sb3",
    "packing",
    "minatar_vs_sb3",
    "minatar_population",
    "minatar_floor",
)
OPTIONAL_SECTIONS = ("sac_mujoco_vs_sb3", "td3_mujoco_population", "sac_floor")  # only when --only names them (mujoco)
SB3_SECTIONS = ("dqn_vs_sb3", "ppo_vs_sb3", "sac_mujoco_vs_sb3", "minatar_vs_sb3")
MUJOCO_FIX = 'pip install -e ".[mujoco]"'
MINATAR_LEARNING_STARTS = 5_000  # conf/experiment/minatar_dqn.yaml
SB3_FIX = 'pip install -e ".[bench]"'
CLEANRL_LEARNING_STARTS = 10_000  # conf/experiment/cleanrl_dqn.yaml
DEFAULT_LEARNING_STARTS = 1_000  # conf/algo/dqn.yaml
ZOO_MUJOCO_LEARNING_STARTS = 10_000  # rl-baselines3-zoo's sac.yml, its MuJoCo entries
# name -> (comparison, target); PASS when the figure compares true against the target (a figure not
# here, sac_update_over_floor, is informational: no verdict)
TARGETS = {
    "dqn_speedup_vs_sb3": (">=", 1.8),
    "per_seed_throughput_p16_vs_p1": (">=", 4.0),
    "diagnostics_overhead": ("<=", 0.10),
    "startup_to_first_step_s": ("<=", 2.5),
    "ppo_speedup_vs_sb3": (">=", 1.5),
    "packed_grid_speedup": (">=", 2.5),
    "sac_mujoco_speedup_vs_sb3": (">=", 1.8),
    "minatar_dqn_speedup_vs_sb3": (">=", 1.5),
    "minatar_per_seed_p8_vs_p1": (">=", 3.0),
    "td3_mujoco_per_seed_p5_vs_p1": (">=", 1.0),
    "minatar_update_over_floor": ("<=", 3.0),
}
MINATAR_POPULATION = 8  # minatar_population: P = 1 against P = this
MUJOCO_POPULATION = 5  # td3_mujoco_population: P = 1 against P = this
FLOOR_UPDATES = 200  # minatar_floor: updates per timing (the median of 5 timings)
FLOOR_BATCHES = 64  # minatar_floor: random batches the updates go through in turn
SAC_LOOP_STEPS = 1_200  # sac_floor: env steps per run (learning_starts 240: 960 updates, or 1 without)
SAC_FLOOR_MATMULS = 200  # sac_floor: torch.bmm calls per timing of the floor's rate (the median of 5)
# the packing section's 24-cell slice of the stability grid: 2 network shapes x its 12 init x clipping x
# optimizer cells, each a population of 8 seeds (the grid's own settings, a shorter budget)
GRID_SLICE = ["activation=relu,tanh", "normalization=none"]
GRID_SHAPE = ["activation=relu", "normalization=none"]  # one shape: the pack sizes' 12 cells


# ------------------------------------------------------------------ the SB3 runners (child processes)
def sb3_dqn(steps: int, seed: int, learning_starts: int) -> None:
    """SB3 DQN with CleanRL's CartPole settings (what rlexp runs with +experiment=cleanrl_dqn)."""
    import torch

    torch.set_num_threads(1)
    import gymnasium as gym
    from stable_baselines3 import DQN

    model = DQN(
        "MlpPolicy",
        gym.make("CartPole-v1"),
        learning_rate=2.5e-4,
        buffer_size=10_000,
        learning_starts=learning_starts,
        batch_size=128,
        tau=1.0,
        gamma=0.99,
        train_freq=10,
        gradient_steps=1,
        target_update_interval=500,
        exploration_fraction=0.5,
        exploration_initial_eps=1.0,
        exploration_final_eps=0.05,
        max_grad_norm=10,
        policy_kwargs=dict(net_arch=[120, 84]),
        seed=seed,
        device="cpu",
    )
    model.learn(total_timesteps=steps)


def sb3_ppo(steps: int, seed: int) -> None:
    """SB3 PPO with CleanRL's CartPole settings, learning rate not annealed."""
    import torch

    torch.set_num_threads(1)
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env("CartPole-v1", n_envs=4, seed=seed)  # DummyVecEnv
    model = PPO(
        "MlpPolicy",
        env,
        learning_rate=2.5e-4,
        n_steps=128,
        batch_size=128,
        n_epochs=4,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        clip_range_vf=0.2,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        normalize_advantage=True,
        policy_kwargs=dict(
            net_arch=dict(pi=[64, 64], vf=[64, 64]),
            activation_fn=torch.nn.Tanh,
            ortho_init=True,
            optimizer_kwargs=dict(eps=1e-5),
        ),
        device="cpu",
        seed=seed,
    )
    model.learn(total_timesteps=steps)


def sb3_sac_hopper(steps: int, seed: int, learning_starts: int) -> None:
    """SB3 SAC on Hopper-v5 with rl-baselines3-zoo's entry: SB3's defaults but learning_starts."""
    import torch

    torch.set_num_threads(1)
    import gymnasium as gym
    from stable_baselines3 import SAC

    model = SAC("MlpPolicy", gym.make("Hopper-v5"), learning_starts=learning_starts, seed=seed, device="cpu")
    model.learn(total_timesteps=steps)


def sb3_minatar_dqn(steps: int, seed: int, learning_starts: int) -> None:
    """SB3 DQN with the MinAtar paper's settings and network (what +experiment=minatar_dqn runs) on
    MinAtar Breakout, observations [C, 10, 10] uint8 as rlexp's environment gives them."""
    import torch

    torch.set_num_threads(1)
    from stable_baselines3 import DQN
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    from torch import nn

    from rlexp.config.schema import EnvConfig
    from rlexp.envs.gym import make_env

    class MinAtarTorso(BaseFeaturesExtractor):
        """conv 16 3x3 stride 1, ReLU, flatten, 128 units, ReLU (Young & Tian 2019's QNetwork torso)."""

        def __init__(self, space, features_dim: int = 128) -> None:
            super().__init__(space, features_dim)
            channels, height, width = space.shape
            flat = 16 * (height - 2) * (width - 2)
            self.net = nn.Sequential(
                nn.Conv2d(channels, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(flat, 128), nn.ReLU()
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

    env = make_env(EnvConfig(id="MinAtar/Breakout-v0"))
    model = DQN(
        "MlpPolicy",
        env,
        learning_rate=2.5e-4,
        buffer_size=100_000,
        learning_starts=learning_starts,
        batch_size=32,
        tau=1.0,
        gamma=0.99,
        train_freq=1,
        gradient_steps=1,
        target_update_interval=1000,
        exploration_fraction=0.105,
        exploration_initial_eps=1.0,
        exploration_final_eps=0.1,
        max_grad_norm=1e10,
        policy_kwargs=dict(
            features_extractor_class=MinAtarTorso,
            net_arch=[],
            optimizer_class=torch.optim.RMSprop,
            optimizer_kwargs=dict(alpha=0.95, eps=0.01, centered=True, momentum=0.95),
        ),
        seed=seed,
        device="cpu",
    )
    model.learn(total_timesteps=steps)


# ------------------------------------------------------------------ measuring one process
@dataclass
class Sample:
    """One measured process: whole-process wall time, peak RSS and, for rlexp, its summary's times."""

    process_s: float
    rss_mb: float
    loop_s: float | None = None  # summary.json wall_s: the training loop (start-up excluded)
    startup_s: float | None = None  # launch to the first env step
    floor_s: float | None = None  # minatar_floor, sac_floor: the update's arithmetic at the measured matmul rate
    floor: dict[str, float] | None = None  # and the --floor sub-command's whole JSON (flops, matmul_gflops too)
    updates: int | None = None  # sac_floor's runs: the gradient steps taken (train/updates, the last record)


def run_process(command: list[str], env: dict[str, str], workdir: Path) -> tuple[float, float, float]:
    """Run ``command``; returns (unix launch time, wall seconds launch to exit, peak RSS in MB).
    A failing process ends the benchmark with the tail of its stderr."""
    with tempfile.TemporaryFile(dir=workdir) as err:
        launched = time.time()
        start = time.perf_counter()
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, rusage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-3000:]
            raise SystemExit(f"bench.py: exit code {proc.returncode} from {' '.join(command[1:])}\n{tail}")
    return launched, wall, rusage.ru_maxrss / 1024.0  # ru_maxrss is KiB on Linux


def rlexp_run(overrides: list[str], workdir: Path, mode: str = "disabled", updates: bool = False) -> Sample:
    """One rlexp training job in a fresh process, its run dir under ``workdir``; with ``updates``, the
    number of gradient steps it took (one member's last record's train/updates)."""
    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    command = rlexp_command(overrides, mode) + [f"hydra.run.dir={run_dir}"]
    launched, wall, rss = run_process(command, {**os.environ, "WANDB_SILENT": "true"}, workdir)
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary["status"] != "ok" or summary.get("first_step_at") is None:
        raise SystemExit(f"bench.py: {' '.join(overrides)} ended {summary['status']}: {summary.get('error')}")
    first_step = datetime.fromisoformat(summary["first_step_at"]).timestamp()
    sample = Sample(process_s=wall, rss_mb=rss, loop_s=summary["wall_s"], startup_s=first_step - launched)
    if updates:
        last = next(run_dir.glob("*/metrics.jsonl")).read_text().splitlines()[-1]
        sample.updates = json.loads(last)["train/updates"]
    return sample


def rlexp_command(overrides: list[str], mode: str) -> list[str]:
    """The command line of an rlexp job (without its run dir). Evaluation is off: the SB3 baselines do
    not evaluate, and every section measures training alone."""
    common = [f"logger.mode={mode}", "logger.progress=off", "eval.episodes=0"]
    return [sys.executable, "-m", "rlexp.train", *overrides, *common]


def sb3_command(algo: str, steps: int, seed: int, learning_starts: int = 0) -> list[str]:
    """The command line of an SB3 run: this script's internal --sb3 sub-command."""
    command = [sys.executable, str(Path(__file__).resolve()), "--sb3", algo, "--steps", str(steps), "--seed", str(seed)]
    return command + (["--learning-starts", str(learning_starts)] if algo != "ppo" else [])


def script_env() -> dict[str, str]:
    """The environment of this script's own sub-commands (--sb3, --floor): the repo root on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def sb3_run(algo: str, steps: int, seed: int, workdir: Path, learning_starts: int = 0) -> Sample:
    """One SB3 training run in a fresh process."""
    env = script_env()
    _, wall, rss = run_process(sb3_command(algo, steps, seed, learning_starts), env, workdir)
    return Sample(process_s=wall, rss_mb=rss)


def seconds(fn: Callable[[], object], n: int) -> float:
    """The median of 5 timings of n calls of ``fn``, per call (after n // 10 calls to warm up)."""
    for _ in range(max(1, n // 10)):
        fn()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - start) / n)
    return statistics.median(times)


def compose_config(overrides: list[str]) -> object:
    """rlexp's config for ``overrides`` (W&B and evaluation off), as ``rlexp.train`` composes it."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rlexp.compose.registry import register

    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="config", overrides=overrides))


def layer_macs(net: object) -> list[int]:
    """Each linear (or convolution) layer's multiply-adds per member and sample, in forward order."""
    macs = []
    for layer in net.layers:
        out, fan_in = layer.weight.shape[1:]
        g = getattr(layer, "geometry", None)
        macs.append(out * fan_in * (g.out_height * g.out_width if g is not None else 1))
    return macs


def dqn_update_flops(macs: list[int], members: int, batch_size: int) -> int:
    """A DQN update's FLOPs (2 per multiply-add) from its network's per-layer multiply-adds: the online
    and the target forward, the weight gradients, and the input gradients of every layer but the first
    (the observation needs none)."""
    return 2 * members * batch_size * (4 * sum(macs) - macs[0])


def sac_update_flops(actor: list[int], critic: list[int], members: int, batch_size: int) -> int:
    """One SAC gradient step's FLOPs (2 per multiply-add) from the actor's and one critic's per-layer
    multiply-adds (a gradient step of ``sac.train``; matmuls only, the elementwise passes and the
    optimizers left out). Per member and sample, the actor: its forward on s (with autograd), its forward
    on s' for the target, its weight gradients and its input gradients but the first layer's (from the
    actor loss; s needs none): 4 A - a_0. Each of the twin critics: the target critic's forward on
    (s', a'), its forward on (s, a) and, from the critic loss, its weight gradients and input gradients but
    the first layer's ((s, a) needs none); then its forward on (s, a_pi) and, from the actor loss, the input
    gradients of every layer, the first included (to reach a_pi; its weights frozen, no weight gradients):
    6 C - c_0 per critic. The alpha loss has no matmul."""
    a, c = sum(actor), sum(critic)
    return 2 * members * batch_size * (4 * a - actor[0] + 2 * (6 * c - critic[0]))


def matmul_rate(members: int, batch_size: int, fan_in: int, out: int, calls: int) -> float:
    """The FLOP/s ``torch.bmm`` reaches here on [P, B, fan_in] . [P, fan_in, out] (median of 5 timings)."""
    import torch

    a, b = torch.rand(members, batch_size, fan_in), torch.rand(members, fan_in, out)
    return 2 * members * batch_size * fan_in * out / seconds(lambda: torch.bmm(a, b), calls)


def largest_layer(nets: list[object]) -> tuple[int, int]:
    """(fan_in, out) of the nets' largest linear layer (by weights per member)."""
    largest = max((layer for net in nets for layer in net.layers), key=lambda layer: layer.weight[0].numel())
    out, fan_in = largest.weight.shape[1:]
    return fan_in, out


def minatar_update_floor(members: int, updates: int) -> dict[str, float]:
    """The MinAtar DQN update (``+experiment=minatar_dqn``: a batch of 32 through ``dqn_loss`` and the
    gradient pipeline, as the training loop runs it, one torch thread) timed in this process, beside its
    arithmetic floor: the update's multiply-adds (``dqn_update_flops``) at the rate this machine's
    ``torch.bmm`` reaches on the network's largest layer. Seconds per update; FLOPs; GFLOP/s."""
    import copy

    import torch

    from rlexp.algos.dqn import dqn_loss
    from rlexp.data.buffers import Batch
    from rlexp.run.context import RunContext
    from rlexp.train import set_process_state

    cfg = compose_config(["+experiment=minatar_dqn", f"num_seeds={members}", "logger.mode=disabled", "eval.episodes=0"])
    set_process_state(cfg)  # as the job runs: one thread, the preset's subnormal flush
    ctx = RunContext.create(cfg, torch.device("cpu"))
    n_actions, obs_dim, batch_size = int(ctx.env.action_space.n), ctx.env.obs_dim, cfg.algo.batch_size
    q_net = ctx.make_net(obs_dim, n_actions)
    target_net = copy.deepcopy(q_net).requires_grad_(False)
    pipeline = ctx.make_pipeline(q_net)
    written = q_net.written_backward and not pipeline.has_penalty
    generator = torch.Generator().manual_seed(0)

    def frames() -> torch.Tensor:
        return (torch.rand(members, batch_size, obs_dim, generator=generator) < 0.1).float()  # [P, B, obs]

    # a new batch each update, as replay gives: one batch over and over is fitted within ~1000 updates, and
    # then centered RMSProp's variance rounds below 0 where torch's square root is ~70x slower
    batches = [
        Batch(
            obs=frames(),
            actions=torch.randint(n_actions, (members, batch_size), generator=generator),
            rewards=(torch.rand(members, batch_size, generator=generator) < 0.05).float(),
            next_obs=frames(),
            terminated=torch.zeros(members, batch_size),
        )
        for _ in range(FLOOR_BATCHES)
    ]
    r_scale = torch.ones(members)
    drawn = itertools.cycle(batches)

    def update() -> None:
        loss, _ = dqn_loss(q_net, target_net, next(drawn), cfg.algo, r_scale, written, cfg.algo.gamma)
        pipeline.step(loss, 0, written_backward=written)

    update_s = seconds(update, updates)
    flops = dqn_update_flops(layer_macs(q_net), members, batch_size)
    rate = matmul_rate(members, batch_size, *largest_layer([q_net]), updates)  # FLOP/s
    ctx.env.close()
    ctx.evaluator.close()
    return {"update_s": update_s, "floor_s": flops / rate, "flops": flops, "matmul_gflops": rate / 1e9}


def sac_floor(members: int, calls: int) -> dict[str, float]:
    """The arithmetic floor of rlexp's SAC update on Hopper-v5 (``sac_mujoco_overrides``: 256-256 ReLU,
    batch 256): its multiply-adds (``sac_update_flops``, from the layers of ``sac.build``'s networks) at
    the rate this machine's ``torch.bmm`` reaches on their largest layer ([B, 256] . [256, 256]; median of 5
    timings of ``calls`` calls, one torch thread). Seconds per update; FLOPs; GFLOP/s."""
    import torch

    from rlexp.algos import sac
    from rlexp.run.context import RunContext

    torch.set_num_threads(1)
    # the steps set total_steps and learning_starts alone, which the networks do not read
    overrides = [*sac_mujoco_overrides(5_000), f"num_seeds={members}", "logger.mode=disabled", "eval.episodes=0"]
    cfg = compose_config(overrides)
    ctx = RunContext.create(cfg, torch.device("cpu"))
    nets = sac.build(ctx).nets
    actor, critics = nets["actor"], list(nets["critics"])
    flops = sac_update_flops(layer_macs(actor), layer_macs(critics[0]), members, cfg.algo.batch_size)
    rate = matmul_rate(members, cfg.algo.batch_size, *largest_layer([actor, *critics]), calls)
    ctx.env.close()
    ctx.evaluator.close()
    return {"floor_s": flops / rate, "flops": flops, "matmul_gflops": rate / 1e9}


FLOORS = {"minatar": minatar_update_floor, "sac": sac_floor}  # --floor-update: which update's floor --floor measures


def floor_command(members: int, updates: int, update: str = "minatar") -> list[str]:
    """The command line of a floor measurement: this script's internal --floor sub-command (``update``:
    which update, a key of ``FLOORS``; MinAtar's, the default, needs no flag)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--floor", str(members), "--steps", str(updates)]
    return command + (["--floor-update", update] if update != "minatar" else [])


def floor_run(members: int, updates: int, workdir: Path, update: str = "minatar") -> Sample:
    """One floor measurement in a fresh process (``FLOORS[update]``; its JSON on stdout). process_s: the
    update's time where the process times it (MinAtar's), else the floor's."""
    env = script_env()
    command = floor_command(members, updates, update)
    proc = subprocess.run(command, env=env, cwd=workdir, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench.py: the floor measurement failed\n{proc.stderr[-2000:]}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    update_s = found.get("update_s", found["floor_s"])
    return Sample(process_s=update_s, rss_mb=0.0, floor_s=found["floor_s"], floor=found)


def grid_command(overrides: list[str], sweep_dir: Path) -> list[str]:
    """The command line of a stability-grid multirun (W&B off, evaluation off, no progress display)."""
    common = ["logger.mode=disabled", "logger.progress=off", "eval.episodes=0", f"hydra.sweep.dir={sweep_dir}"]
    return [sys.executable, "-m", "rlexp.train", "+experiment=stability_grid", *overrides, *common]


def grid_run(overrides: list[str], workdir: Path) -> Sample:
    """One stability-grid multirun in a fresh process; loop_s: the longest job's loop (summary wall_s)."""
    sweep = Path(tempfile.mkdtemp(dir=workdir))
    _, wall, rss = run_process(grid_command(overrides, sweep), {**os.environ, "WANDB_SILENT": "true"}, workdir)
    loops = [json.loads(p.read_text())["wall_s"] for p in sweep.glob("*/summary.json")]
    return Sample(process_s=wall, rss_mb=rss, loop_s=max(loops))


def grid_budget(steps: int) -> list[str]:
    """The grid's settings at ``steps`` env steps per member (learning_starts 1000, or steps // 5)."""
    starts = scaled_learning_starts(steps, DEFAULT_LEARNING_STARTS)
    return [f"total_steps={steps}", f"algo.learning_starts={starts}", f"algo.buffer_size={steps}"]


# ------------------------------------------------------------------ the cases
def scaled_learning_starts(steps: int, default: int) -> int:
    """``default`` when ``steps`` is at least 5x it, else steps // 5 (rlexp needs it < total_steps)."""
    return default if steps >= 5 * default else steps // 5


def dqn_overrides(steps: int) -> list[str]:
    """rlexp's DQN with CleanRL's settings and SB3's fixed choices (Huber loss, global norm 10)."""
    return [
        "+experiment=cleanrl_dqn",
        f"total_steps={steps}",
        f"algo.learning_starts={scaled_learning_starts(steps, CLEANRL_LEARNING_STARTS)}",
        "algo.loss=huber",
        "clipping=global_norm",
        "clipping.max_norm=10",
    ]


# a case: its name, the figure recorded from each sample, and the run (repeat index -> Sample)
Case = tuple[str, Callable[[Sample], float], Callable[[int], Sample]]


def sac_mujoco_overrides(steps: int) -> list[str]:
    """rlexp's SAC with the settings of ``sb3_sac_hopper``."""
    return [
        "algo=sac",
        "env=hopper",
        "activation=relu",
        "init=default",
        "actor.last_layer_gain=null",  # the scheme's output layer, as SB3's
        "normalization=none",
        "clipping=none",
        "optimizer=adam",
        "optimizer.lr=3e-4",
        "network.hidden=[256,256]",
        f"total_steps={steps}",
        f"algo.learning_starts={scaled_learning_starts(steps, ZOO_MUJOCO_LEARNING_STARTS)}",
    ]


def build_cases(
    sections: list[str],
    steps: int,
    ppo_steps: int,
    minatar_steps: int,
    populations: list[int],
    threads: int,
    workdir: Path,
    pack_steps: int = 5000,
    pack_populations: tuple[int, ...] = (),
    mujoco_steps: int = 5_000,
) -> tuple[list[Case], dict[str, list[str]]]:
    """The cases of the chosen sections, in the order they alternate, and each case's command."""
    whole: Callable[[Sample], float] = lambda s: s.process_s  # noqa: E731
    loop: Callable[[Sample], float] = lambda s: s.loop_s  # noqa: E731
    dqn = dqn_overrides(steps)
    dqn_starts = scaled_learning_starts(steps, CLEANRL_LEARNING_STARTS)
    diag = [
        "divergence=off",
        f"total_steps={steps}",
        f"algo.learning_starts={scaled_learning_starts(steps, DEFAULT_LEARNING_STARTS)}",
    ]
    startup = ["total_steps=2000", "algo.learning_starts=1000"]
    ppo = ["+experiment=cleanrl_ppo", f"total_steps={ppo_steps}", "algo.anneal_lr=false"]
    minatar_starts = min(MINATAR_LEARNING_STARTS, minatar_steps // 5)
    minatar = ["+experiment=minatar_dqn", f"total_steps={minatar_steps}", f"algo.learning_starts={minatar_starts}"]
    cases: list[Case] = []
    commands: dict[str, list[str]] = {}

    def add(name: str, figure: Callable[[Sample], float], run: Callable[[int], Sample], command: list[str]) -> None:
        cases.append((name, figure, run))
        commands[name] = [Path(command[0]).name, *command[1:]]

    def rlexp_case(overrides: list[str], mode: str = "disabled") -> Callable[[int], Sample]:
        """An rlexp run of ``overrides`` for a round's seed, its values bound now (not when it runs)."""
        return lambda r: rlexp_run(overrides + [f"seed={r}"], workdir, mode=mode)

    def grid_case(overrides: list[str]) -> Callable[[int], Sample]:
        return lambda r: grid_run(overrides + [f"seed={r}"], workdir)

    def sb3_case(algo: str, steps: int, learning_starts: int = 0) -> Callable[[int], Sample]:
        """An SB3 run for a round's seed, its values bound now: a later section rebinding a name the
        section used (``starts``) cannot change what an earlier section's case runs."""
        return lambda r: sb3_run(algo, steps, r, workdir, learning_starts)

    def one_and_many(name: str, overrides: list[str], members: int) -> None:
        """``overrides`` at P = 1 and P = ``members``, one torch thread each (cases <name>_p1, <name>_p<members>)."""
        for p in (1, members):
            over = [*overrides, f"num_seeds={p}", "threads=1"]
            add(f"{name}_p{p}", loop, rlexp_case(over), rlexp_command(over, "disabled"))

    if "dqn_vs_sb3" in sections:
        add("dqn_rlexp", whole, rlexp_case(dqn), rlexp_command(dqn, "disabled"))
        add(
            "dqn_sb3",
            whole,
            sb3_case("dqn", steps, dqn_starts),
            sb3_command("dqn", steps, 0, dqn_starts),
        )
    if "population" in sections:
        for p in populations:
            over = dqn + [f"num_seeds={p}", f"threads={threads}"]
            add(
                f"population_p{p}",
                loop,
                rlexp_case(over),
                rlexp_command(over, "disabled"),
            )
    if "diagnostics" in sections:
        add(
            "diagnostics_default",
            loop,
            rlexp_case(diag),
            rlexp_command(diag, "disabled"),
        )
        off = diag + ["diagnostics.every=0"]
        add("diagnostics_off", loop, rlexp_case(off), rlexp_command(off, "disabled"))
    if "startup" in sections:
        add(
            "startup_to_first_step",
            lambda s: s.startup_s,
            rlexp_case(startup, mode="offline"),
            rlexp_command(startup, "offline"),
        )
    if "ppo_vs_sb3" in sections:
        add("ppo_rlexp", whole, rlexp_case(ppo), rlexp_command(ppo, "disabled"))
        add("ppo_sb3", whole, sb3_case("ppo", ppo_steps), sb3_command("ppo", ppo_steps, 0))
    if "packing" in sections:
        budget = grid_budget(pack_steps)
        for launcher in ("unpacked", "packed"):
            name = "rlexp_joblib" if launcher == "unpacked" else "rlexp_packed"
            over = [*GRID_SLICE, *budget, f"hydra/launcher={name}", "hydra.launcher.n_jobs=2"]
            add(
                f"grid24_{launcher}",
                whole,
                grid_case(over),
                grid_command(over, Path("<sweep dir>")),
            )
        for p in pack_populations:
            one = ["init=xavier", "clipping=none", "optimizer=adam"] if p == 1 else []  # P = 1: one cell
            over = [*GRID_SHAPE, *one, *budget, f"num_seeds={max(1, p // 12)}", "hydra/launcher=rlexp_packed"]
            over += ["hydra.launcher.n_jobs=1", f"hydra.launcher.max_members={p}"]
            add(
                f"pack_p{p}",
                loop,
                grid_case(over),
                grid_command(over, Path("<sweep dir>")),
            )
    if "sac_mujoco_vs_sb3" in sections:
        sac = sac_mujoco_overrides(mujoco_steps)
        starts = scaled_learning_starts(mujoco_steps, ZOO_MUJOCO_LEARNING_STARTS)
        add("sac_mujoco_rlexp", whole, rlexp_case(sac), rlexp_command(sac, "disabled"))
        add(
            "sac_mujoco_sb3",
            whole,
            sb3_case("sac_hopper", mujoco_steps, starts),
            sb3_command("sac_hopper", mujoco_steps, 0, starts),
        )
    if "minatar_vs_sb3" in sections:
        add(
            "minatar_rlexp",
            whole,
            rlexp_case(minatar),
            rlexp_command(minatar, "disabled"),
        )
        add(
            "minatar_sb3",
            whole,
            sb3_case("minatar_dqn", minatar_steps, minatar_starts),
            sb3_command("minatar_dqn", minatar_steps, 0, minatar_starts),
        )
    if "minatar_population" in sections:
        one_and_many("minatar", minatar, MINATAR_POPULATION)
    if "td3_mujoco_population" in sections:
        starts = scaled_learning_starts(mujoco_steps, ZOO_MUJOCO_LEARNING_STARTS)
        td3 = ["algo=td3", "env=hopper", "network.hidden=[256,256]", f"total_steps={mujoco_steps}"]
        one_and_many("td3_mujoco", [*td3, f"algo.learning_starts={starts}"], MUJOCO_POPULATION)
    if "minatar_floor" in sections:
        add(
            "minatar_update",
            whole,
            lambda r: floor_run(1, FLOOR_UPDATES, workdir),
            floor_command(1, FLOOR_UPDATES),
        )
    if "sac_floor" in sections:  # sac_update: (sac_loop - sac_loop_idle) / their updates' difference, per round
        sac = [*sac_mujoco_overrides(SAC_LOOP_STEPS), "threads=1"]
        idle = [o for o in sac if not o.startswith("algo.learning_starts=")]
        idle.append(f"algo.learning_starts={SAC_LOOP_STEPS - 1}")  # rlexp needs it < total_steps: one update
        for name, over in (("sac_loop", sac), ("sac_loop_idle", idle)):
            add(
                name,
                loop,
                lambda r, over=over: rlexp_run(over + [f"seed={r}"], workdir, updates=True),
                rlexp_command(over, "disabled"),
            )
        add(
            "sac_floor",
            lambda s: s.floor_s,
            lambda r: floor_run(1, SAC_FLOOR_MATMULS, workdir, "sac"),
            floor_command(1, SAC_FLOOR_MATMULS, "sac"),
        )
    return cases, commands


# ------------------------------------------------------------------ figures and report
def sac_update_s(loop: Sample, idle: Sample) -> float:
    """Seconds per SAC update in the loop: the loop time the updates add, over how many more there were."""
    return (loop.loop_s - idle.loop_s) / (loop.updates - idle.updates)


def ratios_of(medians: dict[str, float]) -> dict[str, float | None]:
    """The five figures with targets, from the medians (None when their cases were not measured)."""

    def div(a: str, b: str) -> float | None:
        return medians[a] / medians[b] if a in medians and b in medians else None

    def per_seed(case: str, members: int) -> float | None:
        """A population's env steps/s per seed over one seed's: members x wall(P = 1) / wall(P = members)."""
        ratio = div(f"{case}_p1", f"{case}_p{members}")
        return None if ratio is None else members * ratio

    throughput = div("population_p1", "population_p16")  # wall(1) / wall(16): same steps per seed
    overhead = div("diagnostics_default", "diagnostics_off")
    return {
        "dqn_speedup_vs_sb3": div("dqn_sb3", "dqn_rlexp"),
        "per_seed_throughput_p16_vs_p1": None if throughput is None else 16 * throughput,
        "diagnostics_overhead": None if overhead is None else overhead - 1.0,
        "startup_to_first_step_s": medians.get("startup_to_first_step"),
        "ppo_speedup_vs_sb3": div("ppo_sb3", "ppo_rlexp"),
        "packed_grid_speedup": div("grid24_unpacked", "grid24_packed"),
        "sac_mujoco_speedup_vs_sb3": div("sac_mujoco_sb3", "sac_mujoco_rlexp"),
        "minatar_dqn_speedup_vs_sb3": div("minatar_sb3", "minatar_rlexp"),
        "minatar_per_seed_p8_vs_p1": per_seed("minatar", MINATAR_POPULATION),
        "td3_mujoco_per_seed_p5_vs_p1": per_seed("td3_mujoco", MUJOCO_POPULATION),
        "minatar_update_over_floor": div("minatar_update", "minatar_floor"),
        "sac_update_over_floor": div("sac_update", "sac_floor"),
    }


def verdict(name: str, value: float | None) -> bool | None:
    """True when ``value`` meets its target, None when it was not measured or has no target."""
    if value is None or name not in TARGETS:
        return None
    op, target = TARGETS[name]
    return value >= target if op == ">=" else value <= target


def versions() -> dict[str, str | None]:
    """Python's and the relevant packages' versions (None for a package not installed)."""

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    found = {"python": platform.python_version()}
    for key, dist in (
        ("torch", "torch"),
        ("hydra", "hydra-core"),
        ("gymnasium", "gymnasium"),
        ("wandb", "wandb"),
        ("stable_baselines3", "stable-baselines3"),
        ("mujoco", "mujoco"),
    ):
        found[key] = version(dist)
    return found


def load() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where unavailable)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def paired_ratios(samples: dict[str, list[float]], repeats: int) -> dict[str, float | None]:
    """The figures computed within each round (cases run minutes apart, not across the whole run),
    then their median over the rounds: less sensitive to a machine whose speed drifts."""
    rounds = [ratios_of({name: values[r] for name, values in samples.items()}) for r in range(repeats)]
    return {
        name: None if rounds[0][name] is None else statistics.median(rnd[name] for rnd in rounds) for name in rounds[0]
    }


def print_table(
    medians: dict[str, float],
    samples: dict[str, list[float]],
    ratios: dict[str, float | None],
    paired: dict[str, float | None],
    rss: dict[str, float],
    out: Path,
) -> None:
    """The medians with their samples, the peak RSS per population and the ratios against their targets."""
    print(f"\n{'case':24s} {'median s':>9s}  samples s")
    for name, value in medians.items():
        extra = f"  (peak RSS {rss[name[len('population_p') :]]:.0f} MB)" if name.startswith("population_p") else ""
        print(f"{name:24s} {value:9.4g}  {' '.join(f'{v:.4g}' for v in samples[name])}{extra}")
    print(f"\n{'figure':32s} {'value':>8s}  {'target':>8s}  verdict  {'per round':>9s}")
    for name, value in ratios.items():
        op, target = TARGETS.get(name, ("", "-"))
        ok = verdict(name, value)
        shown = "n/a" if value is None else f"{value:.3f}"
        in_rounds = "n/a" if paired[name] is None else f"{paired[name]:.3f}"
        print(
            f"{name:32s} {shown:>8s}  {op + ' ' + str(target):>8s}  "
            f"{'-' if ok is None else ('PASS' if ok else 'MISS'):7s}  {in_rounds:>9s}"
        )
    print(f"-> {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="DQN 10k steps, PPO 10k steps, populations 1 16, 1 repeat (about a minute)"
    )
    parser.add_argument("--steps", type=int, help="DQN env steps per run (default 50k; 10k with --quick)")
    parser.add_argument("--ppo-steps", type=int, help="PPO env steps per run (default 100k; 10k with --quick)")
    parser.add_argument("--mujoco-steps", type=int, default=5_000, help="sac_mujoco_vs_sb3's env steps (default 5k)")
    parser.add_argument(
        "--minatar-steps", type=int, help="MinAtar DQN env steps per run (default 20k; 5k with --quick)"
    )
    parser.add_argument("--repeats", type=int, help="rounds of every case (default 5; 1 with --quick)")
    parser.add_argument(
        "--populations",
        type=int,
        nargs="+",
        help="num_seeds values (default 1 4 16 64; 1 16 with --quick); the P16/P1 ratio needs 1 and 16",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SECTIONS + OPTIONAL_SECTIONS,
        metavar="SECTION",
        help=f"measure only these sections: {' '.join(SECTIONS + OPTIONAL_SECTIONS)}",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=-1,
        help="the population section's torch threads (rlexp's threads=; default -1: by population size)",
    )
    parser.add_argument("--pack-steps", type=int, help="packing: env steps per member (default 5000; 2000 --quick)")
    parser.add_argument(
        "--pack-populations",
        type=int,
        nargs="+",
        default=[1, 12, 24, 96, 192],
        help="packing: pack sizes P (1, or multiples of 12: one shape's 12 cells x P/12 seeds)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench.json")
    sb3_runs = ("dqn", "ppo", "sac_hopper", "minatar_dqn")
    parser.add_argument("--sb3", choices=sb3_runs, help=argparse.SUPPRESS)  # internal: one SB3 run
    parser.add_argument("--floor", type=int, help=argparse.SUPPRESS)  # internal: one floor measurement, P members
    parser.add_argument("--floor-update", choices=tuple(FLOORS), default="minatar", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--learning-starts", type=int, default=CLEANRL_LEARNING_STARTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sections = list(args.only or SECTIONS)
    needs_sb3 = [s for s in sections if s in SB3_SECTIONS] if not args.sb3 else ["--sb3"]
    if needs_sb3 and importlib.util.find_spec("stable_baselines3") is None:
        others = " ".join(s for s in SECTIONS if s not in SB3_SECTIONS)
        print(
            f"bench.py: stable_baselines3 is not installed (needed by {', '.join(needs_sb3)}): {SB3_FIX}"
            f" (or leave those out: --only {others})",
            file=sys.stderr,
        )
        return 2
    needs_mujoco = [s for s in sections if s in OPTIONAL_SECTIONS]
    if needs_mujoco and importlib.util.find_spec("mujoco") is None:
        print(f"bench.py: mujoco is not installed (needed by {', '.join(needs_mujoco)}): {MUJOCO_FIX}", file=sys.stderr)
        return 2
    if args.floor:
        default = FLOOR_UPDATES if args.floor_update == "minatar" else SAC_FLOOR_MATMULS
        print(json.dumps(FLOORS[args.floor_update](args.floor, args.steps or default)))
        return 0
    if args.sb3:
        if args.sb3 == "dqn":
            sb3_dqn(args.steps, args.seed, args.learning_starts)
        elif args.sb3 == "sac_hopper":
            sb3_sac_hopper(args.steps, args.seed, args.learning_starts)
        elif args.sb3 == "minatar_dqn":
            sb3_minatar_dqn(args.steps, args.seed, args.learning_starts)
        else:
            sb3_ppo(args.steps, args.seed)
        return 0

    steps = args.steps or (10_000 if args.quick else 50_000)
    ppo_steps = args.ppo_steps or (10_000 if args.quick else 100_000)
    minatar_steps = args.minatar_steps or (5_000 if args.quick else 20_000)
    repeats = args.repeats or (1 if args.quick else 5)
    populations = args.populations or ([1, 16] if args.quick else [1, 4, 16, 64])
    pack_steps = args.pack_steps or (2000 if args.quick else 5000)
    if any(p != 1 and (p < 12 or p % 12) for p in args.pack_populations):
        parser.error("--pack-populations: 1 or multiples of 12")
    if steps < 10 or args.mujoco_steps < 10 or ppo_steps < 512 or repeats < 1 or min(populations) < 1:
        parser.error(
            "need --steps >= 10, --mujoco-steps >= 10, --ppo-steps >= 512 (one PPO rollout), --repeats >= 1, "
            "populations >= 1"
        )

    load_start = load()
    with tempfile.TemporaryDirectory() as tmp:
        cases, commands = build_cases(
            sections,
            steps,
            ppo_steps,
            minatar_steps,
            populations,
            args.threads,
            Path(tmp),
            pack_steps,
            args.pack_populations,
            args.mujoco_steps,
        )
        samples: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        extra: dict[str, list[float]] = {}  # rlexp's loop-only times; the start-up run's whole process
        rss: dict[str, list[float]] = {}
        floors: dict[str, list[dict[str, float]]] = {}  # each floor case's measurements, round by round
        updates: dict[str, list[int]] = {}  # sac_floor's runs: their gradient steps, round by round
        for r in range(repeats):
            ran: dict[str, Sample] = {}
            for name, figure, run in cases:
                sample = ran[name] = run(r)
                samples[name].append(figure(sample))
                if name in ("dqn_rlexp", "ppo_rlexp", "sac_mujoco_rlexp", "minatar_rlexp"):
                    extra.setdefault(f"{name}_loop", []).append(sample.loop_s)
                if name == "startup_to_first_step":
                    extra.setdefault("startup_process", []).append(sample.process_s)
                if name == "minatar_update":
                    extra.setdefault("minatar_floor", []).append(sample.floor_s)
                if name in ("minatar_update", "sac_floor"):
                    floors.setdefault(name, []).append(sample.floor)
                if sample.updates is not None:
                    updates.setdefault(name, []).append(sample.updates)
                if name in ("grid24_unpacked", "grid24_packed"):
                    extra.setdefault(f"{name}_loop", []).append(sample.loop_s)
                if name.startswith("population_p"):
                    rss.setdefault(name[len("population_p") :], []).append(sample.rss_mb)
                print(f"[{r + 1}/{repeats}] {name}: {samples[name][-1]:.2f} s", flush=True)
            if "sac_loop" in ran:
                extra.setdefault("sac_update", []).append(sac_update_s(ran["sac_loop"], ran["sac_loop_idle"]))
    samples.update(extra)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    ratios = ratios_of(medians)
    paired = paired_ratios(samples, repeats)
    peak_rss = {p: max(values) for p, values in rss.items()}
    throughput = {
        p: {
            "per_seed_steps_per_s": steps / medians[f"population_p{p}"],
            "population_steps_per_s": int(p) * steps / medians[f"population_p{p}"],
        }
        for p in peak_rss
    }
    pack_throughput = {
        name[len("pack_p") :]: pack_steps / medians[name] for name in medians if name.startswith("pack_p")
    }  # env steps/s per member
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor(),
            "load_average_start": load_start,
            "load_average_end": load(),
        },
        "versions": versions(),
        "settings": {
            "steps": steps,
            "ppo_steps": ppo_steps,
            "minatar_steps": minatar_steps,
            "repeats": repeats,
            "populations": populations,
            "population_threads": args.threads,
            "sections": sections,
            "quick": args.quick,
            "dqn_learning_starts": scaled_learning_starts(steps, CLEANRL_LEARNING_STARTS),
            "pack_steps": pack_steps,
            "pack_populations": args.pack_populations,
            "mujoco_steps": args.mujoco_steps,
        },
        "commands": commands,
        "medians_s": medians,
        "samples_s": samples,
        "peak_rss_mb": peak_rss,
        "throughput": throughput,
        "pack_per_member_steps_per_s": pack_throughput,
        "floors": floors,  # per floor case and round: floor_s, flops, matmul_gflops (and MinAtar's update_s)
        "updates": updates,  # per sac_floor run and round: its gradient steps
        "ratios": ratios,  # from the medians: what the verdicts judge
        "ratios_per_round_median": paired,  # each round's figure, then the median over rounds
        "targets": {  # null: an informational figure (sac_update_over_floor)
            name: {"op": TARGETS[name][0], "value": TARGETS[name][1]} if name in TARGETS else None for name in ratios
        },
        "passed": {name: verdict(name, value) for name, value in ratios.items()},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(medians, samples, ratios, paired, peak_rss, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
