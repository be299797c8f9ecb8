"""Initializers (rlexp/nn/init.py): each member drawn from its own generator, the formulas' statistics,
orthogonality, the gains, biases, and the last layer's settings."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from rlexp.config.schema import (
    ActivationConfig,
    GainInitConfig,
    InitConfig,
    LayerNormConfig,
    LeakyReLUConfig,
    NetworkConfig,
    NormalizationConfig,
)
from rlexp.nn.activations import ACTIVATIONS, activation_gain
from rlexp.nn.init import INITIALIZERS, init_linear, scheme_gain
from rlexp.nn.nets import (
    PopMLP,
    weight_parameters,
)


# ---------------------------------------------------------------- helpers
def gens(*seeds: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def structured(cls, **kw):
    """A config node as Hydra hands it to the code (a structured DictConfig)."""
    return OmegaConf.structured(cls(**kw))


def activation_config(name: str, **kw) -> ActivationConfig:
    """The structured config of an activation, from its registry entry's schema."""
    return structured(ACTIVATIONS[name].schema, name=name, **kw)


ALL_SCHEMES = sorted(INITIALIZERS)


def test_initializer_registry_names():
    assert set(ALL_SCHEMES) == {
        "default",
        "xavier",
        "xavier_uniform",
        "xavier_normal",
        "he",
        "he_normal",
        "he_uniform",
        "orthogonal",
        "lecun",
    }


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_pop_mlp_member_initialization_depends_only_on_its_own_generator(scheme):
    cls = InitConfig if scheme in ("default", "lecun") else GainInitConfig
    init = structured(cls, name=scheme, bias=None if scheme == "default" else 0.0)
    args = (
        NetworkConfig(name="mlp", hidden=[8, 8]),
        ActivationConfig(name="tanh"),
        LayerNormConfig(name="layer"),
        init,
    )
    a = PopMLP(2, 4, 3, *args, gens(0, 1))
    b = PopMLP(2, 4, 3, *args, gens(9, 1))
    c = PopMLP(1, 4, 3, *args, gens(1))  # member 1 alone in a population of one
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa[1], pb[1]), name
        assert torch.equal(pa[1], pc[0]), name
    wa = [w[0] for w in weight_parameters(a)]
    wb = [w[0] for w in weight_parameters(b)]
    assert all(not torch.equal(x, y) for x, y in zip(wa, wb))  # seed 0 != seed 9


# ---------------------------------------------------------------- initializers
@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_init_linear_member_depends_only_on_its_own_generator(scheme):
    cfg = structured(InitConfig if scheme in ("default", "lecun") else GainInitConfig, name=scheme, bias=None)
    w_a, b_a = torch.empty(2, 5, 7), torch.empty(2, 5)
    w_b, b_b = torch.empty(2, 5, 7), torch.empty(2, 5)
    init_linear(w_a, b_a if scheme == "default" else None, cfg, 1.2, gens(0, 1))
    init_linear(w_b, b_b if scheme == "default" else None, cfg, 1.2, gens(9, 1))
    assert torch.equal(w_a[1], w_b[1])
    assert not torch.equal(w_a[0], w_b[0])
    if scheme == "default":
        assert torch.equal(b_a[1], b_b[1])


def test_he_init_member_equals_a_direct_draw_from_its_generator():
    cfg = GainInitConfig(name="he", gain=None)
    w = torch.empty(3, 6, 10)
    init_linear(w, None, cfg, math.sqrt(2.0), gens(4, 5, 6))
    for p, seed in enumerate((4, 5, 6)):
        direct = torch.empty(6, 10).normal_(
            0.0, math.sqrt(2.0) / math.sqrt(10), generator=torch.Generator().manual_seed(seed)
        )
        torch.testing.assert_close(w[p], direct)


def test_default_init_matches_nn_linear_reset_parameters():
    w, b = torch.empty(2, 6, 9), torch.empty(2, 6)
    init_linear(w, b, InitConfig(name="default", bias=None), 1.0, gens(3, 8))
    for p, seed in enumerate((3, 8)):
        g = torch.Generator().manual_seed(seed)
        ref_w = torch.nn.init.kaiming_uniform_(torch.empty(6, 9), a=math.sqrt(5), generator=g)
        ref_b = torch.empty(6).uniform_(-1 / math.sqrt(9), 1 / math.sqrt(9), generator=g)
        torch.testing.assert_close(w[p], ref_w)
        torch.testing.assert_close(b[p], ref_b)


