"""DQN's update (rlexp/algos/dqn.py), in pieces: the loss with DQN 3.0's switches against a written-out
target, its written gradients bit for bit against autograd, where the gradient reaches, the epsilon
schedule; a population's update: members bitwise independent, a NaN batch freezing its member alone,
a member as it trains alone."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra)
from rlexp.algos.common import epsilon
from rlexp.algos.dqn import dqn_loss, td_loss
from rlexp.config.schema import (
    ActivationConfig,
    AdamConfig,
    ClippingConfig,
    DQNConfig,
    GainInitConfig,
    NetworkConfig,
    NormalizationConfig,
    NormClipConfig,
    RegularizationConfig,
)
from rlexp.data.buffers import Batch
from rlexp.nn.nets import PopMLP, weight_parameters
from rlexp.optim.pipeline import CAUSES, GradientPipeline, Health

torch.set_num_threads(1)

CPU = torch.device("cpu")


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


def test_a_spectral_norms_power_iteration_runs_in_the_update_and_not_in_the_target():
    """dqn_loss runs the online network's forward in training mode, as torch's spectral_norm does there: the
    update moves u one power iteration towards W's first left singular vector (written out here), then
    leaves the network in eval mode; the target's forward (eval mode) leaves the target's u as it is."""
    P = 3
    q_net = PopMLP(
        P,
        OBS,
        ACT,
        NetworkConfig(name="mlp", hidden=[8, 8]),
        ActivationConfig(name="relu"),
        NormalizationConfig(name="spectral", power_iterations=1),
        GainInitConfig(name="he"),
        [torch.Generator().manual_seed(k) for k in range(P)],
    )
    target_net = copy.deepcopy(q_net)
    layer = q_net.layers[0]
    with torch.no_grad():  # a new W: u is no longer near its first left singular vector
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=torch.Generator().manual_seed(5)))
    u, weight, target_u = layer.u.clone(), layer.weight.detach().clone(), target_net.layers[0].u.clone()
    v = F.normalize(torch.einsum("po,poi->pi", u, weight), dim=-1, eps=1e-12)
    expected = F.normalize(torch.einsum("poi,pi->po", weight, v), dim=-1, eps=1e-12)
    q_net.eval(), target_net.eval()  # as the training loop leaves them (acting)
    dqn_loss(q_net, target_net, make_batch(P, 16), algo_cfg(), torch.ones(P))
    torch.testing.assert_close(layer.u, expected)
    assert not torch.equal(layer.u, u)
    assert torch.equal(target_net.layers[0].u, target_u)
    assert not q_net.training and not layer.training


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
