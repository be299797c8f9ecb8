"""Interventions against loss of plasticity (rlexp/diagnostics/interventions.py), each against a direct computation
written here: ReDo's dormant units by hand, shrink and perturb's convex combination, reset's fresh
layers; the optimizer state they reset; member isolation; the l2_init penalty."""

from __future__ import annotations

import copy

import pytest
import torch

from rlexp.config.schema import (
    AdamConfig,
    ClippingConfig,
    DefaultInitConfig,
    InterventionConfig,
    NetworkConfig,
    NormalizationConfig,
    RegularizationConfig,
    RMSpropTFConfig,
    SGDConfig,
)
from rlexp.diagnostics.interventions import INTERVENTIONS, PURPOSE, Interventions, Subject, dormant_units
from rlexp.envs.streams import member_generator
from rlexp.nn.nets import PopMLP, weight_parameters
from rlexp.optim.pipeline import GradientPipeline, Health

P, B, N_IN, N_OUT, HIDDEN = 4, 32, 3, 2, [8, 6]
SEEDS = [5, 6, 7, 8]
DEAD = [1, 5]  # member 2's first-layer units made dead (relu of a large negative bias)


def optimizer_config(name: str):
    return {"adam": AdamConfig(name="adam"), "rmsprop_tf": RMSpropTFConfig(name="rmsprop_tf")}[name]


