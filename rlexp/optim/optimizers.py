"""Optimizers (the ``optimizer`` config group).

All are elementwise, so one optimizer over stacked [P, ...] tensors equals P optimizers, one per
member (bitwise given rows of whole 64-byte blocks, as GradientPipeline pads them: a CPU kernel's
scalar remainder loop rounds differently from its vector body). ``rmsprop_tf`` reproduces
tf.train.RMSPropOptimizer (TensorFlow 1.x) exactly; the others run torch.optim's own ops bit for bit.
None is a torch.optim.Optimizer, whose first construction in a process imports torch._dynamo (about
1.2 s of start-up): each is a ``OneGroup``.

With the run's fast paths off (``make_optimizer(..., fast_paths=False)``) adam, adamw, rmsprop and sgd are
torch.optim's own classes (``TorchOptimizer``: single-tensor, neither fused nor foreach), one parameter
tensor each; rmsprop_tf, which torch.optim has no twin of, is ``RMSpropTF`` (public ops only) on them.
An option whose private kernels the installed torch lacks on the parameters' device (``fast_kernels_run``)
takes that plain form with the fast paths on too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig

from rlexp.config.schema import (
    AdamConfig,
    AdamWConfig,
    OptimizerConfig,
    RMSpropConfig,
    RMSpropTFConfig,
    SGDConfig,
    require,
    require_choice,
)
from rlexp.nn import capabilities


class OneGroup:
    """What the pipeline and schedules use of an optimizer: ``params``, ``param_groups`` (one group:
    the params and the hyperparameters; its "lr" may change between steps) and ``step()``."""

    slots: tuple[str, ...] = ()  # its lists of state tensors, one per parameter (``state_dict``)

    def __init__(self, params: Iterable[torch.Tensor], **hyper: object) -> None:
        self.params = list(params)
        self.param_groups = [{"params": self.params, **hyper}]
        self.base_lr = hyper.get("lr")  # the configured learning rate (a schedule scales it)

    def step(self) -> None:
        raise NotImplementedError

    def state(self) -> list[tuple[torch.Tensor, float]]:
        """Every state tensor, shaped as its parameter, with the value a fresh optimizer starts it at
        (an intervention resets chosen elements of one member to it): kind by kind, each kind one
        tensor per parameter in ``params``' order."""
        return []

    def state_dict(self) -> dict[str, Any]:
        """The group's hyperparameters and each slot's tensors: shaped as their parameter, or 0-dim
        (Adam's step counts)."""
        hyper = [{k: v for k, v in group.items() if k != "params"} for group in self.param_groups]
        return {"param_groups": hyper} | {name: list(getattr(self, name)) for name in self.slots}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``'s values (the state tensors copied in place)."""
        for group, saved in zip(self.param_groups, state["param_groups"]):
            group.update(saved)
        for name in self.slots:
            for mine, saved in zip(getattr(self, name), state[name]):
                mine.copy_(saved)

    def param_state(self, i: int) -> list[tuple[torch.Tensor, float]]:
        """The state tensors of ``params[i]`` (shaped as it) with their fresh values."""
        return self.state()[i :: len(self.params)]


class RMSpropTF(OneGroup):
    """tf.train.RMSPropOptimizer(learning_rate, decay, momentum, epsilon), non-centered.

    Per element: ms starts at 1.0 (TensorFlow initializes the rms slot with ones), then
    ``ms += (g^2 - ms) * (1 - decay)``; ``mom = momentum * mom + lr * g / sqrt(ms + epsilon)``;
    ``p -= mom``. Epsilon sits inside the square root, unlike torch.optim.RMSprop.
    ``weight_decay`` adds ``weight_decay * p`` to g first (an L2 penalty's gradient).
    """

    slots = ("ms", "mom")

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        decay: float = 0.9,
        momentum: float = 0.0,
        epsilon: float = 1e-10,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr=lr, decay=decay, momentum=momentum, epsilon=epsilon, weight_decay=weight_decay)
        self.ms = [torch.ones_like(p) for p in self.params]
        self.mom = [torch.zeros_like(p) for p in self.params]

    def state(self) -> list[tuple[torch.Tensor, float]]:
        return [(t, 1.0) for t in self.ms] + [(t, 0.0) for t in self.mom]

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        for p, ms, mom in zip(self.params, self.ms, self.mom):
            grad = p.grad
            if group["weight_decay"] != 0.0:
                grad = grad.add(p, alpha=group["weight_decay"])
            ms.add_((grad * grad - ms) * (1.0 - group["decay"]))
            mom.mul_(group["momentum"]).addcdiv_(grad, (ms + group["epsilon"]).sqrt(), value=group["lr"])
            p.sub_(mom)


