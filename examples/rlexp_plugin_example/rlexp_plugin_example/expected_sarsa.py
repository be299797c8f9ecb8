"""Expected SARSA for a population of members: a plugin's algorithm, written on rlexp's run context alone.

Reads top to bottom: a Q-network and its target copy -> replay -> per step: epsilon-greedy act, store,
and every ``train_frequency`` env steps ``gradient_steps`` updates; a hard target copy every
``target_update_period`` env steps. Evaluation plays the greedy policy (epsilon-greedy with
``eval.epsilon`` > 0).

The update differs from DQN's in its target: the value of the next state under an epsilon-greedy
policy of the target network, not its best action's value (per member, no gradient through y):
    V(s') = (eps_t / A) * sum_a Q_target(s', a) + (1 - eps_t) * max_a Q_target(s', a)
    y = r + gamma * (1 - terminated) * V(s')
    loss = mean over the batch of (Q(s, a) - y)^2
``eps_t`` is ``algo.target_epsilon``, this algorithm's own key: 0 is Q-learning's target, the
behaviour's final epsilon (``algo.end_e``) expected SARSA of the policy the agent ends up following.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from omegaconf import DictConfig

from rlexp.algos.common import check_replay, epsilon, epsilon_greedy
from rlexp.config.schema import AlgoConfig, knob, require
from rlexp.data.buffers import Batch, ReplayBuffer
from rlexp.diagnostics.instruments import (
    activity_instruments,
    locate_in_update,
    locate_nonfinite,
    parameter_names,
    update_instruments,
)
from rlexp.diagnostics.interventions import Subject
from rlexp.nn.nets import PopMLP, hard_update_
from rlexp.optim.pipeline import UpdateStats
from rlexp.run.context import RunContext
from rlexp.run.evaluation import Networks
from rlexp.run.recorder import Located

Hyper = float | torch.Tensor  # one value for every member, or float32 [P, 1]
# the algo keys its members may differ in (AlgoSpec.member_keys, beside the context's CONTEXT_KEYS)
MEMBER_KEYS = ("algo.gamma", "algo.start_e", "algo.end_e", "algo.exploration_fraction", "algo.target_epsilon")


@dataclass
class ExpectedSarsaConfig(AlgoConfig):
    """expected_sarsa: DQN's replay and schedule, the target an epsilon-greedy policy's expected value."""

    target_epsilon: float = knob(0.05, "expected_sarsa: epsilon of the policy the target's expectation is over")


def check(cfg: DictConfig) -> None:
    """A replay's combinations, and ``algo.target_epsilon`` in [0, 1] (ConfigError otherwise)."""
    check_replay(cfg)
    eps_t = cfg.algo.target_epsilon
    require(0 <= eps_t <= 1, "algo.target_epsilon", eps_t, "a value in [0, 1] (0 = Q-learning's max)")


def build(ctx: RunContext) -> Networks:
    """The Q-network and its greedy policy: normalized observations [P, N, obs] -> actions [P, N]."""
    n_actions = int(ctx.env.action_space.n)
    q_net = ctx.make_net(ctx.env.obs_dim, n_actions)
    q_net.eval()  # acting uses running statistics when the network has batch norm
    q_values, eps = q_net.host_inference(), ctx.cfg.eval.epsilon

    def policy(obs: np.ndarray) -> np.ndarray:
        greedy = q_values(obs).argmax(-1)  # [P, N]
        if eps == 0:
            return greedy
        u = ctx.evaluator.uniform(2 * obs.shape[1])  # [P, 2N] evaluation's own stream
        n = obs.shape[1]
        return np.where(u[:, :n] < eps, (u[:, n:] * n_actions).astype(np.int64), greedy)

    return Networks({"q_net": q_net}, policy)


