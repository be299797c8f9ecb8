"""The gradient pipeline: compute -> process -> apply, per population member.

One place, used by every algorithm for every network::

    loss [P] (+ L1/L2/L2-init penalty) -> backward -> grad norms (pre) -> processors (clipping)
    -> grad norms (post) -> non-finite check -> optimizer step (members still alive only)

Every reduction (norms, clipping scales, finiteness) is per member: one member's gradients never
scale another's, and a member whose loss, gradient or parameters become non-finite is marked
diverged and frozen while the others go on bitwise unchanged.

``GradientPipeline`` computes over one flat buffer with the optimizers' fused kernels;
``PlainPipeline``, its twin for the run's ``fast_paths=false``, over each parameter tensor with
torch.optim's classes. ``gradient_pipeline`` picks one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig

from rlexp.config.members import member_runs, require_same
from rlexp.config.schema import (
    AGCConfig,
    ClippingConfig,
    NormClipConfig,
    OptimizerConfig,
    PerTensorClipConfig,
    RegularizationConfig,
    ValueClipConfig,
    require,
    require_choice,
)
from rlexp.config.state import PerMember
from rlexp.nn.component import ParameterStorage
from rlexp.nn.nets import member_sum
from rlexp.optim.optimizers import make_optimizer

CAUSES = (
    "none",
    "nonfinite_loss",
    "nonfinite_grad",
    "nonfinite_param",
    "nonfinite_obs",
    "value_explosion",
    "grad_explosion",
)


def _member_view(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Reshape a per-member [P] tensor to broadcast against ``like`` [P, ...]."""
    return x.view(-1, *([1] * (like.dim() - 1)))


def tensor_norms(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """L2 norm of each [P, ...] tensor per member: [T, P], in float64 (finite for any finite float32
    values, so only NaN/Inf elements make it non-finite)."""
    return torch.stack([torch.linalg.vector_norm(t.flatten(1), dim=1, dtype=torch.float64) for t in tensors])


def joint_norms(norms: torch.Tensor) -> torch.Tensor:
    """Per-tensor L2 norms [T, P] (``tensor_norms``) combined into each member's joint norm [P]: the
    square root of their squares' sum, added tensor after tensor (``member_sum``)."""
    return member_sum(norms.square()).sqrt()


def member_norms(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Joint L2 norm of a list of [P, ...] tensors, per member: [P] (float64), in one reduction."""
    flat = torch.cat([t.reshape(t.shape[0], -1) for t in tensors], 1)  # [P, N]
    return torch.linalg.vector_norm(flat, dim=1, dtype=torch.float64)


# ---------------------------------------------------------------- processors (clipping)
# Each takes (params, grads, cfg, norm) and rewrites grads in place; ``norm`` is the members' joint
# gradient norm [P] when the caller has it already (None: computed where needed).
Processor = Callable[..., None]


def clip_none(
    params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], cfg: ClippingConfig, norm: torch.Tensor | None = None
) -> None:
    """Leave gradients as they are."""


def clip_global_norm(
    params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], cfg: ClippingConfig, norm: torch.Tensor | None = None
) -> None:
    """Scale each member's gradients by min(1, max_norm / (||g||_member + 1e-6)) (clip_grad_norm_)."""
    norm = member_norms(grads) if norm is None else norm
    scale = (cfg.max_norm / (norm + 1e-6)).clamp(max=1.0).to(grads[0].dtype)  # [P]
    for g in grads:
        g.mul_(_member_view(scale, g))


def clip_per_tensor(
    params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], cfg: ClippingConfig, norm: torch.Tensor | None = None
) -> None:
    """TF clip_by_norm on each tensor and member: g * max_norm / max(||g||, max_norm)."""
    for g in grads:
        norm = g.flatten(1).norm(dim=1)  # [P]
        g.mul_(_member_view(cfg.max_norm / torch.clamp(norm, min=cfg.max_norm), g))


def clip_value(
    params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], cfg: ClippingConfig, norm: torch.Tensor | None = None
) -> None:
    """Clamp every gradient element to +-clip_value."""
    for g in grads:
        g.clamp_(-cfg.clip_value, cfg.clip_value)


