"""The switch that turns every fast path off (``fast_paths=false``; docs/architecture.md, "Fast paths are
declared and twinned").

In pieces (tests/optim/test_plain_paths.py), one per fast path: with the switch off its code is never
reached (its kernel or method made to raise) and the plain twin computes what plain torch does:
torch.optim's own classes bit for bit from their first step (the same arithmetic), the fused kernels'
results closely (not the same arithmetic); a network without its written backward, host form and
``fast_forward``; target updates tensor by tensor, bit for bit the foreach ones; a pipeline whose
parameters keep their storage, which clips, freezes a diverged member and resets one member's optimizer
state; gymnasium's CartPoles one by one. End to end: jobs with the switch off never reach a fast path; a
grid of short DQN jobs on CartPole (epsilon = 1 throughout, so the data never depends on the networks
and the runs differ only in how they learn), a PPO and a TD3 job, each run both ways, give the same
member statuses and the same greedy actions of the final networks on a fixed batch of observations
(near-ties aside; TD3's actions within a tenth of the action range).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from composing import compose_config

from rlexp.envs.gym import CartPoles
from rlexp.nn.activations import PopActivation
from rlexp.nn.component import Component
from rlexp.nn.nets import PopLayerNorm, PopLinear, PopMLP
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


@pytest.mark.parametrize(
    "algo", [pytest.param(a, marks=pytest.mark.compat) if a == "dqn" else a for a in sorted(NEVER_FAST)]
)
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


COMPAT = {("tanh", "layer", "rmsprop", "global_norm"), ("silu", "rms", "adamw", "value")}  # the smoke subset's


@pytest.mark.parametrize(
    "choices", [pytest.param(c, marks=pytest.mark.compat) if c in COMPAT else c for c in GRID], ids="-".join
)
def test_dqn_learns_the_same_greedy_policy_either_way(choices, built, tmp_path):
    groups = [f"{g}={c}" for g, c in zip(("activation", "normalization", "optimizer", "clipping"), choices)]
    obs = torch.randn(2, 256, 4, generator=torch.Generator().manual_seed(6)) * torch.tensor([1.0, 1.0, 0.1, 1.0])
    runs = {fast: finals([*DQN, *groups], fast, tmp_path / str(fast), built) for fast in (True, False)}
    assert runs[True][0] == runs[False][0]
    q_fast = torch.from_numpy(runs[True][1].host_inference()(obs.numpy()))  # how each acts: numpy, torch
    q_plain = torch.from_numpy(runs[False][1].host_inference()(obs.numpy()))
    agree_off_ties(q_fast, q_plain)


@pytest.mark.compat
def test_a_diverging_dqn_diverges_either_way(built, tmp_path):
    overrides = [*DQN, "total_steps=800", "algo.learning_starts=500", "optimizer=sgd", "optimizer.lr=50"]
    statuses = [finals(overrides, fast, tmp_path / str(fast), built)[0] for fast in (True, False)]
    assert statuses[0] == statuses[1] == ["diverged", "diverged"]


@pytest.mark.compat
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


@pytest.mark.compat
def test_a_torch_without_the_private_entry_points_trains_its_fast_paths_plain(
    torch_without_private_entry_points, built, tmp_path
):
    """A torch release lacking the fused, foreach and ATen kernels (older or newer than this one): with the
    fast paths on, each part takes its plain form (calling one of those would crash the job) and learns what
    the fast paths off learn."""
    groups = ["activation=tanh", "normalization=layer", "optimizer=rmsprop", "clipping=global_norm"]
    overrides = [*DQN, *groups, "algo.target_update=soft", "algo.tau=0.1"]
    obs = torch.randn(2, 256, 4, generator=torch.Generator().manual_seed(9)) * torch.tensor([1.0, 1.0, 0.1, 1.0])
    fast = finals(overrides, True, tmp_path / "fast", built)
    assert not fast[1].written_backward and fast[1].fast_paths  # autograd, although the switch is on
    plain = finals(overrides, False, tmp_path / "plain", built)
    assert fast[0] == plain[0] == ["ok", "ok"]
    q_fast = torch.from_numpy(fast[1].host_inference()(obs.numpy()))
    q_plain = torch.from_numpy(plain[1].host_inference()(obs.numpy()))
    agree_off_ties(q_fast, q_plain)
