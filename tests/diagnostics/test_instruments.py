"""Tests of the instruments (rlexp.diagnostics.instruments, dqn.instruments / dqn.locate): activation
statistics, per-layer norms, weight-norm statistics, where a non-finite value was born, explosion
checks, the instrument history. Their jobs are in tests/jobs/test_instrument_jobs.py.

Every check compares rlexp against a direct computation written out here on a tiny network or on hand-
made tensors: per-member float64 forward passes with F.linear, gradients from plain autograd per member,
norms summed element by element, strike counters written as a loop.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import pytest
import torch
import torch.nn.functional as F

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra before compose)
from rlexp.algos import dqn
from rlexp.config.schema import (
    ActivationConfig,
    DiagnosticsConfig,
    DQNConfig,
    GainInitConfig,
    LayerNormConfig,
    NetworkConfig,
    NormalizationConfig,
    NormClipConfig,
    RegularizationConfig,
    SGDConfig,
    WeightNormConfig,
)
from rlexp.data.buffers import Batch
from rlexp.diagnostics.instruments import (
    Explosions,
    InstrumentHistory,
    activation_stats,
    hidden_outputs,
    layer_of,
    layer_stats,
    locate_gradient,
    locate_nonfinite,
    parameter_names,
    per_layer,
    resolve,
)
from rlexp.nn.nets import PopMLP, PopWeightNormLinear, weight_parameters
from rlexp.optim.pipeline import GradientPipeline, Health

torch.set_num_threads(1)

CPU = torch.device("cpu")


OBS, ACT = 3, 3


# ====================================================================== helpers
def make_net(
    members: int = 2,
    hidden: Sequence[int] = (5, 4),
    norm: NormalizationConfig | None = None,
    seed: int = 0,
    act: str = "relu",
) -> PopMLP:
    """A tiny population MLP; biases randomized too so references must use them."""
    gens = [torch.Generator().manual_seed(100 * seed + k) for k in range(members)]
    net = PopMLP(
        members,
        OBS,
        ACT,
        NetworkConfig(name="mlp", hidden=list(hidden)),
        ActivationConfig(name=act),
        norm or NormalizationConfig(name="none"),
        GainInitConfig(name="he"),
        gens,
    )
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for layer in net.layers:
            layer.bias.copy_(0.2 * torch.randn(layer.bias.shape, generator=g))
    return net


def make_batch(P: int, B: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    terminated = (torch.rand(P, B, generator=g) < 0.3).float()
    terminated[:, 0], terminated[:, 1] = 1.0, 0.0
    return Batch(
        obs=torch.randn(P, B, OBS, generator=g),
        actions=torch.randint(0, ACT, (P, B), generator=g),
        rewards=torch.randn(P, B, generator=g),
        next_obs=torch.randn(P, B, OBS, generator=g),
        terminated=terminated,
    )


def ref_forward(weights: list[tuple], x: torch.Tensor) -> torch.Tensor:
    """Plain relu MLP of one member, float64: weights [(W, b), ...], x [B, in] -> [B, A]."""
    h = x.double()
    for i, (w, b) in enumerate(weights):
        h = F.linear(h, w, b)
        if i < len(weights) - 1:
            h = torch.relu(h)
    return h


def member_weights(net: PopMLP, p: int) -> list[tuple]:
    return [(layer.weight[p].detach().double(), layer.bias[p].detach().double()) for layer in net.layers]


def l2(*tensors: torch.Tensor) -> float:
    """sqrt of the sum of squares of every element, summed in Python float64."""
    return math.sqrt(sum(float(v) ** 2 for t in tensors for v in t.detach().double().flatten()))


# ====================================================================== 1. activation statistics
def test_activation_stats_mean_std_dead_dormant_per_member():
    tau = 0.025
    # member 0: unit 4 small but not zero (dormant, not dead); unit 2 zero on some samples only
    # member 1: unit 0 exactly zero on the whole batch (dead), unit 3 small (dormant); negative values
    h0 = torch.stack(
        [
            torch.tensor([[1.0, -2.0, 0.0, 1.5, 0.01], [2.0, 1.0, 0.5, -1.0, -0.02], [0.7, 1.1, 0.0, 0.9, 0.015]]),
            torch.tensor([[0.0, 1.0, 0.6, 0.02, -2.0], [0.0, -0.5, 3.0, 0.01, 1.0], [0.0, 2.5, -1.0, -0.03, 0.4]]),
        ]
    )  # [P=2, B=3, H=5]
    h1 = torch.tensor([[[0.3, 0.4], [0.0, 0.9]], [[0.0, 0.0], [0.0, 0.0]]])  # [2, 2, 2]: member 1 all dead
    stats = activation_stats([h0, h1], "q", tau, 0.01)

    for i, h in enumerate([h0, h1]):
        P, B, H = h.shape
        for p in range(P):
            vals = [float(h[p, b, u]) for b in range(B) for u in range(H)]
            n = len(vals)
            mean = sum(vals) / n
            std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))  # Bessel-corrected
            dead = sum(all(float(h[p, b, u]) == 0.0 for b in range(B)) for u in range(H)) / H
            score = [sum(abs(float(h[p, b, u])) for b in range(B)) / B for u in range(H)]
            avg = sum(score) / H
            dormant = sum((s / avg if avg > 0 else 0.0) <= tau for s in score) / H
            assert stats[f"act_mean/q.{i}"][p].item() == pytest.approx(mean, rel=1e-6, abs=1e-7)
            assert stats[f"act_std/q.{i}"][p].item() == pytest.approx(std, rel=1e-6)
            assert stats[f"dead/q.{i}"][p].item() == pytest.approx(dead)
            assert stats[f"dormant/q.{i}"][p].item() == pytest.approx(dormant)

    # a score exactly at tau counts as dormant (<=): mean |h| per unit 0.5, 1.5, 1, 1 -> scores 0.5, 1.5, 1, 1
    edge = torch.tensor([[[0.5, 1.5, 1.0, 2.0], [-0.5, 1.5, -1.0, 0.0]]])  # [P=1, B=2, H=4]
    assert activation_stats([edge], "q", 0.5, 0.01)["dormant/q.0"].item() == pytest.approx(1 / 4)

    # the known answers of the hand-made layer 0
    assert stats["dead/q.0"].tolist() == pytest.approx([0.0, 1 / 5])  # member 0's unit 2 is only sometimes 0
    assert stats["dormant/q.0"].tolist() == pytest.approx([1 / 5, 2 / 5])  # small != dead, but dormant
    assert stats["dead/q.1"].tolist() == pytest.approx([0.0, 1.0])


def test_activation_stats_count_a_forced_dead_relu_unit_of_a_pop_mlp():
    P, B, H = 3, 16, 6
    net = make_net(P, hidden=(H, 5), seed=3)
    x = torch.randn(P, B, OBS, generator=torch.Generator().manual_seed(5))
    _, hidden = hidden_outputs(net, x)
    before = activation_stats(hidden, "q", 0.025, 0.01)
    with torch.no_grad():
        net.layers[0].bias[0, 2] = -1e4  # member 0, unit 2: relu(x w - 1e4) == 0 on every sample
    out, hidden = hidden_outputs(net, x)
    # hidden_outputs is the forward pass, and its first hidden layer is relu(F.linear) member by member
    assert torch.equal(out, net(x))
    for p in range(P):
        w, b = net.layers[0].weight[p], net.layers[0].bias[p]
        torch.testing.assert_close(hidden[0][p], torch.relu(F.linear(x[p], w, b)))
    assert (hidden[0][0, :, 2] == 0).all()
    after = activation_stats(hidden, "q", 0.025, 0.01)
    for p in range(P):
        h = hidden[0][p]
        dead = sum(bool((h[:, u] == 0).all()) for u in range(H)) / H
        assert after["dead/q.0"][p].item() == pytest.approx(dead)
    # the forced unit adds exactly one dead unit to member 0 and nothing to the other members
    assert after["dead/q.0"][0].item() == pytest.approx(before["dead/q.0"][0].item() + 1 / H)
    assert torch.equal(after["dead/q.0"][1:], before["dead/q.0"][1:])
    assert torch.equal(after["act_mean/q.0"][1:], before["act_mean/q.0"][1:])
    assert after["dormant/q.0"][0].item() >= 1 / H  # a dead unit is dormant too (score 0)


# ====================================================================== 2. per-layer norms, names
def test_per_layer_is_sqrt_of_sum_of_squares_of_the_layer_tensors():
    names = ["q.0.weight", "q.0.bias", "q.0.g", "q.1.weight", "q.1.bias", "q.0.norm.weight", "q.0.norm.bias"]
    values = torch.rand(len(names), 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 5
    out = per_layer(values, names)
    assert set(out) == {"q.0", "q.1"}
    groups = {"q.0": [0, 1, 2, 5, 6], "q.1": [3, 4]}
    for layer, idx in groups.items():
        for p in range(3):
            expected = math.sqrt(sum(float(values[i, p]) ** 2 for i in idx))
            assert out[layer][p].item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "norm, expected",
    [
        (
            NormalizationConfig(name="none"),
            ["q.0.weight", "q.0.bias", "q.1.weight", "q.1.bias", "q.2.weight", "q.2.bias"],
        ),
        (
            WeightNormConfig(name="weight"),
            ["q.0.weight", "q.0.bias", "q.0.g", "q.1.weight", "q.1.bias", "q.1.g", "q.2.weight", "q.2.bias", "q.2.g"],
        ),
        (
            LayerNormConfig(name="layer"),
            [
                "q.0.weight",
                "q.0.bias",
                "q.1.weight",
                "q.1.bias",
                "q.2.weight",
                "q.2.bias",
                "q.0.norm.weight",
                "q.0.norm.bias",
                "q.1.norm.weight",
                "q.1.norm.bias",
            ],
        ),
    ],
)
def test_parameter_names_are_aligned_with_net_parameters(norm, expected):
    net = make_net(2, norm=norm)
    names = parameter_names(net, "q")
    assert sorted(names) == sorted(expected)
    params = list(net.parameters())
    assert len(names) == len(params)
    for name, p in zip(names, params):
        parts = name.split(".")
        i = int(parts[1])
        target = getattr(net.norms[i], parts[3]) if parts[2] == "norm" else getattr(net.layers[i], parts[2])
        assert p is target, name
        assert layer_of(name) == f"q.{i}"


# ====================================================================== 3. instruments of a diagnosed update
def test_dqn_instruments_match_direct_gradients_clipping_updates_and_q_statistics():
    P, B, lr = 2, 6, 0.05
    q_net = make_net(P, hidden=(5, 4), seed=1)
    target_net = copy.deepcopy(q_net)
    with torch.no_grad():
        g = torch.Generator().manual_seed(9)
        for p in target_net.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    target_net.requires_grad_(False)
    batch = make_batch(P, B, seed=4)
    algo = DQNConfig(name="dqn")
    r_max = torch.ones(P)
    names = parameter_names(q_net, "q")
    L = len(q_net.layers)

    # reference: per member, plain autograd on float64 copies; y from the target net's max
    before = [
        [t.detach().clone() for t in layer_params]
        for layer_params in [(layer.weight, layer.bias) for layer in q_net.layers]
    ]
    ref_grads = []  # [P][L] (gW, gb)
    for p in range(P):
        ws = [(w[p].double().requires_grad_(), b[p].double().requires_grad_()) for w, b in before]
        q_all = ref_forward(ws, batch.obs[p])
        q = q_all[torch.arange(B), batch.actions[p]]
        next_v = ref_forward(member_weights(target_net, p), batch.next_obs[p]).max(-1).values
        y = batch.rewards[p].double() + algo.gamma * (1 - batch.terminated[p].double()) * next_v
        loss = ((q - y) ** 2).mean()
        grads = torch.autograd.grad(loss, [t for wb in ws for t in wb])
        ref_grads.append([(grads[2 * i], grads[2 * i + 1]) for i in range(L)])
    layer_pre = [[l2(*ref_grads[p][i]) for i in range(L)] for p in range(P)]
    total = [math.sqrt(sum(v**2 for v in layer_pre[p])) for p in range(P)]
    max_norm = 0.5 * min(total)  # clipping really scales every member
    scale = [min(1.0, max_norm / (total[p] + 1e-6)) for p in range(P)]
    assert all(s < 0.6 for s in scale)

    health = Health(P, CPU)
    pipeline = GradientPipeline(
        list(q_net.parameters()),
        SGDConfig(name="sgd", lr=lr),
        NormClipConfig(name="global_norm", max_norm=max_norm),
        RegularizationConfig(),
        weight_parameters(q_net),
        health,
    )
    loss, _ = dqn.dqn_loss(q_net, target_net, batch, algo, r_max)
    update = pipeline.step(loss, env_step=100, diagnose=True)
    record = dqn.instruments(q_net, target_net, batch, algo, r_max, update, names, DiagnosticsConfig())

    after = [(layer.weight.detach().clone(), layer.bias.detach().clone()) for layer in q_net.layers]
    for p in range(P):
        for i in range(L):
            # the SGD step applied the clipped reference gradient
            for t_after, t_before, g_ref in zip(after[i], before[i], ref_grads[p][i]):
                expected = t_before[p].double() - lr * scale[p] * g_ref
                torch.testing.assert_close(t_after[p].double(), expected, rtol=1e-5, atol=1e-6)
            name = f"q.{i}"
            assert record[f"grad_norm/{name}"][p].item() == pytest.approx(layer_pre[p][i], rel=1e-5)
            assert record[f"grad_norm_post/{name}"][p].item() == pytest.approx(layer_pre[p][i] * scale[p], rel=1e-5)
            param_norm = l2(after[i][0][p], after[i][1][p])
            assert record[f"param_norm/{name}"][p].item() == pytest.approx(param_norm, rel=1e-5)
            moved = l2(after[i][0][p] - before[i][0][p], after[i][1][p] - before[i][1][p])
            assert moved > 0
            assert record[f"update_ratio/{name}"][p].item() == pytest.approx(moved / param_norm, rel=1e-4)

        # Q statistics, after the update, against the target net
        q_all = ref_forward(member_weights(q_net, p), batch.obs[p])
        q = q_all[torch.arange(B), batch.actions[p]]
        next_v = ref_forward(member_weights(target_net, p), batch.next_obs[p]).max(-1).values
        y = batch.rewards[p].double() + algo.gamma * (1 - batch.terminated[p].double()) * next_v
        td = q - y
        q_t = ref_forward(member_weights(target_net, p), batch.obs[p])[torch.arange(B), batch.actions[p]]
        gap = (q - q_t).mean().item()
        assert abs(gap) > 1e-3  # the target net really differs
        assert record["q/mean"][p].item() == pytest.approx(q.mean().item(), rel=1e-5, abs=1e-6)
        assert record["q/min"][p].item() == pytest.approx(q.min().item(), rel=1e-5, abs=1e-6)
        assert record["q/max"][p].item() == pytest.approx(q.max().item(), rel=1e-5, abs=1e-6)
        assert record["q/abs_max"][p].item() == pytest.approx(q_all.abs().max().item(), rel=1e-5)
        assert record["td/abs_max"][p].item() == pytest.approx(td.abs().max().item(), rel=1e-5)
        assert record["q/online_target_gap"][p].item() == pytest.approx(gap, rel=1e-4, abs=1e-6)
    # every record entry is a [P] float tensor
    assert all(v.shape == (P,) and v.dtype == torch.float32 for v in resolve(record).values())


# ====================================================================== 4. weight normalization
def test_weight_norm_stats_are_smallest_and_largest_unit_norms_of_v():
    net = make_net(2, hidden=(5, 4), norm=WeightNormConfig(name="weight", eps=1e-8))
    with torch.no_grad():
        net.layers[1].weight[0, 2] *= 1e-4  # member 0: one collapsed direction
        net.layers[2].weight[1, 0] *= 50.0  # member 1: one large direction
    stats = {k: v for k, v in layer_stats(net, "q").items() if k.startswith("wn_")}
    assert set(stats) == {f"wn_{m}/q.{i}" for m in ("v_min", "v_max") for i in range(3)}
    for i, layer in enumerate(net.layers):
        for p in range(2):
            unit_norms = [l2(layer.weight[p, u]) for u in range(layer.weight.shape[1])]
            assert stats[f"wn_v_min/q.{i}"][p].item() == pytest.approx(min(unit_norms), rel=1e-5)
            assert stats[f"wn_v_max/q.{i}"][p].item() == pytest.approx(max(unit_norms), rel=1e-5)
    assert stats["wn_v_min/q.1"][0].item() < 1e-3 < stats["wn_v_min/q.1"][1].item()
    # an output layer without weight normalization has no entry
    plain_out = make_net(2, norm=WeightNormConfig(name="weight", output_layer=False))
    assert not isinstance(plain_out.layers[2], PopWeightNormLinear)
    assert {k for k in layer_stats(plain_out, "q") if k.startswith("wn_")} == {
        f"wn_{m}/q.{i}" for m in ("v_min", "v_max") for i in range(2)
    }


def test_zero_v_with_eps0_is_located_at_the_weight_norm():
    P, B = 2, 5
    net = make_net(P, hidden=(5, 4), norm=WeightNormConfig(name="weight", eps=0.0))
    target_net = copy.deepcopy(net).requires_grad_(False)
    with torch.no_grad():
        net.layers[1].weight[0, 3] = 0.0  # member 0, layer 1, unit 3: ||v|| = 0, g/||v|| = inf
    batch = make_batch(P, B, seed=2)
    stats = layer_stats(net, "q")
    assert stats["wn_v_min/q.1"][0].item() == 0.0
    out = net(batch.obs)
    assert not torch.isfinite(out[0]).all() and torch.isfinite(out[1]).all()

    cause, where, detail = locate_nonfinite(net, "q", 0, batch.obs[0], "replay.obs")
    assert (cause, where) == ("nonfinite_loss", "q.1.weight_norm")
    assert "||v||" in detail and float(detail.rsplit("=", 1)[1]) == 0.0
    assert locate_nonfinite(net, "q", 1, batch.obs[1], "replay.obs") is None

    # the same through a real update: the pipeline sees a non-finite loss, locate names the layer
    names = parameter_names(net, "q")
    health = Health(P, CPU)
    pipeline = GradientPipeline(
        list(net.parameters()),
        SGDConfig(name="sgd", lr=0.01),
        NormClipConfig(name="none"),
        RegularizationConfig(),
        weight_parameters(net),
        health,
    )
    algo = DQNConfig(name="dqn")
    loss, _ = dqn.dqn_loss(net, target_net, batch, algo, torch.ones(P))
    update = pipeline.step(loss, env_step=7)
    assert update.newly_diverged.tolist() == [True, False]
    cause, where, _ = dqn.locate(net, target_net, batch, 0, "nonfinite_loss", names, update)
    assert (cause, where) == ("nonfinite_loss", "q.1.weight_norm")
    assert net.layers[1].weight[0, 3].abs().sum().item() == 0.0  # the frozen member kept its parameters


# ====================================================================== 5. locating non-finite values
@pytest.mark.parametrize("norm", ["none", "layer", "batch", "weight"])
def test_locate_nonfinite_all_finite_is_none(norm):
    cfgs = {
        "none": NormalizationConfig(name="none"),
        "layer": LayerNormConfig(name="layer"),
        "batch": rlexp.config.schema.BatchNormConfig(name="batch"),
        "weight": WeightNormConfig(name="weight"),
    }
    net = make_net(2, norm=cfgs[norm])
    x = torch.randn(2, 8, OBS, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(net(x)).all()
    for p in range(2):
        assert locate_nonfinite(net, "q", p, x[p], "replay.obs") is None


@pytest.mark.parametrize(
    "module, tensor, expected",
    [
        ("layers", "weight", "q.1.weight"),
        ("layers", "bias", "q.2.bias"),
        ("norms", "weight", "q.0.norm.weight"),
    ],
)
def test_locate_nonfinite_parameter_names_the_tensor_of_that_member_only(module, tensor, expected):
    net = make_net(2, norm=LayerNormConfig(name="layer"))
    index = int(expected.split(".")[1])
    with torch.no_grad():
        getattr(getattr(net, module)[index], tensor)[1].view(-1)[0] = float("nan")  # member 1 only
    x = torch.randn(2, 4, OBS, generator=torch.Generator().manual_seed(0))
    cause, where, detail = locate_nonfinite(net, "q", 1, x[1], "replay.obs")
    assert (cause, where) == ("nonfinite_param", expected)
    assert detail.startswith("1 of ")
    assert locate_nonfinite(net, "q", 0, x[0], "replay.obs") is None  # another member's NaN does not matter


def test_locate_nonfinite_input():
    net = make_net(2)
    x = torch.randn(2, 4, OBS, generator=torch.Generator().manual_seed(0))
    x[0, 2, 1] = float("inf")
    x[0, 3, 0] = float("nan")
    cause, where, detail = locate_nonfinite(net, "q", 0, x[0], "replay.next_obs")
    assert (cause, where) == ("nonfinite_obs", "replay.next_obs")
    assert detail.startswith("2 ")
    assert locate_nonfinite(net, "q", 1, x[1], "replay.next_obs") is None


def test_locate_nonfinite_overflowing_linear_output():
    net = make_net(2, hidden=(5, 4))
    x = torch.rand(2, 4, OBS, generator=torch.Generator().manual_seed(0)) + 0.5  # positive inputs
    with torch.no_grad():
        net.layers[0].weight[0] = 1e20  # finite: outputs ~1e20, positive, through the relu
        net.layers[0].bias[0] = 0.0
        net.layers[1].weight[0] = 1e20  # finite, but 1e20 * 1e20 overflows float32
    # direct computation: the first layer whose float32 output is non-finite, member 0
    h, first_bad = x[0], None
    for i, layer in enumerate(net.layers):
        pre = F.linear(h, layer.weight[0].detach(), layer.bias[0].detach())
        if not torch.isfinite(pre).all():
            first_bad = i
            break
        h = torch.relu(pre)
    assert first_bad == 1
    assert all(torch.isfinite(p).all() for p in net.parameters())
    cause, where, _ = locate_nonfinite(net, "q", 0, x[0], "replay.obs")
    assert (cause, where) == ("nonfinite_loss", f"q.{first_bad}.linear")
    assert locate_nonfinite(net, "q", 1, x[1], "replay.obs") is None


def test_locate_nonfinite_parameters_in_forward_order_with_layer_norm():
    net = make_net(1, norm=LayerNormConfig(name="layer"))
    with torch.no_grad():
        net.norms[0].weight[0, 0] = float("nan")  # used in the forward pass before q.1.weight
        net.layers[1].weight[0, 0, 0] = float("nan")
    x = torch.randn(4, OBS, generator=torch.Generator().manual_seed(0))
    assert locate_nonfinite(net, "q", 0, x, "replay.obs")[:2] == ("nonfinite_param", "q.0.norm.weight")


def test_locate_gradient_returns_the_nonfinite_gradient_nearest_the_output():
    net = make_net(2, hidden=(5, 4))
    names = parameter_names(net, "q")
    grads = [torch.zeros_like(p) for p in net.parameters()]
    assert locate_gradient(names, grads, 0) is None
    grads[names.index("q.0.weight")][0, 1, 2] = float("nan")
    grads[names.index("q.1.weight")][0, 0, 0] = float("inf")
    grads[names.index("q.1.weight")][0, 2, 1] = float("nan")
    grads[names.index("q.2.bias")][1, 0] = float("nan")  # another member's
    where, detail = locate_gradient(names, grads, 0)
    assert where == "q.1.weight"
    assert detail.startswith("2 of 20 ")
    assert locate_gradient(names, grads, 1)[0] == "q.2.bias"


def test_locate_gradient_nearest_the_output_with_layer_norm():
    net = make_net(2, hidden=(5, 4), norm=LayerNormConfig(name="layer"))
    x = torch.randn(2, 4, OBS, generator=torch.Generator().manual_seed(0))
    out = net(x)
    upstream = torch.ones_like(out)
    upstream[0] = float("nan")  # member 0: a non-finite gradient born at the output
    out.backward(upstream)
    names = parameter_names(net, "q")
    grads = [p.grad for p in net.parameters()]
    assert all(not torch.isfinite(g[0]).all() for g in grads)  # it reaches every tensor of member 0
    where, _ = locate_gradient(names, grads, 0)
    assert layer_of(where) == "q.2" and ".norm." not in where


# ====================================================================== 6. explosions
def _strikes_reference(exceed: list[list[bool]], patience: int) -> list[list[bool]]:
    """Per check and member: flagged when the last ``patience`` checks all exceeded."""
    counts = [0] * len(exceed[0])
    flagged = []
    for row in exceed:
        counts = [c + 1 if e else 0 for c, e in zip(counts, row)]
        flagged.append([c >= patience for c in counts])
    return flagged


def test_explosions_need_patience_consecutive_checks_per_member():
    # member 0: 3 in a row; member 1: 2, drop (reset), then 3; member 2: never; member 3: exactly at the bound
    q_bound = torch.tensor([10.0, 5.0, 1.0, 2.0])
    q = [[11, 6, 0.5, 2], [12, 7, 0.9, 2], [13, 4, 0.1, 2], [14, 6, 0.2, 2], [9, 6, 0.3, 2], [11, 7, 0.4, 2]]
    g_bound = 100.0
    g = [
        [1, 101, 1e9, 100],
        [1, 102, 1e9, 100],
        [1, 103, 1, 100],
        [1, 50, 1e9, 100],
        [101, 200, 1e9, 100],
        [1, 300, 1e9, 100],
    ]
    exp = Explosions(4, patience=3, device=CPU)
    q_exceed = [[float(v) > float(b) for v, b in zip(row, q_bound)] for row in q]
    g_exceed = [[float(v) > g_bound for v in row] for row in g]
    q_ref, g_ref = _strikes_reference(q_exceed, 3), _strikes_reference(g_exceed, 3)
    for t in range(len(q)):
        value, gradient = exp.check(
            torch.tensor(q[t], dtype=torch.float32), q_bound, torch.tensor(g[t], dtype=torch.float64), g_bound
        )
        assert value.tolist() == q_ref[t], t
        assert gradient.tolist() == g_ref[t], t
    # the known answers: value flagged for member 0 from the 3rd check, member 1 only at the 6th
    assert [row[0] for row in q_ref] == [False, False, True, True, False, False]
    assert [row[1] for row in q_ref] == [False, False, False, False, False, True]
    assert [row[1] for row in g_ref] == [False, False, True, False, False, False]  # 3, reset, then only 2
    assert [row[2] for row in g_ref] == [False, False, False, False, False, True]
    assert not any(row[3] for row in q_ref + g_ref)


# ====================================================================== 7. instrument history
def test_instrument_history_keeps_finite_records_and_finds_first_moved():
    h = InstrumentHistory()
    assert h.last() is None and h.first_moved() is None
    h.add(100, {"a": 1.0, "b": -2.0, "grad_norm_post/q.0": 1.0, "c": 3.0})
    h.add(200, {"a": 5.0, "b": -2.5, "grad_norm_post/q.0": 80.0, "c": 3.0})  # post-clip grows 80x: ignored
    h.add(250, {"a": float("nan"), "b": 1e6, "grad_norm_post/q.0": 1.0, "c": 3.0})  # not finite: not kept
    h.add(260, {"a": 1.0, "b": float("inf"), "grad_norm_post/q.0": 1.0, "c": 3.0})
    h.add(300, {"a": 9.0, "b": -25.0, "grad_norm_post/q.0": 90.0, "c": 3.0})  # |b| grows 12.5x: moved first
    h.add(400, {"a": 100.0, "b": -30.0, "grad_norm_post/q.0": 90.0, "c": 3.0})  # a grows 100x, later
    assert [s for s, _ in h.records] == [100, 200, 300, 400]
    assert h.last() == {"a": 100.0, "b": -30.0, "grad_norm_post/q.0": 90.0, "c": 3.0}
    moved = h.first_moved()
    assert moved["instrument"] == "b" and moved["step"] == 300
    assert moved["from"] == -2.0 and moved["to"] == -25.0
    h.add(500, {"a": float("-inf")})
    assert h.last()["a"] == 100.0  # still the last finite record


def test_instrument_history_compares_with_the_earliest_kept_record():
    h = InstrumentHistory(length=3)
    h.add(1, {"x": 1.0})
    h.add(2, {"x": 1.0})
    h.add(3, {"x": 20.0})
    h.add(4, {"x": 20.0})  # kept: steps 2, 3, 4; earliest x = 1
    assert h.first_moved() == pytest.approx({"instrument": "x", "step": 3, "from": 1.0, "to": 20.0, "since_step": 2})
    h.add(5, {"x": 20.0})  # kept: steps 3, 4, 5; earliest x = 20: nothing moved
    assert h.first_moved() is None
    h.add(6, {"x": 199.0})  # 9.95x: below the factor
    assert h.first_moved() is None
    h.add(7, {"x": 200.0})  # kept 5, 6, 7: earliest 20 -> 200 is 10x
    assert h.first_moved()["instrument"] == "x" and h.first_moved()["step"] == 7