class FusedAdam(OneGroup):
    """torch.optim.Adam / AdamW with ``fused=True``: the same kernel (torch._fused_adam_ /
    torch._fused_adamw_) and state."""

    slots = ("exp_avg", "exp_avg_sq", "steps")

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float,
        betas: tuple,
        eps: float,
        weight_decay: float,
        decoupled: bool = False,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.steps = [torch.zeros((), dtype=torch.float32, device=p.device) for p in self.params]
        self.kernel = torch._fused_adamw_ if decoupled else torch._fused_adam_

    def state(self) -> list[tuple[torch.Tensor, float]]:
        """The moments only: the step count (bias correction) is one per tensor, shared by every
        member and element, and stays (as in ReDo's reference implementation)."""
        return [(t, 0.0) for t in self.exp_avg + self.exp_avg_sq]

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        torch._foreach_add_(self.steps, 1)
        self.kernel(
            self.params,
            [p.grad for p in self.params],
            self.exp_avg,
            self.exp_avg_sq,
            [],
            self.steps,
            amsgrad=False,
            lr=group["lr"],
            beta1=group["betas"][0],
            beta2=group["betas"][1],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
            grad_scale=None,
            found_inf=None,
        )


def _sqrt(values: list[torch.Tensor], eps: float) -> list[torch.Tensor]:
    """``torch._foreach_sqrt(values)`` for a denominator ``sqrt(v) + eps``, in a new list. On x86 CPUs the
    square root of zero or of a subnormal number (a unit's running average that decays once its
    gradient is 0) takes 10-50 times that of a normal one. Every v below the smallest normal number
    gives sqrt(v) + eps == eps when eps exceeds 4 sqrt(tiny) / (machine epsilon) (3.6e-12 in float32),
    so on a CPU those are raised to it first: the same bits, at the cost of a normal square root.
    Values with a negative v (centered, rounded below 0) or a NaN take torch's own square root."""
    info = torch.finfo(values[0].dtype)
    if (
        values[0].device.type != "cpu"
        or not eps * info.eps / 4 > math.sqrt(info.tiny)
        or not all(float(v.amin()) >= 0 for v in values)  # a negative or a NaN anywhere: torch's own
    ):
        return torch._foreach_sqrt(values)
    lifted = torch._foreach_clamp_min(values, info.tiny)
    torch._foreach_sqrt_(lifted)
    return lifted


class ForeachRMSprop(OneGroup):
    """torch.optim.RMSprop with ``foreach=True``: its ops in its order, bit for bit, without its
    per-step bookkeeping or its first construction's import. v starts at 0;
    v = alpha v + (1 - alpha) g^2; centered subtracts the running mean's square; p -= lr g / (sqrt(v) + eps),
    through a momentum buffer when momentum > 0."""

    slots = ("square_avg", "grad_avg", "momentum_buffer")

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float,
        alpha: float,
        eps: float,
        momentum: float,
        centered: bool,
        weight_decay: float,
    ) -> None:
        super().__init__(
            params, lr=lr, alpha=alpha, eps=eps, momentum=momentum, centered=centered, weight_decay=weight_decay
        )
        self.square_avg = [torch.zeros_like(p) for p in self.params]
        self.grad_avg = [torch.zeros_like(p) for p in self.params] if centered else []
        self.momentum_buffer = [torch.zeros_like(p) for p in self.params] if momentum > 0 else []

    def state(self) -> list[tuple[torch.Tensor, float]]:
        return [(t, 0.0) for t in self.square_avg + self.grad_avg + self.momentum_buffer]

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        lr, alpha = group["lr"], group["alpha"]
        grads = [p.grad for p in self.params]
        if group["weight_decay"] != 0:
            grads = torch._foreach_add(grads, self.params, alpha=group["weight_decay"])
        torch._foreach_mul_(self.square_avg, alpha)
        torch._foreach_addcmul_(self.square_avg, grads, grads, value=1 - alpha)
        if group["centered"]:
            torch._foreach_lerp_(self.grad_avg, grads, 1 - alpha)
            avg = torch._foreach_addcmul(self.square_avg, self.grad_avg, self.grad_avg, value=-1)
        else:
            avg = self.square_avg
        avg = _sqrt(avg, group["eps"])
        torch._foreach_add_(avg, group["eps"])
        if group["momentum"] > 0:
            torch._foreach_mul_(self.momentum_buffer, group["momentum"])
            torch._foreach_addcdiv_(self.momentum_buffer, grads, avg)
            torch._foreach_add_(self.params, self.momentum_buffer, alpha=-lr)
        else:
            torch._foreach_addcdiv_(self.params, grads, avg, value=-lr)


