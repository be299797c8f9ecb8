"""Actor-critic algorithms (PPO, A2C, DDPG, TD3), in pieces: each loss and estimator against a direct
computation written out here (GAE with a plain loop, the clipped surrogate and value losses, TD3's
smoothed twin-min target, the EMA update); networks with an action input or a linear hidden layer
against a hand-written forward pass; the policies' distributions; bad input."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from composing import compose_config

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra)
from rlexp.algos.common import Actor, Minibatch, ScaledTanh, gae, ppo_losses
from rlexp.algos.ppo import explained_variance
from rlexp.algos.td3 import td3_target
from rlexp.compose.validate import validate
from rlexp.config.schema import (
    ActivationConfig,
    ActorCriticConfig,
    ConfigError,
    GainInitConfig,
    NetworkConfig,
    NormalizationConfig,
    TD3Config,
)
from rlexp.data.buffers import Batch
from rlexp.nn.nets import PopMLP, soft_update_
from rlexp.run.context import RunContext, network_groups

torch.set_num_threads(1)


QUIET = ["logger.mode=disabled", "logger.progress=off", "device=cpu", "threads=1"]


def pop_mlp(
    members: int,
    n_in: int,
    n_out: int,
    hidden=(8, 8),
    seed: int = 0,
    activation: str = "relu",
    extra_in: int = 0,
    extra_at: int = 0,
    linear_last_hidden: bool = False,
) -> PopMLP:
    gens = [torch.Generator().manual_seed(100 * seed + k) for k in range(members)]
    net = PopMLP(
        members,
        n_in,
        n_out,
        NetworkConfig(name="mlp", hidden=list(hidden), linear_last_hidden=linear_last_hidden),
        ActivationConfig(name=activation),
        NormalizationConfig(name="none"),
        GainInitConfig(name="he"),
        gens,
        extra_in=extra_in,
        extra_at=extra_at,
    )
    with torch.no_grad():  # random biases, so a reference forward must use them
        for layer in net.layers:
            layer.bias.copy_(0.3 * torch.randn(layer.bias.shape, generator=torch.Generator().manual_seed(seed + 7)))
    return net


def ref_forward(
    net: PopMLP, member: int, x: torch.Tensor, extra: torch.Tensor = None, act=torch.relu, linear_last: bool = False
) -> torch.Tensor:
    """One member's forward pass, written out: x [B, in] -> [B, out]."""
    h = x
    n = len(net.layers)
    for i, layer in enumerate(net.layers):
        if extra is not None and i == net.extra_at:
            h = torch.cat([h, extra], -1)
        h = h @ layer.weight[member].T + layer.bias[member]
        if i < n - 1 and not (linear_last and i == n - 2):
            h = act(h)
    return h


# ====================================================================== networks
@pytest.mark.parametrize("extra_at", [0, 1, 2])
def test_critic_takes_the_action_at_the_chosen_layer(extra_at):
    P, B, O, A = 3, 5, 4, 2
    net = pop_mlp(P, O, 1, hidden=(8, 6), extra_in=A, extra_at=extra_at)
    assert net.layers[extra_at].weight.shape[-1] == (O, 8, 6)[extra_at] + A
    x, a = torch.randn(P, B, O), torch.randn(P, B, A)
    out = net(x, a)
    for k in range(P):
        torch.testing.assert_close(out[k], ref_forward(net, k, x[k], a[k]))


def test_linear_last_hidden_layer_has_no_activation():
    P, B = 2, 6
    net = pop_mlp(P, 3, 1, hidden=(8, 5, 5), linear_last_hidden=True)
    assert net.activated == [True, True, False]
    x = torch.randn(P, B, 3)
    for k in range(P):
        torch.testing.assert_close(net(x)[k], ref_forward(net, k, x[k], linear_last=True))
        assert not torch.allclose(net(x)[k], ref_forward(net, k, x[k]))  # the flag changes the result


