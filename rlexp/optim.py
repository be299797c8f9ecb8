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


def _adam(params, c: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=c.lr, betas=(c.beta1, c.beta2), eps=c.eps, weight_decay=c.weight_decay,
                            fused=True)


def _adamw(params, c: OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=c.lr, betas=(c.beta1, c.beta2), eps=c.eps, weight_decay=c.weight_decay,
                             fused=True)


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
