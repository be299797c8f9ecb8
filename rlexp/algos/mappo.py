"""MAPPO (Yu et al. 2022) for a population of members: PPO with a centralized value function.

Reads top to bottom: per agent a policy on its own observation (or, with ``share_parameters``, one
policy for every agent, which then also sees its agent's one-hot index unless ``agent_index`` is off;
continuous actions as ``continuous_policy`` says: ``rlexp.algos.common.Actor``) and one centralized critic
V(x) -> [N] on the joint observation x (one value per agent, each agent's own reward; with
``shared_value`` one value, used for every agent's reward) -> per rollout
``num_steps`` vector steps of acting -> GAE per agent -> ``update_epochs`` passes over
``num_minibatches`` shuffled minibatches (each member shuffles with its own stream). The losses are
PPO's (``rlexp.algos.common.ppo_losses``, per agent, advantages normalized per member and agent):
    actor loss  = mean over agents of (clipped surrogate_i - ent_coef * entropy_i)
    critic loss = vf_coef * mean over agents of value loss_i
With separate policies each agent's term moves only its own policy; with a shared one the mean is
the loss over every agent's samples. Episodes reset at once (``rlexp.envs.marl``): a truncated step
bootstraps from V(its final observation), a terminated one from 0, and GAE never crosses an
episode's end. Observations are normalized when ``obs_norm`` is on; rewards are used as they are
(``reward_norm`` is not read) and the learning rate stays constant (``anneal_lr`` is not read).
Evaluation plays each policy's deterministic action (argmax, the Gaussian's mean clipped to the box, or
tanh_normal's squashed location).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch.nn import functional as F

from rlexp.algos.common import Actor, Minibatch, gae, locate, ppo_losses
from rlexp.config.schema import DiagnosticsConfig, MAPPOConfig
from rlexp.diagnostics.collapse import ActionWindow
from rlexp.diagnostics.instruments import activity_instruments, parameter_names, update_instruments
from rlexp.nn.nets import PopMLP, member_sum
from rlexp.optim.pipeline import UpdateStats
from rlexp.run.context import RunContext
from rlexp.run.evaluation import Networks, Policy


class Policies:
    """The agents' policies: one ``Actor`` per agent, or one shared by all (its input: the agent's
    observation and its one-hot index)."""

    def __init__(self, ctx: RunContext, shared: bool) -> None:
        env = ctx.env
        self.agents, self.slices, self.shared = env.agents, env.slices, shared
        n = len(self.agents)
        self.index = shared and ctx.cfg.algo.agent_index  # a shared policy sees its agent's one-hot index
        extra = n if self.index else 0
        count = 1 if shared else n
        self.actors = [
            Actor.build(
                ctx,
                self.agents[i].obs_dim + extra,
                self.agents[i].action_dim,
                None if self.agents[i].discrete else (self.agents[i].low, self.agents[i].high),
            )
            for i in range(count)
        ]
        for actor in self.actors:
            actor.eval()

    def actor(self, i: int) -> Actor:
        return self.actors[0 if self.shared else i]

    def inputs(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Agent i's policy input from joint observations [..., D]: its slice (and its index, shared)."""
        own = x[..., self.slices[i]]
        if not self.index:
            return own
        index = F.one_hot(torch.tensor(i), len(self.agents)).to(own).expand(*own.shape[:-1], -1)
        return torch.cat([own, index], -1)

    def outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Every agent's policy output [P, B, A_i] on joint observations x [P, B, D]."""
        return [self.actor(i).net(self.inputs(x, i)) for i in range(len(self.agents))]