def unitwise_norm(x: torch.Tensor) -> torch.Tensor:
    """AGC's unit-wise norm of a [P, ...] tensor: per output unit for matrices [P, out, in] (norm
    over inputs, -> [P, out, 1]), over the whole vector for vectors [P, n] (-> [P, 1])."""
    if x.dim() <= 2:
        return x.norm(dim=1, keepdim=True)
    return x.norm(dim=-1, keepdim=True)


def clip_agc(
    params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], cfg: ClippingConfig, norm: torch.Tensor | None = None
) -> None:
    """Adaptive gradient clipping (Brock et al. 2021): where ||G_i|| > lambda * max(||W_i||, eps),
    scale G_i to that norm; unit-wise, per member."""
    for p, g in zip(params, grads):
        max_norm = cfg.clip_factor * unitwise_norm(p.detach()).clamp(min=cfg.eps)
        g_norm = unitwise_norm(g)
        clipped = g * (max_norm / g_norm.clamp(min=1e-6))
        g.copy_(torch.where(g_norm > max_norm, clipped, g))


# processors that only need each member's joint norm or work elementwise: they run on the flat
# gradient buffer [P, N] as one tensor
FLAT_CLIPPERS = ("none", "global_norm", "value")


@dataclass(frozen=True)
class Clipper:
    """A clipping option: its processor and the schema of its config."""

    process: Processor
    schema: type[ClippingConfig]

    def __call__(
        self,
        params: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor],
        cfg: ClippingConfig,
        norm: torch.Tensor | None = None,
    ) -> None:
        self.process(params, grads, cfg, norm)


CLIPPERS: dict[str, Clipper] = {
    "none": Clipper(clip_none, ClippingConfig),
    "global_norm": Clipper(clip_global_norm, NormClipConfig),
    "per_tensor": Clipper(clip_per_tensor, PerTensorClipConfig),
    "value": Clipper(clip_value, ValueClipConfig),
    "agc": Clipper(clip_agc, AGCConfig),
}


def check_clipping(cfg: DictConfig, key: str) -> None:
    """Refuse an unknown clipping option and bounds <= 0 (``key``: the node's dotted path)."""
    require_choice(cfg.name, f"{key}.name", CLIPPERS)
    for k in ("max_norm", "clip_value", "clip_factor", "eps"):
        require(cfg[k] > 0, f"{key}.{k}", cfg[k], "a value > 0")


# ---------------------------------------------------------------- member health
class Health:
    """Per-member divergence state, kept on the device so the hot path never waits for the host.

    alive [P] bool; diverged_at [P] env step of the first non-finite update (-1 if none);
    cause [P] index into CAUSES.
    """

    def __init__(self, members: int, device: torch.device) -> None:
        self.alive = torch.ones(members, dtype=torch.bool, device=device)
        self.diverged_at = torch.full((members,), -1, dtype=torch.long, device=device)
        self.cause = torch.zeros(members, dtype=torch.long, device=device)

    def mark(self, ok: torch.Tensor, cause: torch.Tensor | int, step: int) -> torch.Tensor:
        """Members alive but not ``ok`` [P] diverge now, at env step ``step``, for ``cause`` ([P] or
        an index into CAUSES); returns them ([P] bool)."""
        newly = self.alive & ~ok
        self.diverged_at = torch.where(newly, step, self.diverged_at)
        self.cause = torch.where(newly, cause, self.cause)
        self.alive = self.alive & ok
        return newly

    def state_dict(self) -> dict[str, Any]:
        return {"alive": self.alive, "diverged_at": self.diverged_at, "cause": self.cause}  # [P] each

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = self.alive.device
        self.alive, self.diverged_at, self.cause = (state[k].to(device) for k in ("alive", "diverged_at", "cause"))


