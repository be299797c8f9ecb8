"""Tests of DQN and the machinery it runs on: the loss (DQN 3.0 switches), replay memory,
population environments (autoreset, truncation vs termination), member streams, population
independence of an update, and small end-to-end runs through rlexp.train.run_job.

Every check compares rlexp against a direct computation written out here: a member-by-member
F.linear forward in float64, the Bellman target and losses from their formulas, episode returns summed
from the recorded step rewards, and so on.
"""

from __future__ import annotations

import copy
import json
import math
import os
import platform
import resource
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from composing import compose_config

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra)
from rlexp.algos import dqn as dqn_module
from rlexp.algos.common import epsilon
from rlexp.algos.dqn import dqn_loss, td_loss
from rlexp.config.schema import (
    ActivationConfig,
    AdamConfig,
    BatchNormConfig,
    ClippingConfig,
    DQNConfig,
    EnvConfig,
    GainInitConfig,
    LayerNormConfig,
    NetworkConfig,
    NormalizationConfig,
    NormClipConfig,
    RegularizationConfig,
    WeightNormConfig,
)
from rlexp.data.buffers import Batch, ReplayBuffer
from rlexp.envs.gym import PopulationEnv
from rlexp.envs.streams import MemberStreams, member_generator
from rlexp.nn.activations import ACTIVATIONS
from rlexp.nn.nets import PopMLP, PopWeightNormLinear, weight_parameters
from rlexp.optim.pipeline import CAUSES, GradientPipeline, Health
from rlexp.train import keep_freed_memory, population_threads, run_job

torch.set_num_threads(1)

CPU = torch.device("cpu")
CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
OBS, ACT = 3, 4


# ---------------------------------------------------------------- helpers
def make_net(members: int, seed: int, hidden=(8, 8), n_in: int = OBS, n_out: int = ACT) -> PopMLP:
    """A small relu PopMLP; biases are randomized too so the reference forward must use them."""
    gens = [torch.Generator().manual_seed(1000 * seed + k) for k in range(members)]
    net = PopMLP(
        members,
        n_in,
        n_out,
        NetworkConfig(name="mlp", hidden=list(hidden)),
        ActivationConfig(name="relu"),
        NormalizationConfig(name="none"),
        GainInitConfig(name="he"),
        gens,
    )
    g = torch.Generator().manual_seed(seed + 77)
    with torch.no_grad():
        for layer in net.layers:
            layer.bias.copy_(0.3 * torch.randn(layer.bias.shape, generator=g))
    return net


def ref_q(net: PopMLP, x: torch.Tensor) -> torch.Tensor:
    """The MLP written out member by member with F.linear in float64: [P, B, obs] -> [P, B, A]."""
    outs = []
    for p in range(x.shape[0]):
        h = x[p].double()
        for i, layer in enumerate(net.layers):
            h = F.linear(h, layer.weight[p].double(), layer.bias[p].double())
            if i < len(net.layers) - 1:
                h = torch.relu(h)
        outs.append(h)
    return torch.stack(outs)


def ref_target(q_net, target_net, batch: Batch, algo: DQNConfig, r_max: torch.Tensor) -> torch.Tensor:
    """y = r(/r_max) + gamma * (1 - terminated) * Q_boot(s', a*), element by element, float64."""
    with torch.no_grad():
        boot = target_net if target_net is not None else q_net
        q_boot, q_online = ref_q(boot, batch.next_obs), ref_q(q_net, batch.next_obs)
        P, B = batch.rewards.shape
        y = torch.empty(P, B, dtype=torch.float64)
        for p in range(P):
            for b in range(B):
                if algo.double:
                    a_star = int(q_online[p, b].argmax())
                    value = float(q_boot[p, b, a_star])
                else:
                    value = float(q_boot[p, b].max())
                r = float(batch.rewards[p, b])
                if algo.rescale_r:
                    r = r / float(r_max[p])
                mask = 1.0 - float(batch.terminated[p, b]) if algo.terminal_masking else 1.0
                y[p, b] = r + algo.gamma * mask * value
    return y


def ref_elementwise(td: torch.Tensor, algo: DQNConfig) -> torch.Tensor:
    """mse: td^2; huber(d): 0.5 td^2 if |td| <= d else d (|td| - d / 2); clip_delta > 0 wins."""
    if algo.clip_delta > 0:
        d = algo.clip_delta
    elif algo.loss == "huber":
        d = algo.huber_delta
    else:
        return td * td
    a = td.abs()
    return torch.where(a <= d, 0.5 * td * td, d * (a - 0.5 * d))


def ref_dloss_dq(td: torch.Tensor, algo: DQNConfig) -> torch.Tensor:
    """d(mean_b loss)/d Q(s_b, a_b): 2 td / B (mse), clip(td, +-d) / B (huber, clip_delta)."""
    B = td.shape[1]
    if algo.clip_delta > 0:
        return td.clamp(-algo.clip_delta, algo.clip_delta) / B
    if algo.loss == "huber":
        return td.clamp(-algo.huber_delta, algo.huber_delta) / B
    return 2.0 * td / B