def mappo_losses(
    policies: Policies,
    obs: torch.Tensor,
    minibatches: list[Minibatch],
    new_values: torch.Tensor,
    algo: MAPPOConfig,
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """One minibatch's losses: the actor loss [P] of each policy (separate: agent i's own PPO actor loss;
    shared: the mean over agents) and every PPO loss and statistic averaged over agents ([P] each).
    ``obs`` [P, M, D] joint observations, ``minibatches[i]`` agent i's actions, old log-probs,
    advantages, returns and values, ``new_values`` [P, M, N] the centralized critic's."""
    per_agent = []
    for i, (out, mb) in enumerate(zip(policies.outputs(obs), minibatches)):
        log_prob, entropy = policies.actor(i).log_prob_entropy(None, mb.actions, out)
        per_agent.append(ppo_losses(log_prob, entropy, new_values[..., i], mb, algo))
    mean = {key: member_sum(losses[key] for losses in per_agent) / len(per_agent) for key in per_agent[0]}
    actor_losses = [mean["actor_loss"]] if policies.shared else [losses["actor_loss"] for losses in per_agent]
    return actor_losses, mean


def evaluation_policy(policies: Policies, device: torch.device) -> Policy:
    """The deterministic joint policy: normalized joint observations [P, N, D] -> one action array per
    agent (``Actor.mode``: argmax of the logits, the Gaussian's mean clipped to the box, or tanh_normal's
    squashed location)."""

    def act(obs: np.ndarray) -> list[np.ndarray]:
        with torch.no_grad():
            outs = policies.outputs(torch.from_numpy(obs).to(device))
        return [policies.actor(i).mode(out, a.low, a.high) for i, (out, a) in enumerate(zip(outs, policies.agents))]

    return act


@dataclass
class Built(Networks):
    """MAPPO's networks (``actor<j>``, ``critic``) with the policies that hold the actors."""

    policies: Policies | None = None


def build(ctx: RunContext) -> Built:
    """The agents' policies (one shared, or one per agent) and the centralized critic, and the
    policies' deterministic joint action."""
    algo, n = ctx.cfg.algo, len(ctx.env.agents)
    policies = Policies(ctx, algo.share_parameters)
    critic = ctx.make_net(ctx.env.obs_dim, 1 if algo.shared_value else n, role="critic")  # V(x): per agent, or one
    critic.eval()
    nets = {f"actor{j}": a for j, a in enumerate(policies.actors)} | {"critic": critic}
    return Built(nets, evaluation_policy(policies, ctx.device), policies)


def train(ctx: RunContext) -> None:
    """Train a MAPPO population (see the module docstring)."""
    cfg, env, device, recorder = ctx.cfg, ctx.env, ctx.device, ctx.recorder
    algo: MAPPOConfig = cfg.algo
    members, E, D, agents = env.members, env.num_envs, env.obs_dim, env.agents
    n, T = len(agents), algo.num_steps
    built = build(ctx)
    policies, critic = built.policies, built.nets["critic"]
    actor_pipes = [ctx.make_pipeline(actor) for actor in policies.actors]
    critic_pipe = ctx.make_pipeline(critic)
    actor_names = [parameter_names(a.net, f"actor{j}") for j, a in enumerate(policies.actors)]
    critic_names = parameter_names(critic, "critic")
    recorder.evaluate_with(built.policy)
    window = ActionWindow(agents, members, cfg.diagnostics)
    recorder.window = window

    obs_buf = torch.zeros(T, members, E, D, device=device)  # normalized, as the networks saw them
    actions_buf = [torch.zeros(T, members, E, *(() if a.discrete else (a.action_dim,)), device=device) for a in agents]
    log_probs, values, next_values, rewards = (torch.zeros(T, members, E, n, device=device) for _ in range(4))
    terminated, dones = torch.zeros(T, members, E, device=device), torch.zeros(T, members, E, device=device)
    updates, t = 0, 0
    obs = env.reset()
    ctx.obs_norm.update(obs)
    saved = {f"actor{j}": a for j, a in enumerate(policies.actors)} | {"critic": critic, "critic_pipe": critic_pipe}
    saved |= {f"actor{j}_pipe": pipe for j, pipe in enumerate(actor_pipes)}
    collected = (obs_buf, *actions_buf, log_probs, values, next_values, rewards, terminated, dones)  # [T, P, ...]
    loop = ctx.checkpoint_state(
        saved,
        lambda: (
            {f"rollout_{i}": x.transpose(0, 1) for i, x in enumerate(collected)}  # [P, T, ...] views
            | dict(obs=obs, t=t, updates=updates)
            | window.checkpoint()
        ),
    )
    if loop:  # continued from a checkpoint
        t, updates = loop["t"], loop["updates"]
        window.restore(loop)
    for step in recorder.steps():
        # act: sample every agent's policy, each member from its own stream
        x = torch.from_numpy(ctx.obs_norm(obs)).to(device)  # [P, E, D]
        env_actions = []
        with torch.no_grad():
            for i, out in enumerate(policies.outputs(x)):
                a, actor = agents[i], policies.actor(i)
                u = torch.from_numpy(ctx.streams.uniform(E * a.action_dim).reshape(members, E, a.action_dim)).float()
                action = actor.sample(out, u.to(device))
                log_probs[t, ..., i] = actor.log_prob(out, action)
                actions_buf[i][t] = action  # tanh_normal: the pre-squash sample
                env_actions.append(action.cpu().numpy() if a.discrete else actor.env_action(action, a.low, a.high))
                window.add(i, env_actions[-1], actor.location(out))
            values[t] = critic(x)
        result, agent_reward = ctx.step_env(env_actions, step)  # agent_reward: [P, E, N]
        with torch.no_grad():  # V(the step's last observation): the bootstrap of a truncated step too
            next_values[t] = critic(torch.from_numpy(ctx.obs_norm(result.obs)).to(device))
        obs_buf[t] = x
        rewards[t] = torch.from_numpy(agent_reward).float()
        terminated[t] = torch.from_numpy(result.terminated).float()
        dones[t] = torch.from_numpy(result.terminated | result.truncated).float()
        obs = result.next_obs
        t += 1
        if t < T:
            continue
        t = 0

        # GAE per agent: agents as extra environments [T, P, E * N]
        def flat(v: torch.Tensor) -> torch.Tensor:
            return v.reshape(T, members, E * n)

        def per_agent(v: torch.Tensor) -> torch.Tensor:
            return v.unsqueeze(-1).expand(T, members, E, n)

        adv, ret = gae(
            flat(rewards),
            flat(values),
            flat(next_values),
            flat(per_agent(terminated)),
            flat(per_agent(dones)),
            algo.gamma,
            algo.gae_lambda,
        )
        adv, ret = adv.view(T, members, E, n), ret.view(T, members, E, n)
        batch = T * E
        size = batch // algo.num_minibatches
        samples = [
            x.transpose(0, 1).reshape(members, batch, *x.shape[3:]) for x in (obs_buf, log_probs, adv, ret, values)
        ]
        obs_s, logp_s, adv_s, ret_s, val_s = samples  # [P, T*E, ...]
        act_s = [a.transpose(0, 1).reshape(members, batch, *a.shape[3:]) for a in actions_buf]
        for _ in range(algo.update_epochs):
            order = torch.from_numpy(np.argsort(ctx.streams.uniform(batch), axis=1)).to(device)  # [P, T*E]
            for m in range(algo.num_minibatches):
                idx = order[:, m * size : (m + 1) * size]  # [P, M]

                def take(v: torch.Tensor, idx: torch.Tensor = idx) -> torch.Tensor:
                    return v.gather(1, idx.view(*idx.shape, *([1] * (v.dim() - 2))).expand(-1, -1, *v.shape[2:]))

                mb_obs = take(obs_s)
                mbs = [
                    Minibatch(
                        mb_obs,
                        take(act_s[i]),
                        take(logp_s)[..., i],
                        take(adv_s)[..., i],
                        take(ret_s)[..., i],
                        take(val_s)[..., i],
                    )
                    for i in range(n)
                ]
                for actor in policies.actors:
                    actor.train()
                critic.train()
                actor_losses, losses = mappo_losses(policies, mb_obs, mbs, critic(mb_obs).expand(-1, -1, n), algo)
                for actor in policies.actors:
                    actor.eval()
                critic.eval()
                diagnose = recorder.diagnose(updates)
                results = {}
                for j, (pipe, loss) in enumerate(zip(actor_pipes, actor_losses)):  # each reaches its own policy
                    results[f"actor{j}_"] = pipe.step(loss, step, diagnose)
                results["critic_"] = critic_pipe.step(losses["critic_loss"], step, diagnose)
                for j, a in enumerate(policies.actors):
                    recorder.locate_divergence(
                        results[f"actor{j}_"],
                        partial(locate, [a.net], [f"actor{j}"], actor_names[j], mb_obs, None, results[f"actor{j}_"]),
                    )
                recorder.locate_divergence(
                    results["critic_"],
                    partial(locate, [critic], ["critic"], critic_names, mb_obs, None, results["critic_"]),
                )
                recorder.record_update(
                    results, {k: losses[k] for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")}
                )
                if diagnose:
                    record = instruments(policies, critic, mb_obs, results, actor_names, critic_names, cfg.diagnostics)
                    grad_norm = torch.stack([u.grad_norm_pre_clip for u in results.values()]).amax(0)  # [P]
                    recorder.record_instruments(
                        record,
                        step,
                        grad_norm,
                        q_abs_max=record["v/abs_max"],
                        reward_scale=ctx.reward_range.r_max,
                        output_layer=f"critic.{len(critic.layers) - 1}",
                        update=updates,
                    )
                updates += 1


def instruments(
    policies: Policies,
    critic: PopMLP,
    obs: torch.Tensor,
    results: dict[str, UpdateStats],
    actor_names: list[list[str]],
    critic_names: list[str],
    diag: DiagnosticsConfig,
) -> dict[str, torch.Tensor]:
    """Per-member instrument record ([P] each) after a diagnosed update on joint observations ``obs``
    [P, M, D]: each policy's layers (``actor{j}``; a shared policy on agent 0's input) and the critic's,
    their per-layer gradient norms before and after clipping, parameter norms and update ratios, and
    the centralized values (``v/*`` over every agent's value)."""
    stats: dict[str, torch.Tensor] = {}
    for j, actor in enumerate(policies.actors):
        stats |= activity_instruments(actor.net, f"actor{j}", policies.inputs(obs, j), diag)[1]
        stats |= update_instruments(results[f"actor{j}_"], actor_names[j])
    v, critic_stats = activity_instruments(critic, "critic", obs, diag)  # [P, M, N]
    stats |= critic_stats | update_instruments(results["critic_"], critic_names)
    stats |= {
        "v/mean": v.mean((1, 2)),
        "v/min": v.amin((1, 2)),
        "v/max": v.amax((1, 2)),
        "v/abs_max": v.abs().amax((1, 2)),
    }
    return {k: x.float() for k, x in stats.items()}
