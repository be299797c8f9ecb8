"""PPO and A2C for a population of members, discrete or continuous actions (a Gaussian, or a tanh-squashed
normal with ``algo.continuous_policy=tanh_normal``: ``Actor``).

Reads top to bottom: actor and critic networks (separate, each through its own gradient pipeline)
-> per rollout: ``num_steps`` vector steps of acting (observations normalized and rewards scaled
when enabled) -> GAE advantages -> ``update_epochs`` passes over ``num_minibatches`` shuffled
minibatches (each member shuffles with its own stream) -> actor loss (clipped surrogate minus
entropy bonus) and critic loss (value MSE, optionally clipped). A2C is the same code with one
epoch over one minibatch: the policy ratio is then 1 and the surrogate's gradient is the plain
policy gradient. Evaluation plays the distribution's deterministic action (``evaluation_policy``): the
likeliest action, the Gaussian's mean clipped to the action bounds, or tanh_normal's squashed location.

The losses, per member, over the samples of a minibatch:
    ratio = exp(log pi(a|s) - log pi_old(a|s));  A normalized per member when norm_adv
    policy loss = mean max(-A ratio, -A clip(ratio, 1 - clip_coef, 1 + clip_coef))
    value loss  = 0.5 mean max((V - R)^2, (V_old + clip(V - V_old, +-clip_coef) - R)^2)  (clip_vloss)
    actor loss  = policy loss - ent_coef * entropy;  critic loss = vf_coef * value loss
GAE: delta_t = r_t + gamma (1 - terminated_t) V(s_t+1) - V(s_t);
     A_t = delta_t + gamma lambda (1 - done_t) A_t+1;  R_t = A_t + V(s_t).
A truncated episode bootstraps from V(final observation) (the step's ``obs``, valued when it ends), a
terminated one from 0, and the sum never crosses an episode's end.
``value_target=mc``: R_t = r_t + gamma (1 - done_t) R_t+1 with no value after the rollout (pure
Monte-Carlo, the seed critic's targets), A_t = R_t - V(s_t).
With network=lstm (``rlexp.nn.recurrent``) acting carries each network's hidden state, zeroed where an
episode starts; the update unrolls the rollout again from its first step's states (truncated BPTT)
in minibatches of whole environment sequences.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from functools import partial

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from rlexp.algos.common import Actor, Minibatch, gae, ppo_losses
from rlexp.config.schema import ActorCriticConfig, DiagnosticsConfig
from rlexp.data.buffers import take_rows
from rlexp.diagnostics.instruments import (
    activity_instruments,
    locate_in_update,
    locate_nonfinite,
    parameter_names,
    update_instruments,
)
from rlexp.diagnostics.interventions import Subject
from rlexp.nn.nets import PopMLP
from rlexp.nn.recurrent import RecurrentNet, RolloutMemory, mc_returns, recurrent_policy, take_sequences
from rlexp.optim.pipeline import UpdateStats
from rlexp.run.context import RunContext
from rlexp.run.evaluation import Networks, Policy
from rlexp.run.recorder import Located


def evaluation_policy(
    policy_out: Callable[[torch.Tensor], torch.Tensor],
    device: torch.device,
    actor: Actor,
    bounds: tuple[np.ndarray, np.ndarray] | None,
) -> Policy:
    """The deterministic policy: normalized observations [P, N, obs] -> ``actor.mode`` of the policy's
    output (the argmax of the logits [P, N], the Gaussian's mean clipped to ``bounds`` (low, high) as
    acting clips, or tanh_normal's tanh(m) in the box [P, N, A])."""

    def act(obs: np.ndarray) -> np.ndarray:
        return actor.mode(policy_out(torch.from_numpy(obs).to(device)), *(bounds or (None, None)))

    act.reset = getattr(policy_out, "reset", None)  # type: ignore[attr-defined] # a recurrent policy's state
    return act


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """1 - Var(R - V) / Var(R) per member over the samples of [P, N] tensors."""
    return 1.0 - (returns - values).var(1, correction=0) / returns.var(1, correction=0).clamp(min=1e-12)


def histograms(
    actor: Actor, critic: PopMLP, actor_names: list[str], critic_names: list[str], mb: Minibatch, out: torch.Tensor
) -> dict[str, torch.Tensor]:
    """W&B histograms: the minibatch's actions, the policy's output ``out`` [P, M, A] and each
    parameter's gradient."""
    return (
        {"policy/action": mb.actions.float(), "policy/output": out.detach()}
        | {f"grad/{k}": p.grad for k, p in zip(actor_names, actor.parameters())}
        | {f"grad/{k}": p.grad for k, p in zip(critic_names, critic.parameters())}
    )


def locate(
    net: Actor | PopMLP, prefix: str, names: list[str], obs: torch.Tensor, update: UpdateStats, member: int, cause: str
) -> Located:
    """Where member ``member``'s non-finite update of ``net`` was born: its forward on the minibatch's
    observations [P, M, obs] layer by layer, then the loss, the gradients and the parameters after the step."""
    found = locate_nonfinite(net.net if isinstance(net, Actor) else net, prefix, member, obs[member], "rollout.obs")
    return found or locate_in_update(cause, names, list(net.parameters()), member, update)


def minibatches(
    data: Minibatch, ctx: RunContext, algo: ActorCriticConfig, steps: int, memory: RolloutMemory | None
) -> Iterator[tuple[Minibatch, contextlib.AbstractContextManager]]:
    """``update_epochs`` passes of ``num_minibatches`` minibatches over the rollout ``data`` ([P, T * E, ...]
    time-major), each member shuffling with its own stream: of samples, or with a recurrent ``memory``
    of whole environment sequences, which the networks unroll within the minibatch's context."""
    members, n = data.returns.shape
    if memory is not None:
        size = n // steps // algo.num_minibatches  # environments per minibatch
        for _ in range(algo.update_epochs):
            order = np.argsort(ctx.streams.uniform(n // steps), axis=1)  # [P, E] environments, shuffled
            for start in range(0, size * algo.num_minibatches, size):
                envs = torch.from_numpy(order[:, start : start + size]).to(data.returns.device)  # [P, n]
                fields = (take_sequences(getattr(data, f), envs, steps) for f in Minibatch.__dataclass_fields__)
                yield Minibatch(*fields), memory.unroll(envs)
        return
    size = n // algo.num_minibatches
    member_rows = np.arange(members)[:, None] * n  # [P, 1] member k's samples are rows k*N ... of [P*N]
    for _ in range(algo.update_epochs):
        order = np.argsort(ctx.streams.uniform(n), axis=1) + member_rows  # [P, N] rows, shuffled per member
        for start in range(0, size * algo.num_minibatches, size):
            rows = torch.from_numpy(order[:, start : start + size].reshape(-1)).to(data.returns.device)  # [P * M]
            fields = (take_rows(getattr(data, f), rows) for f in Minibatch.__dataclass_fields__)
            yield Minibatch(*fields), contextlib.nullcontext()


def build(ctx: RunContext) -> Networks:
    """The actor and the critic, and the distribution's deterministic action as the policy."""
    env = ctx.env
    continuous = isinstance(env.action_space, gym.spaces.Box)
    action_dim = int(np.prod(env.action_space.shape)) if continuous else int(env.action_space.n)
    bounds = (env.action_space.low.astype(np.float32), env.action_space.high.astype(np.float32)) if continuous else None
    actor = Actor.build(ctx, env.obs_dim, action_dim, bounds)
    critic = ctx.make_net(env.obs_dim, 1, role="critic")
    actor.eval(), critic.eval()  # acting uses running statistics when a network has batch norm
    acting = recurrent_policy(actor.net) if isinstance(critic, RecurrentNet) else actor.net.inference()
    return Networks({"actor": actor, "critic": critic}, evaluation_policy(acting, ctx.device, actor, bounds))


def train(ctx: RunContext) -> None:
    """Train a PPO (or A2C) population (see the module docstring)."""
    cfg, env, device, recorder = ctx.cfg, ctx.env, ctx.device, ctx.recorder
    algo: ActorCriticConfig = cfg.algo
    members, num_envs, obs_dim = env.members, env.num_envs, env.obs_dim
    continuous = isinstance(env.action_space, gym.spaces.Box)
    action_dim = int(np.prod(env.action_space.shape)) if continuous else int(env.action_space.n)
    if continuous:
        low, high = env.action_space.low.astype(np.float32), env.action_space.high.astype(np.float32)

    built = build(ctx)
    actor, critic = built.nets["actor"], built.nets["critic"]
    recurrent = isinstance(critic, RecurrentNet)  # network=lstm: states carried, rollouts unrolled again
    if recurrent:
        memory = RolloutMemory({"actor": actor.net, "critic": critic}, algo.num_steps, num_envs)
        policy_out, value_of = memory.stepper("actor"), memory.stepper("critic")
    else:
        policy_out, value_of = actor.net.inference(), critic.inference()  # acting: no gradient, less overhead
    recorder.evaluate_with(built.policy)
    actor_pipe, critic_pipe = ctx.make_pipeline(actor), ctx.make_pipeline(critic)  # an optimizer each
    intervene = ctx.interventions(Subject("actor", actor.net, actor_pipe), Subject("critic", critic, critic_pipe))
    actor_names = parameter_names(actor.net, "actor") + (["actor.log_std"] if actor.log_std is not None else [])
    critic_names = parameter_names(critic, "critic")
    lr = ctx.hyper("optimizer.lr", "array")  # float or [P, 1]
    gamma, gae_lambda = (ctx.hyper(k, dtype=torch.float64) for k in ("algo.gamma", "algo.gae_lambda"))  # or [P, 1]

    T, E = algo.num_steps, num_envs
    shape = (T, members, E)
    log_probs, values = torch.zeros(shape, device=device), torch.zeros(shape, device=device)
    # what the host has each step (observations, actions, the environments' results) stays there
    # until the rollout is complete, then moves to the device at once
    obs_np = np.zeros((*shape, obs_dim), dtype=np.float32)  # [T, P, E, obs] (normalized, as the nets saw them)
    actions_np = np.zeros((*shape, action_dim), dtype=np.float32) if continuous else np.zeros(shape, dtype=np.int64)
    rewards_np, terminated_np, dones_np = (np.zeros(shape, dtype=np.float32) for _ in range(3))
    final_values = torch.zeros(shape, device=device)  # V(the final observation) where an episode was truncated

    steps_per_rollout = T * E
    num_updates = max(1, (algo.anneal_steps or cfg.total_steps) // steps_per_rollout)  # lr schedule
    updates = 0
    obs = env.reset()  # [P, E, obs] raw, on the host
    ctx.obs_norm.update(obs)
    t = 0
    rollout = 0
    saved = {
        "actor": actor,
        "critic": critic,
        "actor_pipe": actor_pipe,
        "critic_pipe": critic_pipe,
        "interventions": intervene,
    }
    # the rollout so far, each [T, P, ...]
    collected = (log_probs, values, obs_np, actions_np, rewards_np, terminated_np, dones_np, final_values)
    loop = ctx.checkpoint_state(
        saved,
        lambda: (
            {f"rollout_{i}": x.swapaxes(0, 1) for i, x in enumerate(collected)}  # [P, T, ...] views
            | dict(obs=obs, t=t, rollout=rollout, updates=updates)
            | (memory.checkpoint() if recurrent else {})
        ),
    )
    if loop:  # continued from a checkpoint
        t, rollout, updates = loop["t"], loop["rollout"], loop["updates"]
    for step in recorder.steps():
        # act: sample from the policy, each member from its own stream
        obs_in = ctx.obs_norm(obs)  # [P, E, obs]
        obs_t = torch.from_numpy(obs_in).to(device)
        u = torch.from_numpy(ctx.streams.uniform(E * action_dim).reshape(members, E, action_dim)).float()
        if recurrent:
            memory.begin(t)  # states zeroed where an episode starts
        with torch.no_grad():
            out = policy_out(obs_t)  # [P, E, A]
            action = actor.sample(out, u.to(device))
            log_prob = actor.log_prob(out, action)
            value = value_of(obs_t).squeeze(-1)  # [P, E]
        action_np = action.cpu().numpy()  # [P, E] or [P, E, A]
        env_action = actor.env_action(action, low, high) if continuous else action_np
        result, reward = ctx.step_env(env_action, step)  # reward: reward_norm's scaling
        done = result.terminated | result.truncated
        final_values[t] = 0.0
        if result.truncated.any():  # the value a truncated episode bootstraps from
            with torch.no_grad():
                final_obs = torch.from_numpy(ctx.obs_norm(result.obs)).to(device)
                final = memory.peek("critic", final_obs, carry_on=True) if recurrent else value_of(final_obs)
            final_values[t] = torch.where(torch.from_numpy(result.truncated).to(device), final.squeeze(-1), 0.0)
        if recurrent:
            memory.end(done)
        obs_np[t], actions_np[t], log_probs[t], values[t] = obs_in, action_np, log_prob, value
        rewards_np[t], terminated_np[t], dones_np[t] = reward, result.terminated, done
        obs = result.next_obs
        t += 1
        if t < T:
            continue

        # learn from the rollout
        t = 0
        rollout += 1
        if algo.anneal_lr:
            for pipe in (actor_pipe, critic_pipe):
                pipe.scale_lr(max(0.0, 1.0 - (rollout - 1) / num_updates))  # each member's lr
            recorder.note(lr=lr * max(0.0, 1.0 - (rollout - 1) / num_updates))
        rewards, terminated, dones = (torch.from_numpy(x).to(device) for x in (rewards_np, terminated_np, dones_np))
        with torch.no_grad():
            last_obs = torch.from_numpy(ctx.obs_norm(obs)).to(device)
            last_value = (memory.peek("critic", last_obs) if recurrent else value_of(last_obs)).squeeze(-1)  # [P, E]
            next_values = torch.cat([values[1:], last_value.unsqueeze(0)])  # [T, P, E]
            next_values = torch.where(dones > terminated, final_values, next_values)  # truncated: V(final obs)
            advantages, returns = gae(rewards, values, next_values, terminated, dones, gamma, gae_lambda)
            if algo.value_target == "mc":  # Monte-Carlo: no value bootstraps the returns
                returns = mc_returns(rewards, dones, gamma)
                advantages = returns - values

        def flat(x: torch.Tensor) -> torch.Tensor:  # [T, P, E, ...] -> [P, T*E, ...]
            return x.transpose(0, 1).reshape(members, T * E, *x.shape[3:])

        data = Minibatch(
            flat(torch.from_numpy(obs_np).to(device)),
            flat(torch.from_numpy(actions_np).to(device)),
            flat(log_probs),
            flat(advantages),
            flat(returns),
            flat(values),
        )
        rollout_stats = {"explained_variance": explained_variance(data.values, data.returns)}
        for mb, unrolled in minibatches(data, ctx, algo, T, memory if recurrent else None):
            with unrolled:
                diagnose = recorder.diagnose(updates)
                recorder.inject_param(critic, step)  # debug.inject.what=param poisons the critic
                actor.train(), critic.train()  # batch statistics, a spectral norm's power iteration
                out = actor.net(mb.obs)
                new_log_prob, entropy = actor.log_prob_entropy(mb.obs, mb.actions, out)
                new_values = critic(mb.obs).squeeze(-1)
                actor.eval(), critic.eval()
                losses = ppo_losses(new_log_prob, entropy, new_values, mb, algo)
                actor_update = actor_pipe.step(losses["actor_loss"], step, diagnose)
                critic_update = critic_pipe.step(losses["critic_loss"], step, diagnose)
                stats = {k: losses[k] for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")}
                stats.update(rollout_stats)
                recorder.record_update({"actor_": actor_update, "critic_": critic_update}, stats)
                recorder.locate_divergence(
                    actor_update, partial(locate, actor, "actor", actor_names, mb.obs, actor_update)
                )
                recorder.locate_divergence(
                    critic_update, partial(locate, critic, "critic", critic_names, mb.obs, critic_update)
                )
                if diagnose:
                    record = instruments(
                        actor,
                        critic,
                        mb,
                        actor_update,
                        critic_update,
                        actor_names,
                        critic_names,
                        cfg.diagnostics,
                        low if continuous else None,
                        high if continuous else None,
                    )
                    grad_norm = torch.maximum(actor_update.grad_norm_pre_clip, critic_update.grad_norm_pre_clip)
                    recorder.record_instruments(
                        record,
                        step,
                        grad_norm,
                        q_abs_max=record["v/abs_max"],
                        reward_scale=ctx.reward_range.r_max,
                        output_layer=f"critic.{len(critic.layers) - 1}",
                        update=updates,
                        histograms=partial(histograms, actor, critic, actor_names, critic_names, mb, out),
                    )
                updates += 1
                intervene(updates, mb.obs)


def instruments(
    actor: Actor,
    critic: PopMLP,
    mb: Minibatch,
    actor_update,
    critic_update,
    actor_names: list[str],
    critic_names: list[str],
    diag: DiagnosticsConfig,
    low: np.ndarray | None,
    high: np.ndarray | None,
) -> dict[str, torch.Tensor]:
    """Per-member instrument record ([P] each): both networks' layers, the value and the policy's
    output distribution (entropy, action mean and std; for Box actions the fraction of sampled
    actions beyond the bounds, which the environment clips, or for tanh_normal squashed to within 1%
    of them)."""
    out, stats = activity_instruments(actor.net, "actor", mb.obs, diag)
    v, critic_stats = activity_instruments(critic, "critic", mb.obs, diag)
    stats.update(critic_stats)
    stats.update(update_instruments(actor_update, actor_names))
    stats.update(update_instruments(critic_update, critic_names))
    with torch.no_grad():
        v = v.squeeze(-1)
        stats.update({"v/mean": v.mean(1), "v/min": v.amin(1), "v/max": v.amax(1), "v/abs_max": v.abs().amax(1)})
        _, entropy = actor.log_prob_entropy(mb.obs, mb.actions, out)
        stats["policy/entropy"] = entropy.mean(1)
        if actor.tanh:  # the pre-squash location and std; saturated: tanh(u) within 1% of the box's ends
            loc, std = actor.loc_std(out)
            stats["policy/mean"] = loc.mean((1, 2))
            stats["policy/mean_abs_max"] = loc.abs().amax((1, 2))
            stats["policy/std"] = std.mean((1, 2))
            stats["policy/saturated"] = (torch.tanh(mb.actions).abs() > 0.99).float().mean((1, 2))
        elif actor.continuous:
            stats["policy/mean"] = out.mean((1, 2))
            stats["policy/mean_abs_max"] = out.abs().amax((1, 2))
            stats["policy/std"] = actor.log_std.exp().mean(1)
            lo, hi = (torch.as_tensor(b, device=out.device) for b in (low, high))
            beyond = (mb.actions <= lo) | (mb.actions >= hi)  # [P, M, A]
            stats["policy/saturated"] = beyond.float().mean((1, 2))
        else:
            stats["policy/max_prob"] = F.softmax(out, -1).amax(-1).mean(1)
    return {k: v.float() for k, v in stats.items()}
