"""The capability checks (``rlexp.nn.capabilities``, ``rlexp.optim.optimizers.fast_kernels_run``): each private
torch entry point a fast path calls is looked up once, and without it the part takes its plain torch form."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from rlexp.config.schema import (
    ActivationConfig,
    AdamConfig,
    AdamWConfig,
    DefaultInitConfig,
    LayerNormConfig,
    NetworkConfig,
    RMSpropConfig,
    RMSpropTFConfig,
    SGDConfig,
)
from rlexp.nn import capabilities
from rlexp.nn.activations import ACTIVATIONS, PopActivation
from rlexp.nn.conv import PopConv
from rlexp.nn.nets import PopBatchNorm, PopLayerNorm, PopMLP, PopRMSNorm, hard_update_, soft_update_
from rlexp.optim.optimizers import FusedAdam, RMSpropTF, TorchOptimizer, fast_kernels_run, make_optimizer

pytestmark = pytest.mark.compat  # what differs between torch releases: the smoke subset

OPTIMIZERS = {
    "adam": AdamConfig(name="adam", lr=0.01, weight_decay=0.1),
    "adamw": AdamWConfig(name="adamw", lr=0.01),
    "rmsprop": RMSpropConfig(name="rmsprop", lr=0.01, momentum=0.9, centered=True),
    "sgd": SGDConfig(name="sgd", lr=0.01, momentum=0.9, nesterov=True),
}


def population(members: int = 3, seed: int = 0, activation: str = "relu") -> PopMLP:
    """A small MLP population [P, B, 4] -> [P, B, 2] with layer norm."""
    return PopMLP(
        members,
        4,
        2,
        NetworkConfig(name="mlp", hidden=[8, 8]),
        ActivationConfig(name=activation),
        LayerNormConfig(name="layer"),
        DefaultInitConfig(name="default"),
        [torch.Generator().manual_seed(seed + k) for k in range(members)],
    )


def stepped(params: list[torch.Tensor], cfg, fast_paths: bool) -> list[torch.Tensor]:
    """The parameters after three steps of ``make_optimizer(..., cfg, fast_paths)`` on fixed gradients."""
    g = torch.Generator().manual_seed(1)
    params = [p.clone() for p in params]
    optimizer = make_optimizer(params, cfg, fast_paths)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()
    return params


# ---------------------------------------------------------------- the checks
def test_the_checks_find_what_torch_has_and_miss_what_it_lacks():
    assert capabilities.has_torch("_foreach_lerp_", "native_layer_norm")
    assert not capabilities.has_torch("_foreach_lerp_", "_no_such_kernel_")
    assert capabilities.has_aten("gelu_backward") and not capabilities.has_aten("no_such_kernel_backward")
    assert capabilities.has_functional("layer_norm") and not capabilities.has_functional("no_such_function")


def test_each_check_looks_once_per_process(monkeypatch):
    capabilities.clear()
    try:
        assert not capabilities.has_torch("_rlexp_probe_")
        monkeypatch.setattr(torch, "_rlexp_probe_", lambda: None, raising=False)
        assert not capabilities.has_torch("_rlexp_probe_")  # the first answer, kept
        capabilities.clear()
        assert capabilities.has_torch("_rlexp_probe_")
    finally:
        monkeypatch.undo()
        capabilities.clear()


def test_importing_rlexp_checks_nothing():
    """No work at import time: every module imported, no check has been asked yet."""
    code = (
        "import rlexp.train, rlexp.nn.conv, rlexp.nn.networks\n"
        "from rlexp.nn import capabilities as c\n"
        "from rlexp.optim.optimizers import fast_kernels_run as f\n"
        "print(sum(g.cache_info().currsize for g in (c.has_torch, c.has_aten, c.has_functional, f)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "0"


# ---------------------------------------------------------------- optimizers
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_an_optimizer_without_its_kernels_is_torch_optims_own(name, torch_without_private_entry_points):
    cfg = OPTIMIZERS[name]
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(2, 5, 3, generator=g), torch.randn(2, 5, generator=g)]
    assert not fast_kernels_run(name, "cpu")
    assert isinstance(make_optimizer([p.clone() for p in params], cfg), TorchOptimizer)
    fast, plain = stepped(params, cfg, True), stepped(params, cfg, False)
    assert all(torch.equal(a, b) for a, b in zip(fast, plain))  # the same class, the same bits
    assert all(not torch.equal(a, p) for a, p in zip(fast, params))


def test_rmsprop_tf_needs_no_private_kernel(torch_without_private_entry_points):
    assert fast_kernels_run("rmsprop_tf", "cpu")
    assert isinstance(make_optimizer([torch.zeros(2, 3)], RMSpropTFConfig(name="rmsprop_tf")), RMSpropTF)


def test_a_fused_kernel_without_a_kernel_for_the_device_is_not_taken(monkeypatch):
    """torch 2.2 has ``_fused_adam_`` for CUDA only: on the CPU it raises NotImplementedError."""

    def cuda_only(*args, **kwargs):
        raise NotImplementedError("Could not run 'aten::_fused_adam_' with arguments from the 'CPU' backend")

    adamw_fused = fast_kernels_run("adamw", "cpu")  # its own kernel (torch 2.2: CUDA only too)
    fast_kernels_run.cache_clear()
    try:
        monkeypatch.setattr(torch, "_fused_adam_", cuda_only)
        assert isinstance(make_optimizer([torch.zeros(2, 3)], OPTIMIZERS["adam"]), TorchOptimizer)
        adamw = make_optimizer([torch.zeros(2, 3)], OPTIMIZERS["adamw"])
        assert isinstance(adamw, FusedAdam if adamw_fused else TorchOptimizer)
    finally:
        monkeypatch.undo()
        fast_kernels_run.cache_clear()


# ---------------------------------------------------------------- networks
def components() -> list[torch.nn.Module]:
    """One of each component with a written backward that calls ATen's kernels."""
    acts = [PopActivation(entry, ActivationConfig(name=name)) for name, entry in ACTIVATIONS.items() if entry.kernels]
    return [*acts, PopLayerNorm(2, 4, 1e-5), PopBatchNorm(2, 4, 1e-5, 0.1), PopConv(2, 4, 3)]


