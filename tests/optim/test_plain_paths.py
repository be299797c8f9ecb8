"""The fast paths off (``fast_paths=false``), in pieces: torch.optim's own optimizer classes (no private
kernels), RMSpropTF through public ops, a plain network (no written backward, host form or
fast_forward), plain target updates bit for bit, the plain pipeline, CartPoles stepped one by one."""

from __future__ import annotations

import copy

import pytest
import torch

from rlexp.config.schema import (
    ActivationConfig,
    AdamConfig,
    AdamWConfig,
    DefaultInitConfig,
    EnvConfig,
    LayerNormConfig,
    NetworkConfig,
    NormClipConfig,
    RegularizationConfig,
    RMSpropConfig,
    RMSpropTFConfig,
    SGDConfig,
)
from rlexp.envs.gym import CartPoles, PopulationEnv
from rlexp.nn.activations import PopActivation
from rlexp.nn.component import Component, ParameterStorage
from rlexp.nn.nets import PopLayerNorm, PopLinear, PopMLP, hard_update_, plain_paths, soft_update_, weight_parameters
from rlexp.optim.optimizers import RMSpropTF, TorchOptimizer, make_optimizer
from rlexp.optim.pipeline import GradientPipeline, Health, PlainPipeline, gradient_pipeline

pytestmark = pytest.mark.compat  # the fast paths' plain twins: the smoke subset run on the oldest and newest torch


def forbid(monkeypatch: pytest.MonkeyPatch, *targets: tuple[object, str]) -> None:
    """Make each ``(owner, name)`` raise when called."""
    for owner, name in targets:

        def refuse(*args, _name=name, **kwargs):
            raise AssertionError(f"a fast path ran with fast_paths=false: {_name}")

        monkeypatch.setattr(owner, name, refuse)


def private_kernels() -> list[tuple[object, str]]:
    """torch's private fused and foreach kernels (``torch._fused_adam_``, ``torch._foreach_lerp_``, ...)."""
    return [(torch, name) for name in dir(torch) if name.startswith(("_fused_", "_foreach_"))]


def component_fast_paths() -> list[tuple[object, str]]:
    """The components' written backwards, host forms and fast forwards, and the CartPoles stepped together."""
    methods = ("forward_saved", "backward_to_grads", "host_forward", "fast_forward")
    owners = (Component, PopLinear, PopLayerNorm, PopActivation)
    return [(owner, m) for owner in owners for m in methods if m in vars(owner)] + [(CartPoles, "step")]


def population(members: int = 3, seed: int = 0) -> PopMLP:
    """A small MLP population [P, B, 4] -> [P, B, 2] whose every component declares every fast path."""
    return PopMLP(
        members,
        4,
        2,
        NetworkConfig(name="mlp", hidden=[8, 8]),
        ActivationConfig(name="relu"),
        LayerNormConfig(name="layer"),
        DefaultInitConfig(name="default"),
        [torch.Generator().manual_seed(seed + k) for k in range(members)],
    )


# ---------------------------------------------------------------- optimizers
PLAIN = {  # config -> torch.optim's own class and the arguments it is given, written out
    "adam": (
        AdamConfig(name="adam", lr=0.01, weight_decay=0.1),
        lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, foreach=False),
    ),
    "adamw": (
        AdamWConfig(name="adamw", lr=0.01, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, foreach=False),
    ),
    "rmsprop": (
        RMSpropConfig(name="rmsprop", lr=0.01, momentum=0.9, centered=True, weight_decay=0.1),
        lambda p: torch.optim.RMSprop(
            p, lr=0.01, alpha=0.99, eps=1e-8, momentum=0.9, centered=True, weight_decay=0.1, foreach=False
        ),
    ),
    "sgd": (
        SGDConfig(name="sgd", lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.1),
        lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.1, foreach=False),
    ),
}