def make_batch(P: int, B: int, seed: int = 0, reward_scale: float = 3.0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    terminated = (torch.rand(P, B, generator=g) < 0.4).float()
    terminated[:, 0], terminated[:, 1] = 1.0, 0.0  # every member has both kinds
    return Batch(
        obs=torch.randn(P, B, OBS, generator=g),
        actions=torch.randint(0, ACT, (P, B), generator=g),
        rewards=reward_scale * torch.randn(P, B, generator=g),
        next_obs=torch.randn(P, B, OBS, generator=g),
        terminated=terminated,
    )


class Recorder(torch.nn.Module):
    """Wraps a PopMLP; keeps every output so its gradient can be read after backward."""

    def __init__(self, net: PopMLP) -> None:
        super().__init__()
        self.net = net
        self.uses_batch_stats = net.uses_batch_stats
        self.calls = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        if out.requires_grad:
            out.retain_grad()
        self.calls.append((x, out))
        return out


def algo_cfg(**kw) -> DQNConfig:
    return DQNConfig(name="dqn", **kw)


LOSS_CASES = {
    "mse": dict(),
    "huber": dict(loss="huber", huber_delta=1.0),
    "huber_delta_0.5": dict(loss="huber", huber_delta=0.5),
    "clip_delta": dict(clip_delta=1.0),
    "clip_delta_overrides_huber": dict(loss="huber", huber_delta=3.0, clip_delta=0.7),
    "double": dict(double=True),
    "no_terminal_masking": dict(terminal_masking=False),
    "rescale_r": dict(rescale_r=True, gamma=0.9),
    "gamma_0": dict(gamma=0.0),
}


# ---------------------------------------------------------------- epsilon
def test_epsilon_is_the_linear_decay_then_constant():
    total = 1000
    duration = 0.25 * total
    for step in (0, 1, 100, 249, 250, 251, 999):
        expected = 1.0 + (0.05 - 1.0) * min(1.0, step / duration)
        assert epsilon(step, 1.0, 0.05, 0.25, total) == pytest.approx(expected, abs=1e-12)
    assert epsilon(0, 1.0, 0.05, 0.25, total) == pytest.approx(1.0)
    assert epsilon(5000, 1.0, 0.05, 0.25, total) == pytest.approx(0.05)
    # members with schedules of their own: [P, 1] arrays, each member's value as alone
    start, end, fraction = np.array([[1.0], [0.5]]), np.array([[0.05], [0.1]]), np.array([[0.25], [0.5]])
    each = epsilon(300, start, end, fraction, total)
    assert each.shape == (2, 1)
    assert each[0, 0] == epsilon(300, 1.0, 0.05, 0.25, total) and each[1, 0] == epsilon(300, 0.5, 0.1, 0.5, total)


# ---------------------------------------------------------------- the loss
@pytest.mark.parametrize("case", list(LOSS_CASES), ids=list(LOSS_CASES))
def test_dqn_loss_matches_written_out_target_and_loss(case):
    P, B = 3, 10
    algo = algo_cfg(**LOSS_CASES[case])
    q_net, target_net = make_net(P, 0), make_net(P, 1)
    batch = make_batch(P, B, seed=3)
    r_max = torch.tensor([1.0, 2.5, 4.0])

    loss, stats = dqn_loss(q_net, target_net, batch, algo, r_max)

    y = ref_target(q_net, target_net, batch, algo, r_max)
    q = ref_q(q_net, batch.obs).gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)  # [P, B]
    td = q - y
    expected = ref_elementwise(td, algo).mean(1)
    assert loss.shape == (P,)
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats["q_mean"].double(), q.mean(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats["q_max"].double(), q.amax(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats["td_abs_mean"].double(), td.abs().mean(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats["td_abs_max"].double(), td.abs().amax(1), rtol=1e-5, atol=1e-5)
    # td_loss on its own is the same elementwise formula
    torch.testing.assert_close(td_loss(td, algo), ref_elementwise(td, algo).mean(1))

    d = algo.clip_delta if algo.clip_delta > 0 else (algo.huber_delta if algo.loss == "huber" else None)
    if d is not None:  # both branches of the Huber form are exercised
        assert (td.abs() < d).any() and (td.abs() > d).any()


# ---------------------------------------------------------------- gradients without autograd
# every activation with a written derivative, from the registry; non-default parameters where it has some
_PARAMETERS = {"elu": {"alpha": 0.7}, "leaky_relu": {"negative_slope": 0.2}}
WRITTEN_ACTIVATIONS = {
    name: entry.schema(name=name, **_PARAMETERS.get(name, {}))
    for name, entry in ACTIVATIONS.items()
    if entry.backward is not None
}


def written_net(
    members: int, activation: ActivationConfig, dtype: torch.dtype = torch.float32, norm: str = "none", **network
) -> PopMLP:
    """A PopMLP with biases, norm affines and weight-norm gains randomized (so every pre-activation
    has both signs)."""
    gens = [torch.Generator().manual_seed(50 + k) for k in range(members)]
    normalization = {
        "none": NormalizationConfig(name="none"),
        "layer": LayerNormConfig(name="layer"),
        "batch": BatchNormConfig(name="batch"),
        "weight": WeightNormConfig(name="weight", g_init=0.8),
        "weight_hidden": WeightNormConfig(name="weight", g_init=0.8, output_layer=False),
    }[norm]
    net = PopMLP(
        members,
        OBS,
        ACT,
        NetworkConfig(name="mlp", hidden=[16, 12], **network),
        activation,
        normalization,
        GainInitConfig(name="he"),
        gens,
    ).to(dtype)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for layer in net.layers:
            layer.bias.copy_(0.5 * torch.randn(layer.bias.shape, generator=g))
            if isinstance(layer, PopWeightNormLinear):  # gains of both signs, away from g_init
                layer.g.add_(torch.randn(layer.g.shape, generator=g))
        for norm_layer in net.norms if norm in ("layer", "batch") else []:
            norm_layer.weight.add_(0.3 * torch.randn(norm_layer.weight.shape, generator=g))
            norm_layer.bias.add_(0.3 * torch.randn(norm_layer.bias.shape, generator=g))
    return net


@pytest.mark.parametrize("name", list(WRITTEN_ACTIVATIONS))
@pytest.mark.parametrize("members", [1, 3])
@pytest.mark.parametrize(
    "network",
    [{}, {"output_scale": 0.3}, {"linear_last_hidden": True}],
    ids=["plain", "output_scale", "linear_last_hidden"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("norm", ["none", "layer", "batch", "weight", "weight_hidden"])
def test_backward_to_grads_equals_autograd_bit_for_bit(name, members, network, dtype, norm):
    """Outputs, gradients and (batch norm, training mode) the running statistics: a network through
    autograd against its twin through forward_saved and backward_to_grads."""
    net, twin = (written_net(members, WRITTEN_ACTIVATIONS[name], dtype, norm, **network) for _ in range(2))
    assert twin.written_backward
    g = torch.Generator().manual_seed(4)
    x = torch.randn(members, 64, OBS, generator=g, dtype=dtype)
    grad_out = torch.randn(members, 64, ACT, generator=g, dtype=dtype)
    expected_out = net(x)
    expected_out.backward(grad_out)
    for p in twin.parameters():  # stale values must be overwritten, not added to
        p.grad = torch.full_like(p, 123.0)
    out, saved = twin.forward_saved(x)
    assert not out.requires_grad
    assert torch.equal(out, expected_out.detach())
    twin.backward_to_grads(saved, grad_out)
    for (pname, p), e in zip(twin.named_parameters(), net.parameters()):
        assert torch.equal(p.grad, e.grad), pname
        assert p.grad.abs().sum() > 0, pname
    for (bname, b), e in zip(twin.named_buffers(), net.buffers()):
        assert torch.equal(b, e), bname
    if norm == "batch":
        assert not torch.equal(twin.norms[0].running_mean, torch.zeros_like(twin.norms[0].running_mean))


def test_written_backward_only_where_it_is_exact():
    """Residual connections and a second input keep autograd."""
    relu = ActivationConfig(name="relu")
    gens = [torch.Generator().manual_seed(k) for k in range(2)]

    def pop(activation=relu, norm=NormalizationConfig(name="none"), extra_in=0, **network):
        return PopMLP(
            2,
            OBS,
            ACT,
            NetworkConfig(name="mlp", hidden=[8, 8], **network),
            activation,
            norm,
            GainInitConfig(name="he"),
            gens,
            extra_in=extra_in,
        )

    assert pop().written_backward
    assert pop(activation=ActivationConfig(name="softsign")).written_backward
    assert pop(norm=LayerNormConfig(name="layer")).written_backward
    assert pop(norm=BatchNormConfig(name="batch")).written_backward
    assert pop(norm=WeightNormConfig(name="weight")).written_backward
    assert pop(norm=WeightNormConfig(name="weight", output_layer=False)).written_backward
    assert not pop(residual=True).written_backward
    assert not pop(extra_in=1).written_backward


@pytest.mark.parametrize("case", list(LOSS_CASES), ids=list(LOSS_CASES))
@pytest.mark.parametrize("batch_size", [10, 128])
def test_dqn_loss_written_grads_equal_backward_bit_for_bit(case, batch_size):
    P = 3
    algo = algo_cfg(**LOSS_CASES[case])
    q_net, target_net = make_net(P, 0), make_net(P, 1)
    batch = make_batch(P, batch_size, seed=3)
    r_max = torch.tensor([1.0, 2.5, 4.0])
    loss, stats = dqn_loss(q_net, target_net, batch, algo, r_max)
    loss.sum().backward()
    expected = [p.grad.clone() for p in q_net.parameters()]
    for p in q_net.parameters():
        p.grad.fill_(-7.0)
    written_loss, written_stats = dqn_loss(q_net, target_net, batch, algo, r_max, written_backward=True)
    assert not written_loss.requires_grad
    assert torch.equal(written_loss, loss.detach())
    for key in stats:
        assert torch.equal(written_stats[key], stats[key]), key
    for p, e in zip(q_net.parameters(), expected):
        assert torch.equal(p.grad, e)


def test_pipeline_refuses_written_grads_with_a_penalty():
    net = make_net(2, 0)
    params = list(net.parameters())
    pipe = GradientPipeline(
        params,
        AdamConfig(name="adam"),
        ClippingConfig(name="none"),
        RegularizationConfig(l2=1e-3),
        weight_parameters(net),
        Health(2, CPU),
    )
    assert pipe.has_penalty
    with pytest.raises(ValueError, match="penalty"):
        pipe.step(torch.zeros(2), env_step=1, written_backward=True)


def test_dqn_loss_switches_change_the_result():
    """The switches are not no-ops on this batch, so the written-out comparisons above can tell them apart."""
    P, B = 3, 10
    q_net, target_net = make_net(P, 0), make_net(P, 1)
    batch = make_batch(P, B, seed=3)
    r_max = torch.tensor([1.0, 2.5, 4.0])
    base = dqn_loss(q_net, target_net, batch, algo_cfg(), r_max)[0]
    for kw in (
        {"double": True},
        {"terminal_masking": False},
        {"rescale_r": True},
        {"loss": "huber"},
        {"clip_delta": 1.0},
    ):
        other = dqn_loss(q_net, target_net, batch, algo_cfg(**kw), r_max)[0]
        assert not torch.allclose(other, base), kw
    # double DQN matters only where the online and target argmax differ; make sure they do here
    a_online = ref_q(q_net, batch.next_obs).argmax(-1)
    a_target = ref_q(target_net, batch.next_obs).argmax(-1)
    assert (a_online != a_target).any()


def test_terminal_masking_off_bootstraps_through_terminations_only():
    """rlexp's own y (read back from the mse gradient: y = Q(s,a) - B/2 * dL/dQ(s,a)) changes with
    terminal_masking=false by exactly gamma * max_a Q_target(s', a) on the terminal rows."""
    P, B = 2, 8
    q_net, target_net = make_net(P, 0), make_net(P, 1)
    batch = make_batch(P, B, seed=5)
    r_max = torch.ones(P)
    ys = {}
    for masking in (True, False):
        rec = Recorder(q_net)
        loss, _ = dqn_loss(rec, target_net, batch, algo_cfg(terminal_masking=masking, gamma=0.9), r_max)
        loss.sum().backward()
        (q_all,) = [out for _, out in rec.calls if out.requires_grad]
        idx = batch.actions.unsqueeze(-1)
        q, dq = q_all.gather(-1, idx).squeeze(-1), q_all.grad.gather(-1, idx).squeeze(-1)
        ys[masking] = (q - 0.5 * B * dq).detach().double()
        q_net.zero_grad()
    boot = ref_q(target_net, batch.next_obs).max(-1).values
    torch.testing.assert_close(ys[False] - ys[True], 0.9 * batch.terminated.double() * boot, rtol=1e-4, atol=1e-5)
    # masked: terminal rows have y = r exactly
    term = batch.terminated.bool()
    torch.testing.assert_close(ys[True][term], batch.rewards[term].double(), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- gradients: target isolation
@pytest.mark.parametrize("case", ["mse", "huber", "clip_delta", "double", "rescale_r"])
def test_gradient_reaches_only_chosen_actions_and_never_the_target_net(case):
    P, B = 3, 10
    algo = algo_cfg(**LOSS_CASES[case])
    q_net = make_net(P, 0)
    target_net = copy.deepcopy(q_net)  # requires_grad left on: only dqn_loss keeps it out of the graph
    with torch.no_grad():
        for p in target_net.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(9)))
    batch = make_batch(P, B, seed=4)
    r_max = torch.tensor([1.0, 2.0, 3.0])

    rec = Recorder(q_net)
    loss, _ = dqn_loss(rec, target_net, batch, algo, r_max)
    loss.sum().backward()

    for p in target_net.parameters():
        assert p.grad is None or not p.grad.any()
    with_grad = [(x, out) for x, out in rec.calls if out.requires_grad]
    assert len(with_grad) == 1 and with_grad[0][0] is batch.obs  # the next_obs passes carry no graph
    q_all = with_grad[0][1]
    y = ref_target(q_net, target_net, batch, algo, r_max)
    q = ref_q(q_net, batch.obs).gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)
    expected = torch.zeros(P, B, ACT, dtype=torch.float64)
    expected.scatter_(-1, batch.actions.unsqueeze(-1), ref_dloss_dq(q - y, algo).unsqueeze(-1))
    torch.testing.assert_close(q_all.grad.double(), expected, rtol=1e-5, atol=1e-6)
    chosen = F.one_hot(batch.actions, ACT).bool()
    assert not q_all.grad[~chosen].any()  # exactly zero at the other actions
    if algo.clip_delta > 0:  # the gradient is clip(delta)/B: some entries sit at the clip limit
        assert torch.isclose(q_all.grad.abs()[chosen], torch.tensor(algo.clip_delta / B)).any()
        assert (q_all.grad.abs()[chosen] <= algo.clip_delta / B + 1e-7).all()


@pytest.mark.parametrize("double", [False, True])
def test_without_target_network_y_carries_no_gradient(double):
    """target_net=None bootstraps from the online net, but the parameter gradient is that of
    mean (Q(s,a) - y)^2 with y computed under no_grad by hand."""
    P, B = 2, 8
    algo = algo_cfg(target_network=False, double=double, gamma=0.95)
    q_net = make_net(P, 2)
    batch = make_batch(P, B, seed=6)
    r_max = torch.ones(P)

    rec = Recorder(q_net)
    loss, _ = dqn_loss(rec, None, batch, algo, r_max)
    loss.sum().backward()
    got = [p.grad.clone() for p in q_net.parameters()]
    assert [x is batch.obs for x, out in rec.calls if out.requires_grad] == [True]
    assert all(not out.requires_grad for x, out in rec.calls if x is batch.next_obs)

    # by hand: y from the online net under no_grad (float32, same net), then the squared error
    params = list(q_net.parameters())
    for p in params:
        p.grad = None
    with torch.no_grad():
        next_q = q_net(batch.next_obs)
        next_v = next_q.max(-1).values
        y = batch.rewards + 0.95 * (1.0 - batch.terminated) * next_v
    q = q_net(batch.obs).gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)
    ((q - y).square().mean(1)).sum().backward()
    for g, p in zip(got, params):
        torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss.detach(), (q - y).square().mean(1).detach(), rtol=1e-5, atol=1e-6)

    # the check can fail: a y that carries the gradient gives a different parameter gradient
    leaky = [
        torch.autograd.grad(
            (
                q_net(batch.obs).gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1)
                - batch.rewards
                - 0.95 * (1.0 - batch.terminated) * q_net(batch.next_obs).max(-1).values
            )
            .square()
            .mean(1)
            .sum(),
            params,
        )
    ]
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(leaky[0], got))


