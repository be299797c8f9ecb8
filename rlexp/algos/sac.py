"""SAC for a population of members (continuous actions; Haarnoja et al. 2018, with automatic entropy tuning).

Reads top to bottom: a tanh-squashed Gaussian actor, twin critics and their EMA targets, and one
entropy coefficient alpha per member -> per step: uniform random actions until ``learning_starts``,
then a sample of the policy -> replay -> every ``train_frequency`` steps ``gradient_steps`` updates
of alpha, the critics, the actor and the critics' targets, in Stable-Baselines3's order.

The actor's outputs [P, B, 2A] are a mean m and a log standard deviation, clamped to
[log_std_min, log_std_max]; with noise e ~ N(0, 1) (from each member's stream):
    u = m + exp(log_std) e,  a = tanh(u) in [-1, 1]^A,  the env's action = center + half_range * a
    log pi(a|s) = sum_j [log N(u_j; m_j, std_j) - log(1 - tanh(u_j)^2)]      (the squashing correction,
                  computed as 2 (log 2 - u - softplus(-2u)), exact and finite for every u)
The log-probability is that of a in [-1, 1]^A (the action box's constant Jacobian left out, as SB3 does).
Per update, per member, with alpha = exp(log_alpha) before its step (no gradient through y):
    alpha loss  = -mean log_alpha (log pi(a|s) + target_entropy)         target_entropy = -|A| by default
    y           = r + gamma (1 - terminated) (min_i Q_target_i(s', a') - alpha log pi(a'|s')),  a' ~ pi(s')
    critic loss = 1/2 sum_i mean (Q_i(s, a) - y)^2
    actor loss  = mean (alpha log pi(a|s) - min_i Q_i(s, a)),  a ~ pi(s) reparametrized (critics frozen)
Targets: theta' <- (1 - tau) theta' + tau theta after every update. alpha's optimizer is Adam at
``optimizer.lr`` with no clipping or penalty (SB3's); ``algo.autotune=false`` keeps alpha at
``algo.alpha``. A truncated episode bootstraps, a terminated one does not. Evaluation plays the
deterministic policy center + half_range * tanh(m).
"""

from __future__ import annotations

import copy
import math
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from rlexp.algos.common import LOG_2PI, ScaledTanh, batch_std, check_replay, locate, normal, squashed_policy
from rlexp.config.schema import (
    AdamConfig,
    ClippingConfig,
    ConfigError,
    DiagnosticsConfig,
    RegularizationConfig,
    SACConfig,
)
from rlexp.data.buffers import Batch, ReplayBuffer
from rlexp.diagnostics.instruments import activity_instruments, parameter_names, update_instruments
from rlexp.diagnostics.interventions import Subject
from rlexp.nn.nets import PopMLP, soft_update_
from rlexp.optim.pipeline import GradientPipeline, UpdateStats, gradient_pipeline
from rlexp.run.context import RunContext
from rlexp.run.evaluation import Networks


class LogAlpha(nn.Module):
    """The entropy coefficient's logarithm, one per member: ``value`` [P, 1]."""

    def __init__(self, members: int, alpha: float, device: torch.device) -> None:
        super().__init__()
        self.value = nn.Parameter(torch.full((members, 1), math.log(alpha), device=device))


def squashed_sample(
    out: torch.Tensor, noise: torch.Tensor, log_std_min: float, log_std_max: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The actor's outputs [P, B, 2A] and standard normal ``noise`` [P, B, A] -> (a = tanh(u) [P, B, A]
    in [-1, 1], log pi(a|s) [P, B]) with the tanh squashing's correction (see the module docstring)."""
    mean, log_std = out.chunk(2, -1)
    log_std = log_std.clamp(log_std_min, log_std_max)
    u = mean + log_std.exp() * noise
    gaussian = (-0.5 * noise.square() - log_std - 0.5 * LOG_2PI).sum(-1)  # log N(u; mean, std)
    correction = (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)  # log(1 - tanh(u)^2)
    return torch.tanh(u), gaussian - correction