@dataclass
class UpdateStats:
    """Per-member results of one update, [P] tensors on the device; per-tensor ones [T, P]."""

    loss: torch.Tensor
    grad_norm_pre_clip: torch.Tensor
    grad_norm_post_clip: torch.Tensor
    newly_diverged: torch.Tensor | None = None  # [P] bool, when some member may have diverged
    tensor_grad_pre: torch.Tensor | None = None  # the rest only with diagnose=True
    tensor_grad_post: torch.Tensor | None = None
    tensor_param: torch.Tensor | None = None
    tensor_update: torch.Tensor | None = None  # ||p_after - p_before||
    param_finite_after: torch.Tensor | None = None  # [T, P] after the step (slow path only)


class GradientPipeline:
    """compute -> process -> apply for one network's parameters (all [P, ...]).

    The pipeline owns its parameters' storage: one flat buffer [P, N] per pipeline (member k's
    row holds all of member k's values), and each parameter becomes a view into it, as does each
    gradient into a flat gradient buffer. Norms, global-norm clipping, the finiteness checks, the
    restore of frozen members and the optimizer step then each run once over the buffer instead of
    once per tensor; what they compute is unchanged (every operation is per member or elementwise).
    The optimizer (``optimizer``, a config) is built over the flat buffer, its rows padded to whole
    64-byte blocks (see ``__init__``).

    Building one moves its parameters' storage, counted in ``ParameterStorage.moves``: a fast path
    holding views of parameter memory (PopMLP.inference) makes them anew when it changes.
    """

    fast_paths = True  # the flat buffer and the fused optimizers (PlainPipeline: False)

    def __init__(
        self,
        params: list[torch.Tensor],
        optimizer: OptimizerConfig | list[OptimizerConfig],
        clipping: ClippingConfig | list[ClippingConfig],
        regularization: RegularizationConfig | list[RegularizationConfig],
        weights: list[torch.Tensor],
        health: Health,
    ) -> None:
        members = params[0].shape[0]
        self._store(params)
        self.params = params
        self.grads = [p.grad for p in params]
        self._sizes = [p[0].numel() for p in params]
        # members differing in their optimizer or clipping: each run of equal members' configs steps
        # (clips) its rows [a, b) of the buffers with its own rule and numbers; one run when all agree
        self.optimizers = []  # (a, b, optimizer over the rows [a, b): _rows)
        for a, b, config in member_runs(optimizer, members):
            self.optimizers.append((a, b, make_optimizer(self._rows(a, b), config, self.fast_paths)))
        self.optimizer = self.optimizers[0][2] if len(self.optimizers) == 1 else None  # None: per-member groups
        self.lr_factor = 1.0  # the schedule's factor (scale_lr)
        self.clippers = member_runs(clipping, members)  # (a, b, config)
        self.clipping = self.clippers[0][2]
        self.clip = CLIPPERS[self.clipping.name]
        self.clipped = any(c.name != "none" for _, _, c in self.clippers)
        flat_clipper = self.fast_paths and self.clipping.name in FLAT_CLIPPERS
        self._clip_grads = [self.flat_grad] if flat_clipper else self.grads
        self.health = health
        runs = member_runs(regularization, members)
        if len(runs) == 1:  # plain numbers
            self.l1, self.l2, self.l2_init = runs[0][2].l1, runs[0][2].l2, runs[0][2].l2_init
        else:  # per member [P]
            regs = regularization if isinstance(regularization, list) else [regularization] * members
            self.l1, self.l2, self.l2_init = (
                torch.tensor([getattr(r, k) for r in regs], dtype=params[0].dtype, device=params[0].device)
                for k in ("l1", "l2", "l2_init")
            )
        require_same(regularization, "weights_only", "regularization.weights_only")
        strengths = (self.l1, self.l2, self.l2_init)
        self._penalties = tuple(bool((w > 0).any()) if isinstance(w, torch.Tensor) else w > 0 for w in strengths)
        self.penalized = weights if runs[0][2].weights_only else params
        # l2_init's w_0: the penalized tensors as the pipeline finds them (the network's initial values)
        self.initial = [w.detach().clone() for w in self.penalized] if self._penalties[2] else []
        # called with (grads, env_step) between backward and the processors (fault injection)
        self.after_backward: Callable[[list[torch.Tensor], int], None] | None = None
        self._on_cpu = not params[0].is_cuda

    def _store(self, params: list[torch.Tensor]) -> None:
        """Move the parameters into the flat buffers: each parameter and its gradient a view."""
        members = params[0].shape[0]
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(members, -1) for p in params], 1)  # [P, N]
        # the optimizer steps rows padded with zeros to whole 64-byte blocks [P, N']: a CPU kernel's
        # vector body and its scalar remainder loop round differently, and with N' a multiple of every
        # vector width no element falls in the remainder, so the last member's bits never depend on P
        block = 64 // flat.element_size()
        self._padded = flat.new_zeros(members, -(-flat.shape[1] // block) * block)  # [P, N']
        self._padded.grad = torch.zeros_like(self._padded)  # [P, N'], padding: 0 forever
        self.flat = self._padded[:, : flat.shape[1]]  # [P, N] views
        self.flat_grad = self._padded.grad[:, : flat.shape[1]]
        self.flat.copy_(flat)
        self._before = torch.empty_like(self.flat)  # the parameters before a step
        offset = 0
        self._offsets: dict[int, int] = {}  # id(parameter) -> its first column in the buffers
        for p in params:  # each parameter and its gradient become views into the buffers
            n = p[0].numel()
            self._offsets[id(p)] = offset
            p.data = self.flat[:, offset : offset + n].view(p.shape)
            p.grad = self.flat_grad[:, offset : offset + n].view(p.shape)  # backward adds into it in place
            offset += n
        ParameterStorage.moves += 1

    def _rows(self, a: int, b: int) -> list[torch.Tensor]:
        """What the optimizer of members [a, b) steps: the padded buffer's rows (a view: rows are
        contiguous), with their gradient rows."""
        if (a, b) == (0, self._padded.shape[0]):
            return [self._padded]
        rows = self._padded[a:b]
        rows.grad = self._padded.grad[a:b]
        return [rows]

    def penalty(self) -> torch.Tensor:
        """Penalty per member: l1 * sum|w| + l2 * sum w^2 + l2_init * sum (w - w_0)^2 over the penalized
        tensors -> [P]."""
        total = torch.zeros((), device=self.params[0].device)
        l1_on, l2_on, l2_init_on = self._penalties
        if l1_on:
            total = total + self.l1 * member_sum(w.abs().flatten(1).sum(1) for w in self.penalized)
        if l2_on:
            total = total + self.l2 * member_sum(w.square().flatten(1).sum(1) for w in self.penalized)
        if l2_init_on:
            moved = [(w - w0).square().flatten(1).sum(1) for w, w0 in zip(self.penalized, self.initial)]
            total = total + self.l2_init * member_sum(moved)
        return total

    @torch.no_grad()
    def reset_state(self, param: torch.Tensor, member: int, index: tuple = ()) -> None:
        """Set the optimizer state of ``param[member][index]`` to a fresh optimizer's (moments 0;
        rmsprop_tf's mean square 1); ``param`` is one of the pipeline's tensors, the other members'
        state is untouched."""
        offset, n = self._offsets[id(param)], param[0].numel()
        for a, b, optimizer in self.optimizers:
            if a <= member < b:
                for state, initial in optimizer.state():
                    state[:, offset : offset + n].view(b - a, *param.shape[1:])[member - a][index] = initial

    def scale_lr(self, factor: float) -> None:
        """Set every member's learning rate to its configured one times ``factor`` (a schedule)."""
        self.lr_factor = factor
        for _, _, optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = optimizer.base_lr * factor

    @torch.no_grad()
    def set_optimizers(self, configs: list[OptimizerConfig]) -> None:
        """Give the members new optimizer configs at run time (population-based training changes a
        member's lr), keeping every member's optimizer state.

        The runs are split anew from ``configs`` (``member_runs``: maximal runs of equal configs, each one
        optimizer over its rows ``[a, b)``, views: ``_rows``); each member's state rows
        (``optimizer.state()``: moments) move from the run that held them into the new one, and the
        runs' counters (Adam's step count, SGD's first step: equal in every run, since every run steps
        at every update) carry over. A member computes in a run what it computes alone (rows of whole
        64-byte blocks), so a member whose config is unchanged steps bitwise as before; one whose lr
        changed steps with exactly its new lr (times the schedule's ``lr_factor``). A per-member lr
        tensor would need another kernel than torch's fused ones, and change every member's bits.
        A member keeps its optimizer kind and flags (only its numbers may change).
        """
        members = self.params[0].shape[0]
        old = self.optimizers
        self.optimizers = []
        for a, b, config in member_runs(configs, members):
            optimizer = make_optimizer(self._rows(a, b), config, self.fast_paths)
            for k in range(a, b):  # member k's state rows, from the run that held them
                c, _, previous = next(run for run in old if run[0] <= k < run[1])
                for (state, _), (held, _) in zip(optimizer.state(), previous.state()):
                    state[k - a].copy_(held[k - c])
            previous = next(run for run in old if run[0] <= a < run[1])[2]
            for name, value in vars(previous).items():  # counters shared by a run's members
                if isinstance(value, bool):
                    setattr(optimizer, name, value)
                elif isinstance(value, list) and all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in value):
                    for mine, held in zip(getattr(optimizer, name), value):
                        mine.copy_(held)
            for group in optimizer.param_groups:
                group["lr"] = optimizer.base_lr * self.lr_factor
            self.optimizers.append((a, b, optimizer))
        self.optimizer = self.optimizers[0][2] if len(self.optimizers) == 1 else None

    def state_dict(self) -> dict[str, Any]:
        """Each member's optimizer state (``PerMember``: its rows of its run's state tensors, [N'] each,
        and its run's step counts, flags and hyperparameters) and the lr schedule's factor. Members in
        runs of different optimizers hold different state: each member's entry is its own run's."""
        members = []
        for a, b, optimizer in self.optimizers:
            state = optimizer.state_dict()
            for row in range(b - a):
                members.append({name: _row(value, row) for name, value in state.items()})
        return {"optimizer": PerMember(members), "lr_factor": self.lr_factor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``'s values: each run's state tensors stacked from its members' rows."""
        members = state["optimizer"]
        for a, b, optimizer in self.optimizers:
            optimizer.load_state_dict(_stacked(members[a:b]))
        self.lr_factor = state["lr_factor"]

    def _clip_runs(self, norm: torch.Tensor) -> None:
        """Clip each run of members [a, b) with its own rule and bounds, on views of its rows."""
        for a, b, config in self.clippers:
            clipper = CLIPPERS[config.name]
            if config.name in FLAT_CLIPPERS:
                clipper([p[a:b] for p in self.params], [self.flat_grad[a:b]], config, norm[a:b])
            else:
                clipper([p[a:b] for p in self.params], [g[a:b] for g in self.grads], config, None)

    def _params_finite(self) -> torch.Tensor:
        """[T, P] True where every element of the tensor is finite, per member."""
        sums = [p.flatten(1).sum(1, dtype=torch.float64) for p in self.params]  # no overflow in float64
        return torch.isfinite(torch.stack(sums))

    @property
    def has_penalty(self) -> bool:
        """True when the loss gets a penalty (whose gradient comes from backward)."""
        return any(self._penalties)

    def _zero_grads(self) -> None:
        self.flat_grad.zero_()

    def _backward(self, loss: torch.Tensor, env_step: int, written_backward: bool) -> torch.Tensor:
        """The gradients of ``loss.sum()`` (and the penalty's) in every ``.grad``, unless the caller wrote
        them (``written_backward``); then the ``after_backward`` hook (fault injection). Returns the
        loss [P] with the penalty."""
        if written_backward:
            if self.has_penalty:
                raise ValueError("GradientPipeline.step: written_backward=True cannot add the L1/L2 penalty's gradient")
        else:
            if self.has_penalty:
                loss = loss + self.penalty()
            self._zero_grads()
            loss.sum().backward()  # members are independent: d(sum)/d(loss_k) = 1 for each k
        if self.after_backward is not None:
            self.after_backward(self.grads, env_step)
        return loss

    def step(
        self, loss: torch.Tensor, env_step: int, diagnose: bool = False, written_backward: bool = False
    ) -> UpdateStats:
        """Run one update from per-member losses ``loss`` [P] (without the penalty) at ``env_step``.

        ``diagnose`` also returns per-tensor gradient norms before and after the processors,
        parameter norms and update norms (for the instruments). ``written_backward``: the caller has
        already written the gradient of ``loss.sum()`` into every parameter's ``.grad`` (no
        backward here; not with a penalty).
        """
        grads, flat, flat_grad = self.grads, self.flat, self.flat_grad
        loss = self._backward(loss, env_step, written_backward)
        clipped = self.clipped
        norm_pre = torch.linalg.vector_norm(flat_grad, dim=1, dtype=torch.float64)  # [P] each member's
        tensor_pre = tensor_norms(grads) if diagnose else None  # [T, P] per tensor, for the instruments
        if len(self.clippers) == 1:
            self.clip(self.params, self._clip_grads, self.clipping, norm_pre)
        else:
            self._clip_runs(norm_pre)
        norm_post = torch.linalg.vector_norm(flat_grad, dim=1, dtype=torch.float64) if clipped else norm_pre
        stats = UpdateStats(loss.detach(), norm_pre, norm_post)
        if diagnose:
            stats.tensor_grad_pre = tensor_pre
            stats.tensor_grad_post = tensor_norms(grads) if clipped else tensor_pre

        with torch.no_grad():
            before = self._before  # to restore frozen or failing members
            before.copy_(flat)
            for _, _, optimizer in self.optimizers:
                optimizer.step()
            if diagnose:
                stats.tensor_param = tensor_norms(self.params)
                stats.tensor_update = tensor_norms(list((flat - before).split(self._sizes, 1)))
            # CPU fast path (a host check is free there): every member alive, with a finite loss
            # and gradient norm, and finite parameters after the step (a finite sum has only finite
            # terms; a sum that overflows takes the exact path below)
            if (
                self._on_cpu
                and bool(self.health.alive.all())
                and math.isfinite(stats.loss.sum() + norm_pre.sum() + flat.sum())
            ):
                return stats
            # otherwise (and always on a GPU, so the host is never asked): restore every member
            # that may not change, on the device, and mark the new divergences
            loss_ok = torch.isfinite(stats.loss)
            grad_ok = torch.isfinite(norm_pre)
            ok = self.health.alive & loss_ok & grad_ok  # [P] members allowed to update
            stats.param_finite_after = self._params_finite()
            keep = ok & stats.param_finite_after.all(0)
            flat.copy_(torch.where(keep.unsqueeze(1), flat, before))
            cause = torch.where(~loss_ok, 1, torch.where(~grad_ok, 2, 3))
            stats.newly_diverged = self.health.mark(keep | ~self.health.alive, cause, env_step)
        return stats


def _tensors(value: Any) -> bool:
    """Whether ``value`` is one of an optimizer's slots: a non-empty list of tensors."""
    return isinstance(value, list) and bool(value) and all(isinstance(v, torch.Tensor) for v in value)


def _row(value: Any, row: int) -> Any:
    """A run's optimizer state value as one member's: row ``row`` of each state tensor (a 0-dim count
    is the run's, as it is); hyperparameters and flags as they are."""
    return [v if v.dim() == 0 else v[row] for v in value] if _tensors(value) else value


def _stacked(members: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's optimizer state from its members' entries (``_row``'s inverse): each state tensor's
    rows stacked, the rest as the run's first member holds it."""
    state = dict(members[0])
    for name, value in members[0].items():
        if _tensors(value):
            rows = zip(*(m[name] for m in members))  # per state tensor: its rows, one per member
            state[name] = [v if v.dim() == 0 else torch.stack(list(r)) for v, r in zip(value, rows)]
    return state


class PlainPipeline(GradientPipeline):
    """``GradientPipeline``'s plain twin (the run's ``fast_paths=false``): the same steps, per member, in
    the simplest torch form.

    Each parameter keeps its own storage and its own gradient (autograd adds into it); each run of
    members' configs steps its rows of every parameter with torch.optim's own optimizer
    (``make_optimizer(..., fast_paths=False)``); the gradient norm is the norm of the per-tensor norms
    (as torch.nn.utils.clip_grad_norm_), clipping runs per tensor; every update checks each member's
    loss, gradient and parameters and restores the members that may not change, tensor by tensor.
    """

    fast_paths = False

    def _store(self, params: list[torch.Tensor]) -> None:
        """Give each parameter a zero gradient of its own (backward then adds into it in place)."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self._index = {id(p): i for i, p in enumerate(params)}  # id(parameter) -> its place in params
        self._before = [torch.empty_like(p) for p in params]  # the parameters before a step

    def _rows(self, a: int, b: int) -> list[torch.Tensor]:
        """What the optimizer of members [a, b) steps: the parameters, or views of their rows [a, b)
        with their gradients' rows."""
        if (a, b) == (0, self.params[0].shape[0]):
            return list(self.params)
        rows = []
        for p in self.params:
            row = p.detach()[a:b]
            row.grad = p.grad[a:b]
            rows.append(row)
        return rows

    def _zero_grads(self) -> None:
        for g in self.grads:
            g.zero_()

    @torch.no_grad()
    def reset_state(self, param: torch.Tensor, member: int, index: tuple = ()) -> None:
        i = self._index[id(param)]
        for a, b, optimizer in self.optimizers:
            if a <= member < b:
                for state, initial in optimizer.param_state(i):
                    state[member - a][index] = initial

    def step(
        self, loss: torch.Tensor, env_step: int, diagnose: bool = False, written_backward: bool = False
    ) -> UpdateStats:
        """``GradientPipeline.step``, tensor by tensor."""
        params, grads, before = self.params, self.grads, self._before
        loss = self._backward(loss, env_step, written_backward)
        with torch.no_grad():
            tensor_pre = tensor_norms(grads)  # [T, P]
            norm_pre = joint_norms(tensor_pre)  # [P] each member's (float64)
            for a, b, config in self.clippers:
                CLIPPERS[config.name]([p[a:b] for p in params], [g[a:b] for g in grads], config, norm_pre[a:b])
            tensor_post = tensor_norms(grads) if self.clipped else tensor_pre
            norm_post = joint_norms(tensor_post) if self.clipped else norm_pre
            stats = UpdateStats(loss.detach(), norm_pre, norm_post)
            if diagnose:
                stats.tensor_grad_pre, stats.tensor_grad_post = tensor_pre, tensor_post
            for saved, p in zip(before, params):
                saved.copy_(p)
            for _, _, optimizer in self.optimizers:
                optimizer.step()
            if diagnose:
                stats.tensor_param = tensor_norms(params)
                stats.tensor_update = tensor_norms([p - saved for p, saved in zip(params, before)])
            loss_ok = torch.isfinite(stats.loss)
            grad_ok = torch.isfinite(norm_pre)
            ok = self.health.alive & loss_ok & grad_ok  # [P] members allowed to update
            stats.param_finite_after = self._params_finite()
            keep = ok & stats.param_finite_after.all(0)  # [P]
            for saved, p in zip(before, params):
                p.copy_(torch.where(_member_view(keep, p), p, saved))
            cause = torch.where(~loss_ok, 1, torch.where(~grad_ok, 2, 3))
            stats.newly_diverged = self.health.mark(keep | ~self.health.alive, cause, env_step)
        return stats


def gradient_pipeline(
    params: list[torch.Tensor],
    optimizer: OptimizerConfig | list[OptimizerConfig],
    clipping: ClippingConfig | list[ClippingConfig],
    regularization: RegularizationConfig | list[RegularizationConfig],
    weights: list[torch.Tensor],
    health: Health,
    fast_paths: bool = True,
) -> GradientPipeline:
    """The pipeline for ``params`` (``GradientPipeline``'s arguments): the flat one, or ``PlainPipeline``
    when the run's ``fast_paths`` is off."""
    kind = GradientPipeline if fast_paths else PlainPipeline
    return kind(params, optimizer, clipping, regularization, weights, health)