def test_components_declare_their_written_backward_when_torch_has_its_kernels():
    assert all(c.written_backward for c in components())
    assert population().written_backward


def test_without_their_kernels_components_and_networks_take_autograd(torch_without_private_entry_points):
    assert not any(c.written_backward for c in components())
    net = population(activation="tanh")
    assert not net.written_backward
    x = torch.randn(3, 16, 4, generator=torch.Generator().manual_seed(2))
    net(x).square().sum().backward()  # autograd
    assert all(p.grad is not None and bool(p.grad.ne(0).any()) for p in net.parameters())


def test_rms_norm_without_f_rms_norm_computes_the_same_bits(monkeypatch):
    """torch before 2.4 has no F.rms_norm: the same formula in public ops (F.rms_norm's own composite ops)."""
    if not hasattr(F, "rms_norm"):
        pytest.skip(f"torch {torch.__version__} has no F.rms_norm to compare with (test_registries: its definition)")
    norm = PopRMSNorm(3, 8, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(3, 8, generator=torch.Generator().manual_seed(3)) + 0.5)
    x = (torch.randn(3, 16, 8, generator=torch.Generator().manual_seed(4)) * 3).requires_grad_()
    runs = []
    for available in (True, False):
        monkeypatch.setattr(capabilities, "has_functional", lambda name, _a=available: _a)
        x.grad = None
        y = norm(x)
        y.backward(torch.ones_like(y))
        runs.append((y.detach(), x.grad.clone()))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_target_updates_without_foreach_kernels_go_tensor_by_tensor(torch_without_private_entry_points):
    online, target = population(seed=0), population(seed=10)
    expected = [t.detach().lerp(o.detach(), 0.3) for t, o in zip(target.parameters(), online.parameters())]
    soft_update_(target, online, 0.3)
    assert all(torch.equal(t, e) for t, e in zip(target.parameters(), expected))
    hard_update_(target, online)
    assert all(torch.equal(t, o) for t, o in zip(target.state_dict().values(), online.state_dict().values()))