def sac_target(
    actor: PopMLP,
    critic_targets: list[PopMLP],
    squash: ScaledTanh,
    batch: Batch,
    algo: SACConfig,
    alpha: torch.Tensor,
    noise: torch.Tensor,
    gamma: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """The entropy-regularized bootstrap target y [P, B] from alpha [P] and standard normal ``noise``
    [P, B, A] for the next action (no gradient); ``gamma`` [P, 1]: each member's discount (default
    ``algo.gamma`` for all)."""
    with torch.no_grad():
        a, log_prob = squashed_sample(actor(batch.next_obs), noise, algo.log_std_min, algo.log_std_max)
        next_action = squash.center + squash.half_range * a  # [P, B, A]
        next_q = torch.stack([c(batch.next_obs, next_action).squeeze(-1) for c in critic_targets]).amin(0)  # [P, B]
        soft_q = next_q - alpha.unsqueeze(1) * log_prob
        return batch.rewards + (algo.gamma if gamma is None else gamma) * (1.0 - batch.terminated) * soft_q


def alpha_pipeline(log_alpha: LogAlpha, ctx: RunContext) -> GradientPipeline:
    """log alpha's own optimizer: Adam at each member's ``optimizer.lr``, no clipping, no penalty (member
    health shared)."""
    lrs = ctx.member_values("optimizer.lr")
    adam = [AdamConfig(name="adam", lr=lr) for lr in lrs] if len(set(lrs)) > 1 else AdamConfig(name="adam", lr=lrs[0])
    return gradient_pipeline(
        [log_alpha.value],
        adam,
        ClippingConfig(name="none"),
        RegularizationConfig(),
        [],
        ctx.recorder.health,
        ctx.cfg.fast_paths,
    )


def histograms(actor: PopMLP, actor_names: list[str], batch: Batch) -> dict[str, torch.Tensor]:
    """W&B histograms: the actor's means and log standard deviations on the batch [P, B, A], its gradients."""
    mean, log_std = actor(batch.obs).chunk(2, -1)
    return {"policy/mean": mean, "policy/log_std": log_std} | {
        f"grad/{k}": p.grad for k, p in zip(actor_names, actor.parameters())
    }


def check(cfg: DictConfig) -> None:
    """The combinations SAC needs (ConfigError otherwise): a replay's, and log_std's range."""
    check_replay(cfg)
    algo = cfg.algo
    if algo.log_std_max <= algo.log_std_min:
        raise ConfigError(
            "algo.log_std_max",
            f"{algo.log_std_max} <= algo.log_std_min={algo.log_std_min}",
            "raise algo.log_std_max above algo.log_std_min",
        )


def build(ctx: RunContext) -> Networks:
    """The actor (mean | log_std) and the twin critics, and the squashed mean as the policy."""
    env = ctx.env
    action_dim = int(np.prod(env.action_space.shape))
    low, high = env.action_space.low.astype(np.float32), env.action_space.high.astype(np.float32)
    actor = ctx.make_net(env.obs_dim, 2 * action_dim, role="actor")  # [P, B, obs] -> mean | log_std [P, B, 2A]
    critics = nn.ModuleList(ctx.make_net(env.obs_dim, 1, role="critic", extra_in=action_dim) for _ in range(2))
    actor.eval()
    act, squash = actor.inference(), ScaledTanh(low, high, ctx.device)
    policy = squashed_policy(lambda x: act(x)[..., :action_dim], squash, ctx.device, low, high)
    return Networks({"actor": actor, "critics": critics}, policy)


def train(ctx: RunContext) -> None:
    """Train a SAC population (see the module docstring)."""
    cfg, env, device, recorder = ctx.cfg, ctx.env, ctx.device, ctx.recorder
    algo: SACConfig = cfg.algo
    members, num_envs, obs_dim = env.members, env.num_envs, env.obs_dim
    action_dim = int(np.prod(env.action_space.shape))
    low, high = env.action_space.low.astype(np.float32), env.action_space.high.astype(np.float32)
    squash = ScaledTanh(low, high, device)
    target_entropy = -float(action_dim) if algo.target_entropy is None else float(algo.target_entropy)

    built = build(ctx)
    actor, critics = built.nets["actor"], built.nets["critics"]
    critic_targets = copy.deepcopy(critics)
    critic_targets.requires_grad_(False)
    for net in (actor, critics, critic_targets):
        net.eval()  # acting and targets use running statistics when a network has batch norm
    log_alpha = LogAlpha(members, algo.alpha, device)
    actor_pipe, critic_pipe = ctx.make_pipeline(actor), ctx.make_pipeline(critics)
    alpha_pipe = alpha_pipeline(log_alpha, ctx)
    intervene = ctx.interventions(  # intervention.*, every few updates
        Subject("actor", actor, actor_pipe),
        *(Subject(p, c, critic_pipe, (t,)) for p, c, t in zip(["critic", "critic2"], critics, critic_targets)),
    )
    critic_prefixes = ["critic", "critic2"]
    actor_names = parameter_names(actor, "actor")
    critic_names = [n for c, prefix in zip(critics, critic_prefixes) for n in parameter_names(c, prefix)]
    buffer = ReplayBuffer(members, algo.buffer_size, obs_dim, device, action_dim)
    updates = 0
    # per-member hyperparameters (members that differ in them; None: every member has algo's)
    gamma = ctx.hyper("algo.gamma")  # float or [P, 1]: one per member
    tau = ctx.hyper("algo.tau", "runs")  # float or [(a, b, tau)]

    act = actor.inference()  # acting: the same forward, no gradient, less overhead per call
    recorder.evaluate_with(built.policy)
    obs = env.reset()  # [P, E, obs] raw, on the host
    ctx.obs_norm.update(obs)
    prev_step = 0
    learn_from = algo.learning_starts  # updates begin after this env step
    saved = {"actor": actor, "critics": critics, "critic_targets": critic_targets, "log_alpha": log_alpha}
    saved |= {"actor_pipe": actor_pipe, "critic_pipe": critic_pipe, "alpha_pipe": alpha_pipe}
    saved |= {"buffer": buffer, "interventions": intervene}
    loop = ctx.checkpoint_state(saved, lambda: dict(obs=obs, prev_step=prev_step, updates=updates))
    if loop:  # continued from a checkpoint; without its replay the buffer refills for learning_starts steps
        prev_step, updates = loop["prev_step"], loop["updates"]
        learn_from = learn_from if cfg.checkpoint.replay else prev_step + algo.learning_starts
    for step in recorder.steps():
        # act: uniform random actions until learning starts, then a sample of the policy
        u = ctx.streams.uniform(num_envs * action_dim).reshape(members, num_envs, action_dim)
        if step <= algo.learning_starts:
            actions = low + u * (high - low)
        else:
            out = act(torch.from_numpy(ctx.obs_norm(obs)).to(device))  # [P, E, 2A]
            noise = normal(u, u.shape, device)
            a, _ = squashed_sample(out, noise, algo.log_std_min, algo.log_std_max)
            actions = np.clip((squash.center + squash.half_range * a).cpu().numpy(), low, high)
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
            diagnose = recorder.diagnose(updates)
            recorder.inject_param(critics[0], step)  # debug.inject.what=param poisons the critic
            shape = (members, algo.batch_size, action_dim)
            noise_pi = normal(ctx.streams.uniform(algo.batch_size * action_dim), shape, device)
            noise_next = normal(ctx.streams.uniform(algo.batch_size * action_dim), shape, device)

            # the policy's reparametrized sample on the batch, and alpha (its value before its step)
            actor.train()
            a_pi, log_prob = squashed_sample(actor(batch.obs), noise_pi, algo.log_std_min, algo.log_std_max)
            actor.eval()
            alpha = log_alpha.value.detach().exp().squeeze(1)  # [P]
            alpha_loss = -(log_alpha.value * (log_prob.detach() + target_entropy)).mean(1)  # [P]
            alpha_update = alpha_pipe.step(alpha_loss, step) if algo.autotune else None

            # critics
            target = sac_target(actor, list(critic_targets), squash, batch, algo, alpha, noise_next, gamma)  # [P, B]
            critics.train()
            q_pred = [c(batch.obs, batch.actions).squeeze(-1) for c in critics]  # each [P, B]
            critics.eval()
            critic_loss = 0.5 * sum((q - target).square().mean(1) for q in q_pred)  # [P]
            critic_update = critic_pipe.step(critic_loss, step, diagnose)
            recorder.locate_divergence(
                critic_update,
                partial(locate, critics, critic_prefixes, critic_names, batch.obs, batch.actions, critic_update),
            )

            # actor (the critics' parameters get no gradient), then the targets
            critics.requires_grad_(False)
            action_pi = squash.center + squash.half_range * a_pi
            q_pi = torch.stack([c(batch.obs, action_pi).squeeze(-1) for c in critics]).amin(0)  # [P, B]
            actor_loss = (alpha.unsqueeze(1) * log_prob - q_pi).mean(1)  # [P]
            critics.requires_grad_(True)
            actor_update = actor_pipe.step(actor_loss, step, diagnose)
            recorder.locate_divergence(
                actor_update, partial(locate, [actor], ["actor"], actor_names, batch.obs, None, actor_update)
            )
            soft_update_(critic_targets, critics, tau)
            intervene(updates + 1, batch.obs, batch.actions)  # after the actor's backward, which reads its weights

            q_detached, log_prob_detached = q_pred[0].detach(), log_prob.detach()
            pipelines = {"actor_": actor_update, "critic_": critic_update}
            recorder.record_update(
                pipelines if alpha_update is None else pipelines | {"alpha_": alpha_update},
                {
                    "q_mean": q_detached.mean(1),
                    "q_max": q_detached.amax(1),
                    "td_abs_mean": (q_detached - target).abs().mean(1),
                    "alpha": alpha,
                    "entropy": -log_prob_detached.mean(1),
                },
            )
            if diagnose:
                record = instruments(
                    actor,
                    critics,
                    critic_targets,
                    batch,
                    target,
                    log_prob_detached,
                    alpha,
                    actor_update,
                    critic_update,
                    actor_names,
                    critic_names,
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
                    update=updates,
                    histograms=partial(histograms, actor, actor_names, batch),
                )
            updates += 1


def instruments(
    actor: PopMLP,
    critics: nn.ModuleList,
    critic_targets: nn.ModuleList,
    batch: Batch,
    target: torch.Tensor,
    log_prob: torch.Tensor,
    alpha: torch.Tensor,
    actor_update: UpdateStats,
    critic_update: UpdateStats,
    actor_names: list[str],
    critic_names: list[str],
    diag: DiagnosticsConfig,
) -> dict[str, torch.Tensor]:
    """Per-member instrument record ([P] each): actor and critic layers, Q and TD-error statistics, the
    online - target gap, the twin critics' gap mean |Q_1 - Q_2|, the policy's entropy estimate
    -mean log pi [nats], its log-probabilities, alpha, its standard deviations, and the fraction of
    saturated means (|tanh(m)| > 0.99)."""
    out, stats = activity_instruments(actor, "actor", batch.obs, diag)
    q_all = []
    for critic, prefix in zip(critics, ["critic", "critic2"]):
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
                "q/twin_gap": (q_all[0] - q_all[1]).abs().mean(1),
                "td/mean": td.mean(1),
                "td/std": batch_std(td),
                "td/abs_max": td.abs().amax(1),
            }
        )
        stats["q/online_target_gap"] = (q - critic_targets[0](batch.obs, batch.actions).squeeze(-1)).mean(1)
        mean, log_std = out.chunk(2, -1)  # [P, B, A] each
        stats["policy/entropy"] = -log_prob.mean(1)
        stats["policy/log_prob_min"] = log_prob.amin(1)
        stats["policy/log_prob_max"] = log_prob.amax(1)
        stats["policy/alpha"] = alpha
        stats["policy/log_std"] = log_std.mean((1, 2))
        stats["policy/saturated"] = (torch.tanh(mean).abs() > 0.99).float().mean((1, 2))
    return {k: v.float() for k, v in stats.items()}