# ---------------------------------------------------------------- replay memory
def _replay_rows(P, E, step, valid):
    """obs/next_obs/action/reward/terminated for one add: the obs carries a unique id per row."""
    ids = torch.tensor([[1000.0 * p + 10.0 * step + e + 1 for e in range(E)] for p in range(P)])
    if not valid.all():
        ids = torch.where(torch.as_tensor(valid), ids, -ids)  # invalid rows have negative ids
    obs = torch.stack([ids, ids + 0.5], -1)  # [P, E, 2]
    next_obs = obs + 0.25
    actions = torch.tensor([[(step + e) % 3 for e in range(E)] for _ in range(P)])
    rewards = 0.5 * ids
    terminated = torch.tensor([[float(e == 1) for e in range(E)] for _ in range(P)])
    return obs, actions, rewards, next_obs, terminated


def _row(obs, act, rew, nxt, term):
    return torch.cat([obs, nxt, torch.tensor([float(act), float(rew), float(term)])])


def test_replay_add_keeps_valid_rows_in_order_and_wraps():
    P, C, O, E = 2, 5, 2, 3
    buf = ReplayBuffer(P, C, O, CPU)
    masks = [
        [[True, False, True], [True, True, True]],
        [[False, False, False], [True, False, False]],
        [[True, True, True], [False, True, True]],
        [[True, True, False], [True, True, True]],
    ]
    stored = [[] for _ in range(P)]  # every valid row, in order, per member
    for step, mask in enumerate(masks):
        valid = np.array(mask)
        obs, actions, rewards, next_obs, terminated = _replay_rows(P, E, step, valid)
        # the numpy mask and a torch mask are the same thing
        buf.add(obs, actions, rewards, next_obs, terminated, valid if step % 2 == 0 else torch.tensor(mask))
        for p in range(P):
            for e in range(E):
                if mask[p][e]:
                    stored[p].append(_row(obs[p, e], actions[p, e], rewards[p, e], next_obs[p, e], terminated[p, e]))
        for p in range(P):
            n = len(stored[p])
            assert int(buf.size[p]) == min(n, C)
            assert int(buf.ptr[p]) == n % C
            for j in range(max(0, n - C), n):  # the C newest rows, row j at position j mod C
                torch.testing.assert_close(buf.data[p, j % C], stored[p][j], rtol=0, atol=0)
    assert [len(s) for s in stored] == [7, 9]  # both members wrapped around


