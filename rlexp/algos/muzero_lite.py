"""MuZero-lite: a value-equivalent model trained on K-step unrolls, acting by a one-step lookahead.

No tree search. Three population networks, trained together by one gradient pipeline (one loss):
    representation h(o) -> s            dynamics g(s, a) -> (s', r_hat)       prediction f(s) -> (logits, v_hat)
Each hidden state is min-max scaled to [0, 1] per sample (MuZero's), s = (x - min x) / (max x - min x).

Reads top to bottom: networks and their EMA targets -> replay of trajectories -> per step: epsilon-greedy
act from the lookahead, store, and every ``train_frequency`` env steps ``gradient_steps`` updates.

Acting (and evaluation, greedy): q(o, a) = r_hat(s, a) + gamma * v_hat(g(s, a)), s = h(o); a = argmax_a q.

The update, per member, on B windows of L = K + n consecutive steps j = 0 .. L-1 of one environment:
    s_0 = h(o_0);  s_k, r_hat_k = g(s'_{k-1}, a_{k-1}),  s'_k = scale_gradient(s_k, dynamics_grad_scale)
        (MuZero's pseudocode: the scaling follows every dynamics step; the root state is not scaled)
    logits_k, v_hat_k = f(s_k)                                                       k = 0 .. K
    loss = l_0 + (1/K) sum_{k=1..K} l_k      (MuZero scales each unroll step's loss by 1/K)
    l_k = mean_B [value_coef w^v_k (v_hat_k - z_k)^2 + w^r_k (r_hat_k - u_k)^2 + policy_coef w^p_k CE(pi_k, logits_k)]
Step j of a window is live when it is a stored step of the window's episode. Targets (no gradient):
    z_k = sum_{m=0}^{b-k} gamma^m r_{k+m} + gamma^{b-k+1} (1 - terminated_b) v_target(o'_b)   for live k,
        b the last live step in k .. k+n-1 (the n-step return, cut at the episode's end or the newest step;
        bootstrapped from the target model: EMA copies of h, g and f, tau = algo.tau)
    z_k = 0 after a termination (an absorbing state), u_k = r_{k-1} or 0 after a termination,
    pi_k = softmax(q_target(o_k, .) / policy_temperature), the target model's one-step lookahead (live k)
    Weights w are 1 where the target is known (live, or after a termination; the policy: live) and 0 past
    a truncation or the newest step.
L2 weight decay is ``regularization.l2`` (on the weights; the algorithm's yaml sets MuZero's 1e-4); the
clipping group clips the update's whole gradient, after backward: a different operation from
scale_gradient, which scales the gradient flowing back through the hidden state inside the unroll.

Instruments (docs/muzero.md): per unroll step k, ``grad_norm/unroll_<k>/repr`` = ||d l_k' / d s_0|| (l_k' =
l_0 or l_k / K: the gradient that step's loss sends into the representation network's output, before
clipping) and ``grad_norm/hidden_<k>`` = ||d loss / d s_k|| (what reaches the network producing s_k).
"""

from __future__ import annotations

import copy
import dataclasses
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from rlexp.algos.common import check_replay, epsilon, epsilon_greedy
from rlexp.config.schema import ConfigError, DiagnosticsConfig, MuZeroLiteConfig
from rlexp.data.buffers import SequenceBatch, SequenceReplay
from rlexp.diagnostics.instruments import (
    activity_instruments,
    locate_in_update,
    locate_nonfinite,
    parameter_names,
    update_instruments,
)
from rlexp.diagnostics.interventions import Subject
from rlexp.nn.nets import PopMLP, member_sum, scale_gradient, soft_update_
from rlexp.optim.pipeline import UpdateStats
from rlexp.run.context import RunContext
from rlexp.run.evaluation import Networks, Policy
from rlexp.run.recorder import Located

ROLES = (("repr", "h"), ("dyn", "g"), ("pred", "f"))  # each network's instrument prefix, the model's attribute


