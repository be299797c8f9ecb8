"""Optimizers (the ``optimizer`` config group).

All are elementwise, so one optimizer over stacked [P, ...] tensors equals P optimizers, one per
member. ``rmsprop_tf`` reproduces tf.train.RMSPropOptimizer (TensorFlow 1.x) exactly.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable

import torch

from rlexp.config import OptimizerConfig


class RMSpropTF(torch.optim.Optimizer):
    """tf.train.RMSPropOptimizer(learning_rate, decay, momentum, epsilon), non-centered.

    Per element: ms starts at 1.0 (TensorFlow initializes the rms slot with ones), then
    ``ms += (g^2 - ms) * (1 - decay)``; ``mom = momentum * mom + lr * g / sqrt(ms + epsilon)``;
    ``p -= mom``. Epsilon sits inside the square root, unlike torch.optim.RMSprop.
    ``weight_decay`` adds ``weight_decay * p`` to g first (an L2 penalty's gradient).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        decay: float = 0.9,
        momentum: float = 0.0,
        epsilon: float = 1e-10,
        weight_decay: float = 0.0,
    ) -> None:
        defaults = dict(lr=lr, decay=decay, momentum=momentum, epsilon=epsilon, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if group["weight_decay"] != 0.0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                state = self.state[p]
                if not state:
                    state["ms"] = torch.ones_like(p)
                    state["mom"] = torch.zeros_like(p)
                ms, mom = state["ms"], state["mom"]
                ms.add_((grad * grad - ms) * (1.0 - group["decay"]))
                mom.mul_(group["momentum"]).addcdiv_(grad, (ms + group["epsilon"]).sqrt(), value=group["lr"])
                p.sub_(mom)
        return None


class FusedAdam:
    """torch.optim.Adam / AdamW with ``fused=True``: the same kernel (torch._fused_adam_ /
    torch._fused_adamw_) and state, without torch.optim.Optimizer, whose first construction in a
    process imports torch._dynamo (about 1.2 s of start-up). Exposes ``param_groups`` (one group;
    its "lr" may be changed between steps, as schedules do) and ``step()``."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas: tuple, eps: float, weight_decay: float,
                 decoupled: bool = False) -> None:
        self.params = list(params)
        self.param_groups = [{"params": self.params, "lr": lr, "betas": betas, "eps": eps,
                              "weight_decay": weight_decay}]
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.steps = [torch.zeros((), dtype=torch.float32, device=p.device) for p in self.params]
        self.kernel = torch._fused_adamw_ if decoupled else torch._fused_adam_

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        torch._foreach_add_(self.steps, 1)
        self.kernel(self.params, [p.grad for p in self.params], self.exp_avg, self.exp_avg_sq, [], self.steps,
                    amsgrad=False, lr=group["lr"], beta1=group["betas"][0], beta2=group["betas"][1],
                    weight_decay=group["weight_decay"], eps=group["eps"], maximize=False, grad_scale=None,
                    found_inf=None)


def _adam(params, c: OptimizerConfig) -> FusedAdam:
    return FusedAdam(params, c.lr, (c.beta1, c.beta2), c.eps, c.weight_decay)


def _adamw(params, c: OptimizerConfig) -> FusedAdam:
    return FusedAdam(params, c.lr, (c.beta1, c.beta2), c.eps, c.weight_decay, decoupled=True)


def _rmsprop(params, c: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.RMSprop(
        params, lr=c.lr, alpha=c.alpha, eps=c.eps, momentum=c.momentum, centered=c.centered,
        weight_decay=c.weight_decay, foreach=True,
    )


def _rmsprop_tf(params, c: OptimizerConfig) -> torch.optim.Optimizer:
    return RMSpropTF(params, lr=c.lr, decay=c.decay, momentum=c.momentum, epsilon=c.epsilon, weight_decay=c.weight_decay)


def _sgd(params, c: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=c.lr, momentum=c.momentum, nesterov=c.nesterov, weight_decay=c.weight_decay,
                           fused=True)


OPTIMIZERS: Dict[str, Callable[[Iterable[torch.Tensor], OptimizerConfig], torch.optim.Optimizer]] = {
    "adam": _adam,
    "adamw": _adamw,
    "rmsprop": _rmsprop,
    "rmsprop_tf": _rmsprop_tf,
    "sgd": _sgd,
}


def make_optimizer(params: Iterable[torch.Tensor], cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """The optimizer a config names, over the given (population-stacked) parameters."""
    return OPTIMIZERS[cfg.name](list(params), cfg)
