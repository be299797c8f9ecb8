"""Tests of the plasticity instruments (rlexp.diagnostics.instruments): feature rank srank, effective rank erank,
active fraction, feature norm, weight magnitude and weight change from initialization.

Ranks are checked on matrices built with a known spectrum (H = U diag(s) V^T with orthonormal U, V),
the rest against direct per-member computations written out here; every statistic is per member
(perturbing or poisoning member k leaves the others' values bitwise unchanged).
"""

from __future__ import annotations

import math

import pytest
import torch

from rlexp.config.schema import (
    ActivationConfig,
    ClippingConfig,
    GainInitConfig,
    NetworkConfig,
    NormalizationConfig,
    RegularizationConfig,
    SGDConfig,
    WeightNormConfig,
)
from rlexp.diagnostics.instruments import (
    Deferred,
    activation_stats,
    feature_ranks,
    keep_initial,
    layer_stats,
    rank_stats,
    resolve,
)
from rlexp.nn.nets import PopMLP, weight_parameters
from rlexp.optim.pipeline import GradientPipeline, Health

torch.set_num_threads(1)

B, D = 32, 12  # batch, units
PLASTICITY = ("srank", "erank", "active", "feature_norm")


def with_spectrum(spectra: list[list[float]], batch: int = B, seed: int = 0) -> torch.Tensor:
    """Member k's [batch, D] matrix U diag(s_k) V^T (U, V with orthonormal columns): its singular
    values are exactly s_k in exact arithmetic -> [P, batch, D]."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in spectra:
        u = torch.linalg.qr(torch.randn(batch, len(s), generator=g, dtype=torch.float64))[0]
        v = torch.linalg.qr(torch.randn(D, len(s), generator=g, dtype=torch.float64))[0]
        out.append(u @ torch.diag(torch.tensor(s, dtype=torch.float64)) @ v.T)
    return torch.stack(out).float()


@pytest.mark.parametrize("batch", [B, 8])  # the Gram matrix h^T h (B >= D) or h h^T (B < D)
def test_srank_and_erank_of_r_equal_singular_values_are_r(batch):
    ranks = [1, 3, 5, min(batch, D)]
    h = with_spectrum([[2.0] * r for r in ranks], batch)
    srank, erank = feature_ranks(h, 0.01)
    assert srank.tolist() == [float(r) for r in ranks]
    assert [round(e) for e in erank.tolist()] == ranks  # exp(log r) = r up to rounding


def test_srank_counts_singular_values_up_to_1_minus_delta_of_their_sum():
    # p = (0.5, 0.3, 0.195, 0.0025, 0.0025): cumulative 0.5, 0.8, 0.995, 0.9975, 1 (no boundary within rounding)
    h = with_spectrum([[50.0, 30.0, 19.5, 0.25, 0.25]])
    for delta, expected in ((0.001, 5), (0.004, 4), (0.01, 3), (0.1, 3), (0.25, 2), (0.6, 1)):
        assert feature_ranks(h, delta)[0].item() == expected, delta


def test_erank_is_exp_of_the_entropy_of_the_normalized_singular_values():
    s = [50.0, 30.0, 19.5, 0.25, 0.25]
    h = with_spectrum([s])
    p = [x / sum(s) for x in s]
    expected = math.exp(-sum(q * math.log(q) for q in p))  # Roy & Vetterli 2007, about 2.83
    assert feature_ranks(h, 0.01)[1].item() == pytest.approx(expected, rel=1e-4)


def test_ranks_match_a_direct_per_member_svd():
    """The Gram matrix's eigenvalues give each member's float64 SVD's ranks."""
    h = torch.randn(3, B, D, generator=torch.Generator().manual_seed(1)).relu()
    srank, erank = feature_ranks(h, 0.05)
    for k in range(3):
        sigma = torch.linalg.svdvals(h[k].double())  # descending
        p = sigma / sigma.sum()
        assert srank[k].item() == 1 + sum(1 for c in p.cumsum(0).tolist() if c < 0.95)
        assert erank[k].item() == pytest.approx(math.exp(-(p * p.log()).sum().item()), rel=1e-6)


