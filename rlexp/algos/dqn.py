"""DQN for a population of members, with DQN 3.0's switches.

Reads top to bottom: networks -> replay -> per step: epsilon-greedy act, store, and every
``train_frequency`` env steps ``gradient_steps`` updates; hard or soft target updates. Evaluation
plays the greedy policy (``evaluation_policy``; epsilon-greedy with ``eval.epsilon`` > 0).

The update (DeepMind's DQN 3.0, per member):
    r' = r / r_max                       if rescale_r (r_max = largest |r| seen, at least algo.r_max)
    y = r' + gamma * (1 - terminated) * Q_boot(s', argmax)   (no gradient through y)
    delta = y - Q(s, a)                  (the gradient reaches only the chosen action's output)
    Q_boot is the target network, or the online network when target_network=false; double DQN
    picks the argmax with the online network. Truncated episodes bootstrap; terminated ones do not.
    loss = mean over the batch of delta^2 (mse) or Huber(delta); clip_delta > 0 replaces it by the
    Huber form whose gradient with respect to Q(s, a) is exactly clip(delta, -clip_delta, clip_delta).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from rlexp.algos.common import batch_std, check_replay, epsilon, epsilon_greedy
from rlexp.config.schema import DiagnosticsConfig, DQNConfig, require_choice
from rlexp.data.buffers import Batch, FrameStackReplay, ReplayBuffer
from rlexp.diagnostics.instruments import (
    activity_instruments,
    hidden_outputs,
    locate_in_update,
    locate_nonfinite,
    parameter_names,
    update_instruments,
)
from rlexp.diagnostics.interventions import Subject
from rlexp.nn.nets import PopMLP, hard_update_, soft_update_
from rlexp.optim.pipeline import UpdateStats
from rlexp.run.context import RunContext
from rlexp.run.evaluation import Networks, Policy
from rlexp.run.recorder import Located


def evaluation_policy(
    q_values: Callable[[np.ndarray], np.ndarray], n_actions: int, eps: float, uniform: Callable[[int], np.ndarray]
) -> Policy:
    """Greedy actions [P, N] from normalized observations [P, N, obs]; with ``eps`` > 0 epsilon-greedy,
    the random numbers from ``uniform`` (evaluation's own stream, [P, n] per call)."""

    def act(obs: np.ndarray) -> np.ndarray:
        greedy = q_values(obs).argmax(-1)  # [P, N]
        if eps == 0:
            return greedy
        n = obs.shape[1]
        u = uniform(2 * n)  # [P, 2N]
        return np.where(u[:, :n] < eps, (u[:, n:] * n_actions).astype(np.int64), greedy)

    return act


def td_loss(td: torch.Tensor, algo: DQNConfig) -> torch.Tensor:
    """Per-member loss from TD errors td = Q(s,a) - y [P, B] -> [P]."""
    if algo.clip_delta > 0:
        elementwise = F.huber_loss(td, torch.zeros_like(td), reduction="none", delta=algo.clip_delta)
    elif algo.loss == "huber":
        elementwise = F.huber_loss(td, torch.zeros_like(td), reduction="none", delta=algo.huber_delta)
    else:
        elementwise = td.square()
    return elementwise.mean(1)


def td_loss_grad(td: torch.Tensor, algo: DQNConfig) -> torch.Tensor:
    """d(sum of td_loss)/d td [P, B], as autograd computes it: (1/B) * clip(td, -delta, delta) for
    Huber (and clip_delta), (1/B) * 2 td for mse."""
    per_sample = torch.full((), 1.0, dtype=td.dtype, device=td.device) / td.shape[1]  # the mean's gradient
    if algo.clip_delta > 0 or algo.loss == "huber":
        delta = algo.clip_delta if algo.clip_delta > 0 else algo.huber_delta
        return td.clamp(-delta, delta) * per_sample
    return td * 2.0 * per_sample


def td_target(
    q_net: PopMLP,
    target_net: PopMLP | None,
    batch: Batch,
    algo: DQNConfig,
    r_max: torch.Tensor,
    gamma: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """The bootstrap target y [P, B], computed without gradient; ``gamma`` [P, 1]: each member's
    discount (default ``algo.gamma`` for all)."""
    with torch.no_grad():
        boot_net = target_net if target_net is not None else q_net
        boot_net.eval()  # targets use running statistics (batch norm) and a spectral norm's u as it is
        next_q = boot_net(batch.next_obs)  # [P, B, A]
        if algo.double:
            next_action = (q_net(batch.next_obs) if boot_net is not q_net else next_q).argmax(-1, keepdim=True)
            next_value = next_q.gather(-1, next_action).squeeze(-1)  # [P, B]
        else:
            next_value = next_q.max(-1).values  # [P, B]
        rewards = batch.rewards / r_max.unsqueeze(1) if algo.rescale_r else batch.rewards
        not_done = 1.0 - batch.terminated if algo.terminal_masking else 1.0
        return rewards + (algo.gamma if gamma is None else gamma) * not_done * next_value


def dqn_loss(
    q_net: PopMLP,
    target_net: PopMLP | None,
    batch: Batch,
    algo: DQNConfig,
    r_max: torch.Tensor,
    written_backward: bool = False,
    gamma: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-member DQN loss [P] and per-member statistics (Q and TD error) for one batch.

    ``written_backward`` (networks with ``written_backward`` only): no autograd graph; the gradient of
    the loss's sum is written into the online network's ``.grad`` instead, bit for bit what
    ``loss.sum().backward()`` would give. ``gamma`` [P, 1]: per-member discounts (td_target).
    """
    target = td_target(q_net, target_net, batch, algo, r_max, gamma)  # [P, B]
    taken = batch.actions.unsqueeze(-1)  # [P, B, 1]
    q_net.train()  # the loss's forward: batch statistics, a spectral norm's power iteration
    if written_backward:
        q_all, saved = q_net.forward_saved(batch.obs)  # [P, B, A]
    else:
        q_all = q_net(batch.obs)  # [P, B, A]
    q_net.eval()
    q = q_all.gather(-1, taken).squeeze(-1)  # [P, B]
    td = q - target
    q_value, td_abs = q.detach(), td.detach().abs()
    stats = {
        "q_mean": q_value.mean(1),
        "q_max": q_value.amax(1),
        "td_abs_mean": td_abs.mean(1),
        "td_abs_max": td_abs.amax(1),
    }
    if written_backward:  # the gradient reaches only the taken action's output
        grad_q = torch.zeros_like(q_all).scatter_(-1, taken, td_loss_grad(td, algo).unsqueeze(-1))  # [P, B, A]
        q_net.backward_to_grads(saved, grad_q)
    return td_loss(td, algo), stats


def instruments(
    q_net: PopMLP,
    target_net: PopMLP | None,
    batch: Batch,
    algo: DQNConfig,
    r_max: torch.Tensor,
    update: UpdateStats,
    names: list[str],
    diag: DiagnosticsConfig,
    gamma: float | torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per-member, per-layer instrument record ([P] each) after a diagnosed update."""
    q_all, stats = activity_instruments(q_net, "q", batch.obs, diag)  # [P, B, A]
    with torch.no_grad():
        q = q_all.gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)  # [P, B]
        td = q - td_target(q_net, target_net, batch, algo, r_max, gamma)
        stats.update(
            {
                "q/mean": q.mean(1),
                "q/min": q.amin(1),
                "q/max": q.amax(1),
                "q/abs_max": q_all.abs().amax((1, 2)),
                "td/mean": td.mean(1),
                "td/std": batch_std(td),
                "td/abs_max": td.abs().amax(1),
            }
        )
        if target_net is not None:
            q_target = target_net(batch.obs).gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)
            stats["q/online_target_gap"] = (q - q_target).mean(1)
    stats.update(update_instruments(update, names))
    return {k: v.float() for k, v in stats.items()}


def locate(
    q_net: PopMLP,
    target_net: PopMLP | None,
    batch: Batch,
    member: int,
    cause: str,
    names: list[str],
    update: UpdateStats,
) -> Located:
    """Where member ``member``'s non-finite update was born: its parameters and batch, then the
    online and target forward passes layer by layer, then the loss, the gradients (nearest the
    output first) and the parameters after the step. Returns (cause, where, detail)."""
    found = locate_nonfinite(q_net, "q", member, batch.obs[member], "replay.obs")
    if found is None and target_net is not None:
        found = locate_nonfinite(target_net, "q_target", member, batch.next_obs[member], "replay.next_obs")
    if found is not None:
        return found
    if not torch.isfinite(batch.rewards[member]).all():
        return "nonfinite_obs", "replay.reward", "non-finite rewards in the batch"
    return locate_in_update(cause, names, list(q_net.parameters()), member, update)


def histograms(q_net: PopMLP, names: list[str], batch: Batch) -> dict[str, torch.Tensor]:
    """W&B histograms: each parameter's gradient and each hidden layer's output on the batch [P, B, h]."""
    hidden = hidden_outputs(q_net, batch.obs)[1]
    return {f"grad/{n}": p.grad for n, p in zip(names, q_net.parameters())} | {
        f"activation/q.{i}": h for i, h in enumerate(hidden)
    }


def check(cfg: DictConfig) -> None:
    """The combinations DQN needs (ConfigError otherwise): a replay's, and its two choices."""
    check_replay(cfg)
    require_choice(cfg.algo.target_update, "algo.target_update", ("hard", "soft"))
    require_choice(cfg.algo.loss, "algo.loss", ("mse", "huber"))


def build(ctx: RunContext) -> Networks:
    """The Q-network and its greedy policy (epsilon-greedy with ``eval.epsilon`` > 0)."""
    n_actions = int(ctx.env.action_space.n)
    q_net = ctx.make_net(ctx.env.obs_dim, n_actions)
    q_net.eval()  # acting uses running statistics when the network has batch norm
    policy = evaluation_policy(q_net.host_inference(), n_actions, ctx.cfg.eval.epsilon, ctx.evaluator.uniform)
    return Networks({"q_net": q_net}, policy)


def train(ctx: RunContext) -> None:
    """Train a DQN population (see the module docstring)."""
    cfg, env, device, recorder = ctx.cfg, ctx.env, ctx.device, ctx.recorder
    algo: DQNConfig = cfg.algo
    members, num_envs = env.members, env.num_envs
    n_actions = int(env.action_space.n)

    built = build(ctx)
    q_net = built.nets["q_net"]
    q_values = q_net.host_inference()  # acting: host observations to host Q-values [P, E, A], no gradient
    recorder.evaluate_with(built.policy)
    target_net = None
    if algo.target_network:
        target_net = copy.deepcopy(q_net)
        target_net.requires_grad_(False)
    pipeline = ctx.make_pipeline(q_net)  # the configured optimizer, clipping, penalties
    written = q_net.written_backward and not pipeline.has_penalty  # gradients without autograd
    targets = (target_net,) if target_net is not None else ()
    intervene = ctx.interventions(Subject("q", q_net, pipeline, targets))  # intervention.*, every few updates
    names = parameter_names(q_net, "q")  # q.0.weight, q.0.bias, ... aligned with the pipeline's tensors
    if env.frames and env.stack > 1:  # stacked frames (Atari): each frame kept once
        buffer = FrameStackReplay(members, algo.buffer_size, env.obs_dim, device, env.stack, num_envs)
    else:
        buffer = ReplayBuffer(members, algo.buffer_size, env.obs_dim, device, frames=env.frames)
    updates = 0
    # hyperparameters that may differ between members: algo's value, or one per member
    gamma = ctx.hyper("algo.gamma")  # float or [P, 1]
    start_e, end_e, fraction = (
        ctx.hyper(k, "array") for k in ("algo.start_e", "algo.end_e", "algo.exploration_fraction")
    )
    tau = ctx.hyper("algo.tau", "runs")  # float or [(a, b, tau)]
    period = ctx.hyper("algo.target_update_period", "array")  # int or [P, 1]

    obs = env.reset()  # [P, E, obs] numpy, on the host (raw; obs_norm applies when the network reads it)
    ctx.obs_norm.update(obs)
    prev_step = 0
    learn_from = algo.learning_starts  # updates begin after this env step
    saved = {
        "q_net": q_net,
        "target_net": target_net,
        "pipeline": pipeline,
        "buffer": buffer,
        "interventions": intervene,
    }
    loop = ctx.checkpoint_state(saved, lambda: dict(obs=obs, updates=updates, prev_step=prev_step))
    # pbt.*: the recorder's log steps copy members' state and change their lr and ε schedule's fraction
    varied = {"algo.exploration_fraction": fraction if isinstance(fraction, np.ndarray) else None}  # set in place
    ctx.population_based_training(saved, varied)
    if loop:  # continued from a checkpoint; without its replay the buffer refills for learning_starts steps
        updates, prev_step = loop["updates"], loop["prev_step"]
        learn_from = learn_from if cfg.checkpoint.replay else prev_step + algo.learning_starts
    for step in recorder.steps():
        # act: epsilon-greedy, each member from its own stream (decided on the host, where the envs are)
        eps = epsilon(step, start_e, end_e, fraction, cfg.total_steps)  # float or [P, 1]
        u = ctx.streams.uniform(2 * num_envs)  # [P, 2E]
        actions = epsilon_greedy(u, eps, n_actions, lambda o: q_values(ctx.obs_norm(o)).argmax(-1), obs)  # [P, E]

        result, reward = ctx.step_env(actions, step)  # reward: reward_norm's scaling
        buffer.add(obs, actions, reward, result.obs, result.terminated, result.terminated | result.truncated)
        obs = result.next_obs
        recorder.note(epsilon=eps)

        # learn
        if step > learn_from and step // algo.train_frequency > prev_step // algo.train_frequency:
            r_scale = torch.as_tensor(ctx.reward_range.r_max, dtype=torch.float32, device=device)  # [P]
            for _ in range(algo.gradient_steps):
                diagnose = recorder.diagnose(updates)
                batch = buffer.sample(ctx.streams.uniform(algo.batch_size))
                batch = ctx.obs_norm.batch(batch)  # stored raw, normalized with the current statistics
                recorder.inject_param(q_net, step)
                loss, stats = dqn_loss(q_net, target_net, batch, algo, r_scale, written, gamma)
                update = pipeline.step(loss, step, diagnose, written_backward=written)
                recorder.record_update(update, stats)
                recorder.locate_divergence(
                    update, partial(locate, q_net, target_net, batch, names=names, update=update)
                )
                if diagnose:
                    record = instruments(q_net, target_net, batch, algo, r_scale, update, names, cfg.diagnostics, gamma)
                    reward_scale = torch.ones_like(r_scale) if algo.rescale_r else r_scale  # [P]
                    recorder.record_instruments(
                        record,
                        step,
                        update.grad_norm_pre_clip,
                        q_abs_max=record["q/abs_max"],
                        reward_scale=reward_scale,
                        output_layer=f"q.{len(q_net.layers) - 1}",
                        update=updates,
                        histograms=partial(histograms, q_net, names, batch),
                    )
                updates += 1
                if target_net is not None and algo.target_update == "soft":
                    soft_update_(target_net, q_net, tau)
                intervene(updates, batch.obs)
        if target_net is not None and algo.target_update == "hard":
            if not isinstance(period, np.ndarray):
                if step // period > prev_step // period:
                    hard_update_(target_net, q_net)
            elif (due := step // period > prev_step // period).any():  # [P] the members whose period ended
                hard_update_(target_net, q_net, torch.from_numpy(np.flatnonzero(due)).to(device))
        prev_step = step