def stepped(optimizer_of, params: list[torch.Tensor], grads: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """The parameters after one step per gradient list, by ``optimizer_of(params)``."""
    params = [p.clone() for p in params]
    optimizer = optimizer_of(params)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.clone()
        optimizer.step()
    return params


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_plain_optimizers_are_torch_optims_own_classes_without_private_kernels(name, monkeypatch):
    cfg, torch_own = PLAIN[name]
    g = torch.Generator().manual_seed(1)
    params = [torch.randn(2, 5, 3, generator=g), torch.randn(2, 5, generator=g)]  # [P, out, in], [P, out]
    grads = [[torch.randn(p.shape, generator=g) for p in params] for _ in range(4)]
    fused = stepped(lambda p: make_optimizer(p, cfg), params, grads)  # the fast path: private kernels
    forbid(monkeypatch, *private_kernels())
    optimizer = make_optimizer([p.clone() for p in params], cfg, fast_paths=False)
    assert isinstance(optimizer, TorchOptimizer) and type(optimizer.torch) is type(torch_own(params))
    assert not optimizer.torch.defaults["foreach"] and not optimizer.torch.defaults.get("fused")
    plain = stepped(lambda p: make_optimizer(p, cfg, fast_paths=False), params, grads)
    own = stepped(torch_own, params, grads)  # torch.optim's state made at its first step
    assert all(torch.equal(a, b) for a, b in zip(plain, own))  # the same arithmetic: the same bits
    for a, b in zip(plain, fused):  # the fused kernels round their own way; no exp involved
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert all(not torch.equal(a, p) for a, p in zip(plain, params))


def test_plain_rmsprop_tf_is_rlexps_own_through_public_ops(monkeypatch):
    cfg = RMSpropTFConfig(name="rmsprop_tf", lr=0.01, momentum=0.5)
    g = torch.Generator().manual_seed(2)
    params = [torch.randn(2, 5, 3, generator=g), torch.randn(2, 5, generator=g)]
    grads = [[torch.randn(p.shape, generator=g) for p in params] for _ in range(3)]
    fast = stepped(lambda p: make_optimizer(p, cfg), params, grads)
    forbid(monkeypatch, *private_kernels())
    assert isinstance(make_optimizer(params, cfg, fast_paths=False), RMSpropTF)
    plain = stepped(lambda p: make_optimizer(p, cfg, fast_paths=False), params, grads)
    assert all(torch.equal(a, b) for a, b in zip(plain, fast))


def test_a_torch_optimizer_lists_its_state_per_parameter_as_the_fused_ones():
    params = [torch.zeros(2, 3), torch.zeros(2, 4)]
    adam = make_optimizer(params, AdamConfig(name="adam", lr=0.1), fast_paths=False)
    assert [t.shape for t, _ in adam.state()] == [(2, 3), (2, 4), (2, 3), (2, 4)]  # exp_avg, exp_avg_sq
    assert [t for t, _ in adam.param_state(1)] == [adam.exp_avg[1], adam.exp_avg_sq[1]]
    assert adam.param_state(1)[0][0] is adam.torch.state[params[1]]["exp_avg"]  # the tensors torch.optim steps
    sgd = make_optimizer(params, SGDConfig(name="sgd", lr=0.1), fast_paths=False)
    assert sgd.state() == [] and sgd.steps == []  # no momentum: no state


# ---------------------------------------------------------------- networks and target updates
def test_a_plain_network_never_takes_its_written_backward_host_form_or_fast_forward(monkeypatch):
    net = population()
    net.eval()
    x = torch.randn(3, 16, 4, generator=torch.Generator().manual_seed(3))
    assert net.written_backward and net.fast_paths  # every component declares each capability
    plain_paths(net)
    assert not net.written_backward
    forbid(monkeypatch, *component_fast_paths())
    with torch.no_grad():
        y = net(x)
    assert torch.equal(net.inference()(x), y)
    assert torch.equal(torch.from_numpy(net.host_inference()(x.numpy())), y)  # torch's forward, not numpy's
    with pytest.raises(AssertionError, match="fast path"):  # what the switch keeps away
        net.layers[0].host_forward()


def test_plain_target_updates_go_tensor_by_tensor_to_the_same_bits(monkeypatch):
    online, target = population(seed=0), population(seed=10)
    fast_target = copy.deepcopy(target)
    soft_update_(fast_target, online, 0.3)
    soft_update_(fast_target, online, [(0, 1, 0.5), (1, 3, 0.25)])
    plain_online, plain_target = copy.deepcopy(online), copy.deepcopy(target)
    plain_paths(plain_online)
    forbid(monkeypatch, *private_kernels())
    soft_update_(plain_target, plain_online, 0.3)
    soft_update_(plain_target, plain_online, [(0, 1, 0.5), (1, 3, 0.25)])
    assert all(torch.equal(a, b) for a, b in zip(plain_target.state_dict().values(), fast_target.state_dict().values()))
    hard_update_(plain_target, plain_online)
    assert all(torch.equal(a, b) for a, b in zip(plain_target.state_dict().values(), online.state_dict().values()))


# ---------------------------------------------------------------- pipeline
def pipeline(net: PopMLP, fast_paths: bool) -> GradientPipeline:
    """Adam with global-norm clipping at 0.1 over ``net`` (three members)."""
    adam = AdamConfig(name="adam", lr=0.01)
    clip = NormClipConfig(name="global_norm", max_norm=0.1)
    params, health = list(net.parameters()), Health(3, torch.device("cpu"))
    return gradient_pipeline(params, adam, clip, RegularizationConfig(), weight_parameters(net), health, fast_paths)


def test_a_plain_pipeline_keeps_storage_clips_and_freezes_a_diverged_member_as_the_flat_one(monkeypatch):
    x = torch.randn(3, 32, 4, generator=torch.Generator().manual_seed(4))
    fast_net = population()
    fast = pipeline(fast_net, True)
    net, moves = population(), ParameterStorage.moves
    pointers = [p.data_ptr() for p in net.parameters()]
    plain = pipeline(net, False)
    assert isinstance(plain, PlainPipeline) and ParameterStorage.moves == moves  # nothing moved
    poison = torch.tensor([1.0, float("nan"), 1.0])  # member 1's loss turns NaN at the third update
    results = {}
    for name, (n, pipe) in {"fast": (fast_net, fast), "plain": (net, plain)}.items():
        if name == "plain":
            forbid(monkeypatch, *private_kernels())
        frozen = None
        for step in range(5):
            loss = n(x).square().mean((1, 2)) * (poison if step == 2 else 1.0)  # [P]
            if step == 2:
                frozen = [p[1].detach().clone() for p in n.parameters()]
            stats = pipe.step(loss, env_step=step)
        assert all(torch.equal(p[1], f) for p, f in zip(n.parameters(), frozen))  # member 1 frozen since
        assert pipe.health.alive.tolist() == [True, False, True] and pipe.health.cause[1] == 1  # nonfinite_loss
        results[name] = ([p.detach().clone() for p in n.parameters()], stats)
    assert [p.data_ptr() for p in net.parameters()] == pointers  # the parameters kept their storage
    for a, b in zip(*(results[k][0] for k in ("fast", "plain"))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # fused Adam against torch.optim's
    pre = results["plain"][1].grad_norm_pre_clip
    assert bool((pre[[0, 2]] > 0.1).all())  # the global norm clipped the living members
    post = results["plain"][1].grad_norm_post_clip[[0, 2]]  # max_norm * norm / (norm + 1e-6)
    torch.testing.assert_close(post, torch.full((2,), 0.1, dtype=post.dtype), rtol=1e-4, atol=0)


def test_a_plain_pipeline_resets_one_members_state_and_changes_its_lr_keeping_the_others():
    net = population()
    plain = pipeline(net, False)
    x = torch.randn(3, 8, 4, generator=torch.Generator().manual_seed(5))
    plain.step(net(x).square().mean((1, 2)), env_step=0)
    weight = plain.params[0]  # [P, 8, 4]
    before = [t.clone() for t, _ in plain.optimizer.state()]
    plain.reset_state(weight, member=2, index=(3,))
    for (t, initial), old in zip(plain.optimizer.state(), before):
        expected = old.clone()
        if t.shape == weight.shape:
            expected[2, 3] = initial
        assert torch.equal(t, expected)
    assert bool(before[0][2, 3].ne(0).any())  # it was not 0 before
    moments = [t.clone() for t, _ in plain.optimizer.state()]
    plain.set_optimizers([AdamConfig(name="adam", lr=0.01)] * 2 + [AdamConfig(name="adam", lr=0.02)])
    assert [(a, b) for a, b, _ in plain.optimizers] == [(0, 2), (2, 3)]
    for k in range(3):  # each member's moments moved with it into its new run
        a, _, optimizer = next(r for r in plain.optimizers if r[0] <= k < r[1])
        assert all(torch.equal(t[k - a], m[k]) for (t, _), m in zip(optimizer.state(), moments))
    assert all(float(s) == 1.0 for _, _, o in plain.optimizers for s in o.steps)  # the step counts carried over
    plain.step(net(x).square().mean((1, 2)), env_step=1)
    assert all(float(s) == 2.0 for _, _, o in plain.optimizers for s in o.steps)


# ---------------------------------------------------------------- environments
def test_plain_cartpoles_step_one_by_one():
    cfg = EnvConfig(id="CartPole-v1", num_envs=4)
    assert PopulationEnv(cfg, [0, 1]).cartpoles is not None
    assert PopulationEnv(cfg, [0, 1], together=False).cartpoles is None