class Model(nn.Module):
    """h, g and f of a population: states [P, B, state_dim], actions [P, B] long."""

    def __init__(self, h: PopMLP, g: PopMLP, f: PopMLP, n_actions: int) -> None:
        super().__init__()
        self.h, self.g, self.f, self.n_actions = h, g, f, n_actions

    @staticmethod
    def scale(x: torch.Tensor) -> torch.Tensor:
        """Min-max scaling of each hidden state to [0, 1] over its units: [P, B, S] -> [P, B, S]."""
        low, high = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
        return (x - low) / (high - low).clamp_min(1e-5)

    def represent(self, obs: torch.Tensor) -> torch.Tensor:
        """s = h(o): [P, B, obs] -> [P, B, S]."""
        return self.scale(self.h(obs))

    def dynamics(self, s: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(s', r_hat) = g(s, a): [P, B, S], [P, B] -> [P, B, S], [P, B]."""
        out = self.g(s, F.one_hot(action, self.n_actions).to(s.dtype))  # [P, B, S + 1]
        return self.scale(out[..., :-1]), out[..., -1]

    def predict(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(policy logits, v_hat) = f(s): [P, B, S] -> [P, B, A], [P, B]."""
        out = self.f(s)  # [P, B, A + 1]
        return out[..., :-1], out[..., -1]

    def lookahead(self, obs: torch.Tensor, gamma: float) -> torch.Tensor:
        """q(o, a) = r_hat(s, a) + gamma * v_hat(g(s, a)) for every action: [P, B, obs] -> [P, B, A]."""
        s = self.represent(obs)  # [P, B, S]
        members, batch, width = s.shape
        every = s.unsqueeze(2).expand(members, batch, self.n_actions, width).reshape(members, -1, width)
        actions = torch.arange(self.n_actions, device=s.device).repeat(batch).expand(members, -1)  # [P, B * A]
        s_next, reward = self.dynamics(every, actions)
        value = self.predict(s_next)[1]
        return (reward + gamma * value).view(members, batch, self.n_actions)


def evaluation_policy(model: Model, gamma: float, device: torch.device) -> Policy:
    """The greedy lookahead policy: normalized observations [P, N, obs] -> actions [P, N]."""

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model.lookahead(torch.from_numpy(obs).to(device), gamma).argmax(-1).cpu().numpy()

    return act


@dataclasses.dataclass
class Targets:
    """The unroll's targets and weights, k = 0 .. K (rewards: k = 1 .. K at index k - 1)."""

    value: torch.Tensor  # [P, B, K + 1] z_k
    value_weight: torch.Tensor  # [P, B, K + 1]
    reward: torch.Tensor  # [P, B, K] u_k
    reward_weight: torch.Tensor  # [P, B, K]
    policy: torch.Tensor  # [P, B, K + 1, A] pi_k
    policy_weight: torch.Tensor  # [P, B, K + 1]


def live_steps(batch: SequenceBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(live, absorbing) [P, B, L] bool: step j is a stored step of the window's first episode; step j
    follows that episode's termination."""
    stored = batch.stored.long().cumprod(-1).bool()  # every step up to j stored, in order
    ended = F.pad(batch.done.cumsum(-1)[..., :-1], (1, 0)) > 0  # the episode ended before step j
    live = stored & ~ended
    terminated_live = (batch.terminated > 0) & live
    absorbing = F.pad(terminated_live.long().cumsum(-1)[..., :-1], (1, 0)) > 0
    return live, absorbing


@torch.no_grad()
def unroll_targets(target: Model, batch: SequenceBatch, algo: MuZeroLiteConfig) -> Targets:
    """The targets of one update (see the module docstring) from the target model."""
    K, n, gamma = algo.unroll_steps, algo.td_steps, algo.gamma
    live, absorbing = live_steps(batch)
    livef = live.float()
    members, size, length = live.shape
    boot = target.predict(target.represent(batch.next_obs.reshape(members, -1, batch.next_obs.shape[-1])))[1]
    boot = boot.view(members, size, length) * (1.0 - batch.terminated)  # [P, B, L] v_target(o'_j), 0 if terminal
    powers = gamma ** torch.arange(n + 1, dtype=livef.dtype, device=livef.device)  # [n + 1]
    values = []
    for k in range(K + 1):
        window = livef[..., k : k + n]  # [P, B, n] (live steps form a prefix)
        ret = (window * batch.rewards[..., k : k + n] * powers[:n]).sum(-1)
        count = window.sum(-1).long()  # b - k + 1
        last = (k + count - 1).clamp_min(0)  # b
        bootstrap = boot.gather(-1, last.unsqueeze(-1)).squeeze(-1) * powers[count]
        values.append(torch.where(live[..., k], ret + bootstrap, torch.zeros_like(ret)))
    obs = batch.obs[:, :, : K + 1]  # [P, B, K + 1, obs]
    q = target.lookahead(obs.reshape(members, -1, obs.shape[-1]), gamma)  # [P, B * (K + 1), A]
    policy = torch.softmax(q / algo.policy_temperature, -1).view(members, size, K + 1, -1)
    known = (live | absorbing).float()
    return Targets(
        value=torch.stack(values, -1),
        value_weight=known[..., : K + 1],
        reward=batch.rewards[..., :K] * livef[..., :K],
        reward_weight=known[..., :K],
        policy=policy,
        policy_weight=livef[..., : K + 1],
    )


@dataclasses.dataclass
class Unroll:
    """The model's predictions along the unroll, k = 0 .. K."""

    states: list[torch.Tensor]  # K + 1 of [P, B, S] s_k (before the gradient scaling)
    values: torch.Tensor  # [P, B, K + 1]
    rewards: torch.Tensor  # [P, B, K] r_hat_k, k = 1 .. K
    logits: torch.Tensor  # [P, B, K + 1, A]


def unroll(model: Model, obs: torch.Tensor, actions: torch.Tensor, grad_scale: float) -> Unroll:
    """Unroll the model from o_0 [P, B, obs] along actions [P, B, K], scaling the gradient through the
    hidden state by ``grad_scale`` after each dynamics step."""
    s = model.represent(obs)
    states, values, rewards, logits = [s], [], [], []
    for k in range(actions.shape[-1] + 1):
        logit, value = model.predict(s)
        values.append(value)
        logits.append(logit)
        if k == actions.shape[-1]:
            break
        s, reward = model.dynamics(s if k == 0 else scale_gradient(s, grad_scale), actions[..., k])
        states.append(s)
        rewards.append(reward)
    return Unroll(states, torch.stack(values, -1), torch.stack(rewards, -1), torch.stack(logits, -2))


def step_losses(out: Unroll, targets: Targets, algo: MuZeroLiteConfig) -> torch.Tensor:
    """Each unroll step's loss [K + 1, P], already scaled (l_0 and l_k / K); the update's loss is their sum."""
    K = algo.unroll_steps
    value = algo.value_coef * targets.value_weight * (out.values - targets.value).square()  # [P, B, K + 1]
    reward = F.pad(targets.reward_weight * (out.rewards - targets.reward).square(), (1, 0))
    cross_entropy = -(targets.policy * torch.log_softmax(out.logits, -1)).sum(-1)
    policy = algo.policy_coef * targets.policy_weight * cross_entropy
    # [P, K + 1]: the mean over the batch as an inner reduction, whose sums do not depend on P
    per_step = (value + reward + policy).transpose(1, 2).contiguous().mean(-1)
    scale = torch.full((K + 1,), 1.0 / K, dtype=per_step.dtype, device=per_step.device)
    scale[0] = 1.0
    return (per_step * scale).T


def representation_grad_norms(losses: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
    """||d losses[k] / d s_0|| per member [K + 1, P]: the gradient each unroll step's (scaled) loss sends
    into the representation network's output s_0 [P, B, S] (members are independent: the sum's gradient
    with respect to member p's s_0 is member p's)."""
    norms = []
    for loss in losses:
        (grad,) = torch.autograd.grad(loss.sum(), root, retain_graph=True, allow_unused=True)
        norms.append(torch.zeros_like(loss) if grad is None else grad.flatten(1).norm(dim=1))
    return torch.stack(norms)


def locate(model: Model, obs: torch.Tensor, names: list[str], update: UpdateStats, member: int, cause: str) -> Located:
    """Where member ``member``'s non-finite update was born: the representation's forward on the
    replayed observations [P, B, obs], the prediction's and dynamics' on its states, then the loss,
    the gradients and the parameters after the step."""
    found = locate_nonfinite(model.h, "repr", member, obs[member], "replay.obs")
    if found is None:
        with torch.no_grad():
            s = model.represent(obs)
        found = locate_nonfinite(model.f, "pred", member, s[member], "repr.state")
        if found is None:
            one_hot = torch.zeros(s.shape[1], model.n_actions, device=s.device)
            found = locate_nonfinite(model.g, "dyn", member, s[member], "repr.state", one_hot)
    if found is not None:
        return found
    return locate_in_update(cause, names, list(model.parameters()), member, update)


def instruments(
    model: Model,
    batch: SequenceBatch,
    out: Unroll,
    targets: Targets,
    update: UpdateStats,
    names: list[str],
    repr_norms: torch.Tensor,
    hidden_norms: list[torch.Tensor],
    diag: DiagnosticsConfig,
) -> dict[str, torch.Tensor]:
    """Per-member instrument record ([P] each): each network's layers, the value and reward predictions,
    and the gradient norms per unroll step."""
    obs = batch.obs[:, :, 0]
    s, stats = activity_instruments(model.h, "repr", obs, diag)
    s = model.scale(s.detach())
    one_hot = F.one_hot(batch.actions[:, :, 0], model.n_actions).float()
    stats.update(activity_instruments(model.g, "dyn", s, diag, one_hot)[1])
    stats.update(activity_instruments(model.f, "pred", s, diag)[1])
    stats.update(update_instruments(update, names))
    with torch.no_grad():
        v, w = out.values.detach(), targets.value_weight
        stats.update(
            {
                "v/mean": v[..., 0].mean(1),
                "v/abs_max": v.abs().amax((1, 2)),
                "v/error_abs_mean": ((v - targets.value).abs() * w).sum((1, 2)) / w.sum((1, 2)).clamp_min(1),
                "reward/error_abs_mean": ((out.rewards.detach() - targets.reward).abs() * targets.reward_weight).sum(
                    (1, 2)
                )
                / targets.reward_weight.sum((1, 2)).clamp_min(1),
            }
        )
    for k, norm in enumerate(repr_norms):
        stats[f"grad_norm/unroll_{k}/repr"] = norm
    for k, norm in enumerate(hidden_norms):
        stats[f"grad_norm/hidden_{k}"] = norm
    return {k: v.float() for k, v in stats.items()}


def check(cfg: DictConfig) -> None:
    """The combinations MuZero-lite needs (ConfigError otherwise): a replay's, and no ReDo."""
    check_replay(cfg)
    if cfg.intervention.name == "redo":
        raise ConfigError(
            "intervention",
            "redo reads each network's own inputs, which muzero_lite's dynamics and prediction take from the unroll",
            "use intervention=shrink_perturb, reset or none with algo=muzero_lite",
        )


def build(ctx: RunContext) -> Networks:
    """The model (h, g, f) and its one-step lookahead's greedy action as the policy."""
    n_actions, width = int(ctx.env.action_space.n), ctx.cfg.algo.state_dim
    model = Model(
        ctx.make_net(ctx.env.obs_dim, width),  # h
        ctx.make_net(width, width + 1, extra_in=n_actions),  # g: (s, one-hot a) -> (s', r_hat)
        ctx.make_net(width, n_actions + 1),  # f: s -> (logits, v_hat)
        n_actions,
    )
    model.eval()  # acting and targets use running statistics when a network has batch norm
    return Networks({"model": model}, evaluation_policy(model, ctx.cfg.algo.gamma, ctx.device))


def train(ctx: RunContext) -> None:
    """Train a MuZero-lite population (see the module docstring)."""
    cfg, env, device, recorder = ctx.cfg, ctx.env, ctx.device, ctx.recorder
    algo: MuZeroLiteConfig = cfg.algo
    members, num_envs = env.members, env.num_envs
    n_actions, K = int(env.action_space.n), algo.unroll_steps

    built = build(ctx)
    model = built.nets["model"]
    target = copy.deepcopy(model)
    target.requires_grad_(False)
    pipeline = ctx.make_pipeline(model)  # one loss, one optimizer over h, g and f; clipping and L2 per member
    intervene = ctx.interventions(
        *(Subject(name, getattr(model, net), pipeline, (getattr(target, net),)) for name, net in ROLES)
    )
    names = [n for name, net in ROLES for n in parameter_names(getattr(model, net), name)]
    buffer = SequenceReplay(members, algo.buffer_size, num_envs, env.obs_dim, device)
    recorder.evaluate_with(built.policy)
    updates = 0

    obs = env.reset()  # [P, E, obs] raw, on the host
    ctx.obs_norm.update(obs)
    prev_step = 0
    learn_from = algo.learning_starts
    saved = {"model": model, "target": target, "pipeline": pipeline, "buffer": buffer, "interventions": intervene}
    loop = ctx.checkpoint_state(saved, lambda: dict(obs=obs, updates=updates, prev_step=prev_step))
    if loop:
        updates, prev_step = loop["updates"], loop["prev_step"]
        learn_from = learn_from if cfg.checkpoint.replay else prev_step + algo.learning_starts

    @torch.no_grad()
    def greedy(obs: np.ndarray) -> np.ndarray:
        """The lookahead's best actions [P, E]."""
        return model.lookahead(torch.from_numpy(ctx.obs_norm(obs)).to(device), algo.gamma).argmax(-1).cpu().numpy()

    for step in recorder.steps():
        # act: epsilon-greedy over the lookahead, each member from its own stream
        eps = epsilon(step, algo.start_e, algo.end_e, algo.exploration_fraction, cfg.total_steps)
        u = ctx.streams.uniform(2 * num_envs)  # [P, 2E]
        actions = epsilon_greedy(u, eps, n_actions, greedy, obs)  # [P, E]
        result, reward = ctx.step_env(actions, step)  # reward: reward_norm's scaling
        done = result.terminated | result.truncated
        buffer.add(obs, actions, reward, result.obs, result.terminated, done)
        obs = result.next_obs
        recorder.note(epsilon=eps)

        # learn
        if step <= learn_from or step // algo.train_frequency == prev_step // algo.train_frequency:
            prev_step = step
            continue
        prev_step = step
        for _ in range(algo.gradient_steps):
            diagnose = recorder.diagnose(updates)
            batch = buffer.sample_windows(ctx.streams.uniform(2 * algo.batch_size), K + algo.td_steps)
            batch = ctx.obs_norm.batch(batch)  # stored raw, normalized with the current statistics
            recorder.inject_param(model.h, step)
            targets = unroll_targets(target, batch, algo)
            model.train()
            out = unroll(model, batch.obs[:, :, 0], batch.actions[:, :, :K], algo.dynamics_grad_scale)
            model.eval()
            losses = step_losses(out, targets, algo)  # [K + 1, P]
            hidden_norms: list[torch.Tensor] = []
            repr_norms = torch.empty(0)
            if diagnose:  # the gradient per unroll step reaching s_0, and reaching each s_k (hooks, per member)
                repr_norms = representation_grad_norms(losses, out.states[0])
                hidden_norms = [torch.empty(0)] * (K + 1)
                for k, s in enumerate(out.states):
                    s.register_hook(partial(_keep_norm, hidden_norms, k))
            update = pipeline.step(member_sum(losses), step, diagnose)
            v = out.values.detach()[..., 0]
            recorder.record_update(update, {"v_mean": v.mean(1), "v_max": v.amax(1)})
            recorder.locate_divergence(update, partial(locate, model, batch.obs[:, :, 0], names, update))
            if diagnose:
                record = instruments(
                    model, batch, out, targets, update, names, repr_norms, hidden_norms, cfg.diagnostics
                )
                recorder.record_instruments(
                    record,
                    step,
                    update.grad_norm_pre_clip,
                    q_abs_max=record["v/abs_max"],
                    reward_scale=ctx.reward_range.r_max,
                    output_layer=f"pred.{len(model.f.layers) - 1}",
                    update=updates,
                )
            updates += 1
            soft_update_(target, model, algo.tau)
            intervene(updates, batch.obs[:, :, 0])


def _keep_norm(norms: list[torch.Tensor], k: int, grad: torch.Tensor) -> None:
    """Backward hook on s_k [P, B, S]: keep its gradient's norm per member [P]."""
    norms[k] = grad.detach().flatten(1).norm(dim=1)
