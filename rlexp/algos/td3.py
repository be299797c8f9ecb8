"""TD3 and DDPG for a population of members (continuous actions).

Reads top to bottom: actor, critic(s) and their EMA targets -> per step: uniform random actions
until ``learning_starts``, then the actor's action plus Gaussian noise -> replay -> every
``train_frequency`` steps ``gradient_steps`` critic updates, and every ``policy_delay``-th of
them an actor update followed by the EMA target updates.

The actor's output is squashed and scaled to the action bounds (the output scaling layer):
    mu(s) = center + half_range * tanh(net(s))
The critic update, per member (no gradient through y):
    a' = clip(mu_target(s') + clip(noise, +-target_noise_clip), low, high),  noise ~ N(0, target_noise)
    y  = r + gamma (1 - terminated) min_i Q_target_i(s', a')      (TD3; DDPG: the one critic, no noise)
    critic loss = sum_i mean (Q_i(s, a) - y)^2
The actor update: actor loss = -mean Q_1(s, mu(s)) (the critic's parameters get no gradient).
Targets: theta' <- (1 - tau) theta' + tau theta (tau = 0.001 is the seed's DDPG). Noise scales are
fractions of the half action range. A truncated episode bootstraps, a terminated one does not.
Evaluation plays mu(s), without exploration noise (``squashed_policy``).
"""

from __future__ import annotations

import copy
from functools import partial

import numpy as np
import torch
from torch import nn

from rlexp.algos.common import ScaledTanh, batch_std, locate, normal, squashed_policy
from rlexp.config.schema import DiagnosticsConfig, TD3Config
from rlexp.data.buffers import Batch, ReplayBuffer
from rlexp.diagnostics.instruments import (
    activity_instruments,
    parameter_names,
    update_instruments,
)
from rlexp.diagnostics.interventions import Subject
from rlexp.nn.nets import PopMLP, soft_update_
from rlexp.optim.pipeline import UpdateStats
from rlexp.run.context import RunContext
from rlexp.run.evaluation import Networks