def test_zero_features_have_rank_0_and_nonfinite_features_nan_for_that_member_only():
    h = torch.randn(4, B, D, generator=torch.Generator().manual_seed(2))
    poisoned = h.clone()
    poisoned[0] = 0.0
    poisoned[1, 3, 4] = float("nan")
    poisoned[2, 0, 0] = float("inf")
    srank, erank = feature_ranks(poisoned, 0.01)  # does not raise
    assert srank[0].item() == 0 and erank[0].item() == 0
    assert math.isnan(srank[1]) and math.isnan(erank[1]) and math.isnan(srank[2]) and math.isnan(erank[2])
    clean = feature_ranks(h, 0.01)
    assert torch.equal(srank[3], clean[0][3]) and torch.equal(erank[3], clean[1][3])


def test_an_eigensolver_failure_gives_nan_ranks_not_a_crash(monkeypatch):
    def fail(_):
        raise RuntimeError("linalg.eigh: The algorithm failed to converge")

    monkeypatch.setattr(torch.linalg, "eigvalsh", fail)
    srank, erank = feature_ranks(torch.ones(2, B, D), 0.01)
    assert all(math.isnan(v) for v in srank.tolist() + erank.tolist())


def test_active_fraction_and_feature_norm_are_direct_per_member_computations():
    h = torch.randn(3, B, D, generator=torch.Generator().manual_seed(3)).relu()
    h[1, :, :4] = 0.0  # 4 dead units
    stats = resolve(activation_stats([h], "q", 0.025, 0.01))
    for k in range(3):
        positive = sum(1 for v in h[k].flatten().tolist() if v > 0)
        assert stats["active/q.0"][k].item() == pytest.approx(positive / (B * D), abs=1e-7)
        norms = [math.sqrt(sum(v * v for v in row)) for row in h[k].double().tolist()]
        assert stats["feature_norm/q.0"][k].item() == pytest.approx(sum(norms) / B, rel=1e-6)