def test_actor_and_critic_overrides_fall_back_to_the_shared_groups():
    cfg = rlexp_cfg(
        [
            "algo=ppo",
            "activation=relu",
            "init=he",
            "critic.activation=elu",
            "actor.init=orthogonal",
            "critic.hidden=[32,16]",
            "critic.linear_last_hidden=true",
            "actor.normalization=layer",
        ]
    )
    act, init, norm, net = network_groups(cfg, "actor")
    assert (act.name, init.name, norm.name, net.hidden) == ("relu", "orthogonal", "layer", [64, 64])
    assert init.last_layer_gain == 0.01 and not net.linear_last_hidden
    act, init, norm, net = network_groups(cfg, "critic")
    assert (act.name, init.name, norm.name, net.hidden) == ("elu", "he", "none", [32, 16])
    assert act.alpha == 1.0 and init.last_layer_gain == 1.0 and net.linear_last_hidden
    shared = network_groups(cfg, None)
    assert (shared[0].name, shared[1].last_layer_gain, shared[3].hidden) == ("relu", None, [64, 64])


def rlexp_cfg(overrides: list[str]):
    from omegaconf import OmegaConf

    return OmegaConf.to_object(compose_config(overrides))


def test_actor_last_layer_gain_scales_the_output_layer():
    """Same generator, gains 0.01 and 1.0: the output weights differ exactly by the factor 100."""
    cfg = rlexp_cfg(["algo=ppo", "init=orthogonal", "num_seeds=2", *QUIET])
    ctx = RunContext.create(cfg, torch.device("cpu"))
    actor = ctx.make_net(4, 2, role="actor")
    ctx.nets_made -= 1  # the same stream again
    critic = ctx.make_net(4, 2, role="critic")
    torch.testing.assert_close(critic.layers[-1].weight, 100 * actor.layers[-1].weight)
    torch.testing.assert_close(critic.layers[0].weight, actor.layers[0].weight)
    ctx.env.close()


# ====================================================================== PPO / A2C
def plain_gae(rewards, values, next_values, terminated, dones, gamma, lam):
    """GAE for one environment, a plain loop over Python floats."""
    T = len(rewards)
    adv = [0.0] * T
    running = 0.0
    for t in reversed(range(T)):
        delta = rewards[t] + gamma * (1 - terminated[t]) * next_values[t] - values[t]
        running = delta + gamma * lam * (1 - dones[t]) * running
        adv[t] = running
    return adv


def test_gae_matches_a_plain_loop_with_terminations_and_truncations():
    T, P, E = 12, 2, 3
    g = torch.Generator().manual_seed(0)
    rewards, values, next_values = (torch.randn(T, P, E, generator=g) for _ in range(3))
    dones = (torch.rand(T, P, E, generator=g) < 0.25).float()
    truncated = dones * (torch.rand(T, P, E, generator=g) < 0.5).float()
    terminated = dones - truncated
    assert terminated.sum() > 0 and truncated.sum() > 0
    adv, ret = gae(rewards, values, next_values, terminated, dones, 0.97, 0.9)
    for p in range(P):
        for e in range(E):
            col = lambda x, p=p, e=e: x[:, p, e].tolist()  # noqa: E731
            expected = plain_gae(col(rewards), col(values), col(next_values), col(terminated), col(dones), 0.97, 0.9)
            torch.testing.assert_close(adv[:, p, e], torch.tensor(expected), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret, adv + values)


def test_gae_with_lambda_one_is_the_discounted_return_bootstrapped_at_the_end():
    T = 6
    rewards = torch.arange(1.0, T + 1).view(T, 1, 1)
    values = torch.zeros(T, 1, 1)
    next_values = torch.zeros(T, 1, 1)
    next_values[-1] = 10.0
    zeros = torch.zeros(T, 1, 1)
    _, ret = gae(rewards, values, next_values, zeros, zeros, 0.9, 1.0)
    expected = [sum(0.9 ** (k - t) * (k + 1) for k in range(t, T)) + 0.9 ** (T - t) * 10.0 for t in range(T)]
    torch.testing.assert_close(ret.flatten(), torch.tensor(expected))


