"""The plugin: ``register(plugin)`` adds an activation, a normalization, an environment option, an
instrument and an algorithm to rlexp's registries (rlexp calls it: the entry point in pyproject.toml, or
``plugins=[rlexp_plugin_example.plugin]``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlexp.algos import CONTEXT_KEYS, AlgoSpec, Replay
from rlexp.compose.plugins import Plugin
from rlexp.config.schema import ActivationConfig, EnvConfig, NormalizationConfig
from rlexp.data.buffers import ReplayBuffer
from rlexp.nn.activations import Activation
from rlexp.nn.nets import Normalization, PopLayerNorm, PopLinear, PopWeightNormLinear
from rlexp_plugin_example import expected_sarsa


def softplus_backward(g: torch.Tensor, h: torch.Tensor, y: torch.Tensor, cfg: ActivationConfig) -> torch.Tensor:
    """softplus's derivative as autograd computes it (ATen's kernel): bit for bit autograd's."""
    return torch.ops.aten.softplus_backward(g, h, 1.0, 20.0)


def weight_norm_linear(cfg: NormalizationConfig, members: int, n_in: int, n_out: int, output: bool) -> PopLinear:
    """Weight-normalized hidden layers; the output layer too when ``normalization.output_layer``."""
    if output and not cfg.output_layer:
        return PopLinear(members, n_in, n_out)
    return PopWeightNormLinear(members, n_in, n_out, cfg.eps, cfg.g_init)


def register(plugin: Plugin) -> None:
    """rlexp's plugin hook: every option this package adds."""
    plugin.add(
        "activation",
        "softplus",
        Activation(ActivationConfig, lambda cfg: F.softplus, lambda cfg: 1.0, backward=softplus_backward),
        "softplus: log(1 + e^x), a smooth ReLU",
        reference=lambda x: torch.log(1.0 + torch.exp(x)),
    )
    plugin.add(
        "normalization",
        "layer_weight",
        Normalization(
            NormalizationConfig,
            linear=weight_norm_linear,
            norm=lambda cfg, members, width: PopLayerNorm(members, width, cfg.eps),
        ),
        "weight-normalized linear layers, each hidden one followed by LayerNorm",
    )
    corridor = EnvConfig(id="rlexp_plugin_example.envs:Corridor-v0")
    plugin.add("env", "corridor", corridor, "a corridor of 8 cells to walk")
    plugin.instrument("act_absmax", lambda units: units.abs().amax((1, 2)))
    sarsa = AlgoSpec(
        expected_sarsa.train,
        expected_sarsa.build,
        expected_sarsa.ExpectedSarsaConfig,
        ("discrete",),
        expected_sarsa.check,
        networks=1,
        replay=Replay(ReplayBuffer, "index"),
        roles=(),
        recurrent=False,
        member_keys=CONTEXT_KEYS + expected_sarsa.MEMBER_KEYS,
    )
    keys = {"optimizer": {"lr": 1e-3}}  # as an algo yaml sets other groups' keys
    plugin.add(
        "algo", "expected_sarsa", sarsa, "expected SARSA: DQN's target is an epsilon-greedy policy's value", keys=keys
    )