def expected_sarsa_loss(
    q_net: PopMLP, target_net: PopMLP, batch: Batch, gamma: float | torch.Tensor, spread: Hyper, greedy: Hyper
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-member loss [P] and statistics ([P] each) of one batch; ``spread`` = eps_t / A and ``greedy``
    = 1 - eps_t, floats or float32 [P, 1] (one per member)."""
    with torch.no_grad():
        next_q = target_net(batch.next_obs)  # [P, B, A]
        next_value = spread * next_q.sum(-1) + greedy * next_q.amax(-1)  # [P, B]
        target = batch.rewards + gamma * (1.0 - batch.terminated) * next_value  # [P, B]
    q = q_net(batch.obs).gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)  # [P, B]
    td = q - target
    stats = {"q_mean": q.detach().mean(1), "q_max": q.detach().amax(1), "td_abs_mean": td.detach().abs().mean(1)}
    return td.square().mean(1), stats


def locate(q_net: PopMLP, batch: Batch, names: list[str], update: UpdateStats, member: int, cause: str) -> Located:
    """Where member ``member``'s non-finite update was born: the forward pass layer by layer, then the
    loss, the gradients and the parameters after the step."""
    found = locate_nonfinite(q_net, "q", member, batch.obs[member], "replay.obs")
    return found or locate_in_update(cause, names, list(q_net.parameters()), member, update)


def train(ctx: RunContext) -> None:
    """Train an expected-SARSA population (see the module docstring)."""
    cfg, env, device, recorder = ctx.cfg, ctx.env, ctx.device, ctx.recorder
    algo = cfg.algo
    members, num_envs = env.members, env.num_envs
    n_actions = int(env.action_space.n)

    built = build(ctx)
    q_net = built.nets["q_net"]
    q_values = q_net.host_inference()  # acting: host observations to host Q-values [P, E, A]

    def greedy_actions(obs: np.ndarray) -> np.ndarray:
        return q_values(ctx.obs_norm(obs)).argmax(-1)  # [P, E] from raw observations [P, E, obs]

    recorder.evaluate_with(built.policy)
    target_net = copy.deepcopy(q_net).requires_grad_(False)
    pipeline = ctx.make_pipeline(q_net)  # the configured optimizer, clipping, penalties
    intervene = ctx.interventions(Subject("q", q_net, pipeline, (target_net,)))
    names = parameter_names(q_net, "q")  # q.0.weight, q.0.bias, ... aligned with the pipeline's tensors
    buffer = ReplayBuffer(members, algo.buffer_size, env.obs_dim, device, frames=env.frames)
    # the keys members may differ in (AlgoSpec.member_keys): the config's value, or one per member
    gamma = ctx.hyper("algo.gamma")  # float or [P, 1]
    start_e, end_e, fraction = (
        ctx.hyper(k, "array") for k in ("algo.start_e", "algo.end_e", "algo.exploration_fraction")
    )
    eps_t = ctx.hyper("algo.target_epsilon", "array")  # float or float64 [P, 1]
    spread, greedy = eps_t / n_actions, 1.0 - eps_t  # in float64, then rounded once to float32
    if isinstance(eps_t, np.ndarray):
        spread, greedy = (torch.as_tensor(x, dtype=torch.float32, device=device) for x in (spread, greedy))

    obs = env.reset()  # [P, E, obs] raw; obs_norm applies when the network reads it
    ctx.obs_norm.update(obs)
    updates, prev_step = 0, 0
    learn_from = algo.learning_starts
    saved = dict(q_net=q_net, target_net=target_net, pipeline=pipeline, buffer=buffer, interventions=intervene)
    loop = ctx.checkpoint_state(saved, lambda: dict(obs=obs, updates=updates, prev_step=prev_step))
    if loop:  # continued from a checkpoint; without its replay the buffer refills for learning_starts steps
        updates, prev_step = loop["updates"], loop["prev_step"]
        learn_from = learn_from if cfg.checkpoint.replay else prev_step + algo.learning_starts
    for step in recorder.steps():
        # act: epsilon-greedy, each member from its own stream
        eps = epsilon(step, start_e, end_e, fraction, cfg.total_steps)  # float or [P, 1]
        u = ctx.streams.uniform(2 * num_envs)  # [P, 2E]
        actions = epsilon_greedy(u, eps, n_actions, greedy_actions, obs)  # [P, E]
        result, reward = ctx.step_env(actions, step)
        buffer.add(obs, actions, reward, result.obs, result.terminated, result.terminated | result.truncated)
        obs = result.next_obs
        recorder.note(epsilon=eps)

        # learn
        if step > learn_from and step // algo.train_frequency > prev_step // algo.train_frequency:
            for _ in range(algo.gradient_steps):
                diagnose = recorder.diagnose(updates)
                batch = ctx.obs_norm.batch(buffer.sample(ctx.streams.uniform(algo.batch_size)))
                recorder.inject_param(q_net, step)
                loss, stats = expected_sarsa_loss(q_net, target_net, batch, gamma, spread, greedy)
                update = pipeline.step(loss, step, diagnose)
                recorder.record_update(update, stats)
                recorder.locate_divergence(update, partial(locate, q_net, batch, names, update))
                if diagnose:
                    q_all, record = activity_instruments(q_net, "q", batch.obs, cfg.diagnostics)  # [P, B, A]
                    record.update(update_instruments(update, names))
                    r_scale = torch.as_tensor(ctx.reward_range.r_max, dtype=torch.float32, device=device)  # [P]
                    q_abs_max = q_all.detach().abs().amax((1, 2))  # [P]
                    output = f"q.{len(q_net.layers) - 1}"
                    recorder.record_instruments(
                        record, step, update.grad_norm_pre_clip, q_abs_max, r_scale, output, updates
                    )
                updates += 1
                intervene(updates, batch.obs)
        if step // algo.target_update_period > prev_step // algo.target_update_period:
            hard_update_(target_net, q_net)
        prev_step = step