def make_minibatch(P=2, M=64, seed=0) -> Minibatch:
    g = torch.Generator().manual_seed(seed)
    return Minibatch(
        obs=torch.randn(P, M, 3, generator=g),
        actions=torch.randint(0, 2, (P, M), generator=g),
        log_probs=torch.randn(P, M, generator=g) * 0.1 - 0.7,
        advantages=torch.randn(P, M, generator=g),
        returns=torch.randn(P, M, generator=g),
        values=torch.randn(P, M, generator=g),
    )


@pytest.mark.parametrize("norm_adv,clip_vloss", [(True, True), (False, False), (True, False)])
def test_ppo_losses_match_the_written_out_formulas(norm_adv, clip_vloss):
    algo = ActorCriticConfig(
        name="ppo", clip_coef=0.2, norm_adv=norm_adv, clip_vloss=clip_vloss, ent_coef=0.01, vf_coef=0.5
    )
    mb = make_minibatch()
    g = torch.Generator().manual_seed(3)
    new_log_prob = mb.log_probs + 0.5 * torch.randn(mb.log_probs.shape, generator=g)  # ratios well beyond 1 +- 0.2
    entropy = torch.rand(mb.log_probs.shape, generator=g)
    new_values = mb.values + torch.randn(mb.values.shape, generator=g)
    out = ppo_losses(new_log_prob, entropy, new_values, mb, algo)
    for k in range(mb.values.shape[0]):
        lp, old, adv = new_log_prob[k], mb.log_probs[k], mb.advantages[k]
        if norm_adv:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        ratio = torch.exp(lp - old)
        assert ((ratio - 1).abs() > 0.2).any() and ((ratio - 1).abs() <= 0.2).any()
        surrogate = torch.stack([adv * ratio, adv * torch.clamp(ratio, 0.8, 1.2)]).min(0).values
        policy_loss = -surrogate.mean()
        v, v_old, ret = new_values[k], mb.values[k], mb.returns[k]
        unclipped = (v - ret) ** 2
        if clip_vloss:
            clipped = (v_old + torch.clamp(v - v_old, -0.2, 0.2) - ret) ** 2
            value_loss = 0.5 * torch.stack([unclipped, clipped]).max(0).values.mean()
        else:
            value_loss = 0.5 * unclipped.mean()
        ent = entropy[k].mean()
        torch.testing.assert_close(out["policy_loss"][k], policy_loss)
        torch.testing.assert_close(out["value_loss"][k], value_loss)
        torch.testing.assert_close(out["actor_loss"][k], policy_loss - 0.01 * ent)
        torch.testing.assert_close(out["critic_loss"][k], 0.5 * value_loss)
        torch.testing.assert_close(out["approx_kl"][k], ((ratio - 1) - (lp - old)).mean())
        torch.testing.assert_close(out["clipfrac"][k], ((ratio - 1).abs() > 0.2).float().mean())


def test_ppo_losses_normalize_one_sample_to_zero_not_nan():
    """norm_adv over a minibatch of one sample per member: the advantage becomes 0 (no NaN from its std)."""
    algo = ActorCriticConfig(name="ppo", norm_adv=True)
    mb = make_minibatch(M=1)
    out = ppo_losses(mb.log_probs, torch.zeros_like(mb.log_probs), mb.values, mb, algo)
    assert all(torch.isfinite(v).all() for v in out.values())
    assert (out["policy_loss"] == 0.0).all()


def test_a2c_gradient_is_the_plain_policy_gradient():
    """One epoch on the rollout's own minibatch: ratio = 1, so d(policy loss) = -mean(A grad log pi)."""
    algo = ActorCriticConfig(name="a2c", norm_adv=False, ent_coef=0.0)
    mb = make_minibatch(P=1)
    logits = torch.randn(1, 64, 2, requires_grad=True)
    log_prob = F.log_softmax(logits, -1).gather(-1, mb.actions.unsqueeze(-1)).squeeze(-1)
    mb.log_probs = log_prob.detach()
    loss = ppo_losses(log_prob, torch.zeros_like(log_prob), mb.values, mb, algo)["actor_loss"]
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    logits2 = logits.detach().clone().requires_grad_(True)
    pg = -(mb.advantages * F.log_softmax(logits2, -1).gather(-1, mb.actions.unsqueeze(-1)).squeeze(-1)).mean()
    (expected,) = torch.autograd.grad(pg, logits2)
    torch.testing.assert_close(grad, expected)


