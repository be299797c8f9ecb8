"""Instruments: per-member, per-layer statistics of population networks, and divergence location.

Everything here reads parameters, gradients and activations and never writes them. Statistics are
[P] tensors on the device; the trainer brings a whole record to the host once per log step.

Names (stable, documented in docs/outputs.md) use the network's name and the layer index, e.g.
``grad_norm/q.0`` for the first linear layer of the Q network; the output layer is the last index.
Activations are read from the network's own forward through its observer argument.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import torch

from rlexp.config.schema import DiagnosticsConfig
from rlexp.nn.nets import PopMLP
from rlexp.optim.pipeline import UpdateStats, joint_norms


class Deferred:
    """A [P] float32 instrument computed only if its record is written: the recorder writes the
    latest record once per log step and never reads the records in between, so an expensive
    instrument (the feature ranks' decompositions) waits for ``resolve``."""

    def __init__(self, compute: Callable[[], torch.Tensor]) -> None:
        self.compute = compute

    def float(self) -> Deferred:
        """Itself: its value is float32 already, as a record's values are."""
        return self


Stats = dict[str, torch.Tensor | Deferred]  # metric name -> [P]


def resolve(stats: Stats) -> dict[str, torch.Tensor]:
    """A record with its deferred instruments computed."""
    return {k: v.compute() if isinstance(v, Deferred) else v for k, v in stats.items()}


def parameter_names(net: PopMLP, prefix: str) -> list[str]:
    """Names of ``net.parameters()`` in order: ``q.1.weight``, ``q.1.g``, ``q.0.norm.weight``, ..."""
    names = []
    for name, _ in net.named_parameters():
        kind, index, tensor = name.split(".", 2)
        names.append(f"{prefix}.{index}.norm.{tensor}" if kind == "norms" else f"{prefix}.{index}.{tensor}")
    return names


_STAGE = {"weight": 0, "g": 1, "bias": 2, "norm.weight": 3, "norm.bias": 4}


def forward_order(name: str) -> tuple[int, int]:
    """Sort key of a parameter name in the order the forward pass uses it (layer, then stage);
    a tensor outside the layers (``actor.log_std``) comes after them."""
    parts = name.split(".", 2)
    if len(parts) < 3 or not parts[1].isdigit():
        return 1 << 30, 0
    return int(parts[1]), _STAGE.get(parts[2], 5)


def layer_of(parameter_name: str) -> str:
    """``q.1.weight`` -> ``q.1``."""
    return ".".join(parameter_name.split(".")[:2])


def per_layer(values: torch.Tensor, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Combine per-tensor L2 norms [T, P] into per-layer norms {layer: [P]} (sqrt of sum of squares)."""
    layers: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        layers.setdefault(layer_of(name), []).append(i)
    return {layer: joint_norms(values[idx]) for layer, idx in layers.items()}


def dormant_scores(h: torch.Tensor) -> torch.Tensor:
    """The tau-dormant score of each unit of a layer output h [P, B, H] (Sokar et al. 2023), per member:
    score_i = E|h_i| / mean_k E|h_k| over the batch -> [P, H]; a unit is tau-dormant when score_i <= tau.
    A convolution's output [P, B, positions, C] scores its channels over the batch and the positions."""
    score = h.abs().flatten(1, -2).mean(1)  # [P, H]
    return score / score.mean(1, keepdim=True).clamp(min=1e-12)


# the per-layer instruments rlexp writes (``<name>/<net>.<layer>``, docs/outputs.md)
OWN_INSTRUMENTS = ("act_mean", "act_std", "dead", "dormant", "active", "feature_norm", "srank", "erank")
OWN_INSTRUMENTS += ("weight_magnitude", "weight_change", "grad_norm", "grad_norm_post", "param_norm", "update_ratio")
# instruments registered from outside (a plugin's, rlexp.compose.plugins): name -> a function of one hidden
# layer's units [P, N, H] (N: the batch, times the positions of a convolution's map) giving [P] float32,
# written as ``<name>/<net>.<layer>`` beside ``act_mean`` and the others
HIDDEN_INSTRUMENTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}


def activation_stats(hidden: Sequence[torch.Tensor], prefix: str, tau: float, srank_delta: float) -> Stats:
    """Per hidden layer output h [P, B, H]: mean, std, dead fraction (units exactly 0 on the whole
    batch), tau-dormant fraction (Sokar et al. 2023: score_i = E|h_i| / mean_k E|h_k| <= tau), active
    fraction (outputs > 0), feature norm (mean over the batch of ||h_b||), and, deferred until the
    record is written, feature rank and effective rank (``rank_stats``). A convolution's output
    [P, B, positions, C]: its units are channels (dead, dormant over the batch and the positions), its
    features the flattened maps [P, B, positions * C]."""
    units = [h.detach().flatten(1, -2) for h in hidden]  # [P, B (* positions), H]
    hidden = [h.detach().flatten(2) for h in hidden]  # [P, B, features]
    stats: Stats = {}
    for i, h in enumerate(hidden):
        name = f"{prefix}.{i}"
        stats[f"act_mean/{name}"] = h.mean((1, 2))
        stats[f"act_std/{name}"] = h.std((1, 2))
        stats[f"dead/{name}"] = (units[i] == 0).all(1).float().mean(1)
        stats[f"dormant/{name}"] = (dormant_scores(units[i]) <= tau).float().mean(1)
        stats[f"active/{name}"] = (h > 0).float().mean((1, 2))
        stats[f"feature_norm/{name}"] = torch.linalg.vector_norm(h, dim=2).mean(1)
        for metric, instrument in HIDDEN_INSTRUMENTS.items():
            stats[f"{metric}/{name}"] = instrument(units[i]).float()
    ranks = cache(partial(rank_stats, hidden, prefix, srank_delta))  # every layer's, once, when first read
    for i in range(len(hidden)):
        for metric in ("srank", "erank"):
            stats[f"{metric}/{prefix}.{i}"] = Deferred(partial(lambda key: ranks()[key], f"{metric}/{prefix}.{i}"))
    return stats


def rank_stats(hidden: Sequence[torch.Tensor], prefix: str, srank_delta: float) -> dict[str, torch.Tensor]:
    """``srank/<prefix>.<i>`` and ``erank/<prefix>.<i>`` [P] of each hidden layer output [P, B, H]
    (``feature_ranks``), in one call for the layers of one shape."""
    members = hidden[0].shape[0] if hidden else 0
    shapes: dict[tuple[int, ...], list[int]] = {}
    for i, h in enumerate(hidden):
        shapes.setdefault(tuple(h.shape), []).append(i)
    stats = {}
    for layers in shapes.values():
        sranks, eranks = feature_ranks(torch.cat([hidden[i].detach() for i in layers]), srank_delta)  # [L * P]
        for j, i in enumerate(layers):
            stats[f"srank/{prefix}.{i}"] = sranks[j * members : (j + 1) * members]
            stats[f"erank/{prefix}.{i}"] = eranks[j * members : (j + 1) * members]
    return stats


def feature_ranks(h: torch.Tensor, delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Feature rank and effective rank of each matrix of h [P, B, H] -> ([P], [P]) (float32).

    With sigma_1 >= ... >= sigma_m (m = min(B, H)) a matrix's singular values and p_i = sigma_i /
    sum_j sigma_j: srank_delta = min k with sum_{i<=k} p_i >= 1 - delta (Kumar et al. 2021), i.e. m
    minus the number of smallest p_i whose sum stays <= delta; erank = exp(-sum_i p_i log p_i) with
    0 log 0 = 0 (Roy & Vetterli 2007). Both are 0 for an all-zero matrix and NaN for a matrix with a
    non-finite value (for every matrix in the rare case the eigensolver does not converge).

    The singular values are the square roots of the eigenvalues of the float64 Gram matrix h^T h
    (or h h^T when B < H): exact products of the float32 values summed in float64, whose eigenvalues
    carry an absolute error near 1e-16 sigma_1^2, so each sigma to about 1e-8 sigma_1 (a float32 SVD:
    1e-7), at half an SVD's cost. Each matrix is decomposed on its own: the others never change it.
    """
    finite = torch.isfinite(h).flatten(1).all(1)  # [P]
    x = torch.where(finite[:, None, None], h, 0.0).double()  # a non-finite matrix -> 0, its ranks -> NaN
    gram = x.mT @ x if x.shape[1] >= x.shape[2] else x @ x.mT  # [P, m, m]
    try:
        sigma = torch.linalg.eigvalsh(gram).clamp(min=0.0).sqrt()  # [P, m] ascending
    except RuntimeError:  # no convergence: an instrument never crashes a job
        sigma = torch.full_like(gram[:, 0], float("nan"))
    total = sigma.sum(1, keepdim=True)  # [P, 1]
    finite = finite & torch.isfinite(total[:, 0])
    p = sigma / total.clamp(min=torch.finfo(sigma.dtype).tiny)  # all 0 for a zero matrix
    srank = sigma.shape[1] - (p.cumsum(1) <= delta).sum(1)  # the tail of mass <= delta is left out
    erank = torch.exp(-torch.special.xlogy(p, p).sum(1)) * (total.squeeze(1) > 0)
    return (
        torch.where(finite, srank.float(), float("nan")),
        torch.where(finite, erank.float(), float("nan")),
    )


def layer_stats(net: PopMLP, prefix: str) -> Stats:
    """Each linear layer's statistics: its reparametrization's (e.g. ``wn_v_min/q.0``, the smallest
    per-unit ||v|| of a weight-normalized layer, which g/||v|| divides by), the mean |w| of its
    effective weight (``weight_magnitude/q.0``) and, when the network keeps its initial parameters
    (``keep_initial``), ||theta - theta_0|| / ||theta_0|| over the layer's parameters (``weight_change/q.0``)."""
    stats: Stats = {}
    for i, layer in enumerate(net.layers):
        for metric, value in layer.instruments().items():
            stats[f"{metric}/{prefix}.{i}"] = value
        training = layer.training
        layer.eval()  # a spectral norm's effective weight without a power iteration (which writes its state)
        stats[f"weight_magnitude/{prefix}.{i}"] = layer.effective_weight().detach().abs().mean((1, 2))
        layer.train(training)
    initial: Initial | None = getattr(net, "initial", None)
    if initial is not None:
        now = torch.cat([p.detach().flatten(1) for p in net.parameters()], 1)  # [P, N]
        moved = torch.zeros_like(initial.norms).index_add_(1, initial.layer, (now - initial.flat).double().square())
        change = (moved.sqrt() / initial.norms).float()  # [P, L]
        for i in range(change.shape[1]):
            stats[f"weight_change/{prefix}.{i}"] = change[:, i]
    return stats


@dataclass
class Initial:
    """A network's parameters when it was built (theta_0), flat: member k's in row k."""

    flat: torch.Tensor  # [P, N] in the order of net.parameters()
    layer: torch.Tensor  # [N] the linear layer each value belongs to
    norms: torch.Tensor  # [P, L] ||theta_0|| of each layer (float64, at least 1e-12)


def keep_initial(net: PopMLP) -> None:
    """Keep the network's parameters as theta_0 of ``weight_change/`` (``net.initial``)."""
    with torch.no_grad():
        named = list(net.named_parameters())  # layers.1.weight, norms.0.bias, ...
        flat = torch.cat([p.detach().flatten(1) for _, p in named], 1).clone()  # [P, N]
        layer = torch.cat(
            [torch.full((p[0].numel(),), int(name.split(".")[1]), device=flat.device) for name, p in named]
        )
        norms = torch.zeros(flat.shape[0], len(net.layers), dtype=torch.float64, device=flat.device)
        norms = norms.index_add_(1, layer, flat.double().square()).sqrt().clamp(min=1e-12)
    net.initial = Initial(flat, layer, norms)


def update_instruments(update: UpdateStats, names: Sequence[str]) -> Stats:
    """Per-layer gradient norms before and after the processors, parameter norms and update ratios
    ||delta w|| / ||w|| from a diagnosed update of a pipeline whose tensors are named ``names``."""
    stats: Stats = {}
    params = per_layer(update.tensor_param, names)
    updates = per_layer(update.tensor_update, names)
    for layer, value in per_layer(update.tensor_grad_pre, names).items():
        stats[f"grad_norm/{layer}"] = value
    for layer, value in per_layer(update.tensor_grad_post, names).items():
        stats[f"grad_norm_post/{layer}"] = value
    for layer, value in params.items():
        stats[f"param_norm/{layer}"] = value
        stats[f"update_ratio/{layer}"] = updates[layer] / value.clamp(min=1e-12)
    return stats


def activity_instruments(
    net: PopMLP, prefix: str, x: torch.Tensor, diag: DiagnosticsConfig, extra: torch.Tensor | None = None
) -> tuple[torch.Tensor, Stats]:
    """A forward pass of x [P, B, in] that returns the output and the hidden layers' activation
    statistics with the linear layers' own (``diag``: dormant_tau, srank_delta; no gradient)."""
    with torch.no_grad():
        out, hidden = hidden_outputs(net, x, extra)
        return out, {**layer_stats(net, prefix), **activation_stats(hidden, prefix, diag.dormant_tau, diag.srank_delta)}


def hidden_outputs(
    net: PopMLP, x: torch.Tensor, extra: torch.Tensor | None = None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The network's forward pass, and each hidden layer's output [P, B, H] (after the activation
    and the residual connection)."""
    hidden: list[torch.Tensor] = []

    def observe(layer: int, stage: str, value: torch.Tensor) -> None:
        if stage == "hidden":
            hidden.append(value)

    return net(x, extra, observe=observe), hidden


class Explosions:
    """Counts consecutive instrument records on which a member's |Q| or gradient norm is beyond its
    bound; ``patience`` in a row is an explosion."""

    def __init__(self, members: int, patience: int, device: torch.device) -> None:
        self.q_strikes = torch.zeros(members, dtype=torch.long, device=device)
        self.grad_strikes = torch.zeros(members, dtype=torch.long, device=device)
        self.patience = patience

    def check(
        self, q_abs_max: torch.Tensor, q_bound: torch.Tensor, grad_norm: torch.Tensor, grad_bound: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Update the counts; returns ([P] value explosion, [P] gradient explosion)."""
        self.q_strikes = torch.where(q_abs_max > q_bound, self.q_strikes + 1, 0)
        self.grad_strikes = torch.where(grad_norm > grad_bound, self.grad_strikes + 1, 0)
        return self.q_strikes >= self.patience, self.grad_strikes >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {"q_strikes": self.q_strikes, "grad_strikes": self.grad_strikes}  # [P] each

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = self.q_strikes.device
        self.q_strikes, self.grad_strikes = state["q_strikes"].to(device), state["grad_strikes"].to(device)


# the stage whose output is non-finite (the ``where`` suffix) -> detail
_STAGE_DETAILS = {
    "linear": "linear output overflows (largest |input| {largest:.3g})",
    "norm": "normalization output is non-finite",
    "activation": "activation output is non-finite",
    "lstm": "LSTM output is non-finite (largest |input| {largest:.3g})",
    "output": "output scaling overflows",
}


def locate_nonfinite(
    net: PopMLP,
    prefix: str,
    member: int,
    x: torch.Tensor,
    input_name: str,
    extra: torch.Tensor | None = None,
) -> tuple[str, str, str] | None:
    """Re-run member ``member``'s batch x [B, in] (and extra [B, extra_in]) through ``net``.

    Returns (cause, where, detail) for the first non-finite parameter, input, effective weight,
    linear output, norm output or activation, in forward order; None when everything is finite.
    The network's own forward runs (every member on this batch) with an observer that inspects
    member ``member``'s slice; in training mode, so a batch norm uses the batch's statistics, and
    the buffers it or a power iteration changes are restored: no side effects.
    """
    with torch.no_grad():
        named = sorted(zip(parameter_names(net, prefix), net.parameters()), key=lambda item: forward_order(item[0]))
        for name, p in named:
            bad = ~torch.isfinite(p[member])
            if bad.any():
                return "nonfinite_param", name, f"{int(bad.sum())} of {bad.numel()} values non-finite"
        for value, label in ((x, input_name), (extra, "action")):
            if value is not None and not torch.isfinite(value).all():
                return "nonfinite_obs", label, f"{int((~torch.isfinite(value)).sum())} non-finite input values"
        found: list[tuple[str, str, str]] = []
        largest = 0.0

        def observe(layer: int, stage: str, value: torch.Tensor) -> None:
            nonlocal largest
            if found:
                return
            name = f"{prefix}.{layer}"
            if stage == "input":  # the layer's effective weight first, then its input's scale
                problem = net.layers[layer].weight_problem(member)
                if problem is not None:
                    found.append(("nonfinite_loss", f"{name}.{problem[0]}", problem[1]))
                largest = value[member].abs().max().item()
            elif stage in _STAGE_DETAILS and not torch.isfinite(value[member]).all():
                found.append(("nonfinite_loss", f"{name}.{stage}", _STAGE_DETAILS[stage].format(largest=largest)))

        members = net.layers[0].weight.shape[0]
        batch = x.unsqueeze(0).expand(members, *x.shape)  # [P, B, in]
        extras = None if extra is None else extra.unsqueeze(0).expand(members, *extra.shape)
        buffers = [b.clone() for b in net.buffers()]
        training = net.training
        try:
            net.train()
            net(batch, extras, observe=observe)
        finally:
            net.train(training)
            for b, before in zip(net.buffers(), buffers):
                b.copy_(before)
    return found[0] if found else None


def locate_gradient(names: Sequence[str], grads: Sequence[torch.Tensor], member: int) -> tuple[str, str] | None:
    """The non-finite gradient closest to the output (where backpropagation produced it first)."""
    for name, g in sorted(zip(names, grads), key=lambda item: forward_order(item[0]), reverse=True):
        bad = ~torch.isfinite(g[member])
        if bad.any():
            return name, f"{int(bad.sum())} of {bad.numel()} gradient values non-finite"
    return None


def locate_in_update(
    cause: str, names: Sequence[str], params: Sequence[torch.Tensor], member: int, update: UpdateStats
) -> tuple[str, str, str]:
    """Where a non-finite update was born once every input and activation is finite: the loss,
    the gradients (nearest the output first) or the parameters after the optimizer step."""
    if cause == "nonfinite_loss":
        return cause, "loss", "every activation is finite; the loss itself overflows"
    if cause == "nonfinite_grad":
        found = locate_gradient(names, [p.grad for p in params], member)
        return (cause, *found) if found is not None else (cause, "gradient", "the gradient norm is non-finite")
    if update.param_finite_after is not None:
        bad = (~update.param_finite_after[:, member]).nonzero().flatten().tolist()
        if bad:
            return "nonfinite_param", names[bad[0]], "the optimizer step made it non-finite"
    return cause, "unknown", ""


# instruments first_moved passes over: grad_norm_post/ is grad_norm/ unclipped; weight_change/ grows from 0
# by construction
_NOT_MOVED = ("grad_norm_post/", "weight_change/")


class InstrumentHistory:
    """The last records of one member's instruments on the host, to say which one moved first."""

    def __init__(self, length: int = 20) -> None:
        self.records: deque[tuple[int, dict[str, float]]] = deque(maxlen=length)

    def add(self, step: int, record: dict[str, float]) -> None:
        """Keep a record only while all its values are finite (the last finite values)."""
        if record and all(math.isfinite(v) for v in record.values()):
            self.records.append((step, record))

    def last(self) -> dict[str, float] | None:
        return self.records[-1][1] if self.records else None

    def state_dict(self) -> dict[str, Any]:
        """The records kept: [(step, {instrument: value})] (one member's: a ``PerMember`` entry)."""
        return {"records": list(self.records)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.records.clear()
        self.records.extend((step, record) for step, record in state["records"])

    def first_moved(self, factor: float = 10.0) -> dict[str, object] | None:
        """The instrument whose magnitude first grew ``factor``-fold over its earliest kept value."""
        if len(self.records) < 2:
            return None
        first_step, first = self.records[0]
        for step, record in list(self.records)[1:]:
            moved = [
                (abs(v) / max(abs(first[k]), 1e-12), k)
                for k, v in record.items()
                if k in first
                and not k.startswith(_NOT_MOVED)
                and abs(v) >= factor * max(abs(first[k]), 1e-12)
                and abs(v) > 1e-6
            ]
            if moved:
                ratio, name = max(moved)
                return {
                    "instrument": name,
                    "step": step,
                    "from": first[name],
                    "to": record[name],
                    "since_step": first_step,
                }
        return None