OUT, IN = 128, 256  # fan_out != fan_in so swapped fans are caught
INIT_STATS = [
    # (scheme, cfg gain, activation, distribution, expected scale: uniform bound or normal std)
    ("default", None, "relu", "uniform", lambda g: 1 / math.sqrt(IN)),
    ("xavier", None, "relu", "uniform", lambda g: 1.0 * math.sqrt(6 / (IN + OUT))),
    ("xavier_uniform", 2.0, "relu", "uniform", lambda g: 2.0 * math.sqrt(6 / (IN + OUT))),
    ("xavier_normal", None, "tanh", "normal", lambda g: 1.0 * math.sqrt(2 / (IN + OUT))),
    ("xavier_normal", 0.5, "tanh", "normal", lambda g: 0.5 * math.sqrt(2 / (IN + OUT))),
    ("he", None, "relu", "normal", lambda g: math.sqrt(2.0) / math.sqrt(IN)),
    ("he_normal", None, "tanh", "normal", lambda g: (5 / 3) / math.sqrt(IN)),
    ("he_normal", 0.3, "relu", "normal", lambda g: 0.3 / math.sqrt(IN)),
    ("he_uniform", None, "relu", "uniform", lambda g: math.sqrt(2.0) * math.sqrt(3 / IN)),
    ("he_uniform", None, "sigmoid", "uniform", lambda g: 1.0 * math.sqrt(3 / IN)),
    ("lecun", None, "relu", "normal", lambda g: math.sqrt(1 / IN)),
]


@pytest.mark.parametrize("scheme,gain,act,dist,scale", INIT_STATS, ids=[f"{s}-{g}-{a}" for s, g, a, _, _ in INIT_STATS])
def test_init_statistics_match_the_formulas(scheme, gain, act, dist, scale):
    cfg = (
        structured(InitConfig, name=scheme)
        if scheme in ("default", "lecun")
        else structured(GainInitConfig, name=scheme, gain=gain)
    )
    w = torch.empty(2, OUT, IN)
    init_linear(w, None, cfg, scheme_gain(cfg, activation_config(act)), gens(0, 1))
    s = scale(gain)
    for p in range(2):
        m = w[p].flatten().double()
        if dist == "uniform":
            assert m.abs().max() <= s
            assert m.abs().max() >= 0.99 * s
            torch.testing.assert_close(m.std().item(), s / math.sqrt(3), rtol=0.03, atol=0.0)
            assert (m.abs() > s / 2).double().mean().item() == pytest.approx(0.5, abs=0.02)
        else:
            torch.testing.assert_close(m.std().item(), s, rtol=0.03, atol=0.0)
            # Gaussian tails: P(|w| > 2 sigma) = 4.55% (a uniform with this std has none beyond 1.73 sigma)
            assert (m.abs() > 2 * s).double().mean().item() == pytest.approx(0.0455, abs=0.006)
        assert abs(m.mean().item()) < 0.03 * s


@pytest.mark.parametrize("act,gain", [("relu", None), ("tanh", None), ("relu", 0.5)])
@pytest.mark.parametrize("shape", [(32, 64), (64, 32)])
def test_orthogonal_init_is_orthogonal_with_gain(act, gain, shape):
    cfg = GainInitConfig(name="orthogonal", gain=gain)
    expected_gain = gain if gain is not None else {"relu": math.sqrt(2.0), "tanh": 5 / 3}[act]
    w = torch.empty(2, *shape, dtype=torch.float64)
    init_linear(w, None, cfg, scheme_gain(cfg, activation_config(act)), gens(0, 1))
    out, n_in = shape
    for p in range(2):
        gram = w[p] @ w[p].T if out <= n_in else w[p].T @ w[p]
        torch.testing.assert_close(
            gram, expected_gain**2 * torch.eye(min(shape), dtype=torch.float64), rtol=0, atol=1e-5
        )
    assert not torch.equal(w[0], w[1])


def test_scheme_and_activation_gains():
    he = GainInitConfig(name="he", gain=None)
    assert scheme_gain(he, activation_config("relu")) == pytest.approx(math.sqrt(2.0))
    for a in ("elu", "gelu", "silu", "mish"):
        assert scheme_gain(he, activation_config(a)) == pytest.approx(math.sqrt(2.0))
    assert scheme_gain(he, activation_config("tanh")) == pytest.approx(5.0 / 3.0)
    assert scheme_gain(he, activation_config("sigmoid")) == pytest.approx(1.0)
    assert scheme_gain(he, activation_config("softsign")) == pytest.approx(1.0)
    leaky = activation_config("leaky_relu", negative_slope=0.2)
    assert scheme_gain(he, leaky) == pytest.approx(math.sqrt(2.0 / (1.0 + 0.2**2)))
    leaky = activation_config("leaky_relu", negative_slope=0.5)
    assert activation_gain(leaky) == pytest.approx(math.sqrt(2.0 / (1.0 + 0.5**2)))
    assert activation_gain(activation_config("leaky_relu")) == pytest.approx(math.sqrt(2.0 / (1.0 + 0.01**2)))
    orthogonal = GainInitConfig(name="orthogonal", gain=None)
    assert scheme_gain(orthogonal, activation_config("tanh")) == pytest.approx(5.0 / 3.0)
    assert scheme_gain(GainInitConfig(name="he_uniform", gain=0.7), activation_config("relu")) == pytest.approx(0.7)
    # null gain -> 1 for default / xavier / lecun whatever the activation
    for cfg in (
        InitConfig(name="default"),
        InitConfig(name="lecun"),
        GainInitConfig(name="xavier", gain=None),
        GainInitConfig(name="xavier_normal", gain=None),
        GainInitConfig(name="xavier_uniform", gain=None),
    ):
        assert scheme_gain(cfg, activation_config("relu")) == pytest.approx(1.0)
    # structured configs behave like the dataclasses
    he = structured(GainInitConfig, name="he", gain=None)
    assert scheme_gain(he, activation_config("tanh")) == pytest.approx(5.0 / 3.0)
    assert scheme_gain(structured(InitConfig, name="lecun"), activation_config("relu")) == pytest.approx(1.0)


