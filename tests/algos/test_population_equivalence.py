"""The batched population computes exactly what its members would compute one at a time.

Speed comes from doing less work, never from changing what is computed: these tests compare the
batched population (PopMLP's stacked weights, the per-member losses, GradientPipeline's per-member
clipping and the stacked fused Adam) against each member computed alone with plain torch.nn layers
(nn.Linear, nn.LayerNorm, nn.BatchNorm1d), the loss written out here, .backward(),
torch.nn.utils.clip_grad_norm_ and torch.optim.Adam, on the same per-member batches: losses,
gradients (after clipping) and parameters after one and after several updates.

P = 4 members with different weights and different batches; any mixing between members (a norm
or a clipping scale computed across members, a member reading another's batch) fails the checks.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra)
from rlexp.algos.common import Actor, Minibatch, ppo_losses
from rlexp.algos.dqn import dqn_loss
from rlexp.config.schema import (
    ActivationConfig,
    ActorCriticConfig,
    AdamConfig,
    BatchNormConfig,
    ClippingConfig,
    DQNConfig,
    GainInitConfig,
    LayerNormConfig,
    NetworkConfig,
    NormalizationConfig,
    NormClipConfig,
    RegularizationConfig,
)
from rlexp.data.buffers import Batch
from rlexp.nn.nets import PopMLP, weight_parameters
from rlexp.optim.pipeline import GradientPipeline, Health

torch.set_num_threads(1)

CPU = torch.device("cpu")
P = 4  # population size
OBS, HIDDEN, N_ACT = 4, (120, 84), 2
LR = 1e-3
MAX_NORM = 0.5  # small enough to bind on these batches
F32, F64 = torch.float32, torch.float64
# float32: rounding-order differences of a batched matmul vs nn.Linear (~1e-7), which Adam's division by
# sqrt(v) + eps can magnify for gradients near eps: parameters are compared to 2% of one Adam step (lr).
# float64: rounding is negligible except for the bias before a batch norm, whose gradient is zero in exact
# arithmetic; Adam turns its rounding residue (~1e-17) into steps of ~1e-11.
TOL = {F32: dict(rtol=1e-5, atol=1e-6), F64: dict(rtol=1e-9, atol=1e-9)}  # losses, gradients, norms
PARAM_TOL = {F32: dict(rtol=0.0, atol=LR / 50), F64: TOL[F64]}  # parameters after Adam steps

PLAIN_ACT = {"relu": nn.ReLU, "tanh": nn.Tanh}
NORMS = {
    "none": NormalizationConfig(name="none"),
    "layer": LayerNormConfig(name="layer"),
    "batch": BatchNormConfig(name="batch"),
}


# ---------------------------------------------------------------- population and its members
def make_pop(n_in: int, n_out: int, activation: str, norm: str, seed: int, dtype: torch.dtype) -> PopMLP:
    """A PopMLP whose members differ in every parameter (biases and norm affines randomized too)."""
    gens = [torch.Generator().manual_seed(100 * seed + k) for k in range(P)]
    net = PopMLP(
        P,
        n_in,
        n_out,
        NetworkConfig(name="mlp", hidden=list(HIDDEN)),
        ActivationConfig(name=activation),
        NORMS[norm],
        GainInitConfig(name="he"),
        gens,
    ).to(dtype)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for layer in net.layers:
            layer.bias.copy_(0.1 * torch.randn(layer.bias.shape, generator=g))
        for n in net.norms:
            for p in n.parameters():
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            for b in n.buffers():  # batch norm's running statistics differ per member too
                b.add_(0.1 * torch.rand(b.shape, generator=g))
    return net


def plain_member(pop: PopMLP, k: int, activation: str, norm: str) -> tuple[nn.Sequential, list[tuple]]:
    """Member k as nn.Sequential(Linear, [LayerNorm | BatchNorm1d], act, ..., Linear) with its weights
    copied in, and the (population tensor, plain tensor) pairs: PopLinear's weight [P, out, in] and
    bias [P, out] hold nn.Linear's weight [out, in] and bias [out] at index k."""
    modules: list[nn.Module] = []
    pairs: list[tuple] = []
    buffers: list[tuple] = []
    dtype = pop.layers[0].weight.dtype
    for i, layer in enumerate(pop.layers):
        out_f, in_f = layer.weight.shape[1:]
        lin = nn.Linear(in_f, out_f, dtype=dtype)
        modules.append(lin)
        pairs += [(layer.weight, lin.weight), (layer.bias, lin.bias)]
        if i < len(pop.layers) - 1:
            pn = pop.norms[i] if len(pop.norms) else None  # a norm after every hidden layer, or none
            if norm == "layer":
                ln = nn.LayerNorm(out_f, eps=pn.eps, dtype=dtype)
            elif norm == "batch":
                ln = nn.BatchNorm1d(out_f, eps=pn.eps, momentum=pn.momentum, dtype=dtype)
                buffers += [(pn.running_mean, ln.running_mean), (pn.running_var, ln.running_var)]
            if norm != "none":
                modules.append(ln)
                pairs += [(pn.weight, ln.weight), (pn.bias, ln.bias)]
            modules.append(PLAIN_ACT[activation]())
    with torch.no_grad():
        for pop_t, plain_t in pairs + buffers:
            plain_t.copy_(pop_t[k])
    return nn.Sequential(*modules), pairs + buffers