def td3_target(
    actor_target: PopMLP,
    critic_targets: list[PopMLP],
    squash: ScaledTanh,
    batch: Batch,
    algo: TD3Config,
    noise: torch.Tensor,
    gamma: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """The bootstrap target y [P, B] from standard normal ``noise`` [P, B, A] (no gradient); ``gamma``
    [P, 1]: each member's discount (default ``algo.gamma`` for all)."""
    with torch.no_grad():
        next_action = squash(actor_target(batch.next_obs))  # [P, B, A]
        if algo.target_noise > 0:
            smoothing = (noise * algo.target_noise).clamp(-algo.target_noise_clip, algo.target_noise_clip)
            low, high = squash.center - squash.half_range, squash.center + squash.half_range
            next_action = torch.minimum(torch.maximum(next_action + smoothing * squash.half_range, low), high)
        next_q = torch.stack([c(batch.next_obs, next_action).squeeze(-1) for c in critic_targets]).amin(0)  # [P, B]
        return batch.rewards + (algo.gamma if gamma is None else gamma) * (1.0 - batch.terminated) * next_q


def histograms(actor: PopMLP, squash: ScaledTanh, actor_names: list[str], batch: Batch) -> dict[str, torch.Tensor]:
    """W&B histograms: the actor's actions and pre-tanh outputs on the batch [P, B, A], its gradients."""
    pre_tanh = actor(batch.obs)
    return {"policy/action": squash(pre_tanh), "policy/pre_tanh": pre_tanh} | {
        f"grad/{k}": p.grad for k, p in zip(actor_names, actor.parameters())
    }


def build(ctx: RunContext) -> Networks:
    """The actor mu and the critic(s) (two for TD3), and mu(s) as the policy, without noise."""
    env = ctx.env
    action_dim = int(np.prod(env.action_space.shape))
    low, high = env.action_space.low.astype(np.float32), env.action_space.high.astype(np.float32)
    actor = ctx.make_net(env.obs_dim, action_dim, role="actor")
    twins = 2 if ctx.cfg.algo.twin else 1
    critics = nn.ModuleList(ctx.make_net(env.obs_dim, 1, role="critic", extra_in=action_dim) for _ in range(twins))
    actor.eval()
    policy = squashed_policy(actor.inference(), ScaledTanh(low, high, ctx.device), ctx.device, low, high)
    return Networks({"actor": actor, "critics": critics}, policy)


def train(ctx: RunContext) -> None:
    """Train a TD3 (or DDPG) population (see the module docstring)."""
    cfg, env, device, recorder = ctx.cfg, ctx.env, ctx.device, ctx.recorder
    algo: TD3Config = cfg.algo
    members, num_envs, obs_dim = env.members, env.num_envs, env.obs_dim
    action_dim = int(np.prod(env.action_space.shape))
    low, high = env.action_space.low.astype(np.float32), env.action_space.high.astype(np.float32)
    squash = ScaledTanh(low, high, device)

    built = build(ctx)
    actor, critics = built.nets["actor"], built.nets["critics"]
    actor_target, critic_targets = copy.deepcopy(actor), copy.deepcopy(critics)
    actor_target.requires_grad_(False), critic_targets.requires_grad_(False)
    for net in (actor, critics, actor_target, critic_targets):
        net.eval()  # acting and targets use running statistics when a network has batch norm
    actor_pipe, critic_pipe = ctx.make_pipeline(actor), ctx.make_pipeline(critics)  # an optimizer each
    # per-member discount and target rate (members that differ in them; else algo's for all)
    gamma = ctx.hyper("algo.gamma")  # float or [P, 1]: one per member
    tau = ctx.hyper("algo.tau", "runs")  # float or [(a, b, tau)]
    intervene = ctx.interventions(  # intervention.*, every few critic updates
        Subject("actor", actor, actor_pipe, (actor_target,)),
        *(Subject(p, c, critic_pipe, (t,)) for p, c, t in zip(["critic", "critic2"], critics, critic_targets)),
    )
    critic_prefixes = ["critic", "critic2"][: len(critics)]
    actor_names = parameter_names(actor, "actor")
    critic_names = [n for c, prefix in zip(critics, critic_prefixes) for n in parameter_names(c, prefix)]
    buffer = ReplayBuffer(members, algo.buffer_size, obs_dim, device, action_dim)
    critic_updates = actor_updates = 0

    act = actor.inference()  # acting: the same forward, no gradient, less overhead per call
    recorder.evaluate_with(built.policy)
    obs = env.reset()  # [P, E, obs] raw, on the host
    ctx.obs_norm.update(obs)
    prev_step = 0
    learn_from = algo.learning_starts  # updates begin after this env step
    saved = {"actor": actor, "critics": critics, "actor_target": actor_target, "critic_targets": critic_targets}
    saved |= {"actor_pipe": actor_pipe, "critic_pipe": critic_pipe, "buffer": buffer, "interventions": intervene}
    loop = ctx.checkpoint_state(
        saved, lambda: dict(obs=obs, prev_step=prev_step, critic=critic_updates, actor=actor_updates)
    )
    ctx.population_based_training(saved, {})  # pbt.*: the recorder's log steps copy members, change their lr
    if loop:  # continued from a checkpoint; without its replay the buffer refills for learning_starts steps
        prev_step, critic_updates, actor_updates = loop["prev_step"], loop["critic"], loop["actor"]
        learn_from = learn_from if cfg.checkpoint.replay else prev_step + algo.learning_starts
    for step in recorder.steps():
        # act: uniform random actions until learning starts, then mu(s) + Gaussian noise
        u = ctx.streams.uniform(num_envs * action_dim).reshape(members, num_envs, action_dim)
        if step <= algo.learning_starts:
            actions = low + u * (high - low)
        else:
            mu = squash(act(torch.from_numpy(ctx.obs_norm(obs)).to(device))).cpu().numpy()  # [P, E, A]
            noise = normal(u, u.shape, torch.device("cpu")).numpy() * algo.exploration_noise * (high - low) / 2
            actions = np.clip(mu + noise, low, high)
        result, reward = ctx.step_env(actions, step)  # reward: reward_norm's scaling
        buffer.add(obs, actions, reward, result.obs, result.terminated, result.terminated | result.truncated)
        obs = result.next_obs

        # learn
        if step <= learn_from or step // algo.train_frequency == prev_step // algo.train_frequency:
            prev_step = step
            continue
        prev_step = step
        for _ in range(algo.gradient_steps):
            batch = buffer.sample(ctx.streams.uniform(algo.batch_size))  # [P, B, ...]
            batch = ctx.obs_norm.batch(batch)  # stored raw, normalized with the current statistics
            update_actor = (critic_updates + 1) % algo.policy_delay == 0
            diagnose = update_actor and recorder.diagnose(actor_updates)
            recorder.inject_param(critics[0], step)  # debug.inject.what=param poisons the critic
            noise = normal(
                ctx.streams.uniform(algo.batch_size * action_dim), (members, algo.batch_size, action_dim), device
            )
            target = td3_target(actor_target, list(critic_targets), squash, batch, algo, noise, gamma)  # [P, B]
            critics.train()
            q_pred = [c(batch.obs, batch.actions).squeeze(-1) for c in critics]  # each [P, B]
            critics.eval()
            critic_loss = sum((q - target).square().mean(1) for q in q_pred)  # [P]
            critic_update = critic_pipe.step(critic_loss, step, diagnose)
            critic_updates += 1
            intervene(critic_updates, batch.obs, batch.actions)
            recorder.locate_divergence(
                critic_update,
                partial(locate, critics, critic_prefixes, critic_names, batch.obs, batch.actions, critic_update),
            )
            if not update_actor:
                continue

            critics.requires_grad_(False)  # the actor's loss moves the actor only
            actor.train()
            actor_loss = -critics[0](batch.obs, squash(actor(batch.obs))).squeeze(-1).mean(1)  # [P]
            actor.eval()
            critics.requires_grad_(True)
            actor_update = actor_pipe.step(actor_loss, step, diagnose)
            recorder.locate_divergence(
                actor_update, partial(locate, [actor], ["actor"], actor_names, batch.obs, None, actor_update)
            )
            soft_update_(actor_target, actor, tau)
            soft_update_(critic_targets, critics, tau)
            q_detached = q_pred[0].detach()
            recorder.record_update(
                {"actor_": actor_update, "critic_": critic_update},
                {
                    "q_mean": q_detached.mean(1),
                    "q_max": q_detached.amax(1),
                    "td_abs_mean": (q_detached - target).abs().mean(1),
                },
            )
            if diagnose:
                record = instruments(
                    actor,
                    critics,
                    critic_targets,
                    squash,
                    batch,
                    target,
                    actor_update,
                    critic_update,
                    actor_names,
                    critic_names,
                    critic_prefixes,
                    cfg.diagnostics,
                )
                grad_norm = torch.maximum(actor_update.grad_norm_pre_clip, critic_update.grad_norm_pre_clip)
                recorder.record_instruments(
                    record,
                    step,
                    grad_norm,
                    q_abs_max=record["q/abs_max"],
                    reward_scale=ctx.reward_range.r_max,
                    output_layer=f"critic.{len(critics[0].layers) - 1}",
                    update=actor_updates,
                    histograms=partial(histograms, actor, squash, actor_names, batch),
                )
            actor_updates += 1


def instruments(
    actor: PopMLP,
    critics: nn.ModuleList,
    critic_targets: nn.ModuleList,
    squash: ScaledTanh,
    batch: Batch,
    target: torch.Tensor,
    actor_update: UpdateStats,
    critic_update: UpdateStats,
    actor_names: list[str],
    critic_names: list[str],
    critic_prefixes: list[str],
    diag: DiagnosticsConfig,
) -> dict[str, torch.Tensor]:
    """Per-member instrument record ([P] each): actor and critic layers, Q and TD-error statistics,
    the online - target gap, and the actor's output distribution (mean, std, and the fraction
    saturated: |tanh| > 0.99, where the squashing's gradient has all but vanished)."""
    pre_tanh, stats = activity_instruments(actor, "actor", batch.obs, diag)
    q_all = []
    for critic, prefix in zip(critics, critic_prefixes):
        q, critic_stats = activity_instruments(critic, prefix, batch.obs, diag, batch.actions)
        stats.update(critic_stats)
        q_all.append(q.squeeze(-1))
    stats.update(update_instruments(actor_update, actor_names))
    stats.update(update_instruments(critic_update, critic_names))
    with torch.no_grad():
        q = q_all[0]  # [P, B]
        td = q - target
        stats.update(
            {
                "q/mean": q.mean(1),
                "q/min": q.amin(1),
                "q/max": q.amax(1),
                "q/abs_max": torch.stack(q_all).abs().amax((0, 2)),
                "td/mean": td.mean(1),
                "td/std": batch_std(td),
                "td/abs_max": td.abs().amax(1),
            }
        )
        stats["q/online_target_gap"] = (q - critic_targets[0](batch.obs, batch.actions).squeeze(-1)).mean(1)
        squashed = torch.tanh(pre_tanh)  # [P, B, A]
        stats["policy/mean"] = squashed.mean((1, 2))
        stats["policy/std"] = batch_std(squashed).mean(1)
        stats["policy/saturated"] = (squashed.abs() > 0.99).float().mean((1, 2))
    return {k: v.float() for k, v in stats.items()}
