"""MADDPG (Lowe et al. 2017) for a population of members: decentralized actors, centralized critics.

Reads top to bottom: per agent i an actor mu_i(o_i) on its own observation and a critic
Q_i(x, a_1..a_N) on the joint observation x (all agents' observations) and every agent's action, each
with an EMA target copy, a gradient pipeline and the shared config groups (``actor.*``, ``critic.*``
override them as for TD3) -> per step: uniform random actions until ``learning_starts``, then each
actor's sample -> replay of joint transitions with the agents' own rewards -> every
``train_frequency`` steps ``gradient_steps`` updates of every agent on one minibatch, then the EMA
targets. Members are seeds; the agents of a member are separate networks (one PopMLP each), so every
reduction (clipping, losses, divergence) stays per member and per agent.

Actions as the critics see them: a discrete agent's one-hot vector, a continuous agent's vector in
its box (``center + half_range * tanh(net)``, TD3's squashing). Acting: a discrete agent samples
argmax(logits + Gumbel noise) (a sample of softmax(logits)); a continuous one adds Gaussian noise
(``exploration_noise`` x the half range, as TD3; annealed linearly to ``exploration_noise_end`` over
``exploration_anneal_steps`` when set, at every step or, with ``exploration_anneal_every``, once per
that many steps). The critic update of agent i (no gradient through y):
    a'_j = onehot(argmax mu'_j(o'_j)) (discrete) or mu'_j(o'_j) (continuous), for every agent j
           (``target_actor=false``: mu_j, the current actor, as BenchMARL's MADDPG)
    y_i  = r_i + gamma (1 - terminated) Q'_i(x', a'_1..a'_N)
    critic loss_i = mean (Q_i(x, a) - y_i)^2
The actor update of agent i: its action from the replayed o_i is replaced, the others' stay as replayed:
    discrete:   a_i = Gumbel-softmax(logits, gumbel_temperature), straight-through one-hot when gumbel_hard
    actor loss_i = -mean Q_i(x, a_1..a_i..a_N) + policy_reg * mean logits^2   (the paper's 1e-3)
The critic steps before the actor's loss is computed on the same minibatch (the MADDPG paper's code);
with ``actor_first`` the critic steps after the actor, whose loss then sees the critic before this
step's update, as TorchRL's DDPG loss computes both from one forward (BenchMARL's MADDPG).
Targets: theta' <- (1 - tau) theta' + tau theta (the actors' only with ``target_actor``). A truncated
episode bootstraps, a terminated one not.

With ``share_parameters`` (BenchMARL's MADDPG; agents of one observation and action space) every agent
acts with one actor mu(o_i) and one critic Q(x, a) stands for all of them, trained on every agent's
reward, and the actor update gives the critic every agent's action from the current actor:
    critic loss = mean over agents i of mean (Q(x, a) - y_i)^2,  y_i = r_i + gamma (1 - terminated) Q'(x', a')
    actor loss  = -mean Q(x, a_1..a_N) (+ policy_reg * the agents' mean logits^2)

The instruments of the seed's symptom (an agent that repeats one action) are kept per agent over each
log window from the actions the policy takes after ``learning_starts`` (a discrete agent's sample of
softmax(logits), so a concentrated distribution shows; a continuous agent's mu(o) plus its noise):
``rlexp.diagnostics.collapse.ActionWindow``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from torch.nn import functional as F

from rlexp.algos.common import ScaledTanh, batch_std, locate, normal
from rlexp.config.schema import Config, MADDPGConfig
from rlexp.data.buffers import Batch, ReplayBuffer
from rlexp.diagnostics.collapse import ActionWindow
from rlexp.diagnostics.instruments import activity_instruments, parameter_names, update_instruments
from rlexp.diagnostics.interventions import Interventions, Subject
from rlexp.envs.marl import AgentSpace
from rlexp.nn.nets import PopMLP, member_sum, soft_update_
from rlexp.optim.pipeline import GradientPipeline, UpdateStats
from rlexp.run.context import RunContext
from rlexp.run.evaluation import Networks, Policy


def gumbel(uniform: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel numbers -log(-log u) from uniforms in (0, 1)."""
    return -torch.log(-torch.log(uniform.clamp(1e-10, 1 - 1e-7)))