def test_explained_variance_matches_its_definition():
    g = torch.Generator().manual_seed(1)
    ret, val = torch.randn(2, 50, generator=g), torch.randn(2, 50, generator=g)
    ev = explained_variance(val, ret)
    for k in range(2):
        r, v = ret[k].numpy(), val[k].numpy()
        assert ev[k].item() == pytest.approx(1 - np.var(r - v) / np.var(r), rel=1e-4)


def test_policy_log_prob_and_entropy_match_torch_distributions():
    P, B, A = 2, 7, 3
    g = torch.Generator().manual_seed(2)
    obs = torch.randn(P, B, 4, generator=g)
    discrete = Actor(pop_mlp(P, 4, A), P, A, continuous=False)
    actions = torch.randint(0, A, (P, B), generator=g)
    lp, ent = discrete.log_prob_entropy(obs, actions)
    dist = torch.distributions.Categorical(logits=discrete.net(obs))
    torch.testing.assert_close(lp, dist.log_prob(actions))
    torch.testing.assert_close(ent, dist.entropy())
    torch.testing.assert_close(discrete.log_prob(discrete.net(obs), actions), dist.log_prob(actions))  # acting's

    gaussian = Actor(pop_mlp(P, 4, A), P, A, continuous=True)
    with torch.no_grad():
        gaussian.log_std.copy_(torch.randn(P, A, generator=g) * 0.5)
    actions = torch.randn(P, B, A, generator=g)
    lp, ent = gaussian.log_prob_entropy(obs, actions)
    dist = torch.distributions.Normal(gaussian.net(obs), gaussian.log_std.exp().unsqueeze(1))
    torch.testing.assert_close(lp, dist.log_prob(actions).sum(-1))
    torch.testing.assert_close(ent, dist.entropy().sum(-1))
    torch.testing.assert_close(gaussian.log_prob(gaussian.net(obs), actions), dist.log_prob(actions).sum(-1))


def test_policy_sampling_is_the_inverse_cdf_of_each_members_uniforms():
    from scipy.stats import norm

    P, E, A = 2, 50, 3
    g = torch.Generator().manual_seed(4)
    out = torch.randn(P, E, A, generator=g)
    u = torch.rand(P, E, A, generator=g)
    discrete = Actor(pop_mlp(P, 4, A), P, A, continuous=False)
    sampled = discrete.sample(out, u)
    probs = F.softmax(out, -1)
    for k in range(P):
        for e in range(E):
            cumulative, expected = 0.0, A - 1
            for a in range(A):
                cumulative += probs[k, e, a].item()
                if u[k, e, 0].item() <= cumulative:
                    expected = a
                    break
            assert sampled[k, e].item() == expected
    gaussian = Actor(pop_mlp(P, 4, A), P, A, continuous=True)
    with torch.no_grad():
        gaussian.log_std.fill_(math.log(0.5))
    sampled = gaussian.sample(out, u)
    expected = out + 0.5 * torch.tensor(norm.ppf(u.double().numpy()), dtype=torch.float32)
    torch.testing.assert_close(sampled, expected, rtol=1e-4, atol=1e-4)


def tanh_normal_actor(P: int, A: int) -> tuple[Actor, np.ndarray, np.ndarray]:
    low, high = np.array([-1.0, 0.0, -3.0], np.float32)[:A], np.array([1.0, 2.0, 1.0], np.float32)[:A]
    return Actor(pop_mlp(P, 4, 2 * A), P, A, True, (low, high), min_std=0.05, init_std=0.8), low, high


