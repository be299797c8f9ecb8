"""What two or more algorithms share: bounded continuous actions (``ScaledTanh``, normal noise from a
member's uniform stream, the squashed deterministic policy), divergence location through several
networks, the linear epsilon schedule, and the clipped-surrogate actor-critic (``Actor``, GAE,
``ppo_losses``) of PPO, A2C and MAPPO. No algorithm imports another; each imports what it shares
from here."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from rlexp.config.schema import ActorCriticConfig, ConfigError, require_choice
from rlexp.diagnostics.instruments import locate_in_update, locate_nonfinite
from rlexp.nn.nets import NORMALIZATIONS, PopMLP
from rlexp.optim.pipeline import UpdateStats
from rlexp.run.context import RunContext
from rlexp.run.evaluation import Policy
from rlexp.run.recorder import Located

Hyper = float | np.ndarray  # a hyperparameter: every member's value, or one per member [P, 1]
LOG_2PI = math.log(2 * math.pi)

LOG_2 = math.log(2)


class ScaledTanh(nn.Module):
    """Maps network outputs [P, B, A] to the action box: center + half_range * tanh(x)."""

    def __init__(self, low: np.ndarray, high: np.ndarray, device: torch.device) -> None:
        super().__init__()
        self.register_buffer("center", torch.as_tensor((high + low) / 2, dtype=torch.float32, device=device))
        self.register_buffer("half_range", torch.as_tensor((high - low) / 2, dtype=torch.float32, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.center + self.half_range * torch.tanh(x)


def normal(uniform: np.ndarray, shape: tuple, device: torch.device) -> torch.Tensor:
    """Standard normal numbers of ``shape`` from a member's uniform stream [P, n] (inverse CDF)."""
    u = torch.from_numpy(uniform).float().reshape(shape).clamp(1e-7, 1 - 1e-7)
    return torch.special.ndtri(u).to(device)


def squashed_policy(
    act: Callable[[torch.Tensor], torch.Tensor],
    squash: ScaledTanh,
    device: torch.device,
    low: np.ndarray,
    high: np.ndarray,
) -> Policy:
    """The deterministic policy: normalized observations [P, N, obs] -> mu(s) [P, N, A], no noise,
    clipped to the action bounds ``low``, ``high`` [A] as acting clips (against rounding at tanh's ends)."""

    def policy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            mu = squash(act(torch.from_numpy(obs).to(device)))  # [P, N, A]
        return np.clip(mu.cpu().numpy(), low, high)

    return policy


def locate(
    nets: Sequence[PopMLP],
    prefixes: Sequence[str],
    names: list[str],
    obs: torch.Tensor,
    actions: torch.Tensor | None,
    update: UpdateStats,
    member: int,
    cause: str,
) -> Located:
    """Where member ``member``'s non-finite update of ``nets`` was born: each network's forward on the
    batch's observations [P, B, obs] (and, for the critics, actions [P, B, A]) layer by layer, then the
    loss, the gradients and the parameters after the step."""
    for net, prefix in zip(nets, prefixes):
        found = locate_nonfinite(
            net, prefix, member, obs[member], "replay.obs", None if actions is None else actions[member]
        )
        if found is not None:
            return found
    return locate_in_update(cause, names, [p for net in nets for p in net.parameters()], member, update)


def epsilon(step: int, start: Hyper, end: Hyper, fraction: Hyper, total_steps: int) -> Hyper:
    """The linear decay from ``start`` to ``end`` over ``fraction`` * ``total_steps`` env steps: floats,
    or float64 [P, 1] arrays for members with schedules of their own (``RunContext.hyper``)."""
    return start + (end - start) * np.minimum(1.0, step / (fraction * total_steps))


def epsilon_greedy(
    u: np.ndarray, eps: Hyper, n_actions: int, greedy: Callable[[np.ndarray], np.ndarray], obs: np.ndarray
) -> np.ndarray:
    """Epsilon-greedy actions [P, E] from each member's uniform numbers ``u`` [P, 2E] (the first E decide,
    the last E pick the random action) and ``greedy(obs)`` [P, E], called only when an environment uses it."""
    num_envs = u.shape[1] // 2
    explore = u[:, :num_envs] < eps
    actions = (u[:, num_envs:] * n_actions).astype(np.int64)  # [P, E] the random actions
    return actions if explore.all() else np.where(explore, actions, greedy(obs))