def test_replay_sample_is_floor_u_times_size_per_member():
    P, C, O, E = 2, 6, 2, 2
    buf = ReplayBuffer(P, C, O, CPU)
    valid = np.array([[True, True], [True, False]])
    obs, actions, rewards, next_obs, terminated = _replay_rows(P, E, 0, valid)
    buf.add(obs, actions, rewards, next_obs, terminated, valid)
    valid2 = np.array([[True, False], [True, True]])
    obs2, actions2, rewards2, next_obs2, terminated2 = _replay_rows(P, E, 1, valid2)
    buf.add(obs2, actions2, rewards2, next_obs2, terminated2, valid2)
    # member 0 holds rows (step0,e0), (step0,e1), (step1,e0); member 1 holds (step0,e0), (step1,e0), (step1,e1)
    held = [[obs[0, 0], obs[0, 1], obs2[0, 0]], [obs[1, 0], obs2[1, 0], obs2[1, 1]]]
    acts = [[actions[0, 0], actions[0, 1], actions2[0, 0]], [actions[1, 0], actions2[1, 0], actions2[1, 1]]]
    u = torch.tensor([[0.0, 0.3, 0.34, 0.5, 0.7, 0.999999], [0.999, 0.1, 0.6666, 0.67, 0.2, 0.4]], dtype=torch.float64)
    batch = buf.sample(u)
    assert batch.obs.shape == (P, 6, O) and batch.actions.dtype == torch.long
    for p in range(P):
        for b in range(u.shape[1]):
            j = math.floor(float(u[p, b]) * 3)
            torch.testing.assert_close(batch.obs[p, b], held[p][j], rtol=0, atol=0)
            torch.testing.assert_close(batch.next_obs[p, b], held[p][j] + 0.25, rtol=0, atol=0)
            assert int(batch.actions[p, b]) == int(acts[p][j])
            assert float(batch.rewards[p, b]) == 0.5 * float(held[p][j][0])


def test_replay_never_samples_invalid_rows():
    P, C, O, E = 2, 4, 2, 3
    buf = ReplayBuffer(P, C, O, CPU)
    g = np.random.default_rng(0)
    streams = MemberStreams([0, 1])
    valid_ids = [set() for _ in range(P)]
    for step in range(6):
        valid = g.random((P, E)) < 0.5
        valid[:, 0] |= step == 0  # something valid from the start
        obs, actions, rewards, next_obs, terminated = _replay_rows(P, E, step, valid)
        buf.add(obs, actions, rewards, next_obs, terminated, valid)
        batch = buf.sample(streams.uniform(4000))
        for p in range(P):
            for e in range(E):
                if valid[p, e]:
                    valid_ids[p].add(float(obs[p, e, 0]))
            sampled = set(batch.obs[p, :, 0].tolist())
            assert all(i > 0 for i in sampled)  # no invalid (negative id) row, no empty (zero) row
            assert sampled <= valid_ids[p]
            # exactly the rows held now are drawn (the oldest may have been overwritten)
            held = set(buf.data[p, : int(buf.size[p]), 0].tolist())
            assert sampled == held


