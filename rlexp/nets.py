"""Population networks: every parameter carries a leading member dimension P.

A population linear layer holds weight [P, out, in] and bias [P, out] and runs one batched matmul
over inputs [P, B, in]. Norms normalize per member and per sample (layer) or over each member's own
batch (batch). Nothing here reduces across members, so member k's outputs and gradients depend on
member k's parameters and inputs alone.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlexp.config import ActivationConfig, InitConfig, NetworkConfig, NormalizationConfig
from rlexp.init import init_linear, scheme_gain


ACTIVATIONS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu,
    "leaky_relu": F.leaky_relu,
    "elu": F.elu,
    "gelu": F.gelu,
    "silu": F.silu,
    "tanh": torch.tanh,
    "softsign": F.softsign,
    "sigmoid": torch.sigmoid,
}


def _softsign_backward(g: torch.Tensor, h: torch.Tensor, y: torch.Tensor, cfg: ActivationConfig) -> torch.Tensor:
    """softsign's derivative as autograd composes it for y = h / (|h| + 1) (ATen has no kernel for it):
    division's two gradients, the second through abs's sgn, summed; bit for bit autograd's (tested)."""
    d = h.abs() + 1
    return g / d + (-g * (y / d)) * h.sgn()


# activation name -> its derivative as autograd computes it (the same ATen backward kernels; softsign's
# composition): (grad wrt the output, pre-activation h, output y, config) -> grad wrt h
ACTIVATION_BACKWARD: Dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor, ActivationConfig], torch.Tensor]] = {
    "relu": lambda g, h, y, cfg: torch.ops.aten.threshold_backward(g, y, 0),
    "leaky_relu": lambda g, h, y, cfg: torch.ops.aten.leaky_relu_backward(g, h, cfg.negative_slope, False),
    "elu": lambda g, h, y, cfg: torch.ops.aten.elu_backward(g, cfg.alpha, 1, 1, False, h),
    "gelu": lambda g, h, y, cfg: torch.ops.aten.gelu_backward(g, h),
    "silu": lambda g, h, y, cfg: torch.ops.aten.silu_backward(g, h),
    "tanh": lambda g, h, y, cfg: torch.ops.aten.tanh_backward(g, y),
    "sigmoid": lambda g, h, y, cfg: torch.ops.aten.sigmoid_backward(g, y),
    "softsign": _softsign_backward,
}


# activation name -> the same function in numpy, in place on a float32 array (host_inference)
NUMPY_ACTIVATIONS: Dict[str, Callable[[np.ndarray, ActivationConfig], np.ndarray]] = {
    "relu": lambda h, cfg: np.maximum(h, 0, out=h),
    "leaky_relu": lambda h, cfg: np.where(h > 0, h, h * np.float32(cfg.negative_slope)),
    "elu": lambda h, cfg: np.where(h > 0, h, np.float32(cfg.alpha) * np.expm1(np.minimum(h, 0))),
    "tanh": lambda h, cfg: np.tanh(h, out=h),
    "softsign": lambda h, cfg: np.divide(h, np.abs(h) + 1, out=h),
}