def test_pop_mlp_hidden_gain_follows_leaky_relu_slope():
    init = structured(GainInitConfig, name="he", gain=None)
    act = structured(LeakyReLUConfig, name="leaky_relu", negative_slope=0.5)
    net = PopMLP(
        1, 256, 4, NetworkConfig(name="mlp", hidden=[256]), act, NormalizationConfig(name="none"), init, gens(0)
    )
    expected = math.sqrt(2.0 / (1.0 + 0.5**2)) / math.sqrt(256)  # vs sqrt(2)/16 for slope 0.01: 10% apart
    torch.testing.assert_close(net.layers[0].weight.std().item(), expected, rtol=0.02, atol=0.0)


def test_constant_bias_and_default_bias():
    w, b = torch.empty(2, 64, 100), torch.empty(2, 64)
    init_linear(w, b, GainInitConfig(name="he", bias=0.1), 1.0, gens(0, 1))
    assert torch.equal(b, torch.full((2, 64), 0.1))
    init_linear(w, b, InitConfig(name="default", bias=0.0), 1.0, gens(0, 1))
    assert torch.equal(b, torch.zeros(2, 64))
    wide_w, wide_b = torch.empty(4, 256, 100), torch.empty(4, 256)
    init_linear(wide_w, wide_b, InitConfig(name="default", bias=None), 1.0, gens(0, 1, 2, 3))
    bound = 1.0 / math.sqrt(100)
    assert wide_b.abs().max() <= bound
    assert wide_b.abs().max() >= 0.98 * bound
    torch.testing.assert_close(wide_b.std().item(), bound / math.sqrt(3), rtol=0.06, atol=0.0)


def test_last_layer_uniform_draws_weight_and_bias_from_the_scale():
    cfg = GainInitConfig(name="he", gain=None, bias=0.5, last_layer="uniform", last_layer_scale=0.003)
    w, b = torch.empty(4, 64, 256), torch.empty(4, 64)
    init_linear(w, b, cfg, math.sqrt(2.0), gens(0, 1, 2, 3), last=True)
    assert w.abs().max() <= 0.003 and w.abs().max() >= 0.99 * 0.003
    torch.testing.assert_close(w.std().item(), 0.003 / math.sqrt(3), rtol=0.03, atol=0.0)
    assert b.abs().max() <= 0.003 and b.abs().max() >= 0.9 * 0.003  # not the constant 0.5
    # a hidden layer with the same config follows the scheme instead
    init_linear(w, b, cfg, math.sqrt(2.0), gens(0, 1, 2, 3), last=False)
    torch.testing.assert_close(w.std().item(), math.sqrt(2.0) / 16, rtol=0.03, atol=0.0)
    assert torch.equal(b, torch.full((4, 64), 0.5))


def test_last_layer_same_uses_last_layer_gain():
    cfg = GainInitConfig(name="he", gain=None, last_layer="same", last_layer_gain=0.1)
    w = torch.empty(2, 128, 256)
    init_linear(w, None, cfg, math.sqrt(2.0), gens(0, 1), last=True)
    torch.testing.assert_close(w.std().item(), 0.1 / math.sqrt(256), rtol=0.03, atol=0.0)
    init_linear(w, None, cfg, math.sqrt(2.0), gens(0, 1), last=False)
    torch.testing.assert_close(w.std().item(), math.sqrt(2.0) / math.sqrt(256), rtol=0.03, atol=0.0)
    # last_layer_gain = null: the output layer uses the hidden gain
    init_linear(w, None, GainInitConfig(name="he", gain=None), math.sqrt(2.0), gens(0, 1), last=True)
    torch.testing.assert_close(w.std().item(), math.sqrt(2.0) / math.sqrt(256), rtol=0.03, atol=0.0)


def test_pop_mlp_applies_last_layer_settings_to_the_output_layer_only():
    init = structured(GainInitConfig, name="he", gain=None, bias=0.2, last_layer="uniform", last_layer_scale=0.01)
    net = PopMLP(
        2,
        4,
        3,
        NetworkConfig(name="mlp", hidden=[16, 16]),
        ActivationConfig(name="relu"),
        NormalizationConfig(name="none"),
        init,
        gens(0, 1),
    )
    out = net.layers[-1]
    assert out.weight.abs().max() <= 0.01 and out.bias.abs().max() <= 0.01
    assert not torch.equal(out.bias, torch.full_like(out.bias, 0.2))
    for layer in net.layers[:-1]:
        assert torch.equal(layer.bias, torch.full_like(layer.bias, 0.2))
        assert layer.weight.abs().max() > 0.01
