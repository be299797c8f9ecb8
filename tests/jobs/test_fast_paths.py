"""The switch that turns every fast path off (``fast_paths=false``; docs/architecture.md, "Fast paths are
declared and twinned").

Unit, one per fast path: with the switch off its code is never reached (its kernel or method made to
raise) and the plain twin computes what plain torch does: torch.optim's own classes bit for bit from
their first step (the same arithmetic), the fused kernels' results closely (not the same arithmetic);
a network without its written backward, host form and ``fast_forward``; target updates tensor by
tensor, bit for bit the foreach ones; a pipeline whose parameters keep their storage, which clips,
freezes a diverged member and resets one member's optimizer state; gymnasium's CartPoles one by one.
End to end: jobs with the switch off never reach a fast path; a grid of short DQN jobs on CartPole
(epsilon = 1 throughout, so the data never depends on the networks and the runs differ only in how they
learn), a PPO and a TD3 job, each run both ways, give the same member statuses and the same greedy
actions of the final networks on a fixed batch of observations (near-ties aside; TD3's actions within a
tenth of the action range).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from composing import compose_config

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
from rlexp.run.context import RunContext
from rlexp.train import run_job

QUIET = ["logger.mode=disabled", "logger.progress=off", "device=cpu", "threads=1", "eval.episodes=0"]


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


# ---------------------------------------------------------------- end to end
NEVER_FAST = {  # jobs that would reach every fast path with the switch on
    "dqn": ["total_steps=700", "num_seeds=2", "env.num_envs=2", "algo.learning_starts=300", "algo.batch_size=32"]
    + ["algo.target_update=soft", "algo.tau=0.1", "clipping=global_norm", "normalization=layer"],
    "sac": ["algo=sac", "env=pendulum", "total_steps=300", "num_seeds=2", "network.hidden=[16,16]"]
    + ["algo.learning_starts=100", "algo.batch_size=32"],
}


@pytest.fixture
def built(monkeypatch) -> list[PopMLP]:
    """The networks the jobs build (``RunContext.make_net``), in order."""
    made: list[PopMLP] = []
    make_net = RunContext.make_net

    def recorded(self: RunContext, *args, **kwargs) -> PopMLP:
        made.append(make_net(self, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(RunContext, "make_net", recorded)
    return made


@pytest.mark.parametrize("algo", sorted(NEVER_FAST))
def test_a_job_with_the_fast_paths_off_never_reaches_one(algo, built, monkeypatch, tmp_path):
    forbid(monkeypatch, *private_kernels(), *component_fast_paths())
    summary = run_job(compose_config([*NEVER_FAST[algo], *QUIET, "fast_paths=false"]), tmp_path)
    assert [m["status"] for m in summary["members"]] == ["ok", "ok"]
    assert built and not any(net.fast_paths for net in built)


def finals(overrides: list[str], fast_paths: bool, out_dir: Path, built: list[PopMLP]) -> tuple[list[str], PopMLP]:
    """(member statuses, the first network it built, in eval mode) of a job with ``fast_paths``."""
    built.clear()
    summary = run_job(compose_config([*overrides, *QUIET, f"fast_paths={str(fast_paths).lower()}"]), out_dir)
    return [m["status"] for m in summary["members"]], built[0].eval()


def agree_off_ties(fast: torch.Tensor, plain: torch.Tensor) -> None:
    """The same greedy action [P, B] wherever the fast outputs' two best differ by over 0.2% of their scale
    (rounding differences, grown through training, stay far below it; a near-tie may go either way)."""
    top = fast.topk(2, dim=-1).values
    clear = (top[..., 0] - top[..., 1]) > 0.002 * fast.abs().amax()
    assert clear.float().mean() > 0.5  # most of the batch is no near-tie
    assert torch.equal(fast.argmax(-1)[clear], plain.argmax(-1)[clear])


DQN = ["total_steps=1500", "num_seeds=2", "algo.learning_starts=1000", "algo.end_e=1.0"]  # epsilon = 1: random acting
GRID = [  # activation, normalization, optimizer, clipping
    ("relu", "none", "adam", "none"),
    ("tanh", "layer", "rmsprop", "global_norm"),
    ("gelu", "batch", "sgd", "agc"),
    ("elu", "weight", "rmsprop_tf", "per_tensor"),
    ("silu", "rms", "adamw", "value"),
    ("leaky_relu", "spectral", "adam", "none"),
]


@pytest.mark.parametrize("choices", GRID, ids="-".join)
def test_dqn_learns_the_same_greedy_policy_either_way(choices, built, tmp_path):
    groups = [f"{g}={c}" for g, c in zip(("activation", "normalization", "optimizer", "clipping"), choices)]
    obs = torch.randn(2, 256, 4, generator=torch.Generator().manual_seed(6)) * torch.tensor([1.0, 1.0, 0.1, 1.0])
    runs = {fast: finals([*DQN, *groups], fast, tmp_path / str(fast), built) for fast in (True, False)}
    assert runs[True][0] == runs[False][0]
    q_fast = torch.from_numpy(runs[True][1].host_inference()(obs.numpy()))  # how each acts: numpy, torch
    q_plain = torch.from_numpy(runs[False][1].host_inference()(obs.numpy()))
    agree_off_ties(q_fast, q_plain)


def test_a_diverging_dqn_diverges_either_way(built, tmp_path):
    overrides = [*DQN, "total_steps=800", "algo.learning_starts=500", "optimizer=sgd", "optimizer.lr=50"]
    statuses = [finals(overrides, fast, tmp_path / str(fast), built)[0] for fast in (True, False)]
    assert statuses[0] == statuses[1] == ["diverged", "diverged"]


def test_ppo_learns_the_same_greedy_policy_either_way(built, tmp_path):
    overrides = ["algo=ppo", "total_steps=4096", "num_seeds=2", "network.hidden=[32,32]"]
    runs = {fast: finals(overrides, fast, tmp_path / str(fast), built) for fast in (True, False)}
    assert runs[True][0] == runs[False][0]
    obs = torch.randn(2, 256, 4, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        agree_off_ties(runs[True][1](obs), runs[False][1](obs))  # the actor's logits


def test_td3_learns_the_same_policy_either_way(built, tmp_path):
    overrides = ["algo=td3", "env=pendulum", "total_steps=1200", "num_seeds=2", "algo.learning_starts=400"]
    runs = {
        fast: finals([*overrides, "network.hidden=[32,32]"], fast, tmp_path / str(fast), built)
        for fast in (True, False)
    }
    assert runs[True][0] == runs[False][0]
    obs = torch.randn(2, 256, 3, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():  # Pendulum's torque in [-2, 2]: tanh-squashed actor outputs
        fast, plain = (2 * torch.tanh(runs[k][1](obs)) for k in (True, False))
    assert float((fast - plain).abs().max()) < 0.4  # a tenth of the range
    assert np.isfinite(fast.numpy()).all()