def make_activation(cfg: ActivationConfig) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation function a config names, with its parameters (leaky_relu slope, elu alpha)."""
    if cfg.name == "leaky_relu":
        slope = cfg.negative_slope
        return lambda x: F.leaky_relu(x, slope)
    if cfg.name == "elu":
        alpha = cfg.alpha
        return lambda x: F.elu(x, alpha)
    return ACTIVATIONS[cfg.name]


def _ensure_grads(*params: torch.Tensor) -> None:
    """Give parameters without a ``.grad`` an (uninitialized) one, for gradients written in place."""
    for p in params:
        if p.grad is None:
            p.grad = torch.empty_like(p)


class PopLinear(nn.Module):
    """y = x W^T + b for each member: x [P, B, in] -> [P, B, out]."""

    def __init__(self, members: int, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(members, n_out, n_in))
        self.bias = nn.Parameter(torch.zeros(members, n_out))

    def effective_weight(self) -> torch.Tensor:
        return self.weight  # [P, out, in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias.unsqueeze(1), x, self.effective_weight().mT)

    def forward_saved(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """``forward`` without autograd, and what ``backward_to_grads`` needs (the input, the weight used)."""
        return torch.baddbmm(self.bias.unsqueeze(1), x, self.weight.mT), (x, self.weight)

    def backward_to_grads(self, saved: tuple, grad: torch.Tensor, input_grad: bool = True) -> Optional[torch.Tensor]:
        """As autograd runs baddbmm's backward: writes the parameters' gradients for the gradient ``grad``
        [P, B, out] wrt the output and returns the one wrt the input [P, B, in] (or None)."""
        x, weight = saved[:2]
        _ensure_grads(self.weight, self.bias)
        torch.sum(grad, 1, out=self.bias.grad)
        self._weight_grads(saved, torch.bmm(x.mT, grad).mT)  # [P, in, out] seen as [P, out, in], as autograd has it
        return torch.bmm(grad, weight) if input_grad else None

    def _weight_grads(self, saved: tuple, grad_weight: torch.Tensor) -> None:
        """Write the gradients that come from the one wrt the weight used, [P, out, in]."""
        self.weight.grad.copy_(grad_weight)


class PopWeightNormLinear(PopLinear):
    """Weight-normalized linear layer (the seed critic's denseWN), per member and output unit.

    w = g * v / sqrt(||v||^2 + eps), with ||v|| over each output unit's input weights; g starts at
    g_init. ``weight`` holds v. eps = 0 reproduces the unguarded division g / ||v||.
    """

    def __init__(self, members: int, n_in: int, n_out: int, eps: float, g_init: float) -> None:
        super().__init__(members, n_in, n_out)
        self.g = nn.Parameter(torch.full((members, n_out), float(g_init)))
        self.eps = eps

    def unit_norms(self) -> torch.Tensor:
        """sqrt(||v_i||^2 + eps) per member and output unit: [P, out]."""
        return torch.sqrt(self.weight.square().sum(-1) + self.eps)

    def _scaled(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The effective weight [P, out, in], the norms ||v|| and g / ||v|| [P, out]."""
        norms = self.unit_norms()
        scale = self.g / norms
        return self.weight * scale.unsqueeze(-1), norms, scale

    def effective_weight(self) -> torch.Tensor:
        return self._scaled()[0]

    def forward_saved(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """``forward`` without autograd, and what ``backward_to_grads`` needs (the norms and scales too)."""
        weight, norms, scale = self._scaled()
        return torch.baddbmm(self.bias.unsqueeze(1), x, weight.mT), (x, weight, norms, scale)

    def _weight_grads(self, saved: tuple, grad_weight: torch.Tensor) -> None:
        """The gradients of v and g as autograd composes them through w = v * (g / sqrt(sum(v^2) + eps)):
        each line is the backward of one op of ``_scaled``, in autograd's formula (mul, div for both
        operands, sqrt, sum, square), the two gradients of v summed."""
        _, _, norms, scale = saved
        v = self.weight
        _ensure_grads(self.g)
        grad_scale = (grad_weight * v).sum(-1)  # [P, out] wrt scale = g / norms
        torch.div(grad_scale, norms, out=self.g.grad)
        grad_norms = -grad_scale * (scale / norms)  # autograd's (g / norms) / norms
        grad_squares = (grad_norms / (2 * norms)).unsqueeze(-1).expand_as(v)  # [P, out, in] wrt v^2
        torch.add(grad_weight * scale.unsqueeze(-1), grad_squares * (2.0 * v), out=v.grad)


class PopLayerNorm(nn.Module):
    """LayerNorm over features, per member and sample, with a per-member affine: [P, B, H]."""

    def __init__(self, members: int, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(members, width))
        self.bias = nn.Parameter(torch.zeros(members, width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x, x.shape[-1:], eps=self.eps)
        return x * self.weight.unsqueeze(1) + self.bias.unsqueeze(1)

    def forward_saved(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """``forward`` without autograd (the kernel F.layer_norm runs), and what ``backward_to_grads`` needs."""
        x_hat, mean, rstd = torch.native_layer_norm(x, x.shape[-1:], None, None, self.eps)
        return x_hat * self.weight.unsqueeze(1) + self.bias.unsqueeze(1), (x, x_hat, mean, rstd)

    def backward_to_grads(self, saved: tuple, grad: torch.Tensor) -> torch.Tensor:
        """As autograd runs it: writes the weight's and bias's gradients (the affine's, summed over the
        batch) and returns the gradient wrt the input [P, B, H] (ATen's layer-norm backward kernel)."""
        x, x_hat, mean, rstd = saved
        _ensure_grads(self.weight, self.bias)
        torch.sum(grad * x_hat, 1, out=self.weight.grad)
        torch.sum(grad, 1, out=self.bias.grad)
        return torch.ops.aten.native_layer_norm_backward(grad * self.weight.unsqueeze(1), x, x.shape[-1:], mean, rstd,
                                                         None, None, [True, False, False])[0]


class PopBatchNorm(nn.Module):
    """BatchNorm over each member's own batch: mean/var over B of [P, B, H], per member and feature.

    Training mode normalizes with the batch statistics and updates the running ones (momentum,
    unbiased variance), eval mode normalizes with the running statistics: torch.nn.BatchNorm1d for
    each member. It runs as one F.batch_norm over the [B, P * H] view, whose P * H channels are
    exactly the members' features, so nothing is shared between members.
    """

    def __init__(self, members: int, width: int, eps: float, momentum: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(members, width))
        self.bias = nn.Parameter(torch.zeros(members, width))
        self.register_buffer("running_mean", torch.zeros(members, width))
        self.register_buffer("running_var", torch.ones(members, width))
        self.eps = eps
        self.momentum = momentum

    @staticmethod
    def _channels(x: torch.Tensor) -> torch.Tensor:
        """[P, B, H] -> the [B, P * H] view the batch-norm kernels run on (a copy)."""
        return x.transpose(0, 1).reshape(x.shape[1], -1)

    def _members(self, y: torch.Tensor) -> torch.Tensor:
        """[B, P * H] -> [P, B, H] (a view)."""
        return y.view(y.shape[0], *self.weight.shape).transpose(0, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the running statistics are updated in place through their flat views; weight and bias may
        # be strided views into a pipeline's buffer, so they are reshaped (copied when they must be)
        y = F.batch_norm(self._channels(x), self.running_mean.view(-1), self.running_var.view(-1),
                         self.weight.reshape(-1), self.bias.reshape(-1), self.training, self.momentum, self.eps)
        return self._members(y)  # [P, B, H]

    def forward_saved(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """``forward`` without autograd (the kernel F.batch_norm runs, updating the running statistics
        in training mode), and what ``backward_to_grads`` needs."""
        channels, weight = self._channels(x), self.weight.reshape(-1)
        y, mean, invstd = torch.native_batch_norm(channels, weight, self.bias.reshape(-1), self.running_mean.view(-1),
                                                  self.running_var.view(-1), self.training, self.momentum, self.eps)
        return self._members(y), (channels, weight, mean, invstd, self.training)

    def backward_to_grads(self, saved: tuple, grad: torch.Tensor) -> torch.Tensor:
        """As autograd runs it (ATen's batch-norm backward kernel on the [B, P * H] view): writes the
        weight's and bias's gradients and returns the gradient wrt the input [P, B, H]."""
        channels, weight, mean, invstd, training = saved
        grad_in, grad_weight, grad_bias = torch.ops.aten.native_batch_norm_backward(
            self._channels(grad), channels, weight, self.running_mean.view(-1), self.running_var.view(-1), mean,
            invstd, training, self.eps, [True, True, True])
        _ensure_grads(self.weight, self.bias)
        self.weight.grad.copy_(grad_weight.view(self.weight.shape))
        self.bias.grad.copy_(grad_bias.view(self.bias.shape))
        return self._members(grad_in)


# normalization name -> the norm module after each hidden linear layer (weight norm changes the
# linear layer itself instead, see PopMLP)
NORMALIZATIONS: Dict[str, Callable[[NormalizationConfig, int, int], nn.Module]] = {
    "none": lambda cfg, members, width: nn.Identity(),
    "layer": lambda cfg, members, width: PopLayerNorm(members, width, cfg.eps),
    "batch": lambda cfg, members, width: PopBatchNorm(members, width, cfg.eps, cfg.momentum),
    "weight": lambda cfg, members, width: nn.Identity(),
}


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return grad * ctx.scale, None


def scale_gradient(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Identity in the forward pass; multiplies the gradient by ``scale`` in the backward pass.

    MuZero's scale_gradient: a model-internal op, unlike gradient clipping, which rescales the
    gradients after backward.
    """
    return _ScaleGradient.apply(x, scale)


class PopMLP(nn.Module):
    """Population MLP: [P, B, n_in] -> [P, B, n_out].

    Hidden layer: linear (weight-normalized if normalization=weight) -> layer/batch norm -> activation
    (none on the last hidden layer with ``network.linear_last_hidden``), plus x + (...) when
    ``network.residual`` and the widths match. Output: linear, times output_scale. A critic's action
    (``extra``) is concatenated to the input of layer ``extra_at`` (0 = with the observation).
    """

    def __init__(
        self,
        members: int,
        n_in: int,
        n_out: int,
        network: NetworkConfig,
        activation: ActivationConfig,
        normalization: NormalizationConfig,
        init: InitConfig,
        generators: List[torch.Generator],
        extra_in: int = 0,
        extra_at: int = 0,
    ) -> None:
        super().__init__()
        sizes = [n_in, *network.hidden, n_out]
        weight_norm = normalization.name == "weight"
        self.layers = nn.ModuleList()
        self.norms = nn.ModuleList()
        self.residual: List[bool] = []
        self.extra_in, self.extra_at = extra_in, extra_at  # a second input joins layer extra_at's input
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            last = i == len(sizes) - 2
            a = a + extra_in if i == extra_at else a
            if weight_norm and (not last or normalization.output_layer):
                layer: PopLinear = PopWeightNormLinear(members, a, b, normalization.eps, normalization.g_init)
            else:
                layer = PopLinear(members, a, b)
            self.layers.append(layer)
            if not last:
                self.norms.append(NORMALIZATIONS[normalization.name](normalization, members, b))
                self.residual.append(network.residual and a == b)
        hidden = len(network.hidden)
        self.activated = [not (network.linear_last_hidden and i == hidden - 1) for i in range(hidden)]
        self.has_norm = normalization.name in ("layer", "batch")
        # plain lists for the forward pass (slicing a ModuleList on every call is slow)
        self._hidden = list(zip(self.layers[:-1], self.norms, self.residual, self.activated))
        self._output = self.layers[-1]
        self.act = make_activation(activation)
        self.activation = activation
        self.uses_batch_stats = normalization.name == "batch"  # acting must then run in eval mode
        self.output_scale = network.output_scale
        # plain linear layers, no norm, residual or second input: inference() may run on raw ops
        self._plain = not (weight_norm or self.has_norm or any(self.residual) or extra_in)
        # no residual or second input, and an activation with a known derivative (any normalization):
        # the gradients can be written without autograd (forward_saved, backward_to_grads)
        self.analytic_backward = not any(self.residual) and not extra_in and activation.name in ACTIVATION_BACKWARD
        gain = scheme_gain(init, activation.name, getattr(activation, "negative_slope", 0.01))
        for i, layer in enumerate(self.layers):
            init_linear(layer.weight, layer.bias, init, gain, generators, last=i == len(self.layers) - 1)

    def forward(self, x: torch.Tensor, extra: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x [P, B, n_in] (and extra [P, B, extra_in] when the network takes one) -> [P, B, n_out]."""
        for i, (layer, norm, residual, activated) in enumerate(self._hidden):
            if extra is not None and i == self.extra_at:
                x = torch.cat([x, extra], -1)
            h = layer.forward(x)
            h = norm(h) if self.has_norm else h
            h = self.act(h) if activated else h
            x = x + h if residual else h
        if extra is not None and self.extra_at == len(self._hidden):
            x = torch.cat([x, extra], -1)
        out = self._output.forward(x)
        return out * self.output_scale if self.output_scale != 1.0 else out

    def forward_saved(self, x: torch.Tensor) -> tuple[torch.Tensor, List[tuple]]:
        """``forward`` without autograd (networks with ``analytic_backward`` only): the output
        [P, B, n_out] and what ``backward_to_grads`` needs (each linear layer's input and weight, the
        pre-activation and output, and a norm's input and statistics)."""
        saved: List[tuple] = []
        with torch.no_grad():
            for layer, norm, _, activated in self._hidden:
                h, linear = layer.forward_saved(x)  # [P, B, H]
                normed = None
                if self.has_norm:
                    h, normed = norm.forward_saved(h)
                y = self.act(h) if activated else h
                saved.append((linear, h, y, activated, normed))
                x = y
            out, linear = self._output.forward_saved(x)
            saved.append((linear, None, None, False, None))
            return (out * self.output_scale if self.output_scale != 1.0 else out), saved

    def backward_to_grads(self, saved: List[tuple], grad_out: torch.Tensor) -> None:
        """Write the gradient of sum(out * grad_out) with respect to every parameter into its
        ``.grad`` (overwritten, as after zeroing and one backward), for ``out`` = ``forward_saved``'s
        output and ``saved`` its record; grad_out [P, B, n_out]. The same kernels and order as
        autograd, so the gradients are the ones ``out.backward(grad_out)`` gives, bit for bit."""
        with torch.no_grad():
            grad = grad_out * self.output_scale if self.output_scale != 1.0 else grad_out  # [P, B, out]
            for i in range(len(self.layers) - 1, -1, -1):
                grad = self.layers[i].backward_to_grads(saved[i][0], grad, input_grad=i > 0)  # [P, B, in]
                if i > 0:  # grad is now the gradient wrt layer i-1's output
                    _, h, y, activated, normed = saved[i - 1]
                    if activated:
                        grad = ACTIVATION_BACKWARD[self.activation.name](grad, h, y, self.activation)
                    if normed is not None:
                        grad = self.norms[i - 1].backward_to_grads(normed, grad)

    def inference(self) -> Callable[..., torch.Tensor]:
        """A forward function without gradient, for acting: the same outputs as
        ``forward`` in the network's current mode, with less overhead per call.

        For a plain network (no norm, weight norm, residual or second input) it runs the same ops
        on detached views of the parameters. Parameters change in place (optimizer steps, target
        copies, restores), which the views see; when a parameter's storage is replaced (a gradient
        pipeline moves it into its flat buffer) the views are made anew. Otherwise it is
        ``forward`` under ``torch.no_grad()``.
        """
        if not self._plain:
            def run(x: torch.Tensor, extra: Optional[torch.Tensor] = None) -> torch.Tensor:
                with torch.no_grad():
                    return self.forward(x, extra)
            return run
        act, scale, params = self.act, self.output_scale, list(self.parameters())
        views: List[tuple] = []
        storage: List[int] = []

        def run_plain(x: torch.Tensor, extra: Optional[torch.Tensor] = None) -> torch.Tensor:
            if storage != [p.data_ptr() for p in params]:  # first call, or a parameter moved
                storage[:] = [p.data_ptr() for p in params]
                views[:] = [(layer.bias.detach().unsqueeze(1), layer.weight.detach().mT, activated)
                            for (layer, _, _, activated) in self._hidden]
                views.append((self._output.bias.detach().unsqueeze(1), self._output.weight.detach().mT, False))
            with torch.no_grad():
                for bias, weight_t, activated in views:
                    x = torch.baddbmm(bias, x, weight_t)
                    x = act(x) if activated else x
                return x * scale if scale != 1.0 else x
        return run_plain

    def host_inference(self) -> Callable[[np.ndarray], np.ndarray]:
        """A forward function from host arrays to host arrays, for acting from the environments'
        observations: float32 [P, B, n_in] -> [P, B, n_out], no gradient, the network's current mode.

        On the CPU, for an activation numpy computes (NUMPY_ACTIVATIONS) and no second input, numpy
        runs the layers (weight norm, layer norm, batch norm with running statistics, residuals) on
        views of the parameters' memory: no torch dispatch per call (a third of the time per acting
        step in CleanRL's DQN loop, about half in isolation). Its outputs equal ``forward``'s up to
        float32 rounding order (a test bounds the difference). Otherwise (and for batch norm in
        training mode) it moves the array to the network's device and back around ``inference``.
        """
        forward, device = self.inference(), self._output.weight.device
        torch_path = lambda x: forward(torch.from_numpy(x).to(device)).cpu().numpy()  # noqa: E731
        if self.activation.name not in NUMPY_ACTIVATIONS or self.extra_in or device.type != "cpu":
            return torch_path
        act, cfg, scale = NUMPY_ACTIVATIONS[self.activation.name], self.activation, self.output_scale
        tensors = list(self.parameters()) + list(self.buffers())
        blocks = [*self._hidden, (self._output, nn.Identity(), False, False)]
        layers: List[tuple] = []
        storage: List[int] = []

        def current() -> List[tuple]:
            pointers = [t.data_ptr() for t in tensors]
            if storage != pointers:  # first call, or a parameter moved (views see in-place changes)
                storage[:] = pointers
                layers[:] = [(_numpy_linear(layer), _numpy_norm(norm), residual, activated)
                             for layer, norm, residual, activated in blocks]
            return layers

        def run_numpy(x: np.ndarray) -> np.ndarray:
            if self.uses_batch_stats and self.training:  # batch statistics: torch's forward
                return torch_path(x)
            with np.errstate(all="ignore"):  # a diverging member's overflow is a result, as in torch
                for linear, norm, residual, activated in current():
                    h = linear(x)  # [P, B, out]
                    h = norm(h) if norm is not None else h
                    h = act(h, cfg) if activated else h
                    x = x + h if residual else h
                return x * np.float32(scale) if scale != 1.0 else x
        return run_numpy


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _numpy_linear(layer: PopLinear) -> Callable[[np.ndarray], np.ndarray]:
    """A population linear layer in numpy on views of its parameters: x [P, B, in] -> [P, B, out]."""
    weight, bias = _numpy(layer.weight), _numpy(layer.bias)[:, None, :]  # [P, out, in], [P, 1, out]
    weight_t = weight.transpose(0, 2, 1)
    if not isinstance(layer, PopWeightNormLinear):
        def linear(x: np.ndarray) -> np.ndarray:
            h = np.matmul(x, weight_t)
            h += bias
            return h
        return linear
    g, eps = _numpy(layer.g), np.float32(layer.eps)  # [P, out]

    def weight_norm_linear(x: np.ndarray) -> np.ndarray:  # x (g v / ||v||)^T = (x v^T) g / ||v||
        h = np.matmul(x, weight_t)
        h *= (g / np.sqrt(np.square(weight).sum(-1) + eps))[:, None, :]
        h += bias
        return h
    return weight_norm_linear


def _numpy_norm(norm: nn.Module) -> Optional[Callable[[np.ndarray], np.ndarray]]:
    """A hidden layer's norm in numpy on views of its parameters (batch norm with its running
    statistics); None for no norm."""
    if isinstance(norm, nn.Identity):
        return None
    weight, bias, eps = _numpy(norm.weight)[:, None, :], _numpy(norm.bias)[:, None, :], np.float32(norm.eps)
    if isinstance(norm, PopLayerNorm):
        def layer_norm(h: np.ndarray) -> np.ndarray:  # over features, per member and sample
            h = h - h.mean(-1, keepdims=True)
            h /= np.sqrt(np.square(h).mean(-1, keepdims=True) + eps)
            h *= weight
            h += bias
            return h
        return layer_norm
    mean, var = _numpy(norm.running_mean)[:, None, :], _numpy(norm.running_var)[:, None, :]

    def batch_norm(h: np.ndarray) -> np.ndarray:  # eval mode: the running statistics
        h = h - mean
        h /= np.sqrt(var + eps)
        h *= weight
        h += bias
        return h
    return batch_norm


def weight_parameters(module: nn.Module) -> List[torch.Tensor]:
    """The weight matrices (or weight-norm directions v) of every population linear layer."""
    return [m.weight for m in module.modules() if isinstance(m, PopLinear)]


@torch.no_grad()
def soft_update_(target: nn.Module, online: nn.Module, tau: float) -> None:
    """EMA target update, in place: target <- (1 - tau) * target + tau * online (buffers copied)."""
    torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)
    buffers = list(target.buffers())
    if buffers:
        torch._foreach_copy_(buffers, list(online.buffers()))


@torch.no_grad()
def hard_update_(target: nn.Module, online: nn.Module) -> None:
    """Hard target update, in place: target <- online (parameters and buffers)."""
    torch._foreach_copy_(list(target.parameters()) + list(target.buffers()), list(online.parameters()) + list(online.buffers()))