def gumbel_softmax(logits: torch.Tensor, noise: torch.Tensor, temperature: float, hard: bool) -> torch.Tensor:
    """softmax((logits + noise) / temperature) [P, B, n]; ``hard``: its argmax one-hot forward with the
    soft sample's gradient (straight-through)."""
    soft = torch.softmax((logits + noise) / temperature, -1)
    if not hard:
        return soft
    one_hot = F.one_hot(soft.argmax(-1), soft.shape[-1]).to(soft.dtype)
    return one_hot - soft.detach() + soft


class Agent:
    """One agent's networks: actor, centralized critic, their targets and pipelines (``shared``: another
    agent's), named ``name`` (default ``agent<index>``), and how its actions look to the critics."""

    def __init__(
        self,
        ctx: RunContext,
        index: int,
        space: AgentSpace,
        obs_slice: slice,
        joint_obs: int,
        joint_act: int,
        shared: Agent | None = None,
        name: str | None = None,
    ):
        self.index, self.space, self.obs = index, space, obs_slice
        self.squash = None if space.discrete else ScaledTanh(space.low, space.high, ctx.device)
        if shared is not None:
            for key in ("name", "actor", "critic", "actor_target", "critic_target", "actor_pipe", "critic_pipe"):
                setattr(self, key, getattr(shared, key))
            self.actor_names, self.critic_names = shared.actor_names, shared.critic_names
            return
        self.name = name or f"agent{index}"
        self.actor = ctx.make_net(space.obs_dim, space.action_dim, role="actor")
        self.critic = ctx.make_net(joint_obs, 1, role="critic", extra_in=joint_act)
        self.actor_target, self.critic_target = copy.deepcopy(self.actor), copy.deepcopy(self.critic)
        self.actor_target.requires_grad_(False), self.critic_target.requires_grad_(False)
        for net in (self.actor, self.critic, self.actor_target, self.critic_target):
            net.eval()  # acting and targets use running statistics when a network has batch norm
        self.actor_pipe, self.critic_pipe = ctx.make_pipeline(self.actor), ctx.make_pipeline(self.critic)
        self.actor_names = parameter_names(self.actor, f"{self.name}.actor")
        self.critic_names = parameter_names(self.critic, f"{self.name}.critic")

    def target_action(self, next_obs: torch.Tensor, delayed: bool) -> torch.Tensor:
        """a'_i on o'_i [P, B, obs_i] from the target actor (``delayed``) or the current one: one-hot
        argmax, or the squashed output."""
        out = (self.actor_target if delayed else self.actor)(next_obs[..., self.obs])
        if self.squash is None:
            return F.one_hot(out.argmax(-1), self.space.action_dim).float()
        return self.squash(out)


def joint_target(agents: list[Agent], next_obs: torch.Tensor, delayed: bool) -> torch.Tensor:
    """Every agent's target action (``delayed``: its target actor's, else its actor's), side by side
    [P, B, sum A] (no gradient)."""
    with torch.no_grad():
        return torch.cat([agent.target_action(next_obs, delayed) for agent in agents], -1)