def assert_member_tensors(pairs, k: int, what: str, tol: dict) -> None:
    """Every population tensor's slice k equals the plain member's tensor."""
    for i, (pop_t, plain_t) in enumerate(pairs):
        torch.testing.assert_close(pop_t.detach()[k], plain_t.detach(), **tol, msg=lambda m, i=i: f"{what} #{i}: {m}")


def assert_member_grads(pairs, k: int, tol: dict) -> None:
    """Every population gradient's slice k equals the plain member's gradient."""
    for i, (pop_t, plain_t) in enumerate(pairs):
        if isinstance(pop_t, nn.Parameter):
            torch.testing.assert_close(pop_t.grad[k], plain_t.grad, **tol, msg=lambda m, i=i: f"grad #{i}: {m}")


def make_pipeline(params, weights, clipping: str) -> GradientPipeline:
    clip = (
        NormClipConfig(name="global_norm", max_norm=MAX_NORM)
        if clipping == "global_norm"
        else ClippingConfig(name="none")
    )
    return GradientPipeline(
        params, AdamConfig(name="adam", lr=LR), clip, RegularizationConfig(), weights, Health(P, CPU)
    )


def plain_step(
    loss: torch.Tensor, params: list[torch.Tensor], opt: torch.optim.Optimizer, clipping: str
) -> torch.Tensor:
    """backward -> clip_grad_norm_ -> Adam step for one member; returns the pre-clip gradient norm."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if clipping == "global_norm":
        pre = torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
    else:
        pre = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
    opt.step()
    return pre


# ---------------------------------------------------------------- DQN
def random_batch(seed: int, dtype: torch.dtype, B: int = 32) -> Batch:
    """A different batch per member; rewards large enough that Huber's linear part is reached."""
    g = torch.Generator().manual_seed(seed)
    return Batch(
        obs=torch.randn(P, B, OBS, generator=g).to(dtype),
        actions=torch.randint(0, N_ACT, (P, B), generator=g),
        rewards=2.0 * torch.randn(P, B, generator=g).to(dtype),
        next_obs=torch.randn(P, B, OBS, generator=g).to(dtype),
        terminated=(torch.rand(P, B, generator=g) < 0.3).to(dtype),
    )