def test_tanh_normal_log_prob_entropy_and_mode_are_the_direct_computation():
    """log pi of the squashed action (tanh's and the box's Jacobian), the entropy's one-sample estimate at the
    rollout's sample (its value and its reparameterized gradient), the std's biased softplus, the mode."""
    from scipy.stats import norm

    P, B, A = 2, 7, 3
    g = torch.Generator().manual_seed(5)
    actor, low, high = tanh_normal_actor(P, A)
    obs = torch.randn(P, B, 4, generator=g)
    out = actor.net(obs)
    u = 1.5 * torch.randn(P, B, A, generator=g)  # the rollout's pre-squash samples
    lp, ent = actor.log_prob_entropy(obs, u, out)

    loc, s = out[..., :A].double(), out[..., A:].double()
    std = F.softplus(s + math.log(math.expm1(0.8 - 0.05))) + 0.05
    lo, hi = torch.from_numpy(low).double(), torch.from_numpy(high).double()
    squash = [torch.distributions.TanhTransform(), torch.distributions.AffineTransform((hi + lo) / 2, (hi - lo) / 2)]
    dist = torch.distributions.TransformedDistribution(torch.distributions.Normal(loc, std), squash)
    action = lo + (hi - lo) * (torch.tanh(u.double()) + 1) / 2
    expected = dist.log_prob(action).sum(-1)
    torch.testing.assert_close(lp.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(actor.log_prob(out, u).double(), expected, rtol=1e-5, atol=1e-5)  # acting's
    torch.testing.assert_close(ent.double(), -expected, rtol=1e-5, atol=1e-5)  # the value: -log pi(u)

    # the estimate's gradient: -log pi(squash(loc + std * eps)) with the sample's noise eps held fixed
    (grad,) = torch.autograd.grad(ent.sum(), out)
    out64 = out.detach().double().requires_grad_(True)
    loc64, std64 = out64[..., :A], F.softplus(out64[..., A:] + math.log(math.expm1(0.75))) + 0.05
    eps = ((u.double() - loc64) / std64).detach()
    pre = loc64 + std64 * eps
    sampled = torch.distributions.TransformedDistribution(torch.distributions.Normal(loc64, std64), squash)
    (want,) = torch.autograd.grad(-sampled.log_prob(lo + (hi - lo) * (torch.tanh(pre) + 1) / 2).sum(), out64)
    torch.testing.assert_close(grad.double(), want, rtol=1e-4, atol=1e-5)

    zero_std = actor.loc_std(torch.zeros(1, 1, 2 * A))[1]
    torch.testing.assert_close(zero_std, torch.full((1, 1, A), 0.8))  # s = 0 gives init_std

    def into_box(x: torch.Tensor) -> np.ndarray:  # low + (high - low) / 2 (tanh(x) + 1), written out
        lo32, hi32 = torch.from_numpy(low), torch.from_numpy(high)
        return (lo32 + (hi32 - lo32) / 2 * (torch.tanh(x) + 1)).numpy()

    with torch.no_grad():
        assert np.array_equal(actor.mode(out, None, None), into_box(out[..., :A]))  # tanh of the location
        assert np.array_equal(actor.env_action(u, low, high), into_box(u))
        uniform = torch.rand(P, B, A, generator=g)
        normal = torch.tensor(norm.ppf(uniform.double().numpy()), dtype=torch.float32)
        torch.testing.assert_close(
            actor.sample(out, uniform), out[..., :A] + std.float() * normal, rtol=1e-4, atol=1e-4
        )
    assert actor.log_std is None and all(p is not None for p in actor.parameters())


# ====================================================================== TD3 / DDPG
def td3_batch(P=2, B=32, O=3, A=2, seed=0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        torch.randn(P, B, O, generator=g),
        torch.rand(P, B, A, generator=g) * 4 - 2,
        torch.randn(P, B, generator=g),
        torch.randn(P, B, O, generator=g),
        (torch.rand(P, B, generator=g) < 0.2).float(),
    )


@pytest.mark.parametrize("twin,target_noise", [(True, 0.2), (False, 0.0)])
def test_td3_target_is_the_smoothed_twin_minimum(twin, target_noise):
    P, B, O, A = 2, 32, 3, 2
    low, high = np.array([-2.0, -1.0], dtype=np.float32), np.array([2.0, 3.0], dtype=np.float32)
    squash = ScaledTanh(low, high, torch.device("cpu"))
    actor = pop_mlp(P, O, A, seed=1)
    critics = [pop_mlp(P, O, 1, seed=2 + i, extra_in=A, extra_at=1) for i in range(2 if twin else 1)]
    algo = TD3Config(name="td3", gamma=0.9, target_noise=target_noise, target_noise_clip=0.3, twin=twin)
    batch = td3_batch(P, B, O, A)
    noise = torch.randn(P, B, A, generator=torch.Generator().manual_seed(9)) * 3  # large: the clip acts
    y = td3_target(actor, critics, squash, batch, algo, noise)
    half, center = (high - low) / 2, (high + low) / 2
    for k in range(P):
        mu = torch.tensor(center) + torch.tensor(half) * torch.tanh(ref_forward(actor, k, batch.next_obs[k]))
        if target_noise > 0:
            eps = torch.clamp(noise[k] * target_noise, -0.3, 0.3) * torch.tensor(half)
            mu = torch.max(torch.min(mu + eps, torch.tensor(high)), torch.tensor(low))
        qs = [ref_forward(c, k, batch.next_obs[k], mu)[:, 0] for c in critics]
        q_next = torch.min(torch.stack(qs), 0).values
        expected = batch.rewards[k] + 0.9 * (1 - batch.terminated[k]) * q_next
        torch.testing.assert_close(y[k], expected, rtol=1e-5, atol=1e-5)
    if twin:  # the minimum is taken somewhere from each critic
        assert not torch.allclose(qs[0], qs[1])


def test_target_networks_follow_the_ema_formula_per_member():
    twins, targets = torch.nn.ModuleList([pop_mlp(3, 4, 1, seed=s) for s in (0, 1)]), None
    targets = copy.deepcopy(twins)
    with torch.no_grad():
        for p in twins.parameters():
            p.add_(1.0)
    t0 = [p.detach().clone() for p in targets.parameters()]
    soft_update_(targets, twins, 0.001)
    for t, old, o in zip(targets.parameters(), t0, twins.parameters()):
        torch.testing.assert_close(t.detach(), 0.999 * old + 0.001 * o.detach())


# ====================================================================== bad input
@pytest.mark.parametrize(
    "overrides,key",
    [
        (["algo=td3"], "algo"),  # CartPole's discrete actions
        (["algo=ppo", "critic.action_layer=5"], "critic.action_layer"),
        (["algo=ppo", "actor.activation=relux"], "actor.activation"),
        (["algo=ppo", "critic.hidden=[0]"], "critic.hidden"),
        (["algo=ppo", "algo.num_minibatches=10000"], "algo.num_minibatches"),
        (["algo=td3", "env=pendulum", "algo.tau=1.5"], "algo.tau"),
        (["algo=ddpg", "env=pendulum", "algo.policy_delay=0"], "algo.policy_delay"),
        (["obs_norm.clip=0"], "obs_norm.clip"),
        (["algo=ppo", "env=pendulum", "algo.continuous_policy=beta"], "algo.continuous_policy"),
        (["algo=ppo", "env=pendulum", "algo.min_std=0.5", "algo.init_std=0.5"], "algo.init_std"),
        (["normalization=batch", "algo.batch_size=1"], "algo.batch_size"),  # no batch statistics in one sample
        (
            ["algo=ppo", "critic.normalization=batch", "algo.num_steps=4", "env.num_envs=1", "algo.num_minibatches=4"],
            "algo.num_minibatches",
        ),
    ],
)
def test_bad_actor_critic_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        validate(compose_config(overrides))
    assert err.value.key == key


def test_batch_std_is_torchs_unbiased_std_and_0_for_one_sample():
    """The instruments' and norm_adv's spread over a batch: torch's unbiased std, bit for bit, and for a
    batch of one sample (algo.batch_size=1) 0 with no warning, where torch's is NaN."""
    import warnings

    from rlexp.algos.common import batch_std

    x = torch.randn(3, 7, 2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(batch_std(x), x.std(1)) and torch.equal(batch_std(x, keepdim=True), x.std(1, keepdim=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(batch_std(x[:, :1]), torch.zeros(3, 2))
