"""scripts/bench.py's cases: what each case runs is bound when the case is made, so a section measures the
same commands whichever other sections run beside it (SB3's SAC once took MinAtar's learning_starts)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench.py"


def load_bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench", bench)  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    return bench


def test_a_sections_runs_do_not_depend_on_the_other_sections(monkeypatch, tmp_path):
    bench = load_bench(monkeypatch)
    for runner in ("rlexp_run", "sb3_run", "grid_run", "floor_run"):  # each run records what it would start
        monkeypatch.setattr(bench, runner, lambda *args, runner=runner, **kwargs: (runner, args, kwargs))
    sizes = dict(steps=3000, ppo_steps=2048, minatar_steps=5000, populations=[1, 16], threads=1, workdir=tmp_path)
    sizes |= dict(pack_steps=2000, pack_populations=(1, 12), mujoco_steps=2000)  # MinAtar and SAC: other starts

    def runs(sections: list[str]) -> dict[str, tuple]:
        cases, commands = bench.build_cases(sections, **sizes)
        return {name: (run(3), commands[name]) for name, _, run in cases}

    every = runs(list(bench.SECTIONS + bench.OPTIONAL_SECTIONS))
    for section in bench.SECTIONS + bench.OPTIONAL_SECTIONS:
        alone = runs([section])
        assert alone and all(every[name] == ran for name, ran in alone.items()), section
    assert every["sac_mujoco_sb3"][0][1][-1] == 400 != every["minatar_sb3"][0][1][-1] == 1000  # each its own starts


def test_the_sac_floor_section_times_the_update_in_the_loop_against_a_floor_process(monkeypatch, tmp_path):
    bench = load_bench(monkeypatch)
    monkeypatch.setattr(bench, "rlexp_run", lambda *args, **kwargs: (args, kwargs))  # what each case would start
    monkeypatch.setattr(bench, "floor_run", lambda *args: args)
    sizes = dict(steps=3000, ppo_steps=2048, minatar_steps=5000, populations=[1], threads=1, workdir=tmp_path)
    cases, commands = bench.build_cases(["sac_floor", "minatar_floor"], **sizes)
    runs = {name: run(0) for name, _, run in cases}
    assert list(runs) == ["minatar_update", "sac_loop", "sac_loop_idle", "sac_floor"]
    ((loop, _), kwargs), ((idle, _), idle_kwargs) = runs["sac_loop"], runs["sac_loop_idle"]
    assert kwargs == idle_kwargs == {"updates": True}  # both count their gradient steps
    assert "total_steps=1200" in loop and "algo.learning_starts=240" in loop and "threads=1" in loop
    assert [o for o in idle if o.startswith("algo.learning_starts=")] == ["algo.learning_starts=1199"]
    assert [o for o in loop if "learning_starts" not in o] == [o for o in idle if "learning_starts" not in o]
    assert runs["sac_floor"] == (1, 200, tmp_path, "sac") and runs["minatar_update"] == (1, 200, tmp_path)
    script = str(SCRIPT)
    assert commands["sac_floor"][1:] == [script, "--floor", "1", "--steps", "200", "--floor-update", "sac"]
    assert commands["minatar_update"][1:] == [script, "--floor", "1", "--steps", "200"]  # MinAtar's, unchanged
    assert "logger.mode=disabled" in commands["sac_loop"] and "eval.episodes=0" in commands["sac_loop"]
    with_updates = bench.Sample(process_s=20.0, rss_mb=0.0, loop_s=19.5, updates=960)
    without = bench.Sample(process_s=3.0, rss_mb=0.0, loop_s=0.33, updates=1)
    assert bench.sac_update_s(with_updates, without) == (19.5 - 0.33) / 959
    assert bench.ratios_of({"sac_update": 0.02, "sac_floor": 0.008})["sac_update_over_floor"] == 0.02 / 0.008
    assert bench.verdict("sac_update_over_floor", 2.5) is None  # informational: no target


def test_a_sac_run_counts_its_updates_and_one_at_its_last_step_without(monkeypatch, tmp_path):
    """sac_loop_idle's learning_starts = total_steps - 1 leaves one update, at the last step; both runs
    read their count from their records (Pendulum: no mujoco needed)."""
    bench = load_bench(monkeypatch)
    small = ["algo=sac", "env=pendulum", "network.hidden=[8]", "algo.batch_size=8", "total_steps=40", "threads=1"]
    counts = [
        bench.rlexp_run([*small, f"algo.learning_starts={starts}"], tmp_path, updates=True).updates
        for starts in (10, 39)
    ]
    assert counts == [30, 1]


def test_the_sac_updates_flops_are_each_pass_counted_by_hand(monkeypatch):
    """A 2-8-8 network on a 3-wide observation and a 1-wide action: the actor 3 -> 8 -> 8 -> 2 (mean |
    log_std), each critic 3 + 1 -> 8 -> 8 -> 1; multiply-adds per member and sample, pass by pass."""
    bench = load_bench(monkeypatch)
    actor, critic = [3 * 8, 8 * 8, 8 * 2], [4 * 8, 8 * 8, 8 * 1]
    actor_forward, critic_forward = 24 + 64 + 16, 32 + 64 + 8
    actor_macs = (
        actor_forward  # the policy's sample on s, with autograd
        + actor_forward  # a' on s' for the target
        + actor_forward  # the actor's weight gradients (from the actor loss)
        + (64 + 16)  # its input gradients, but the first layer's (s needs none)
    )
    critic_macs = (
        critic_forward  # the target critic on (s', a')
        + critic_forward  # the critic on (s, a)
        + critic_forward  # its weight gradients (from the critic loss)
        + (64 + 8)  # its input gradients but the first layer's ((s, a) needs none)
        + critic_forward  # the critic on (s, a_pi)
        + critic_forward  # the input gradients of every layer, back to a_pi (weights frozen)
    )
    members, batch = 2, 5
    assert bench.sac_update_flops(actor, critic, members, batch) == 2 * members * batch * (actor_macs + 2 * critic_macs)
    assert bench.dqn_update_flops(critic, members, batch) == 2 * members * batch * (4 * critic_forward - 32)


def test_the_sac_flop_count_is_the_matmul_flops_torch_counts_in_an_update(monkeypatch):
    """``sac_update_flops`` against torch's own count (FlopCounterMode: every mm, bmm and baddbmm, forward
    and backward) of one gradient step as ``sac.train`` takes it, on ``sac.build``'s networks for a small
    population on Pendulum: alpha's, the critics' and the actor's pipeline steps and the targets' EMA."""
    import copy

    import numpy as np
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from rlexp.algos import sac
    from rlexp.algos.common import ScaledTanh
    from rlexp.data.buffers import Batch
    from rlexp.nn.nets import soft_update_
    from rlexp.run.context import RunContext

    bench = load_bench(monkeypatch)
    members, batch_size = 2, 5
    overrides = ["algo=sac", "env=pendulum", "network.hidden=[8,12]", f"algo.batch_size={batch_size}"]
    cfg = bench.compose_config([*overrides, f"num_seeds={members}", "logger.mode=disabled", "eval.episodes=0"])
    ctx = RunContext.create(cfg, torch.device("cpu"))
    algo, env = cfg.algo, ctx.env
    nets = sac.build(ctx).nets
    actor, critics = nets["actor"], nets["critics"]
    critic_targets = copy.deepcopy(critics).requires_grad_(False)
    log_alpha = sac.LogAlpha(members, algo.alpha, ctx.device)
    actor_pipe, critic_pipe = ctx.make_pipeline(actor), ctx.make_pipeline(critics)
    alpha_pipe = sac.alpha_pipeline(log_alpha, ctx)
    low, high = env.action_space.low.astype(np.float32), env.action_space.high.astype(np.float32)
    squash = ScaledTanh(low, high, ctx.device)
    g = torch.Generator().manual_seed(0)
    shape = (members, batch_size)
    obs, next_obs = torch.randn(*shape, 3, generator=g), torch.randn(*shape, 3, generator=g)
    batch = Batch(
        obs, 4 * torch.rand(*shape, 1, generator=g) - 2, torch.randn(*shape, generator=g), next_obs, torch.zeros(shape)
    )
    noise_pi, noise_next = torch.randn(*shape, 1, generator=g), torch.randn(*shape, 1, generator=g)
    with FlopCounterMode(display=False) as counter:  # sac.train's gradient step, its records left out
        a_pi, log_prob = sac.squashed_sample(actor(batch.obs), noise_pi, algo.log_std_min, algo.log_std_max)
        alpha = log_alpha.value.detach().exp().squeeze(1)
        alpha_pipe.step(-(log_alpha.value * (log_prob.detach() - 1.0)).mean(1), 0)
        target = sac.sac_target(actor, list(critic_targets), squash, batch, algo, alpha, noise_next)
        q_pred = [c(batch.obs, batch.actions).squeeze(-1) for c in critics]
        critic_pipe.step(0.5 * sum((q - target).square().mean(1) for q in q_pred), 0, False)
        critics.requires_grad_(False)
        action_pi = squash.center + squash.half_range * a_pi
        q_pi = torch.stack([c(batch.obs, action_pi).squeeze(-1) for c in critics]).amin(0)
        critics.requires_grad_(True)
        actor_pipe.step((alpha.unsqueeze(1) * log_prob - q_pi).mean(1), 0, False)
        soft_update_(critic_targets, critics, algo.tau)
    actor_macs, critic_macs = bench.layer_macs(actor), bench.layer_macs(critics[0])
    assert actor_macs == [3 * 8, 8 * 12, 12 * 2] and critic_macs == [4 * 8, 8 * 12, 12 * 1]
    assert counter.get_total_flops() == bench.sac_update_flops(actor_macs, critic_macs, members, batch_size)
    env.close()
    ctx.evaluator.close()


def test_the_sac_floor_measurement_runs(monkeypatch, tmp_path):
    pytest.importorskip("mujoco", reason="pip install -e '.[mujoco]'")
    bench = load_bench(monkeypatch)
    sample = bench.floor_run(1, 2, tmp_path, "sac")  # a fresh process: 2 matmuls a timing
    assert sample.floor_s > 0 and sample.floor["flops"] == 564_264_960  # Hopper's 256-256 SAC at batch 256


def test_the_minatar_floor_measurement_runs(monkeypatch):
    pytest.importorskip("minatar", reason="pip install -e '.[minatar]'")
    floor = load_bench(monkeypatch).minatar_update_floor(1, 2)  # 2 updates a timing, each on its own batch
    assert floor["update_s"] > 0 and floor["flops"] == 40_828_928  # conv 16 3x3 -> 128 -> 6 at batch 32