def test_perturbing_member_k_leaves_the_others_plasticity_statistics_bitwise_unchanged():
    g = torch.Generator().manual_seed(4)
    hidden = [torch.randn(3, B, D, generator=g).relu(), torch.randn(3, B, 7, generator=g)]
    before = resolve(activation_stats(hidden, "q", 0.025, 0.01))
    for change in (lambda t: t[:, : t.shape[1] // 2].zero_(), lambda t: t.fill_(float("nan"))):
        moved = [h.clone() for h in hidden]
        for h in moved:
            change(h[1])
        after = resolve(activation_stats(moved, "q", 0.025, 0.01))
        for name in (f"{m}/q.{i}" for m in PLASTICITY for i in range(2)):
            assert not torch.equal(after[name][1], before[name][1]), name
            for k in (0, 2):
                assert torch.equal(after[name][k], before[name][k]), name


def test_ranks_are_deferred_until_the_record_is_resolved():
    """srank and erank wait for the record to be written; then they are each layer's feature_ranks,
    the layers of one shape decomposed together."""
    g = torch.Generator().manual_seed(6)
    hidden = [torch.randn(2, B, D, generator=g), torch.randn(2, B, 7, generator=g), torch.randn(2, B, D, generator=g)]
    stats = activation_stats(hidden, "q", 0.025, 0.01)
    assert all(isinstance(stats[f"{m}/q.{i}"], Deferred) for m in ("srank", "erank") for i in range(3))
    assert set(rank_stats(hidden, "q", 0.01)) == {f"{m}/q.{i}" for m in ("srank", "erank") for i in range(3)}
    record = resolve(stats)
    for i, h in enumerate(hidden):
        srank, erank = feature_ranks(h, 0.01)
        assert torch.equal(record[f"srank/q.{i}"], srank)
        assert record[f"erank/q.{i}"].tolist() == pytest.approx(erank.tolist(), rel=1e-6)


def make_net(norm: NormalizationConfig | None = None) -> PopMLP:
    gens = [torch.Generator().manual_seed(20 + k) for k in range(3)]
    return PopMLP(
        3,
        4,
        2,
        NetworkConfig(name="mlp", hidden=[6, 5]),
        ActivationConfig(name="relu"),
        norm or NormalizationConfig(name="none"),
        GainInitConfig(name="he"),
        gens,
    )


def layer_change(now: list[torch.Tensor], initial: list[torch.Tensor], k: int) -> float:
    """||theta - theta_0|| / ||theta_0|| of member k over a layer's tensors, in Python float64."""
    diff = sum(float(v) ** 2 for a, b in zip(now, initial) for v in (a[k] - b[k]).double().flatten())
    base = sum(float(v) ** 2 for b in initial for v in b[k].double().flatten())
    return math.sqrt(diff) / math.sqrt(base)


@pytest.mark.parametrize("norm", [None, WeightNormConfig(name="weight")])
def test_weight_change_from_initialization_through_the_pipeline_storage(norm):
    """theta_0 kept at build survives the pipeline moving the parameters into its flat buffer; after
    SGD steps weight_change is ||theta - theta_0|| / ||theta_0|| per layer (weight, bias, g together)."""
    net = make_net(norm)
    keep_initial(net)
    initial = [p.detach().clone() for p in net.parameters()]
    changes = [v for k, v in layer_stats(net, "q").items() if k.startswith("weight_change/")]
    assert len(changes) == 3 and all(v.tolist() == [0.0, 0.0, 0.0] for v in changes)
    params = list(net.parameters())
    pipeline = GradientPipeline(
        params,
        SGDConfig(name="sgd", lr=0.1),
        ClippingConfig(name="none"),
        RegularizationConfig(),
        weight_parameters(net),
        Health(3, torch.device("cpu")),
    )
    x = torch.randn(3, 8, 4, generator=torch.Generator().manual_seed(5))
    for _ in range(3):
        pipeline.step(net(x).square().mean((1, 2)).sum(), env_step=0)
    stats = layer_stats(net, "q")
    groups: dict[int, list[int]] = {}
    for t, (name, _) in enumerate(net.named_parameters()):
        groups.setdefault(int(name.split(".")[1]), []).append(t)
    assert len(groups) == 3 and len(groups[0]) == (3 if norm else 2)
    for layer, idx in groups.items():
        now = [params[t].detach() for t in idx]
        for k in range(3):
            expected = layer_change(now, [initial[t] for t in idx], k)
            assert expected > 0
            assert stats[f"weight_change/q.{layer}"][k].item() == pytest.approx(expected, rel=1e-5)


def test_weight_magnitude_and_change_are_per_member():
    net = make_net(WeightNormConfig(name="weight"))
    keep_initial(net)
    before = layer_stats(net, "q")
    for i, layer in enumerate(net.layers):
        direct = [layer.effective_weight()[k].detach().abs().mean().item() for k in range(3)]
        assert before[f"weight_magnitude/q.{i}"].tolist() == pytest.approx(direct, rel=1e-6)
    with torch.no_grad():
        net.layers[1].weight[1].mul_(2.0)
        net.layers[1].g[1].add_(1.0)
    after = layer_stats(net, "q")
    assert (
        after["weight_change/q.1"][1].item() > 0
        and after["weight_magnitude/q.1"][1] != before["weight_magnitude/q.1"][1]
    )
    for name in after:
        for k in (0, 2):
            assert torch.equal(after[name][k], before[name][k]), name


def test_weight_magnitude_of_a_spectral_norm_runs_no_power_iteration():
    net = make_net(NormalizationConfig(name="spectral"))
    net.train()
    buffers = [b.clone() for b in net.buffers()]
    assert buffers  # the power iteration's state
    stats = layer_stats(net, "q")
    assert all(torch.equal(b, before) for b, before in zip(net.buffers(), buffers))
    assert net.training and all(layer.training for layer in net.layers)
    for i, layer in enumerate(net.layers[:-1]):  # W / sigma with the kept sigma
        expected = (layer.weight / layer.sigma()[:, None, None]).detach().abs().mean((1, 2))
        assert torch.equal(stats[f"weight_magnitude/q.{i}"], expected)