class FusedSGD(OneGroup):
    """torch.optim.SGD with ``fused=True``: the same kernel (torch._fused_sgd_) and momentum buffers,
    which the first step fills from the gradient."""

    slots = ("momentum_buffer",)

    def __init__(
        self, params: Iterable[torch.Tensor], lr: float, momentum: float, nesterov: bool, weight_decay: float
    ) -> None:
        super().__init__(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
        self.momentum_buffer = [torch.empty_like(p) for p in self.params] if momentum != 0 else []
        self.first_step = True

    def state(self) -> list[tuple[torch.Tensor, float]]:
        """Zero momentum behaves as a fresh buffer (the first step fills it with the gradient: dampening 0)."""
        return [(t, 0.0) for t in self.momentum_buffer]

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"first_step": self.first_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.first_step = state["first_step"]

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        torch._fused_sgd_(
            self.params,
            [p.grad for p in self.params],
            self.momentum_buffer,
            weight_decay=group["weight_decay"],
            momentum=group["momentum"],
            lr=group["lr"],
            dampening=0.0,
            nesterov=group["nesterov"],
            maximize=False,
            is_first_step=self.first_step and group["momentum"] != 0,
            grad_scale=None,
            found_inf=None,
        )
        self.first_step = False


class TorchOptimizer(OneGroup):
    """A torch.optim optimizer (its single-tensor form) behind ``OneGroup``: the fast paths' plain twin.

    Its state is made at once, with the values torch.optim's first step would start it at (a zero
    momentum buffer gives SGD's first step the gradient, as torch's own first step does), and each
    state kind is listed as an attribute (one tensor per parameter, the ones torch.optim steps in
    place), so checkpoints, interventions and population-based training see it as the others.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, kinds: tuple[str, ...], base_lr: float, counted: bool = True
    ) -> None:
        """``kinds``: the names of torch.optim's per-parameter state tensors; ``counted``: it keeps a step count."""
        self.torch = optimizer
        self.params = list(optimizer.param_groups[0]["params"])
        self.param_groups = optimizer.param_groups  # one group: its "lr" is what torch.optim reads
        self.base_lr = base_lr
        self.kinds = kinds
        self.slots = kinds + (("steps",) if counted else ())  # what state_dict saves
        for p in self.params:
            optimizer.state[p] = {k: torch.zeros_like(p) for k in kinds}
            if counted:
                optimizer.state[p]["step"] = torch.zeros((), dtype=torch.float32)
        for kind in kinds:
            setattr(self, kind, [optimizer.state[p][kind] for p in self.params])
        # the step counts (bias correction), one per tensor, equal in every member
        self.steps = [optimizer.state[p]["step"] for p in self.params] if counted else []

    def state(self) -> list[tuple[torch.Tensor, float]]:
        """The moments (all start at 0); the step counts stay, as the fused optimizers'."""
        return [(t, 0.0) for kind in self.kinds for t in getattr(self, kind)]

    def step(self) -> None:
        self.torch.step()


def _plain(params: list[torch.Tensor], c: OptimizerConfig) -> OneGroup:
    """The optimizer of ``c`` through torch.optim's own classes (rmsprop_tf: ``RMSpropTF``), no fast path."""
    plain = dict(foreach=False, weight_decay=c.weight_decay)
    if c.name in ("adam", "adamw"):
        kind = torch.optim.Adam if c.name == "adam" else torch.optim.AdamW
        optimizer = kind(params, lr=c.lr, betas=(c.beta1, c.beta2), eps=c.eps, fused=False, **plain)
        return TorchOptimizer(optimizer, ("exp_avg", "exp_avg_sq"), c.lr)
    if c.name == "rmsprop":
        optimizer = torch.optim.RMSprop(
            params, lr=c.lr, alpha=c.alpha, eps=c.eps, momentum=c.momentum, centered=c.centered, **plain
        )
        kinds = (
            ("square_avg",) + (("grad_avg",) if c.centered else ()) + (("momentum_buffer",) if c.momentum > 0 else ())
        )
        return TorchOptimizer(optimizer, kinds, c.lr)
    if c.name == "sgd":
        # not fused by default (torch before 2.3 has no ``fused`` argument for SGD)
        optimizer = torch.optim.SGD(params, lr=c.lr, momentum=c.momentum, nesterov=c.nesterov, **plain)
        return TorchOptimizer(optimizer, ("momentum_buffer",) if c.momentum != 0 else (), c.lr, counted=False)
    return _rmsprop_tf(params, c)


def _adam(params, c: OptimizerConfig) -> FusedAdam:
    return FusedAdam(params, c.lr, (c.beta1, c.beta2), c.eps, c.weight_decay)


def _adamw(params, c: OptimizerConfig) -> FusedAdam:
    return FusedAdam(params, c.lr, (c.beta1, c.beta2), c.eps, c.weight_decay, decoupled=True)


def _rmsprop(params, c: OptimizerConfig) -> ForeachRMSprop:
    return ForeachRMSprop(params, c.lr, c.alpha, c.eps, c.momentum, c.centered, c.weight_decay)


def _rmsprop_tf(params, c: OptimizerConfig) -> RMSpropTF:
    return RMSpropTF(
        params, lr=c.lr, decay=c.decay, momentum=c.momentum, epsilon=c.epsilon, weight_decay=c.weight_decay
    )


def _sgd(params, c: OptimizerConfig) -> FusedSGD:
    return FusedSGD(params, c.lr, c.momentum, c.nesterov, c.weight_decay)


@dataclass(frozen=True)
class Optimizer:
    """An optimizer option: its constructor, the schema of its config and the private torch functions its
    step calls (``kernels``: ``torch.<name>``)."""

    make: Callable[[list[torch.Tensor], OptimizerConfig], OneGroup]
    schema: type[OptimizerConfig]
    kernels: tuple[str, ...] = ()

    def __call__(self, params: list[torch.Tensor], cfg: OptimizerConfig) -> OneGroup:
        return self.make(params, cfg)


FOREACH = ("_foreach_add", "_foreach_add_", "_foreach_mul_", "_foreach_addcmul", "_foreach_addcmul_", "_foreach_lerp_")
OPTIMIZERS: dict[str, Optimizer] = {
    "adam": Optimizer(_adam, AdamConfig, ("_fused_adam_", "_foreach_add_")),
    "adamw": Optimizer(_adamw, AdamWConfig, ("_fused_adamw_", "_foreach_add_")),
    "rmsprop": Optimizer(
        _rmsprop,
        RMSpropConfig,
        (*FOREACH, "_foreach_addcdiv_", "_foreach_sqrt", "_foreach_sqrt_", "_foreach_clamp_min"),
    ),
    "rmsprop_tf": Optimizer(_rmsprop_tf, RMSpropTFConfig),
    "sgd": Optimizer(_sgd, SGDConfig, ("_fused_sgd_",)),
}


@functools.cache
def fast_kernels_run(name: str, device_type: str) -> bool:
    """Optimizer ``name``'s fast form runs with the installed torch on ``device_type``: torch has its
    ``kernels`` and they step a one-element tensor there (torch 2.2 has ``_fused_adam_`` without a CPU
    kernel, and no ``_fused_sgd_``). Tried once per process, on first use."""
    entry = OPTIMIZERS[name]
    if not entry.kernels:
        return True
    if not capabilities.has_torch(*entry.kernels):
        return False
    param = torch.zeros(1, device=device_type)
    param.grad = torch.ones_like(param)
    try:
        entry.make([param], entry.schema()).step()
    except (RuntimeError, TypeError):  # no kernel for the device (NotImplementedError), another signature
        return False
    return True


def check_optimizer(cfg: DictConfig, key: str) -> None:
    """Refuse an unknown optimizer and numbers out of range (``key``: the node's dotted path)."""
    require_choice(cfg.name, f"{key}.name", OPTIMIZERS)
    require(cfg.lr > 0, f"{key}.lr", cfg.lr, "a value > 0")
    for k in ("weight_decay", "eps", "epsilon"):
        require(cfg[k] >= 0, f"{key}.{k}", cfg[k], "a value >= 0")
    for k in ("beta1", "beta2", "alpha", "decay", "momentum"):
        require(0 <= cfg[k] < 1, f"{key}.{k}", cfg[k], "a value in [0, 1)")
    if cfg.nesterov:
        require(cfg.momentum > 0, f"{key}.momentum", cfg.momentum, "a value > 0 (nesterov needs momentum)")


def make_optimizer(params: Iterable[torch.Tensor], cfg: OptimizerConfig, fast_paths: bool = True) -> OneGroup:
    """The optimizer a config names, over the given (population-stacked) parameters; with ``fast_paths``
    False, or without its kernels in the installed torch, torch.optim's own class (``TorchOptimizer``;
    rmsprop_tf: ``RMSpropTF``)."""
    params = list(params)
    if fast_paths and fast_kernels_run(cfg.name, params[0].device.type):
        return OPTIMIZERS[cfg.name](params, cfg)
    return _plain(params, cfg)