def plain_dqn_loss(
    q: nn.Module, boot: nn.Module, obs, actions, rewards, next_obs, terminated, algo: DQNConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """y = r + gamma (1 - terminated) max_a Q_boot(s', a) (no gradient); loss = mean (Q(s,a) - y)^2 or Huber.
    Batch norm: the bootstrap pass uses running statistics (eval), the online pass the batch's (train).
    Returns the loss and the TD errors."""
    with torch.no_grad():
        boot.eval()
        y = rewards + algo.gamma * (1.0 - terminated) * boot(next_obs).max(-1).values
    q.train()
    q_sa = q(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
    loss = F.huber_loss(q_sa, y, delta=algo.huber_delta) if algo.loss == "huber" else F.mse_loss(q_sa, y)
    return loss, (q_sa - y).detach()


# (activation, normalization, dtype). Batch norm only in float64: in float32 the bias before it gets a
# gradient of pure rounding noise (~1e-7, zero in exact arithmetic), which Adam turns into random steps
# of order lr, so two correct implementations drift apart by ~lr after one update.
DQN_NETS = [
    ("relu", "none", F32),
    ("relu", "layer", F32),
    ("tanh", "none", F32),
    ("relu", "none", F64),
    ("relu", "layer", F64),
    ("relu", "batch", F64),
]


# every network also runs with its gradients written without autograd (dqn_loss(written_backward=True))
DQN_CASES = [(*net, False) for net in DQN_NETS] + [(*net, True) for net in DQN_NETS]


@pytest.mark.parametrize(
    "activation,norm,dtype,written",
    DQN_CASES,
    ids=[f"{a}-{n}-{str(d)[-7:]}-{'written' if w else 'autograd'}" for a, n, d, w in DQN_CASES],
)
@pytest.mark.parametrize("loss", ["mse", "huber"])
@pytest.mark.parametrize("clipping", ["global_norm", "none"])
@pytest.mark.parametrize("target", [True, False], ids=["target", "no_target"])
def test_dqn_population_equals_members_trained_one_at_a_time(activation, norm, loss, clipping, target, dtype, written):
    algo = DQNConfig(name="dqn", loss=loss, target_network=target)
    tol = TOL[dtype]
    q_net = make_pop(OBS, N_ACT, activation, norm, seed=1, dtype=dtype)
    assert q_net.written_backward or not written
    target_net = None
    if target:  # a copy, moved away from the online net so that mixing the two would show
        target_net = copy.deepcopy(q_net)
        with torch.no_grad():
            for p in target_net.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
        target_net.requires_grad_(False)
    params = list(q_net.parameters())
    pipe = make_pipeline(params, weight_parameters(q_net), clipping)

    members = []  # (online, bootstrap net, pairs, optimizer) per member
    for k in range(P):
        q, pairs = plain_member(q_net, k, activation, norm)
        boot = plain_member(target_net, k, activation, norm)[0] if target else q
        members.append((q, boot, pairs, torch.optim.Adam(q.parameters(), lr=LR)))

    for step in range(3):  # a fresh batch each step: the per-member Adam state carries over
        batch = random_batch(seed=10 + step, dtype=dtype)
        pop_loss, _ = dqn_loss(q_net, target_net, batch, algo, torch.ones(P), written_backward=written)
        stats = pipe.step(pop_loss, env_step=step + 1, written_backward=written)
        for k, (q, boot, pairs, opt) in enumerate(members):
            loss_k, td = plain_dqn_loss(
                q, boot, batch.obs[k], batch.actions[k], batch.rewards[k], batch.next_obs[k], batch.terminated[k], algo
            )
            pre = plain_step(loss_k, list(q.parameters()), opt, clipping)
            torch.testing.assert_close(pop_loss.detach()[k], loss_k.detach(), **tol)
            torch.testing.assert_close(stats.grad_norm_pre_clip[k].to(dtype), pre.detach(), **tol)
            assert_member_grads(pairs, k, tol)  # after clipping
            # after the update (and batch norm's running statistics)
            assert_member_tensors(pairs, k, f"step {step} parameter", PARAM_TOL[dtype])
            if step == 0:  # the batch reaches both branches of the Huber loss, and the clipping binds
                assert (td.abs() > algo.huber_delta).any() and (td.abs() < algo.huber_delta).any()
                assert clipping == "none" or pre > MAX_NORM


def test_dqn_check_detects_a_population_wide_clipping_norm():
    """The comparison above can fail: clipping with the norm over all members (not per member)
    gives gradients that differ from the members' own clip_grad_norm_."""
    algo = DQNConfig(name="dqn")
    q_net = make_pop(OBS, N_ACT, "relu", "none", seed=1, dtype=F32)
    batch = random_batch(seed=10, dtype=F32)
    loss, _ = dqn_loss(q_net, None, batch, algo, torch.ones(P))
    loss.sum().backward()
    grads = [p.grad for p in q_net.parameters()]
    total = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    scale = (MAX_NORM / (total + 1e-6)).clamp(max=1.0)
    q, pairs = plain_member(q_net, 0, "relu", "none")
    loss_0, _ = plain_dqn_loss(
        q, q, batch.obs[0], batch.actions[0], batch.rewards[0], batch.next_obs[0], batch.terminated[0], algo
    )
    plain_step(loss_0, list(q.parameters()), torch.optim.Adam(q.parameters(), lr=LR), "global_norm")
    for g in grads:
        g.mul_(scale)
    with pytest.raises(AssertionError):
        assert_member_grads(pairs, 0, TOL[F32])


# ---------------------------------------------------------------- PPO / A2C
def random_minibatch(
    actor: Actor, critic: PopMLP, continuous: bool, seed: int, dtype: torch.dtype, M: int = 64
) -> Minibatch:
    """Old log-probs and values away from the current ones (so both clips act on part of the
    samples)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    obs = randn(P, M, OBS)
    with torch.no_grad():
        out = actor.net(obs)
        actions = out + randn(*out.shape) if continuous else torch.randint(0, N_ACT, (P, M), generator=g)
        log_prob, _ = actor.log_prob_entropy(obs, actions, out)
        values = critic(obs).squeeze(-1)
    return Minibatch(
        obs=obs,
        actions=actions,
        log_probs=log_prob + 0.3 * randn(P, M),
        advantages=1.0 + randn(P, M),
        returns=values + 2.0 * randn(P, M),
        values=values + 0.3 * randn(P, M),
    )


def plain_ppo_losses(
    policy: nn.Module, log_std: nn.Parameter | None, value_fn: nn.Module, mb: Minibatch, k: int, algo: ActorCriticConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Member k's actor and critic losses over its samples, written out:
    actor = -mean min(A ratio, A clip(ratio)) - ent_coef mean entropy (A normalized with the mean and
    unbiased std); critic = vf_coef * 0.5 mean max((V - R)^2, (V_old + clip(V - V_old) - R)^2)."""
    obs, actions = mb.obs[k], mb.actions[k]
    old_log_prob, adv = mb.log_probs[k], mb.advantages[k]
    returns, old_values = mb.returns[k], mb.values[k]
    out = policy(obs)
    if log_std is None:
        dist = torch.distributions.Categorical(logits=out)
        log_prob, entropy = dist.log_prob(actions), dist.entropy()
    else:
        dist = torch.distributions.Normal(out, log_std.exp())
        log_prob, entropy = dist.log_prob(actions).sum(-1), dist.entropy().sum(-1)
    ratio = torch.exp(log_prob - old_log_prob)
    if algo.norm_adv:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    eps = algo.clip_coef
    policy_loss = -torch.min(adv * ratio, adv * ratio.clamp(1 - eps, 1 + eps)).mean()
    actor_loss = policy_loss - algo.ent_coef * entropy.mean()

    v = value_fn(obs).squeeze(-1)
    v_clipped = old_values + (v - old_values).clamp(-eps, eps)
    value_loss = 0.5 * torch.max((v - returns) ** 2, (v_clipped - returns) ** 2).mean()
    return actor_loss, algo.vf_coef * value_loss


PPO_NETS = [("none", F32), ("layer", F32), ("layer", F64)]


@pytest.mark.parametrize("norm,dtype", PPO_NETS, ids=[f"{n}-{str(d)[-7:]}" for n, d in PPO_NETS])
@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "gaussian"])
@pytest.mark.parametrize("clipping", ["global_norm", "none"])
def test_ppo_population_equals_members_trained_one_at_a_time(continuous, norm, dtype, clipping):
    algo = ActorCriticConfig(name="ppo")
    tol = TOL[dtype]
    actor = Actor(make_pop(OBS, N_ACT, "tanh", norm, seed=2, dtype=dtype), P, N_ACT, continuous).to(dtype)
    if continuous:  # a different log-std per member
        with torch.no_grad():
            actor.log_std.copy_(0.3 * torch.randn(P, N_ACT, generator=torch.Generator().manual_seed(4)))
    critic = make_pop(OBS, 1, "tanh", norm, seed=3, dtype=dtype)
    actor_params, critic_params = list(actor.parameters()), list(critic.parameters())
    actor_pipe = make_pipeline(actor_params, weight_parameters(actor), clipping)
    critic_pipe = make_pipeline(critic_params, weight_parameters(critic), clipping)

    members = []  # per member: plain policy, log-std, value function, their pairs and optimizers
    for k in range(P):
        policy, actor_pairs = plain_member(actor.net, k, "tanh", norm)
        actor_plain = list(policy.parameters())
        log_std = None
        if continuous:
            log_std = nn.Parameter(actor.log_std.detach()[k].clone())
            actor_pairs.append((actor.log_std, log_std))
            actor_plain.append(log_std)
        value_fn, critic_pairs = plain_member(critic, k, "tanh", norm)
        members.append(
            (
                policy,
                log_std,
                value_fn,
                actor_pairs,
                critic_pairs,
                actor_plain,
                torch.optim.Adam(actor_plain, lr=LR),
                torch.optim.Adam(value_fn.parameters(), lr=LR),
            )
        )

    for step in range(2):  # two minibatches: the second sees the updated weights and Adam state
        mb = random_minibatch(actor, critic, continuous, seed=20 + step, dtype=dtype)
        new_log_prob, entropy = actor.log_prob_entropy(mb.obs, mb.actions)
        new_values = critic(mb.obs).squeeze(-1)
        losses = ppo_losses(new_log_prob, entropy, new_values, mb, algo)
        # both clips act for every member
        assert (losses["clipfrac"] > 0).all()
        assert ((new_values - mb.values).abs() > algo.clip_coef).any(1).all()
        actor_stats = actor_pipe.step(losses["actor_loss"], env_step=step + 1)
        critic_stats = critic_pipe.step(losses["critic_loss"], env_step=step + 1)
        for k, (policy, log_std, value_fn, actor_pairs, critic_pairs, actor_plain, actor_opt, critic_opt) in enumerate(
            members
        ):
            actor_loss, critic_loss = plain_ppo_losses(policy, log_std, value_fn, mb, k, algo)
            pre_actor = plain_step(actor_loss, actor_plain, actor_opt, clipping)
            pre_critic = plain_step(critic_loss, list(value_fn.parameters()), critic_opt, clipping)
            torch.testing.assert_close(losses["actor_loss"].detach()[k], actor_loss.detach(), **tol)
            torch.testing.assert_close(losses["critic_loss"].detach()[k], critic_loss.detach(), **tol)
            torch.testing.assert_close(actor_stats.grad_norm_pre_clip[k].to(dtype), pre_actor, **tol)
            torch.testing.assert_close(critic_stats.grad_norm_pre_clip[k].to(dtype), pre_critic, **tol)
            if step == 0:
                assert clipping == "none" or (pre_actor > MAX_NORM and pre_critic > MAX_NORM)  # the clipping binds
            assert_member_grads(actor_pairs, k, tol)
            assert_member_grads(critic_pairs, k, tol)
            assert_member_tensors(actor_pairs, k, f"step {step} actor parameter", PARAM_TOL[dtype])
            assert_member_tensors(critic_pairs, k, f"step {step} critic parameter", PARAM_TOL[dtype])