class Actor(nn.Module):
    """A population policy: logits [P, B, A] (discrete) or, for continuous actions, one of two
    distributions (``algo.continuous_policy``):

    - ``gaussian``: a normal with mean [P, B, A] (the network's output) and a state-independent log-std
      [P, A] (a parameter, 0 at the start); samples are clipped to the box when they reach the environment.
    - ``tanh_normal`` (``box`` given): the network outputs [P, B, 2A], a location m and a scale input s;
      std = softplus(s + b) + min_std with b chosen so that s = 0 gives init_std (a biased softplus);
      a sample u ~ N(m, std) reaches the environment as low + (high - low) (tanh(u) + 1) / 2, so it
      stays inside the box. The rollout keeps u (the pre-squash sample), and
          log pi(a|s) = sum_j [log N(u_j; m_j, std_j) - log((high_j - low_j) / 2) - log(1 - tanh(u_j)^2)]
      with log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2 u)). The entropy has no closed form: it is
      estimated from one sample per state, -log pi(u~) with u~ = m + std * sg((u - m) / std) (value
      -log pi(u), the rollout's sample; gradient: the reparameterized one with that sample's noise), so
      no new random numbers are drawn (TorchRL draws a fresh reparameterized sample instead).
    """

    def __init__(
        self,
        net: PopMLP,
        members: int,
        action_dim: int,
        continuous: bool,
        box: tuple[np.ndarray, np.ndarray] | None = None,
        min_std: float = 0.01,
        init_std: float = 1.0,
    ) -> None:
        super().__init__()
        self.net = net
        self.continuous = continuous
        self.action_dim = action_dim
        device = net.layers[0].weight.device
        self.tanh = continuous and box is not None
        self.log_std = (
            nn.Parameter(torch.zeros(members, action_dim, device=device)) if continuous and not self.tanh else None
        )
        if self.tanh:  # plain attributes, not buffers: they have no member dimension and never change
            low, high = (torch.as_tensor(b, dtype=torch.float32, device=device) for b in box)
            self.low, self.half_range = low, (high - low) / 2  # [A]
            self.log_half_range = self.half_range.log()
            self.min_std, self.std_bias = min_std, math.log(math.expm1(init_std - min_std))

    @classmethod
    def build(cls, ctx: RunContext, obs_dim: int, action_dim: int, box: tuple[np.ndarray, np.ndarray] | None) -> Actor:
        """The policy of ``algo.continuous_policy`` on inputs of ``obs_dim`` (``box``: the continuous
        action bounds (low, high) [A], None for discrete actions); its network from ``ctx.make_net``."""
        algo = ctx.cfg.algo
        tanh = box is not None and algo.continuous_policy == "tanh_normal"
        net = ctx.make_net(obs_dim, 2 * action_dim if tanh else action_dim, role="actor")
        members, continuous = ctx.env.members, box is not None
        return cls(net, members, action_dim, continuous, box if tanh else None, algo.min_std, algo.init_std)

    def loc_std(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tanh_normal: the location and the std, both [P, B, A], from the network's output [P, B, 2A]."""
        loc, scale = out.split(self.action_dim, -1)
        return loc, F.softplus(scale + self.std_bias) + self.min_std

    def location(self, out: torch.Tensor) -> torch.Tensor:
        """The output the mean action comes from [P, B, A]: the logits, the Gaussian's mean, tanh_normal's m."""
        return out[..., : self.action_dim] if self.tanh else out

    def _tanh_log_prob(self, loc: torch.Tensor, std: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        z = (u - loc) / std
        log_jacobian = self.log_half_range + 2 * (LOG_2 - u - F.softplus(-2 * u))  # log |da/du|
        return (-0.5 * z.square() - std.log() - 0.5 * LOG_2PI - log_jacobian).sum(-1)

    def log_prob(self, out: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(a|s) [P, B] from the policy output ``out`` (a forward pass's) and the rollout's actions
        (indices, the Gaussian's samples, or tanh_normal's pre-squash samples u)."""
        if self.tanh:
            return self._tanh_log_prob(*self.loc_std(out), actions)
        if self.continuous:
            log_std = self.log_std.unsqueeze(1)  # [P, 1, A]
            z = (actions - out) * torch.exp(-log_std)
            return (-0.5 * z.square() - log_std - 0.5 * LOG_2PI).sum(-1)
        return F.log_softmax(out, -1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def log_prob_entropy(
        self, obs: torch.Tensor, actions: torch.Tensor, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(a|s) and the policy entropy (tanh_normal: its one-sample estimate), both [P, B]; ``out``
        reuses a forward pass's output."""
        out = self.net(obs) if out is None else out
        if self.tanh:
            loc, std = self.loc_std(out)
            resampled = loc + std * ((actions - loc) / std).detach()  # the rollout's sample, reparameterized
            return self._tanh_log_prob(loc, std, actions), -self._tanh_log_prob(loc, std, resampled)
        if self.continuous:
            log_prob = self.log_prob(out, actions)
            entropy = (0.5 + 0.5 * LOG_2PI + self.log_std.unsqueeze(1)).sum(-1).expand_as(log_prob)
            return log_prob, entropy
        log_p = F.log_softmax(out, -1)  # [P, B, A]
        log_prob = log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(log_p.exp() * log_p).sum(-1)
        return log_prob, entropy

    def sample(self, out: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
        """Actions from the policy output [P, E, A] and uniform numbers [P, E, A] in [0, 1) (each
        member's own stream): inverse-CDF sampling, so no global random state is touched."""
        if self.continuous:
            normal = torch.special.ndtri(uniform.clamp(1e-7, 1 - 1e-7))
            if self.tanh:
                loc, std = self.loc_std(out)
                return loc + std * normal
            return out + torch.exp(self.log_std).unsqueeze(1) * normal
        cdf = F.softmax(out, -1).cumsum(-1)  # [P, E, A]
        index = (cdf < uniform[..., :1]).sum(-1)
        return index.clamp(max=out.shape[-1] - 1)

    def squash(self, u: torch.Tensor) -> torch.Tensor:
        """tanh_normal: the box's action low + (high - low) (tanh(u) + 1) / 2 of pre-squash values u [..., A]."""
        return self.low + self.half_range * (torch.tanh(u) + 1)

    def env_action(self, action: torch.Tensor, low: np.ndarray, high: np.ndarray) -> np.ndarray:
        """What the environment receives for a continuous sample [P, E, A]: the Gaussian's clipped to the
        box (low, high), tanh_normal's squashed into it (its own box)."""
        if self.tanh:
            return self.squash(action).cpu().numpy()
        return np.clip(action.cpu().numpy(), low, high)

    def mode(self, out: torch.Tensor, low: np.ndarray | None, high: np.ndarray | None) -> np.ndarray:
        """The deterministic action of the policy output [P, N, A]: the likeliest action [P, N] (discrete),
        the Gaussian's mean clipped to the box, or tanh_normal's tanh(m) in its box [P, N, A]."""
        if not self.continuous:
            return out.argmax(-1).cpu().numpy()
        if self.tanh:
            return self.squash(self.location(out)).cpu().numpy()
        return np.clip(out.cpu().numpy(), low, high)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    gamma: float | torch.Tensor,
    lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimates and returns, all [T, P, E] (see the module docstring); ``gamma``
    and ``lam`` floats, or float64 [P, 1] one per member (rounded to float32 as a float is)."""
    gamma_lam = gamma * lam  # in float64 either way
    if isinstance(gamma_lam, torch.Tensor):
        gamma_lam = gamma_lam.float()
    if isinstance(gamma, torch.Tensor):
        gamma = gamma.float()
    deltas = rewards + gamma * (1.0 - terminated) * next_values - values  # every step at once
    carry = gamma_lam * (1.0 - dones)  # what A_t+1 is weighted with in A_t
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + carry[t] * last
        advantages[t] = last
    return advantages, advantages + values


def batch_std(x: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """The unbiased standard deviation over dim 1 of x [P, B, ...] per member; 0 for a batch of one
    sample (torch's would be NaN, with a warning)."""
    return x.std(1, keepdim=keepdim, correction=min(1, x.shape[1] - 1))


@dataclass
class Minibatch:
    obs: torch.Tensor  # [P, M, obs]
    actions: torch.Tensor  # [P, M] or [P, M, A]
    log_probs: torch.Tensor  # [P, M] under the policy that acted
    advantages: torch.Tensor  # [P, M]
    returns: torch.Tensor  # [P, M]
    values: torch.Tensor  # [P, M] V(s) when acting


def ppo_losses(
    new_log_prob: torch.Tensor,
    entropy: torch.Tensor,
    new_values: torch.Tensor,
    mb: Minibatch,
    algo: ActorCriticConfig,
) -> dict[str, torch.Tensor]:
    """Per-member losses and statistics ([P] each) of one minibatch: actor_loss, critic_loss,
    policy_loss, value_loss, entropy, approx_kl, clipfrac."""
    log_ratio = new_log_prob - mb.log_probs
    ratio = log_ratio.exp()
    adv = mb.advantages
    if algo.norm_adv:  # per member, by the unbiased standard deviation
        adv = (adv - adv.mean(1, keepdim=True)) / (batch_std(adv, keepdim=True) + 1e-8)
    clipped_ratio = ratio.clamp(1 - algo.clip_coef, 1 + algo.clip_coef)
    policy_loss = torch.maximum(-adv * ratio, -adv * clipped_ratio).mean(1)
    value_error = (new_values - mb.returns).square()
    if algo.clip_vloss:
        clipped_values = mb.values + (new_values - mb.values).clamp(-algo.clip_coef, algo.clip_coef)
        value_error = torch.maximum(value_error, (clipped_values - mb.returns).square())
    value_loss = 0.5 * value_error.mean(1)
    mean_entropy = entropy.mean(1)
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean(1)
        clipfrac = ((ratio - 1).abs() > algo.clip_coef).float().mean(1)
    return {
        "actor_loss": policy_loss - algo.ent_coef * mean_entropy,
        "critic_loss": algo.vf_coef * value_loss,
        "policy_loss": policy_loss.detach(),
        "value_loss": value_loss.detach(),
        "entropy": mean_entropy.detach(),
        "approx_kl": approx_kl,
        "clipfrac": clipfrac,
    }


# ---------------------------------------------------------------- config checks (AlgoSpec.check)
def require_batch_statistics(cfg: DictConfig, key: str, batch: int) -> None:
    """A normalization over the batch (normalization=batch) needs batches of ``min_batch`` samples."""
    for name in (cfg.normalization.name, cfg.actor.normalization, cfg.critic.normalization):
        needed = NORMALIZATIONS[name].min_batch if name is not None else 1
        if batch < needed:
            raise ConfigError(
                key,
                f"a batch of {batch} sample has no batch statistics for normalization={name}",
                f"raise {key} (batches of at least {needed} samples) or use another normalization",
            )


def check_actor_critic(cfg: DictConfig) -> None:
    """Combinations PPO, A2C and MAPPO need: choices, init_std above min_std, minibatches a rollout holds."""
    algo = cfg.algo
    require_choice(algo.value_target, "algo.value_target", ("gae", "mc"))
    require_choice(algo.continuous_policy, "algo.continuous_policy", ("gaussian", "tanh_normal"))
    if algo.init_std <= algo.min_std:
        raise ConfigError(
            "algo.init_std", f"{algo.init_std} <= algo.min_std={algo.min_std}", "raise algo.init_std above min_std"
        )
    if cfg.network.name == "lstm" and algo.num_minibatches > cfg.env.num_envs:
        raise ConfigError(
            "algo.num_minibatches",
            f"{algo.num_minibatches} exceeds env.num_envs={cfg.env.num_envs}: network=lstm takes minibatches "
            "of whole environment sequences",
            "lower algo.num_minibatches or raise env.num_envs",
        )
    batch = algo.num_steps * cfg.env.num_envs
    if algo.num_minibatches > batch:
        raise ConfigError(
            "algo.num_minibatches",
            f"{algo.num_minibatches} exceeds the rollout of {batch} samples (algo.num_steps x env.num_envs)",
            "lower algo.num_minibatches",
        )
    require_batch_statistics(cfg, "algo.num_minibatches", batch // algo.num_minibatches)
    if batch > cfg.total_steps:
        raise ConfigError(
            "total_steps",
            f"{cfg.total_steps} is shorter than one rollout of {batch} steps",
            "raise total_steps or lower algo.num_steps",
        )


def check_replay(cfg: DictConfig) -> None:
    """Combinations every replay-based algorithm needs: a batch the buffer holds, learning before the end."""
    algo = cfg.algo
    if algo.batch_size > algo.buffer_size:
        raise ConfigError(
            "algo.batch_size",
            f"{algo.batch_size} exceeds algo.buffer_size={algo.buffer_size}",
            "lower algo.batch_size or raise algo.buffer_size",
        )
    require_batch_statistics(cfg, "algo.batch_size", algo.batch_size)
    if algo.learning_starts >= cfg.total_steps:
        raise ConfigError(
            "algo.learning_starts",
            f"{algo.learning_starts} >= total_steps={cfg.total_steps}",
            "lower algo.learning_starts or raise total_steps, or nothing is ever learned",
        )