def setup(activation: str = "relu", optimizer: str = "adam", normalization: str = "none"):
    """A population of 4 with a target copy and a pipeline that took three steps (its state non-zero);
    member 2's units DEAD of layer 0 never fire."""
    from rlexp.config.schema import ActivationConfig

    gens = [torch.Generator().manual_seed(k) for k in range(P)]
    net = PopMLP(
        P,
        N_IN,
        N_OUT,
        NetworkConfig(name="mlp", hidden=list(HIDDEN)),
        ActivationConfig(name=activation),
        NormalizationConfig(name=normalization),
        DefaultInitConfig(name="default"),
        gens,
    ).double()
    with torch.no_grad():
        net.layers[0].bias[2, DEAD] = -100.0
    target = copy.deepcopy(net)
    pipeline = GradientPipeline(
        list(net.parameters()),
        optimizer_config(optimizer),
        ClippingConfig(name="none"),
        RegularizationConfig(),
        weight_parameters(net),
        Health(P, torch.device("cpu")),
    )
    x = torch.randn(P, B, N_IN, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for _ in range(3):
        pipeline.step(net(x).square().mean((1, 2)), 0)
    return net, target, pipeline, x


def intervention(name: str, net, target, pipeline, **keys) -> Interventions:
    cfg = InterventionConfig(name=name, every=2, **keys)
    return Interventions(cfg, [Subject("q", net, pipeline, (target,))], SEEDS, pipeline.health)


def fresh_draw(net: PopMLP) -> PopMLP:
    """The draw the intervention makes first: the network anew from each member's stream of purpose 100."""
    return net.fresh([member_generator(s, PURPOSE) for s in SEEDS])


def snapshot(net: PopMLP, pipeline: GradientPipeline):
    return [p.detach().clone() for p in net.parameters()], [t.clone() for t, _ in pipeline.optimizer.state()]


def state_view(pipeline: GradientPipeline, state: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The slice of a flat [P, N] optimizer state tensor that belongs to ``param``, shaped as it."""
    offset = 0
    for p in pipeline.params:
        if p is param:
            return state[:, offset : offset + p[0].numel()].view(p.shape)
        offset += p[0].numel()
    raise KeyError


def dormant_by_hand(net: PopMLP, x: torch.Tensor, activation: str, tau: float) -> list[list[torch.Tensor]]:
    """Per hidden layer and member, the indices of tau-dormant units, from the definition:
    score_i = mean_b |h_bi| / mean_j mean_b |h_bj|, dormant when <= tau; crelu's unit i has two outputs
    (i and i + H) and is dormant when both are."""
    out = []
    h = x
    for i in range(len(HIDDEN)):
        layer, per_member = net.layers[i], []
        z = torch.stack([h[k] @ layer.weight[k].T + layer.bias[k] for k in range(P)])
        h = torch.relu(z) if activation == "relu" else torch.cat([torch.relu(z), torch.relu(-z)], -1)
        for k in range(P):
            score = h[k].abs().mean(0)
            dormant = score / score.mean() <= tau
            if activation == "crelu":
                dormant = dormant[: HIDDEN[i]] & dormant[HIDDEN[i] :]
            per_member.append(dormant.nonzero().flatten())
        out.append(per_member)
    return out


@pytest.mark.parametrize("activation, tau", [("relu", 0.1), ("crelu", 0.9)])
def test_redo_recycles_the_dormant_units_by_hand(activation, tau):
    """Dormant units get the fresh draw's incoming weights and bias, zero outgoing weights (crelu: both
    halves' columns), zero Adam moments on both; everything else, the target and the step count stay."""
    net, target, pipeline, x = setup(activation)
    with torch.no_grad():
        dormant = dormant_by_hand(net, x, activation, tau)
    fresh = fresh_draw(net)
    (params, states), target_before = snapshot(net, pipeline), copy.deepcopy(target)
    steps = [s.clone() for s in pipeline.optimizer.steps]
    redo = intervention("redo", net, target, pipeline, tau=tau)
    assert not redo(1, x)  # not a multiple of every
    assert redo(2, x)
    expected = [p.clone() for p in params]  # weight 0, bias 0, weight 1, bias 1, weight 2, bias 2
    expected_states = [s.clone() for s in states]
    names = list(dict(net.named_parameters()))
    recycled = 0
    for i in range(len(HIDDEN)):
        w, b, w_next = 2 * i, 2 * i + 1, 2 * i + 2
        for k in range(P):
            rows = dormant[i][k]
            recycled += len(rows)
            cols = torch.cat([rows + m * HIDDEN[i] for m in range(net.layers[i + 1].weight.shape[2] // HIDDEN[i])])
            expected[w][k, rows] = fresh.layers[i].weight[k, rows].detach()
            expected[b][k, rows] = fresh.layers[i].bias[k, rows].detach()
            expected[w_next][k, :, cols] = 0.0
            for s in expected_states:
                state_view(pipeline, s, pipeline.params[w])[k, rows] = 0.0
                state_view(pipeline, s, pipeline.params[b])[k, rows] = 0.0
                state_view(pipeline, s, pipeline.params[w_next])[k, :, cols] = 0.0
        counted = torch.tensor([len(r) for r in dormant[i]], dtype=torch.float32)
        assert torch.equal(redo.counts[f"intervention/recycled/q.{i}"], counted)
    assert recycled > 0 and len(dormant[0][2]) >= (len(DEAD) if activation == "relu" else 0)
    for name, p, e in zip(names, net.parameters(), expected):
        assert torch.equal(p, e), name
    for s, e in zip(pipeline.optimizer.state(), expected_states):
        assert torch.equal(s[0], e)
    assert all(torch.equal(a, b) for a, b in zip(pipeline.optimizer.steps, steps))
    assert all(torch.equal(a, b) for a, b in zip(target.parameters(), target_before.parameters()))
    assert torch.equal(redo.counts["intervention/count"], torch.ones(P))


def test_redo_gives_dead_units_back_their_gradient():
    """After recycling, member 2's dead units fire again on the batch (through their fresh rows)."""
    net, target, pipeline, x = setup()
    intervention("redo", net, target, pipeline, tau=0.1)(2, x)
    with torch.no_grad():
        h = torch.relu(x[2] @ net.layers[0].weight[2].T + net.layers[0].bias[2])
    assert (h[:, DEAD] > 0).any(0).all()


def test_shrink_perturb_is_the_convex_mix_with_the_fresh_draw():
    """theta' = shrink * theta + perturb * theta_fresh for every parameter and member, exactly; the
    optimizer state and the target stay."""
    net, target, pipeline, x = setup()
    fresh = fresh_draw(net)
    params, states = snapshot(net, pipeline)
    intervention("shrink_perturb", net, target, pipeline, shrink=0.7, perturb=0.3)(2, x)
    for p, before, f in zip(net.parameters(), params, fresh.parameters()):
        assert torch.equal(p, 0.7 * before + 0.3 * f.detach())
    for s, before in zip(pipeline.optimizer.state(), states):
        assert torch.equal(s[0], before)


@pytest.mark.parametrize("optimizer", ["adam", "rmsprop_tf"])
def test_reset_reinitializes_the_last_layers_and_their_state(optimizer):
    """The last k layers of the network and of its target equal the fresh draw, their optimizer state a
    fresh optimizer's (Adam's moments 0, rmsprop_tf's mean square 1, momentum 0); the first layer and
    its state stay."""
    net, target, pipeline, x = setup(optimizer=optimizer)
    fresh = fresh_draw(net)
    params, states = snapshot(net, pipeline)
    target_first = target.layers[0].weight.clone()
    intervention("reset", net, target, pipeline, layers=2)(2, x)
    kept = [net.layers[0].weight, net.layers[0].bias]
    for j, p in enumerate(net.parameters()):
        if any(p is q for q in kept):
            assert torch.equal(p, params[j])
            for (s, _), before in zip(pipeline.optimizer.state(), states):
                assert torch.equal(state_view(pipeline, s, p), state_view(pipeline, before, p))
        else:
            for (s, initial), _ in zip(pipeline.optimizer.state(), states):
                assert (state_view(pipeline, s, p) == initial).all()
    for copy_ in (net, target):
        for i in (1, 2):
            assert torch.equal(copy_.layers[i].weight, fresh.layers[i].weight)
            assert torch.equal(copy_.layers[i].bias, fresh.layers[i].bias)
    assert torch.equal(target.layers[0].weight, target_first)


@pytest.mark.parametrize("name", sorted(set(INTERVENTIONS) - {"none"}))
def test_intervening_on_one_member_leaves_the_others_bitwise_unchanged(name):
    """Intervening on member 2 of 4 changes member 2 (parameters and, but for shrink_perturb, optimizer
    state) and leaves members 0, 1, 3 bitwise as they were: parameters, optimizer state, target."""
    net, target, pipeline, x = setup(normalization="layer")
    (params, states), target_params = snapshot(net, pipeline), [p.clone() for p in target.parameters()]
    intervention(name, net, target, pipeline, tau=0.1, layers=3)(2, x, members=[2])
    others = [0, 1, 3]
    for p, before in zip(net.parameters(), params):
        assert torch.equal(p[others], before[others])
    for s, before in zip(pipeline.optimizer.state(), states):
        assert torch.equal(s[0][others], before[others])
    for p, before in zip(target.parameters(), target_params):
        assert torch.equal(p[others], before[others])
    assert not all(torch.equal(p[2], before[2]) for p, before in zip(net.parameters(), params))
    if name != "shrink_perturb":
        assert not all(torch.equal(s[0][2], before[2]) for s, before in zip(pipeline.optimizer.state(), states))


def test_a_members_fresh_draws_depend_on_its_seed_alone():
    """Member k's fresh weights come from its own stream: the same in a population of one."""
    net, _, _, _ = setup()
    alone = PopMLP(1, N_IN, N_OUT, *net._build[3:7], [torch.Generator().manual_seed(2)]).double()
    fresh, fresh_alone = fresh_draw(net), alone.fresh([member_generator(SEEDS[2], PURPOSE)])
    for p, q in zip(fresh.parameters(), fresh_alone.parameters()):
        assert torch.equal(p[2], q[0])


@pytest.mark.parametrize("weights_only", [True, False])
def test_l2_init_penalizes_the_distance_to_the_initial_values(weights_only):
    """penalty = l2_init * sum (w - w_0)^2 per member, w_0 the values the pipeline found; one SGD step on
    the penalty alone moves w by -lr * 2 * l2_init * (w - w_0)."""
    net, _, _, x = setup()
    net = copy.deepcopy(net)
    penalized = weight_parameters(net) if weights_only else list(net.parameters())
    initial = [w.detach().clone() for w in penalized]
    pipeline = GradientPipeline(
        list(net.parameters()),
        SGDConfig(name="sgd", lr=0.1),
        ClippingConfig(name="none"),
        RegularizationConfig(l2_init=0.05, weights_only=weights_only),
        weight_parameters(net),
        Health(P, torch.device("cpu")),
    )
    assert torch.equal(pipeline.penalty(), torch.zeros(P, dtype=torch.float64))
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3), dtype=p.dtype))
    moved = [w.detach().clone() for w in penalized]
    expected = sum(0.05 * (w - w0).square().flatten(1).sum(1) for w, w0 in zip(moved, initial))
    torch.testing.assert_close(pipeline.penalty(), expected)
    pipeline.step(0.0 * net(x).sum((1, 2)), 0)
    for w, before, w0 in zip(penalized, moved, initial):
        torch.testing.assert_close(w, before - 0.1 * 2 * 0.05 * (before - w0))


def test_redo_leaves_a_second_inputs_columns_alone():
    """A critic whose action joins layer 1's input: recycling layer 0's dead units zeroes their columns
    of layer 1 and none of the action's (the last columns)."""
    from rlexp.config.schema import ActivationConfig

    gens = [torch.Generator().manual_seed(k) for k in range(P)]
    net = PopMLP(
        P,
        N_IN,
        1,
        NetworkConfig(name="mlp", hidden=list(HIDDEN)),
        ActivationConfig(name="relu"),
        NormalizationConfig(name="none"),
        DefaultInitConfig(name="default"),
        gens,
        extra_in=2,
        extra_at=1,
    ).double()
    with torch.no_grad():
        net.layers[0].bias[2, DEAD] = -100.0
    pipeline = GradientPipeline(
        list(net.parameters()),
        AdamConfig(name="adam"),
        ClippingConfig(name="none"),
        RegularizationConfig(),
        weight_parameters(net),
        Health(P, torch.device("cpu")),
    )
    x = torch.randn(P, B, N_IN, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    action = torch.randn(P, B, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    before = net.layers[1].weight.detach().clone()
    kept = ~dormant_units(net, x, action, 0.1)[1][2]  # layer 1's rows not recycled themselves
    redo = Interventions(
        InterventionConfig(name="redo", every=1, tau=0.1), [Subject("critic", net, pipeline)], SEEDS, pipeline.health
    )
    redo(1, x, action, members=[2])
    after = net.layers[1].weight[2]
    assert kept.any() and (after[kept][:, DEAD] == 0).all()
    assert torch.equal(after[kept, HIDDEN[0] :], before[2, kept, HIDDEN[0] :])  # the action's columns


def population_run(members: int, name: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A float32 population of ``members`` (member k: seed k, its own inputs) trained with Adam for 45
    updates, intervening every 10 (redo with tau 1: about half the units; reset: the output layer);
    member 1's parameters and optimizer state."""
    from rlexp.config.schema import ActivationConfig

    gens = [torch.Generator().manual_seed(k) for k in range(members)]
    # 3 outputs: 107 parameters a member, so every vector width leaves a remainder at the buffer's end
    net = PopMLP(
        members,
        N_IN,
        3,
        NetworkConfig(name="mlp", hidden=list(HIDDEN)),
        ActivationConfig(name="relu"),
        NormalizationConfig(name="none"),
        DefaultInitConfig(name="default"),
        gens,
    )
    pipeline = GradientPipeline(
        list(net.parameters()),
        AdamConfig(name="adam"),
        ClippingConfig(name="none"),
        RegularizationConfig(),
        weight_parameters(net),
        Health(members, torch.device("cpu")),
    )
    cfg = InterventionConfig(name=name, every=10, tau=1.0, layers=1)
    intervene = Interventions(cfg, [Subject("q", net, pipeline)], list(range(members)), pipeline.health)
    x = torch.stack([torch.randn(B, N_IN, generator=torch.Generator().manual_seed(10 + k)) for k in range(members)])
    for update in range(1, 46):
        pipeline.step(net(x).square().mean((1, 2)), 0)
        intervene(update, x)
    return [p[1].detach().clone() for p in net.parameters()], [s[1].clone() for s, _ in pipeline.optimizer.state()]


@pytest.mark.parametrize("name", ["none", "redo", "reset"])
def test_a_member_does_not_depend_on_the_population_size(name):
    """Member 1 of 2 (the last row of the buffers) equals member 1 of 4 bitwise: parameters and Adam's
    moments, through the interventions' resets (the optimizer's kernel has no remainder loop to round
    the last member's last elements differently)."""
    (params2, states2), (params4, states4) = population_run(2, name), population_run(4, name)
    for a, b in zip(params2 + states2, params4 + states4):
        assert torch.equal(a, b)
