"""Recurrent population networks (``network=lstm``): encoder -> LSTM(cell_size) -> the MLP head.

``PopLSTM`` holds per-member weights (weight_ih [P, 4H, in], weight_hh [P, 4H, H], bias_ih and
bias_hh [P, 4H]; gates in torch's order i, f, g, o) and runs each time step as two batched matmuls
over the members, the arithmetic of ``torch.nn.LSTM`` on the CPU:

    gates = (h W_hh^T + b_hh) + (x W_ih^T + b_ih);  i, f, o = sigmoid(.), g = tanh(.)
    c' = f c + i g;  h' = o tanh(c')

``RecurrentNet`` composes the encoder's hidden blocks (the normalization's linear layer, its norm,
the activation), the LSTM and a ``PopMLP`` head over the LSTM's output, every group applying to the
encoder and the head; the LSTM's weights are drawn by the init group's scheme (gain ``init.gain``,
else 1: its gates are sigmoid and tanh) and its biases as the init group's. To instruments and
divergence location it looks as a PopMLP does: ``layers`` (the encoder's linear layers, the LSTM, the
head's linear layers), ``norms`` keyed by layer index, and an observer that sees the LSTM's output
as stage ``lstm`` and as its layer's ``hidden`` output.

A forward over a batch [P, B, in] runs one step from a zero state, unless ``unroll(state, starts)``
gives it sequences: then B = T * N rows, time-major (row t * N + n), unrolled from the state
[P, N, 2, H] (h, c), which is zeroed before step t of sequence n where ``starts`` [P, T, N] is set.
``step`` carries the state across acting steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlexp.config.schema import ActivationConfig, InitConfig, NetworkConfig, NormalizationConfig
from rlexp.nn.activations import ACTIVATIONS, PopActivation
from rlexp.nn.component import Component, PopNetwork
from rlexp.nn.init import init_linear, scheme_gain
from rlexp.nn.nets import NORMALIZATIONS, Observer, PopMLP


@dataclasses.dataclass
class Sequences:
    """What an unrolled forward starts from: state [P, N, 2, H] (h, c) and starts [P, T, N] (bool)."""

    state: torch.Tensor
    starts: torch.Tensor


class PopLSTM(Component):
    """A population LSTM layer: x [P, B, in] -> h [P, B, H] (see the module docstring)."""

    stage = "lstm"

    def __init__(self, members: int, n_in: int, cell: int) -> None:
        super().__init__()
        self.cell = cell
        self.weight_ih = nn.Parameter(torch.empty(members, 4 * cell, n_in))
        self.weight_hh = nn.Parameter(torch.empty(members, 4 * cell, cell))
        self.bias_ih = nn.Parameter(torch.zeros(members, 4 * cell))
        self.bias_hh = nn.Parameter(torch.zeros(members, 4 * cell))
        self.sequences: Sequences | None = None  # set by RecurrentNet.unroll

    @property
    def weight(self) -> torch.Tensor:
        """The input weights [P, 4H, in] (what a caller reading a layer's ``weight`` needs: device, P)."""
        return self.weight_ih

    def weights(self) -> list[torch.Tensor]:
        """The weight matrices (regularization's ``weights_only``)."""
        return [self.weight_ih, self.weight_hh]

    def reset_parameters(self, init: InitConfig, generators: list[torch.Generator]) -> None:
        """Both weight matrices by the init scheme (gain ``init.gain``, else 1), the biases as the init group's."""
        gain = getattr(init, "gain", None) or 1.0
        init_linear(self.weight_ih, self.bias_ih, init, gain, generators)
        init_linear(self.weight_hh, self.bias_hh, init, gain, generators)

    def effective_weight(self) -> torch.Tensor:
        return torch.cat([self.weight_ih, self.weight_hh], -1)  # [P, 4H, in + H]

    def weight_problem(self, member: int) -> tuple[str, str] | None:
        return None

    def instruments(self) -> dict[str, torch.Tensor]:
        return {}

    def cell_step(self, gi: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step from the input's projection gi [P, N, 4H] and the state h, c [P, N, H] -> (h', c')."""
        gates = torch.baddbmm(self.bias_hh.unsqueeze(1), h, self.weight_hh.mT) + gi
        i, f, g, o = gates.chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        members, rows, _ = x.shape
        gi = torch.baddbmm(self.bias_ih.unsqueeze(1), x, self.weight_ih.mT)  # [P, B, 4H] every step at once
        seq = self.sequences
        if seq is None:  # one step from a zero state
            zero = x.new_zeros(members, rows, self.cell)
            return self.cell_step(gi, zero, zero)[0]
        n = seq.state.shape[1]
        gi = gi.view(members, rows // n, n, -1)  # [P, T, N, 4H]
        h, c = seq.state.unbind(2)  # [P, N, H]
        out = []
        for t in range(gi.shape[1]):
            keep = ~seq.starts[:, t, :, None]  # [P, N, 1]
            h, c = self.cell_step(gi[:, t], torch.where(keep, h, 0.0), torch.where(keep, c, 0.0))
            out.append(h)
        return torch.stack(out, 1).view(members, rows, self.cell)

    def step(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """One acting step: x [P, N, in], state [P, N, 2, H] -> the next state [P, N, 2, H]."""
        gi = torch.baddbmm(self.bias_ih.unsqueeze(1), x, self.weight_ih.mT)
        return torch.stack(self.cell_step(gi, *state.unbind(2)), 2)


class RecurrentNet(PopNetwork):
    """Population recurrent network [P, B, n_in] -> [P, B, n_out] (see the module docstring)."""

    def __init__(
        self,
        members: int,
        n_in: int,
        n_out: int,
        network: NetworkConfig,
        activation: ActivationConfig,
        normalization: NormalizationConfig,
        init: InitConfig,
        generators: list[torch.Generator],
        extra_in: int = 0,
        extra_at: int = 0,
        observation_space: gym.Space | None = None,  # NETWORKS' common arguments: vector observations only
    ) -> None:
        super().__init__()
        assert extra_in == 0, "network=lstm takes no second input (ppo and a2c only)"
        entry, activation_entry = NORMALIZATIONS[normalization.name], ACTIVATIONS[activation.name]
        gain = scheme_gain(init, activation)
        self.layers = nn.ModuleList()
        self.norms = nn.ModuleDict()  # keyed by the layer index, as a PopMLP's
        self.activations = nn.ModuleList()
        self.encoder: list[list[Component]] = []
        width = n_in
        for i, b in enumerate(network.encoder):
            layer = entry.linear(normalization, members, width, b, False)
            layer.reset_parameters(init, gain, generators, last=False)
            self.layers.append(layer)
            block: list[Component] = [layer]
            if entry.norm is not None:
                self.norms[str(i)] = entry.norm(normalization, members, b)
                block.append(self.norms[str(i)])
            self.activations.append(PopActivation(activation_entry, activation))
            block.append(self.activations[-1])
            self.encoder.append(block)
            width = b * activation_entry.width
        self.lstm = PopLSTM(members, width, network.cell_size)
        self.lstm.reset_parameters(init, generators)
        self.layers.append(self.lstm)
        self.offset = len(self.layers)  # the head's layer 0 is layer ``offset`` here
        head = PopMLP(members, network.cell_size, n_out, network, activation, normalization, init, generators)
        for layer in head.layers:
            self.layers.append(layer)
        for j, norm in enumerate(head.norms):
            self.norms[str(self.offset + j)] = norm
        for act in head.activations:
            self.activations.append(act)
        object.__setattr__(self, "head", head)  # its modules are registered above, under the layer indices
        self.activation = activation
        self.uses_batch_stats = head.uses_batch_stats or any(c.uses_batch_stats for b in self.encoder for c in b)
        self.mode_dependent = head.mode_dependent or any(c.mode_dependent for b in self.encoder for c in b)

    @contextlib.contextmanager
    def unroll(self, state: torch.Tensor, starts: torch.Tensor) -> Iterator[None]:
        """Within it, a forward over [P, T * N, in] (time-major) unrolls N sequences of T steps from
        ``state`` [P, N, 2, H], zeroing it before the steps where ``starts`` [P, T, N] (bool) is set."""
        self.lstm.sequences = Sequences(state, starts)
        try:
            yield
        finally:
            self.lstm.sequences = None

    def initial_state(self, n: int) -> torch.Tensor:
        """A zero state for n sequences: [P, n, 2, H]."""
        weight = self.lstm.weight_ih
        return weight.new_zeros(weight.shape[0], n, 2, self.lstm.cell)

    def _encode(self, x: torch.Tensor, observe: Observer | None = None) -> torch.Tensor:
        for i, block in enumerate(self.encoder):
            if observe is not None:
                observe(i, "input", x)
            for component in block:
                x = component.forward(x)  # [P, B, H]
                if observe is not None:
                    observe(i, component.stage, x)
            if observe is not None:
                observe(i, "hidden", x)
        return x

    def forward(
        self, x: torch.Tensor, extra: torch.Tensor | None = None, observe: Observer | None = None
    ) -> torch.Tensor:
        """x [P, B, n_in] -> [P, B, n_out]; ``observe(layer, stage, value)`` sees every layer's input and
        every component's output, the LSTM's as stage ``lstm`` and ``hidden`` of its layer."""
        x = self._encode(x, observe)
        i = self.offset - 1
        if observe is not None:
            observe(i, "input", x)
        x = self.lstm(x)  # [P, B, H]
        if observe is not None:
            observe(i, "lstm", x)
            observe(i, "hidden", x)
        head_observe = None if observe is None else lambda j, stage, v: observe(self.offset + j, stage, v)
        return self.head(x, observe=head_observe)

    def step(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """One acting step without gradient: x [P, N, n_in] -> the output [P, N, n_out]; ``state``
        [P, N, 2, H] is advanced in place."""
        with torch.no_grad():
            new = self.lstm.step(self._encode(x), state)
            state.copy_(new)
            return self.head(new[:, :, 0])

    def peek(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """``step``'s output without advancing ``state`` (a bootstrap value at a rollout's end)."""
        with torch.no_grad():
            return self.head(self.lstm.step(self._encode(x), state)[:, :, 0])


def reset_state_(state: torch.Tensor, starts: torch.Tensor) -> None:
    """Zero, in place, the states [P, N, 2, H] of the sequences where ``starts`` [P, N] (bool) is set."""
    state.masked_fill_(starts[:, :, None, None], 0.0)


def take_sequences(x: torch.Tensor, envs: torch.Tensor, steps: int) -> torch.Tensor:
    """The sequences ``envs`` [P, n] (each member its own) of x [P, T * E, ...] (time-major rows)
    -> [P, T * n, ...] time-major."""
    members, rows = x.shape[:2]
    tail = x.shape[2:]
    x = x.reshape(members, steps, rows // steps, *tail)  # [P, T, E, ...]
    index = envs[:, None, :].reshape(members, 1, -1, *([1] * len(tail))).expand(members, steps, -1, *tail)
    return torch.gather(x, 2, index).reshape(members, -1, *tail)


def mc_returns(rewards: torch.Tensor, dones: torch.Tensor, gamma: float | torch.Tensor) -> torch.Tensor:
    """Monte-Carlo discounted returns [T, P, E]: R_t = r_t + gamma (1 - done_t) R_t+1, with nothing
    after the rollout's last step (no value bootstraps them, as the seed critic's targets); ``gamma`` a
    float, or float64 [P, 1] one per member (rounded to float32 as a float is)."""
    if isinstance(gamma, torch.Tensor):
        gamma = gamma.float()
    returns = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):
        last = rewards[t] + gamma * (1.0 - dones[t]) * last
        returns[t] = last
    return returns


class RolloutMemory:
    """The hidden states of a recurrent actor-critic's rollouts (``ppo``, ``a2c`` with network=lstm).

    Acting carries each network's state [P, E, 2, H] across steps (``stepper``), zeroed before an
    observation that starts an episode (the first, and each after a step that ended one); ``starts``
    [T, P, E] records those flags and ``initial`` each network's state at the rollout's first step, from
    which the update unrolls the rollout again (truncated BPTT).
    """

    def __init__(self, nets: dict[str, RecurrentNet], steps: int, envs: int) -> None:
        self.nets = nets
        self.state = {name: net.initial_state(envs) for name, net in nets.items()}  # [P, E, 2, H] acting
        self.initial = {name: s.clone() for name, s in self.state.items()}  # at the rollout's first step
        members = next(iter(self.state.values())).shape[0]
        self.starts = np.zeros((steps, members, envs), dtype=bool)  # [T, P, E]
        self.starting = np.ones((members, envs), dtype=bool)  # [P, E] the next observation starts an episode

    def begin(self, t: int) -> None:
        """Before acting at rollout step t: record and apply the start flags (and keep the states at t = 0)."""
        self.starts[t] = self.starting
        starting = torch.from_numpy(self.starting).to(next(iter(self.state.values())).device)
        for name, state in self.state.items():
            reset_state_(state, starting)
            if t == 0:
                self.initial[name].copy_(state)

    def end(self, done: np.ndarray) -> None:
        """After the environments stepped: where ``done`` [P, E], the next observation starts an episode."""
        self.starting[...] = done

    def stepper(self, name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        """Acting's forward of network ``name``: x [P, E, in] -> [P, E, out], advancing its state."""
        net, state = self.nets[name], self.state[name]
        return lambda x: net.step(x, state)

    def peek(self, name: str, x: torch.Tensor, carry_on: bool = False) -> torch.Tensor:
        """Network ``name``'s output for the next observations x [P, E, in], its state left as it is (the
        bootstrap value after the rollout); ``carry_on``: x continues this step's episodes (a truncated
        episode's final observation), so no state starts anew."""
        state = self.state[name].clone()
        if not carry_on:
            reset_state_(state, torch.from_numpy(self.starting).to(state.device))
        return self.nets[name].peek(x, state)

    def unroll(self, envs: torch.Tensor) -> contextlib.ExitStack:
        """Every network unrolls the rollout's sequences of environments ``envs`` [P, n] within it."""
        stack = contextlib.ExitStack()
        starts = torch.from_numpy(self.starts).to(envs.device).permute(1, 0, 2)  # [P, T, E]
        starts = torch.gather(starts, 2, envs[:, None, :].expand(-1, starts.shape[1], -1))  # [P, T, n]
        for name, net in self.nets.items():
            index = envs[:, :, None, None].expand(-1, -1, *self.initial[name].shape[2:])
            stack.enter_context(net.unroll(torch.gather(self.initial[name], 1, index), starts))
        return stack

    def checkpoint(self) -> dict[str, object]:
        """The loop variables a checkpoint keeps, [P, ...] each (views, restored in place)."""
        return (
            {f"memory_{name}": s for name, s in self.state.items()}
            | {f"memory_initial_{name}": s for name, s in self.initial.items()}
            | {"memory_starts": self.starts.swapaxes(0, 1), "memory_starting": self.starting}
        )


def recurrent_policy(net: RecurrentNet) -> Callable[[torch.Tensor], torch.Tensor]:
    """Evaluation's forward of ``net``: x [P, N, in] -> [P, N, out] with a state of its own, zero at the
    first call after ``reset()`` (the evaluator resets it before each evaluation's episodes)."""
    state: list[torch.Tensor] = []

    def forward(x: torch.Tensor) -> torch.Tensor:
        if not state:
            state.append(net.initial_state(x.shape[1]))
        return net.step(x, state[0])

    forward.reset = state.clear  # type: ignore[attr-defined]
    return forward