def critic_target(
    agent: Agent,
    next_obs: torch.Tensor,
    next_actions: torch.Tensor,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """y_i = r_i + gamma (1 - terminated) Q'_i(x', a') (no gradient), shaped as ``reward``: [P, B] (one
    agent's), or [P, B, N] (every agent's reward, bootstrapped from a shared critic's one Q')."""
    with torch.no_grad():
        next_q = agent.critic_target(next_obs, next_actions).squeeze(-1)  # [P, B]
        bootstrap = gamma * (1.0 - terminated) * next_q  # [P, B]
        return reward + bootstrap.view(*bootstrap.shape, *(1,) * (reward.dim() - 2))


def td_errors(q: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Q(x, a) [P, B] minus its targets [P, B] or [P, B, N], per member: [P, B] or [P, B * N]."""
    return (q.unsqueeze(-1) - target.view(*q.shape, -1)).flatten(1)


def policy_actions(agent: Agent, out: torch.Tensor, noise: torch.Tensor, algo: MADDPGConfig) -> torch.Tensor:
    """The action agent i's actor gives the critic in its update, from its output [P, B, A_i]: the
    Gumbel-softmax sample (discrete) or the squashed output (continuous, ``noise`` unused)."""
    if agent.squash is None:
        return gumbel_softmax(out, noise, algo.gumbel_temperature, algo.gumbel_hard)
    return agent.squash(out)


def noise_std(step: int, algo: MADDPGConfig) -> float:
    """The exploration noise's std after ``step`` env steps per member (a fraction of the half range):
    ``exploration_noise``, falling linearly to ``exploration_noise_end`` over ``exploration_anneal_steps``,
    then constant; with ``exploration_anneal_every`` it moves only at that step's multiples (a collector
    that steps the decay after each batch of that many, as TorchRL's AdditiveGaussianModule in BenchMARL)."""
    end = algo.exploration_noise if algo.exploration_noise_end is None else algo.exploration_noise_end
    if algo.exploration_anneal_steps <= 0:
        return algo.exploration_noise
    if algo.exploration_anneal_every > 0:
        step -= step % algo.exploration_anneal_every
    fraction = min(step / algo.exploration_anneal_steps, 1.0)
    return algo.exploration_noise + fraction * (end - algo.exploration_noise)


def evaluation_policy(agents: list[Agent], device: torch.device) -> Policy:
    """The deterministic joint policy: normalized joint observations [P, N, D] -> one action array per
    agent (argmax of the logits, or mu(o) clipped to the box)."""

    def policy(obs: np.ndarray) -> list[np.ndarray]:
        x = torch.from_numpy(obs).to(device)
        with torch.no_grad():
            return [greedy(agent, agent.actor(x[..., agent.obs])).cpu().numpy() for agent in agents]

    return policy


def greedy(agent: Agent, out: torch.Tensor) -> torch.Tensor:
    """The policy's own choice from actor outputs [P, N, A_i]: argmax [P, N], or mu [P, N, A_i]."""
    if agent.squash is None:
        return out.argmax(-1)
    low, high = agent.squash.center - agent.squash.half_range, agent.squash.center + agent.squash.half_range
    return torch.minimum(torch.maximum(agent.squash(out), low), high)


@dataclass
class Agents(Networks):
    """MADDPG's networks (``<agent>.actor``, ``<agent>.critic``) with the agents that hold them."""

    agents: list[Agent] = field(default_factory=list)


def build(ctx: RunContext) -> Agents:
    """Every agent's actor, critic, targets and pipelines (one set for all with ``share_parameters``),
    and the agents' deterministic joint policy."""
    env, share = ctx.env, ctx.cfg.algo.share_parameters
    joint_act = sum(s.action_dim for s in env.agents)
    first = Agent(ctx, 0, env.agents[0], env.slices[0], env.obs_dim, joint_act, name="shared" if share else None)
    agents = [first] + [
        Agent(ctx, i, s, env.slices[i], env.obs_dim, joint_act, first if share else None)
        for i, s in enumerate(env.agents)
        if i > 0
    ]
    nets = {f"{a.name}.{k}": getattr(a, k) for a in agents[: 1 if share else None] for k in ("actor", "critic")}
    return Agents(nets, evaluation_policy(agents, ctx.device), agents)


def train(ctx: RunContext) -> None:
    """Train a MADDPG population (see the module docstring)."""
    cfg, env, device, recorder = ctx.cfg, ctx.env, ctx.device, ctx.recorder
    algo: MADDPGConfig = cfg.algo
    members, num_envs, spaces = env.members, env.num_envs, env.agents
    widths = [s.action_dim for s in spaces]
    joint_act = sum(widths)
    continuous = not all(s.discrete for s in spaces)  # logs train/exploration_noise
    act_slices = [slice(a, b) for a, b in zip(np.cumsum([0, *widths])[:-1], np.cumsum(widths))]
    share = algo.share_parameters  # one actor and one critic (a single Q) for every agent
    built = build(ctx)
    agents = built.agents
    n_agents = len(agents)
    owners = agents[:1] if share else agents  # the agents whose networks these are
    intervene_critics = ctx.interventions(
        *(Subject(f"{a.name}.critic", a.critic, a.critic_pipe, (a.critic_target,)) for a in owners)
    )
    intervene_actors = [
        Interventions(
            cfg.intervention,
            [Subject(f"{a.name}.actor", a.actor, a.actor_pipe, (a.actor_target,))],
            ctx.seeds,
            recorder.health,
        )
        for a in owners
    ]
    # a row's "action" holds the joint action (one-hot or vector per agent) then the agents' rewards
    buffer = ReplayBuffer(members, algo.buffer_size, env.obs_dim, device, joint_act + n_agents)
    window = ActionWindow(spaces, members, cfg.diagnostics)
    recorder.window = window
    updates = 0

    recorder.evaluate_with(built.policy)
    obs = env.reset()  # [P, E, D] raw joint observations, on the host
    ctx.obs_norm.update(obs)
    prev_step = 0
    saved = {
        f"{a.name}.{k}": getattr(a, k)
        for a in owners
        for k in ("actor", "critic", "actor_target", "critic_target", "actor_pipe", "critic_pipe")
    }
    saved |= {"buffer": buffer, "interventions": intervene_critics}
    loop = ctx.checkpoint_state(
        saved, lambda: dict(obs=obs, prev_step=prev_step, updates=updates) | window.checkpoint()
    )
    if loop:
        prev_step, updates = loop["prev_step"], loop["updates"]
        window.restore(loop)
    for step in recorder.steps():
        # act: uniform random actions until learning_starts, then every agent's policy sample
        x = torch.from_numpy(ctx.obs_norm(obs)).to(device)  # [P, E, D]
        actions, stored = [], []
        sigma = noise_std(step - num_envs, algo)  # continuous agents' noise: the steps taken before this one
        if continuous:
            recorder.note(exploration_noise=sigma)
        with torch.no_grad():
            for agent in agents:
                s = agent.space
                u = ctx.streams.uniform(num_envs * s.action_dim).reshape(members, num_envs, s.action_dim)
                out = agent.actor(x[..., agent.obs])  # [P, E, A_i]
                if s.discrete:
                    if step <= algo.learning_starts:
                        action = (u[..., 0] * s.action_dim).astype(np.int64).clip(max=s.action_dim - 1)
                    else:
                        action = (out + gumbel(torch.from_numpy(u).float().to(device))).argmax(-1).cpu().numpy()
                    stored.append(np.eye(s.action_dim, dtype=np.float32)[action])  # [P, E, n]
                else:
                    if step <= algo.learning_starts:
                        action = s.low + u * (s.high - s.low)
                    else:
                        noise = normal(u, u.shape, torch.device("cpu")).numpy() * sigma
                        action = np.clip(greedy(agent, out).cpu().numpy() + noise * (s.high - s.low) / 2, s.low, s.high)
                    stored.append(action.astype(np.float32))
                actions.append(action)
                if step > algo.learning_starts:  # the policy's own actions, not the uniform ones before
                    window.add(agent.index, action, out)
        result, agent_reward = ctx.step_env(actions, step)  # agent_reward: [P, E, N]
        packed = np.concatenate([*stored, agent_reward.astype(np.float32)], -1)  # [P, E, A + N]
        buffer.add(obs, packed, result.reward, result.obs, result.terminated, result.terminated | result.truncated)
        obs = result.next_obs

        # learn
        if step <= algo.learning_starts or step // algo.train_frequency == prev_step // algo.train_frequency:
            prev_step = step
            continue
        prev_step = step
        for _ in range(algo.gradient_steps):
            batch = buffer.sample(ctx.streams.uniform(algo.batch_size))  # [P, B, ...]
            batch = ctx.obs_norm.batch(batch)  # stored raw, normalized with the current statistics
            joint_actions, rewards = (
                batch.actions[..., :joint_act],
                batch.actions[..., joint_act:],
            )  # [P, B, A], [P, B, N]
            next_actions = joint_target(agents, batch.next_obs, algo.target_actor)  # [P, B, A]
            diagnose = recorder.diagnose(updates)

            def update(  # this gradient step's (step and diagnose bound now)
                pipe: GradientPipeline,
                loss: torch.Tensor,
                net: PopMLP,
                name: str,
                names: list[str],
                x: torch.Tensor,
                extra: torch.Tensor | None = None,
                step: int = step,
                diagnose: bool = diagnose,
            ) -> UpdateStats:
                """Step ``pipe`` on ``loss`` [P]; a member it finds diverged is located in ``net`` on ``x``."""
                result = pipe.step(loss, step, diagnose)
                recorder.locate_divergence(result, partial(locate, [net], [name], names, x, extra, result))
                return result

            recorder.inject_param(agents[0].critic, step)  # debug.inject.what=param poisons agent 0's critic
            results, stats, record = {}, {}, {}
            if share:  # one critic on every agent's reward; one actor loss on every agent's action
                net = agents[0]
                critic_loss, q, target = shared_critic_loss(
                    net, batch, joint_actions, next_actions, rewards, algo.gamma
                )
                critic_step = (net.critic_pipe, critic_loss, net.critic, "shared.critic", net.critic_names)
                critic_step += (batch.obs, joint_actions)
                if not algo.actor_first:
                    critic_update = update(*critic_step)
                net.critic.requires_grad_(False)  # the actor's loss moves the actor only
                noises = [
                    gumbel(
                        torch.from_numpy(ctx.streams.uniform(algo.batch_size * a.space.action_dim)).float().to(device)
                    )
                    for a in agents
                ]
                actor_loss = shared_actor_loss(net, agents, batch.obs, noises, algo)
                net.critic.requires_grad_(True)
                actor_update = update(
                    net.actor_pipe, actor_loss, net.actor, "shared.actor", net.actor_names, batch.obs[..., net.obs]
                )
                if algo.actor_first:  # the actor's loss saw the critic before this step's update
                    critic_update = update(*critic_step)
                intervene_actors[0](updates + 1, batch.obs[..., net.obs])
                results = {"shared/actor_": actor_update, "shared/critic_": critic_update}
                stats = q_stats("shared", q.detach(), target)
                if diagnose:
                    record = instruments(net, batch.obs, joint_actions, target, actor_update, critic_update, cfg)
            else:
                for agent in agents:
                    i = agent.index
                    target = critic_target(
                        agent, batch.next_obs, next_actions, rewards[..., i], batch.terminated, algo.gamma
                    )
                    agent.critic.train()
                    q = agent.critic(batch.obs, joint_actions).squeeze(-1)  # [P, B]
                    agent.critic.eval()
                    critic_loss = (q - target).square().mean(1)  # [P]
                    critic_step = (agent.critic_pipe, critic_loss, agent.critic, f"{agent.name}.critic")
                    critic_step += (agent.critic_names, batch.obs, joint_actions)
                    if not algo.actor_first:
                        critic_update = update(*critic_step)

                    agent.critic.requires_grad_(False)  # the actor's loss moves the actor only
                    agent.actor.train()
                    out = agent.actor(batch.obs[..., agent.obs])  # [P, B, A_i]
                    agent.actor.eval()
                    noise = gumbel(
                        torch.from_numpy(ctx.streams.uniform(algo.batch_size * agent.space.action_dim))
                        .float()
                        .reshape(out.shape)
                        .to(device)
                    )
                    mine = policy_actions(agent, out, noise, algo)
                    pieces = [joint_actions[..., : act_slices[i].start], mine, joint_actions[..., act_slices[i].stop :]]
                    actor_loss = -agent.critic(batch.obs, torch.cat(pieces, -1)).squeeze(-1).mean(1)  # [P]
                    if agent.squash is None and algo.policy_reg > 0:
                        actor_loss = actor_loss + algo.policy_reg * out.square().mean((1, 2))
                    agent.critic.requires_grad_(True)
                    actor_update = update(
                        agent.actor_pipe,
                        actor_loss,
                        agent.actor,
                        f"{agent.name}.actor",
                        agent.actor_names,
                        batch.obs[..., agent.obs],
                    )
                    if algo.actor_first:
                        critic_update = update(*critic_step)
                    intervene_actors[i](updates + 1, batch.obs[..., agent.obs])
                    results[f"{agent.name}/actor_"] = actor_update
                    results[f"{agent.name}/critic_"] = critic_update
                    stats |= q_stats(agent.name, q.detach(), target)
                    if diagnose:
                        record |= instruments(agent, batch.obs, joint_actions, target, actor_update, critic_update, cfg)
            intervene_critics(updates + 1, batch.obs, joint_actions)
            for agent in owners:
                if algo.target_actor:
                    soft_update_(agent.actor_target, agent.actor, algo.tau)
                soft_update_(agent.critic_target, agent.critic, algo.tau)
            recorder.record_update(results, stats)
            if diagnose:
                grad_norm = torch.stack([u.grad_norm_pre_clip for u in results.values()]).amax(0)  # [P]
                q_abs = torch.stack([record[f"{a.name}/q/abs_max"] for a in owners]).amax(0)
                recorder.record_instruments(
                    record,
                    step,
                    grad_norm,
                    q_abs_max=q_abs,
                    reward_scale=ctx.reward_range.r_max,
                    output_layer=f"{agents[0].name}.critic.{len(agents[0].critic.layers) - 1}",
                    update=updates,
                )
            updates += 1


def shared_critic_loss(
    net: Agent,
    batch: Batch,
    joint_actions: torch.Tensor,
    next_actions: torch.Tensor,
    rewards: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A shared critic's loss [P]: mean over agents i and the batch of (Q(x, a) - y_i)^2, y_i = r_i +
    gamma (1 - terminated) Q'(x', a') (no gradient); with Q(x, a) [P, B] and the targets [P, B, N].
    ``rewards`` [P, B, N] every agent's, ``next_actions`` [P, B, A] the target actor's joint action."""
    target = critic_target(net, batch.next_obs, next_actions, rewards, batch.terminated, gamma)  # [P, B, N]
    net.critic.train()
    q = net.critic(batch.obs, joint_actions).squeeze(-1)  # [P, B]
    net.critic.eval()
    return td_errors(q, target).square().mean(1), q, target


def shared_actor_loss(
    net: Agent, agents: list[Agent], obs: torch.Tensor, noises: list[torch.Tensor], algo: MADDPGConfig
) -> torch.Tensor:
    """A shared actor's loss [P]: -mean Q(x, a_1..a_N) with every agent's action from the current actor
    on its own observation (``policy_actions``: Gumbel-softmax with agent i's noise ``noises[i]``, flat
    [B * A_i] per member, or the squashed output), plus policy_reg times the agents' mean squared logits
    (discrete)."""
    net.actor.train()
    outs = [net.actor(obs[..., agent.obs]) for agent in agents]  # [P, B, A_i] each
    net.actor.eval()
    actions = [policy_actions(a, out, noise.reshape(out.shape), algo) for a, out, noise in zip(agents, outs, noises)]
    loss = -net.critic(obs, torch.cat(actions, -1)).squeeze(-1).mean(1)
    if net.squash is None and algo.policy_reg > 0:
        loss = loss + algo.policy_reg * member_sum(out.square().mean((1, 2)) for out in outs) / len(outs)
    return loss


def q_stats(name: str, q: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-member Q statistics of a critic update ([P] each): Q(x, a) [P, B] against its targets [P, B]
    (one agent's) or [P, B, N] (every agent's reward, a shared critic)."""
    td = td_errors(q, target)
    return {
        f"{name}/q_mean": q.mean(1),
        f"{name}/q_std": batch_std(q),
        f"{name}/q_max": q.amax(1),
        f"{name}/td_abs_mean": td.abs().mean(1),
    }


def instruments(
    agent: Agent,
    obs: torch.Tensor,
    joint_actions: torch.Tensor,
    target: torch.Tensor,
    actor_update: UpdateStats,
    critic_update: UpdateStats,
    cfg: Config,
) -> dict[str, torch.Tensor]:
    """Agent i's instrument record ([P] each): its actor's and critic's layers, gradient norms before and
    after clipping per layer, Q and TD statistics, and its actor's output saturation (discrete: the
    fraction of samples whose largest action probability is > 0.99; continuous: |tanh| > 0.99)."""
    name = agent.name
    out, stats = activity_instruments(agent.actor, f"{name}.actor", obs[..., agent.obs], cfg.diagnostics)
    q, critic_stats = activity_instruments(agent.critic, f"{name}.critic", obs, cfg.diagnostics, joint_actions)
    stats.update(critic_stats)
    stats.update(update_instruments(actor_update, agent.actor_names))
    stats.update(update_instruments(critic_update, agent.critic_names))
    with torch.no_grad():
        q = q.squeeze(-1)
        td = td_errors(q, target)
        stats |= {
            f"{name}/q/mean": q.mean(1),
            f"{name}/q/std": batch_std(q),
            f"{name}/q/abs_max": q.abs().amax(1),
            f"{name}/td/abs_max": td.abs().amax(1),
            f"{name}/actor_grad_norm": actor_update.grad_norm_pre_clip,
            f"{name}/actor_grad_norm_post_clip": actor_update.grad_norm_post_clip,
            f"{name}/critic_grad_norm": critic_update.grad_norm_pre_clip,
            f"{name}/critic_grad_norm_post_clip": critic_update.grad_norm_post_clip,
        }
        if agent.squash is None:
            stats[f"{name}/policy/saturated"] = (torch.softmax(out, -1).amax(-1) > 0.99).float().mean(1)
            stats[f"{name}/policy/logit_abs_max"] = out.abs().amax((1, 2))
        else:
            stats[f"{name}/policy/saturated"] = (torch.tanh(out).abs() > 0.99).float().mean((1, 2))
    return {k: v.float() for k, v in stats.items()}