# ---------------------------------------------------------------- environments: autoreset
def _fixed_actions(t: int, P: int, E: int) -> torch.Tensor:
    # per env its own pattern: constant pushes (terminate fast) and alternation (survive)
    patterns = [lambda t: 0, lambda t: t % 2, lambda t: 1, lambda t: (t // 2) % 2]
    return torch.tensor([[patterns[(p * E + e) % 4](t) for e in range(E)] for p in range(P)])


def test_population_env_autoreset_step_is_invalid_and_episode_stats_match_rewards():
    P, E = 2, 2
    env = PopulationEnv(EnvConfig(id="CartPole-v1", num_envs=E, max_episode_steps=5), member_seeds=[0, 1])
    obs = env.reset()
    assert obs.shape == (P, E, 4)
    prev_done = np.zeros((P, E), dtype=bool)
    ret, length = np.zeros((P, E)), np.zeros((P, E), dtype=int)
    expected = [[] for _ in range(P)]
    seen_invalid = 0
    for t in range(23):
        res = env.step(_fixed_actions(t, P, E))
        assert res.obs.shape == (P, E, 4)
        np.testing.assert_array_equal(res.valid, ~prev_done)  # invalid exactly after a done
        for p in range(P):
            for e in range(E):
                if not res.valid[p, e]:
                    seen_invalid += 1
                    assert res.reward[p, e] == 0.0 and not res.terminated[p, e] and not res.truncated[p, e]
                    assert (np.abs(res.obs[p, e]) <= 0.05).all()  # a fresh CartPole start state
                    ret[p, e], length[p, e] = 0.0, 0
                    continue
                ret[p, e] += res.reward[p, e]
                length[p, e] += 1
                if res.terminated[p, e] or res.truncated[p, e]:
                    expected[p].append((ret[p, e], length[p, e]))
        prev_done = res.terminated | res.truncated
    env.close()
    assert seen_invalid >= 4
    episodes = env.take_episodes()
    for p in range(P):
        # member order of episodes within one step is env order, as in ``expected``
        assert len(episodes[p]) == len(expected[p]) == int(env.episode_count[p])
        for (r, n), (er, en) in zip(episodes[p], expected[p]):
            assert r == pytest.approx(er) and n == en
        assert list(env.last_returns[p]) == pytest.approx([r for r, _ in expected[p][-10:]])
    assert env.take_episodes() == [[], []]  # read once


@pytest.mark.parametrize(
    "env_id, P, E, kwargs, limit, steps, together",
    [
        ("CartPole-v1", 1, 3, {}, 7, 40, False),  # one environment after another
        ("Pendulum-v1", 2, 3, {}, 7, 40, False),
        ("CartPole-v1", 4, 3, {}, 7, 40, True),  # CartPoles stepped together
        ("CartPole-v1", 8, 2, {}, None, 300, True),  # 500-step TimeLimit: episodes end by the thresholds
        ("CartPole-v1", 3, 3, {"sutton_barto_reward": True}, None, 200, True),
    ],
)
def test_population_env_steps_exactly_as_gymnasium_sync_vector_env(env_id, P, E, kwargs, limit, steps, together):
    """Both ways of stepping return what gymnasium's SyncVectorEnv (NEXT_STEP autoreset) returns for
    the same seeds and actions: observations, rewards and flags, bit for bit, through autoresets."""
    cfg = EnvConfig(id=env_id, num_envs=E, max_episode_steps=limit, kwargs=kwargs)
    env = PopulationEnv(cfg, member_seeds=[4, 9, 1, 7, 3, 8, 2, 6][:P])
    assert (env.cartpoles is not None) == together
    sync = gym.make_vec(env_id, num_envs=P * E, vectorization_mode="sync", max_episode_steps=limit, **kwargs)
    np.testing.assert_array_equal(env.reset(), sync.reset(seed=env.seeds)[0].reshape(P, E, -1))
    rng = np.random.default_rng(0)
    prev_done, resets, terminations = np.zeros(P * E, dtype=bool), 0, 0
    for _ in range(steps):
        if env_id == "CartPole-v1":
            actions = rng.integers(0, 2, (P, E))
        else:
            actions = rng.uniform(-2, 2, (P, E, 1)).astype(np.float32)
        res = env.step(actions)
        obs, reward, terminated, truncated, _ = sync.step(actions.reshape(P * E, *env.action_space.shape))
        np.testing.assert_array_equal(res.obs, obs.reshape(P, E, -1))
        np.testing.assert_array_equal(res.reward, reward.reshape(P, E))
        np.testing.assert_array_equal(res.terminated, terminated.reshape(P, E))
        np.testing.assert_array_equal(res.truncated, truncated.reshape(P, E))
        np.testing.assert_array_equal(res.valid, ~prev_done.reshape(P, E))
        if together:  # the float64 states too, which float32 observations would round away
            np.testing.assert_array_equal(env.cartpoles.state.T, [e.unwrapped.state for e in sync.envs])
        resets += int(prev_done.sum())
        terminations += int(terminated.sum())
        prev_done = terminated | truncated
    assert resets >= P * E  # the comparison went through autoresets
    assert terminations > 0 or limit is not None  # the thresholds ended episodes, too
    env.close()
    sync.close()


@pytest.mark.parametrize("saved_together", [True, False], ids=["together_to_alone", "alone_to_together"])
def test_a_cartpole_state_continues_whichever_way_the_next_population_steps(saved_together):
    """CartPoles stepped together and one by one save one form: a state saved by one way continues in
    the other bit for bit as it would have, through time limits and terminations (a packed grid that
    regroups its cells on resume steps them in another population)."""
    from rlexp.run.checkpoint import split, stack

    cfg = EnvConfig(id="CartPole-v1", num_envs=2, max_episode_steps=30)
    seeds = [3, 8]

    def stepped(together: bool, actions: list[np.ndarray]) -> PopulationEnv:
        env = PopulationEnv(cfg, seeds, together=together)
        env.reset()
        for a in actions:
            env.step(a)
        return env

    rng = np.random.default_rng(1)
    actions = [rng.integers(0, 2, (2, 2)) for _ in range(120)]
    reference = stepped(True, actions)  # uninterrupted
    first = stepped(saved_together, actions[:57])
    own, shared = split(first.state_dict(), 2)  # through the checkpoint's own split and stack
    resumed = stepped(not saved_together, [])
    resumed.load_state_dict(stack(own, shared))
    assert (first.cartpoles is not None) == saved_together and (resumed.cartpoles is None) == saved_together
    ended = 0
    again = stepped(True, actions[:57])
    for a in actions[57:]:
        expected, result = again.step(a), resumed.step(a)
        for name in ("obs", "reward", "terminated", "truncated", "valid"):
            np.testing.assert_array_equal(getattr(result, name), getattr(expected, name), err_msg=name)
        ended += int((expected.terminated | expected.truncated).sum())
    assert ended > 2 and reference.episode_count.tolist() == resumed.episode_count.tolist()


@pytest.mark.parametrize("E", [1, 4], ids=["one_after_another", "together"])
def test_timeout_terminal_turns_the_step_limit_into_a_termination(E):
    """env.timeout_terminal: the same steps, with each truncation reported as a termination instead."""
    runs = []
    for terminal in (False, True):
        env = PopulationEnv(
            EnvConfig(id="CartPole-v1", num_envs=E, max_episode_steps=6, timeout_terminal=terminal), [5]
        )
        env.reset()
        rng = np.random.default_rng(0)
        runs.append([env.step(rng.integers(0, 2, (1, E))) for _ in range(40)])
    for plain, terminal in zip(*runs):
        np.testing.assert_array_equal(terminal.obs, plain.obs)
        np.testing.assert_array_equal(terminal.valid, plain.valid)
        np.testing.assert_array_equal(terminal.terminated, plain.terminated | plain.truncated)
        assert not terminal.truncated.any()
    assert sum(r.truncated.sum() for r in runs[0]) > 0


def test_population_env_steps_cartpoles_together_only_when_it_is_the_same():
    """Together needs 4+ environments of gymnasium's own CartPole: not for fewer, not for another
    environment, not when rendered (the single environment's render call would be skipped)."""

    def together(id, P, **kwargs):
        return PopulationEnv(EnvConfig(id=id, num_envs=1, kwargs=kwargs), list(range(P))).cartpoles is not None

    assert together("CartPole-v1", 4)
    assert not together("CartPole-v1", 3)
    assert not together("Acrobot-v1", 8)
    assert not together("CartPole-v1", 8, render_mode="rgb_array")


def test_population_env_episode_records_are_the_same_both_ways(monkeypatch):
    """Episode returns, lengths, counts and the last 10 returns do not depend on the way of stepping."""
    records = []
    for min_together in (10**9, 8):  # one by one, then together
        monkeypatch.setattr(PopulationEnv, "MIN_TOGETHER", min_together)
        env = PopulationEnv(EnvConfig(id="CartPole-v1", num_envs=4, max_episode_steps=30), member_seeds=[5, 2])
        assert (env.cartpoles is not None) == (min_together == 8)
        env.reset()
        rng = np.random.default_rng(1)
        episodes = []
        for _ in range(200):
            env.step(rng.integers(0, 2, (2, 4)))
            episodes.append(env.take_episodes())
        records.append((episodes, env.episode_count.tolist(), [list(d) for d in env.last_returns]))
        env.close()
    assert records[0] == records[1]
    assert sum(records[0][1]) > 20
    assert all(isinstance(r, float) and isinstance(n, int) for step in records[1][0] for m in step for r, n in m)


def test_population_env_member_seeds_are_independent_of_population():
    """Member with seed 7 sees the same episode in populations [3, 7] and [9, 7]."""
    runs = []
    for seeds in ([3, 7], [9, 7]):
        env = PopulationEnv(EnvConfig(id="CartPole-v1", num_envs=2, max_episode_steps=6), member_seeds=seeds)
        traj = [torch.as_tensor(env.reset()[1]).clone()]
        for t in range(10):
            traj.append(torch.as_tensor(env.step(_fixed_actions(t, 2, 2)).obs[1]).clone())
        first = env.reset()[0, 0].copy()  # member 0's first env, for the contrast below
        env.close()
        runs.append((torch.stack(traj), first))
    assert torch.equal(runs[0][0], runs[1][0])
    assert not np.array_equal(runs[0][1], runs[1][1])  # members with seeds 3 and 9 do differ


def test_population_env_reset_starts_episode_bookkeeping_afresh():
    env = PopulationEnv(EnvConfig(id="CartPole-v1", num_envs=1, max_episode_steps=5), member_seeds=[0])
    env.reset()
    for _ in range(3):
        env.step(torch.zeros(1, 1, dtype=torch.long))
    env.reset()  # a fresh start: the TimeLimit truncates 5 steps after this
    rewards = []
    while True:
        res = env.step(torch.tensor([[len(rewards) % 2]]))
        rewards.append(float(res.reward[0, 0]))
        if res.terminated[0, 0] or res.truncated[0, 0]:
            break
    env.close()
    assert env.take_episodes()[0] == [(sum(rewards), len(rewards))]


# ---------------------------------------------------------------- the training loop's storage
# evaluation off: these runs record every step of the (training) environments
TINY = [
    "logger.mode=disabled",
    "logger.progress=off",
    "network.hidden=[16,16]",
    "device=cpu",
    "threads=1",
    "eval.episodes=0",
]


class _EnvRecorder:
    """Patches PopulationEnv.reset/step to record what the environments returned and got."""

    def __init__(self, monkeypatch):
        self.resets, self.steps, self.actions = [], [], []
        real_reset, real_step = PopulationEnv.reset, PopulationEnv.step
        rec = self

        def reset(env):
            obs = real_reset(env)
            rec.resets.append(torch.as_tensor(obs).clone())
            return obs

        def step(env, actions):
            rec.actions.append(torch.as_tensor(actions).clone())
            res = real_step(env, actions)
            recorded = copy.deepcopy(res)
            recorded.obs = torch.as_tensor(recorded.obs)
            rec.steps.append(recorded)
            return res

        monkeypatch.setattr(PopulationEnv, "reset", reset)
        monkeypatch.setattr(PopulationEnv, "step", step)


def _is_cartpole_start(x: torch.Tensor) -> bool:
    return bool((x.abs() <= 0.05).all())


def _is_cartpole_terminal(x: torch.Tensor) -> bool:
    return bool(x[0].abs() > 2.4 or x[2].abs() > 12 * 2 * math.pi / 360)


@pytest.fixture(scope="module")
def recorded_dqn_run(tmp_path_factory):
    """A real dqn.train run (P=2, E=2, random actions, short time limit) with its replay memory and
    every environment step recorded."""
    mp = pytest.MonkeyPatch()
    buffers = []

    class RecordingBuffer(ReplayBuffer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            buffers.append(self)

    try:
        mp.setattr(dqn_module, "ReplayBuffer", RecordingBuffer)
        envrec = _EnvRecorder(mp)
        cfg = compose_config(
            TINY
            + [
                "total_steps=400",
                "num_seeds=2",
                "env.num_envs=2",
                "env.max_episode_steps=15",
                "algo.end_e=1.0",
                "algo.learning_starts=300",
                "algo.train_frequency=50",
                "algo.batch_size=16",
                "algo.buffer_size=1000",
                "logger.log_every=100",
            ]
        )
        out = tmp_path_factory.mktemp("recorded")
        job = run_job(cfg, out)
    finally:
        mp.undo()
    assert len(buffers) == 1
    return job, buffers[0], envrec


def _expected_transitions(envrec, P, E):
    """Per member, the transitions dqn.train should store, in storage order: (env, row, done, truncated)."""
    out = [[] for _ in range(P)]
    prev = envrec.resets[0]
    assert len(envrec.resets) == 1
    for actions, res in zip(envrec.actions, envrec.steps):
        for p in range(P):
            for e in range(E):
                if res.valid[p, e]:
                    row = _row(prev[p, e], actions[p, e], res.reward[p, e], res.obs[p, e], float(res.terminated[p, e]))
                    out[p].append((e, row, bool(res.terminated[p, e]), bool(res.truncated[p, e])))
        prev = res.obs
    return out


def test_training_loop_stores_exactly_the_valid_transitions(recorded_dqn_run):
    job, buf, envrec = recorded_dqn_run
    assert job["status"] == "ok"
    P, E = 2, 2
    assert len(envrec.steps) == 400 // E
    expected = _expected_transitions(envrec, P, E)
    n_invalid = sum(int((~s.valid).sum()) for s in envrec.steps)
    assert n_invalid > 0  # autoreset steps happened and ...
    assert sum(len(x) for x in expected) == P * len(envrec.steps) * E - n_invalid  # ... were left out
    for p in range(P):
        assert int(buf.size[p]) == len(expected[p]) <= buf.capacity
        for j, (_, row, _, _) in enumerate(expected[p]):
            torch.testing.assert_close(buf.data[p, j], row, rtol=0, atol=0)


def test_stored_transitions_chain_per_env_and_never_start_from_a_final_observation(recorded_dqn_run):
    _, buf, envrec = recorded_dqn_run
    P, E, O = 2, 2, 4
    expected = _expected_transitions(envrec, P, E)
    checked_chain = checked_reset = 0
    for p in range(P):
        rows = buf.data[p, : int(buf.size[p])]
        envs = [e for e, _, _, _ in expected[p]]
        done = [d or tr for _, _, d, tr in expected[p]]
        final_obs = {tuple(rows[j, O : 2 * O].tolist()) for j in range(len(rows)) if done[j]}
        for j in range(len(rows)):
            assert tuple(rows[j, :O].tolist()) not in final_obs  # no row starts from a final observation
            later = [k for k in range(j + 1, len(rows)) if envs[k] == envs[j]]
            if not later:
                continue
            k = later[0]
            if done[j]:
                assert not torch.equal(rows[k, :O], rows[j, O : 2 * O])
                assert _is_cartpole_start(rows[k, :O])
                checked_reset += 1
            else:
                assert torch.equal(rows[k, :O], rows[j, O : 2 * O])
                checked_chain += 1
    assert checked_chain > 100 and checked_reset > 10


def test_truncation_bootstraps_termination_does_not(recorded_dqn_run):
    """Stored terminated flag: 1 for terminations, 0 for time-limit truncations (and ordinary steps)."""
    _, buf, envrec = recorded_dqn_run
    P, E, O = 2, 2, 4
    expected = _expected_transitions(envrec, P, E)
    n_term = n_trunc = 0
    for p in range(P):
        for j, (_, _, terminated, truncated) in enumerate(expected[p]):
            stored = float(buf.data[p, j, 2 * O + 2])
            next_obs = buf.data[p, j, O : 2 * O]
            if terminated:
                assert stored == 1.0 and _is_cartpole_terminal(next_obs)
                n_term += 1
            else:
                assert stored == 0.0
                n_trunc += truncated
                if truncated:
                    assert not _is_cartpole_terminal(next_obs)
    assert n_term > 0 and n_trunc > 0


# ---------------------------------------------------------------- population independence
def _run_population(perturb: bool = False, nan_obs: bool = False, n_updates: int = 4):
    P, B = 4, 16
    q_net = make_net(P, 11, hidden=(16, 16))
    if perturb:
        with torch.no_grad():
            for p in q_net.parameters():
                p[2].add_(torch.randn(p[2].shape, generator=torch.Generator().manual_seed(5)))
    target = copy.deepcopy(q_net)
    target.requires_grad_(False)
    params = list(q_net.parameters())
    health = Health(P, CPU)
    pipe = GradientPipeline(
        params,
        AdamConfig(name="adam", lr=1e-3),
        NormClipConfig(name="global_norm", max_norm=0.5),
        RegularizationConfig(),
        weight_parameters(q_net),
        health,
    )
    batch = make_batch(P, B, seed=21)
    if nan_obs:
        batch.obs[2] = float("nan")
        batch.next_obs[2] = float("nan")
    algo = algo_cfg(double=True, loss="huber")
    r_max = torch.ones(P)
    initial = [p.detach().clone() for p in params]
    history = []
    for i in range(n_updates):
        loss, _ = dqn_loss(q_net, target, batch, algo, r_max)
        stats = pipe.step(loss, env_step=10 * (i + 1))
        history.append(
            dict(
                loss=stats.loss.clone(),
                pre=stats.grad_norm_pre_clip.clone(),
                grads=[p.grad.clone() for p in params],
                params=[p.detach().clone() for p in params],
            )
        )
    return initial, history, health


def test_population_members_are_bitwise_independent():
    _, base, base_health = _run_population()
    assert (base[0]["pre"] > 0.5).any()  # the clipping acts on this batch
    assert bool(base_health.alive.all())
    for variant in (dict(perturb=True), dict(nan_obs=True)):
        _, other, _ = _run_population(**variant)
        for a, b in zip(base, other):
            for k in (0, 1, 3):
                assert torch.equal(a["loss"][k], b["loss"][k]), variant
                assert all(torch.equal(x[k], y[k]) for x, y in zip(a["grads"], b["grads"])), variant
                assert all(torch.equal(x[k], y[k]) for x, y in zip(a["params"], b["params"])), variant
            # member 2 did change (the test can tell)
            assert not all(torch.equal(x[2], y[2]) for x, y in zip(a["params"], b["params"])), variant


def test_population_member_with_nan_batch_diverges_and_is_frozen():
    initial, hist, health = _run_population(nan_obs=True)
    assert health.alive.tolist() == [True, True, False, True]
    assert CAUSES[int(health.cause[2])] in ("nonfinite_loss", "nonfinite_grad")
    assert int(health.diverged_at[2]) == 10  # the env_step of the first update
    assert health.diverged_at.tolist()[:2] == [-1, -1] and int(health.diverged_at[3]) == -1
    for h in hist:
        assert torch.isnan(h["loss"][2])
        assert all(torch.equal(p[2], p0[2]) for p, p0 in zip(h["params"], initial))  # frozen
        for k in (0, 1, 3):  # the others move
            assert not all(torch.equal(p[k], p0[k]) for p, p0 in zip(h["params"], initial))


def test_population_member_equals_that_member_trained_alone():
    """Member 1 of the population follows the same trajectory as a population of just member 1."""
    _, hist, _ = _run_population()
    P, B = 4, 16
    q_full = make_net(P, 11, hidden=(16, 16))
    q_net = make_net(1, 0, hidden=(16, 16))
    with torch.no_grad():
        for p, src in zip(q_net.parameters(), q_full.parameters()):
            p.copy_(src[1:2])
    target = copy.deepcopy(q_net)
    target.requires_grad_(False)
    params = list(q_net.parameters())
    pipe = GradientPipeline(
        params,
        AdamConfig(name="adam", lr=1e-3),
        NormClipConfig(name="global_norm", max_norm=0.5),
        RegularizationConfig(),
        weight_parameters(q_net),
        Health(1, CPU),
    )
    full = make_batch(P, B, seed=21)
    batch = Batch(full.obs[1:2], full.actions[1:2], full.rewards[1:2], full.next_obs[1:2], full.terminated[1:2])
    algo = algo_cfg(double=True, loss="huber")
    for i, h in enumerate(hist):
        loss, _ = dqn_loss(q_net, target, batch, algo, torch.ones(1))
        pipe.step(loss, env_step=10 * (i + 1))
        torch.testing.assert_close(loss.detach()[0], h["loss"][1])
        for p, ref in zip(params, h["params"]):
            torch.testing.assert_close(p.detach()[0], ref[1])


# ---------------------------------------------------------------- member streams
def test_member_streams_depend_on_the_member_seed_only():
    a = MemberStreams([5, 7], block=16)
    b = MemberStreams([9, 7], block=16)
    alone = MemberStreams([7], block=16)
    draws_a, draws_b, draws_alone = [], [], []
    for n in (3, 5, 7, 1, 20, 2):  # crosses block refills, including one draw larger than a block
        draws_a.append(torch.as_tensor(a.uniform(n)).clone())
        draws_b.append(torch.as_tensor(b.uniform(n)).clone())
        draws_alone.append(torch.as_tensor(alone.uniform(n)).clone())
        assert draws_a[-1].shape == (2, n) and draws_a[-1].dtype == torch.float64
    xa, xb, x1 = torch.cat(draws_a, 1), torch.cat(draws_b, 1), torch.cat(draws_alone, 1)
    assert torch.equal(xa[1], xb[1])
    assert torch.equal(xa[1], x1[0])
    assert not torch.equal(xa[0], xb[0])  # seeds 5 and 9 differ
    assert not torch.equal(xa[0], xa[1])
    for x in (xa, xb):
        assert (x >= 0).all() and (x < 1).all()
    # the first draw is the start of the member's own generator (purpose 2 = streams)
    first = torch.rand(16, generator=member_generator(7, 2), dtype=torch.float64)[:3]
    assert torch.equal(draws_a[0][1], first)
    assert len(set(xa[1].tolist())) == xa.shape[1]  # no repeats within a member


# ---------------------------------------------------------------- end to end
def _read_metrics(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_tiny_training_run_writes_the_output_contract(tmp_path, monkeypatch):
    envrec = _EnvRecorder(monkeypatch)
    total, starts, freq, gsteps, log_every = 600, 200, 50, 4, 100
    cfg = compose_config(
        TINY
        + [
            f"total_steps={total}",
            "num_seeds=2",
            f"algo.learning_starts={starts}",
            f"algo.train_frequency={freq}",
            f"algo.gradient_steps={gsteps}",
            "algo.batch_size=32",
            f"logger.log_every={log_every}",
        ]
    )
    job = run_job(cfg, tmp_path)

    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["status"] == job["status"] == "ok"
    assert on_disk["counts"] == {"ok": 2, "diverged": 0, "crashed": 0}
    assert [m["seed"] for m in on_disk["members"]] == [0, 1]
    assert on_disk["num_seeds"] == 2 and on_disk["total_steps"] == total
    assert on_disk["error"] is None

    # episodes per member, summed from the recorded step rewards
    P = 2
    returns = [[] for _ in range(P)]
    running = np.zeros(P)
    for res in envrec.steps:
        for p in range(P):
            if not res.valid[p, 0]:
                running[p] = 0.0
                continue
            running[p] += res.reward[p, 0]
            if res.terminated[p, 0] or res.truncated[p, 0]:
                returns[p].append(running[p])
    assert len(envrec.steps) == total

    # update phases: steps s > learning_starts where s // train_frequency ticks
    phases = sum(1 for s in range(1, total + 1) if s > starts and s // freq > (s - 1) // freq)
    for k in range(P):
        member = json.loads((tmp_path / f"seed_{k}" / "summary.json").read_text())
        assert member == on_disk["members"][k]
        assert member["status"] == "ok" and member["seed"] == k and member["member"] == k
        assert member["steps"] == total
        assert member["episodes"] == len(returns[k]) > 10
        assert isinstance(member["final_return"], float)
        assert member["final_return"] == pytest.approx(float(np.mean(returns[k][-10:])))
        assert member["diverged_at_step"] is None and member["divergence"] is None

        lines = _read_metrics(tmp_path / f"seed_{k}" / "metrics.jsonl")
        steps = [line["step"] for line in lines]
        assert steps == list(range(log_every, total + 1, log_every))
        for line in lines:
            assert ("train/loss" in line) == (line["step"] > starts)
            if "train/loss" in line:
                assert math.isfinite(line["train/loss"]) and line["train/loss"] >= 0
            n_phases = sum(1 for s in range(1, line["step"] + 1) if s > starts and s // freq > (s - 1) // freq)
            assert line["train/updates"] == gsteps * n_phases
            assert line["train/epsilon"] == pytest.approx(
                epsilon(line["step"], cfg.algo.start_e, cfg.algo.end_e, cfg.algo.exploration_fraction, total)
            )
        assert lines[-1]["train/updates"] == gsteps * phases
        assert lines[-1]["episode/return_last10"] == pytest.approx(member["final_return"])
        assert lines[-1]["episode/count"] == member["episodes"]


def test_a_divergence_is_a_result(tmp_path):
    total, starts, freq, log_every = 600, 200, 50, 100
    cfg = compose_config(
        TINY
        + [
            f"total_steps={total}",
            "num_seeds=2",
            f"algo.learning_starts={starts}",
            f"algo.train_frequency={freq}",
            "algo.gradient_steps=4",
            "algo.batch_size=32",
            f"logger.log_every={log_every}",
            "optimizer=sgd",
            "optimizer.lr=1e6",
        ]
    )
    job = run_job(cfg, tmp_path)  # returns normally

    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["status"] == job["status"] == "diverged"
    assert on_disk["error"] is None
    counts = on_disk["counts"]
    assert counts["crashed"] == 0 and counts["diverged"] >= 1 and counts["ok"] + counts["diverged"] == 2
    phase_steps = {s for s in range(1, total + 1) if s > starts and s // freq > (s - 1) // freq}
    for k in range(2):
        member = json.loads((tmp_path / f"seed_{k}" / "summary.json").read_text())
        assert member == on_disk["members"][k]
        if member["status"] != "diverged":
            continue
        at = member["diverged_at_step"]
        assert at in phase_steps  # divergence is detected at an update
        assert member["divergence"]["cause"] in CAUSES[1:]
        assert at <= member["steps"] < at + log_every  # reported at the first log after it
        lines = _read_metrics(tmp_path / f"seed_{k}" / "metrics.jsonl")
        assert lines[-1]["step"] == member["steps"]  # the member's log stops there


@pytest.mark.parametrize("members", [1, 7, 16, 40])
def test_threads_minus_one_picks_one_thread_per_8_members_within_the_cores(members, tmp_path):
    cores = len(os.sched_getaffinity(0))
    expected = max(1, min(cores, members // 8))  # 1 below 16 members; never more than the cores
    assert population_threads(members) == expected
    try:
        job = run_job(
            compose_config(
                TINY[:-1] + ["threads=-1", f"num_seeds={members}", "total_steps=40", "algo.learning_starts=20"]
            ),
            tmp_path,
        )
        assert job["threads"] == expected == torch.get_num_threads()
    finally:
        torch.set_num_threads(1)  # the rest of the suite runs on one thread


@pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings (Linux only)"
)
def test_keep_freed_memory_reuses_an_update_sized_temporary_without_page_faults():
    keep_freed_memory()
    torch.ones(96, 128, 64)  # 3 MiB: the heap grows once
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        torch.ones(96, 128, 64)  # allocated, written, freed: the same block again
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 768  # glibc's defaults trim and fault the block in again: ~6,000 faults here


@pytest.mark.parametrize(
    "overrides,written",
    [
        ([], True),
        (["regularization.l2=1e-4"], False),
        (["normalization=layer"], True),
        (["activation=softsign"], True),
        (["normalization=weight"], True),
        (["normalization=batch"], True),
    ],
    ids=["plain", "l2_penalty", "layer_norm", "softsign", "weight_norm", "batch_norm"],
)
def test_training_writes_gradients_without_autograd_only_where_exact(tmp_path, monkeypatch, overrides, written):
    """Training takes the written gradients for a plain network without a penalty, and autograd
    otherwise; both train (every update reaches the optimizer)."""
    calls = []
    real = PopMLP.backward_to_grads
    monkeypatch.setattr(PopMLP, "backward_to_grads", lambda self, *a: calls.append(1) or real(self, *a))
    cfg = compose_config(
        TINY
        + overrides
        + [
            "total_steps=300",
            "num_seeds=2",
            "algo.learning_starts=100",
            "algo.train_frequency=20",
            "algo.gradient_steps=2",
            "algo.batch_size=16",
        ]
    )
    job = run_job(cfg, tmp_path)
    assert job["status"] == "ok"
    updates = 2 * ((300 - 100) // 20)
    assert len(calls) == (updates if written else 0)
