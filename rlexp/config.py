"""Structured-config schemas: one dataclass per config-group option.

Every yaml file in ``conf/<group>/<option>.yaml`` names its schema in its defaults list
(``/schema/<group>/<option>@_here_``), so Hydra itself refuses an unknown key or a value of the
wrong type with a message that names the key. Value checks (lr > 0, ...) live in ``rlexp.build``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.errors import CompactHydraException
from omegaconf import MISSING


class ConfigError(CompactHydraException):
    """A bad config value. Hydra prints its message as one line (no traceback) and exits non-zero."""

    def __init__(self, key: str, problem: str, fix: str) -> None:
        super().__init__(f"config error: {key}: {problem}; {fix}")
        self.key = key


# ---------------------------------------------------------------- activation
@dataclass
class ActivationConfig:
    name: str = MISSING


@dataclass
class LeakyReLUConfig(ActivationConfig):
    negative_slope: float = 0.01


@dataclass
class ELUConfig(ActivationConfig):
    alpha: float = 1.0


# ---------------------------------------------------------------- init
@dataclass
class InitConfig:
    name: str = MISSING
    bias: Optional[float] = 0.0  # constant for every bias; null = the scheme's own (default only)
    last_layer: str = "same"  # same | uniform
    last_layer_scale: float = 0.01  # uniform: output weight and bias ~ U(-scale, scale)
    last_layer_gain: Optional[float] = None  # same: gain of the output layer (null = scheme's own)


@dataclass
class GainInitConfig(InitConfig):
    gain: Optional[float] = None  # null = the gain of the chosen activation (xavier: 1.0)


# ---------------------------------------------------------------- normalization
@dataclass
class NormalizationConfig:
    name: str = MISSING
    power_iterations: int = 1  # spectral: power-iteration steps per training-mode forward


@dataclass
class LayerNormConfig(NormalizationConfig):
    eps: float = 1e-5


@dataclass
class BatchNormConfig(NormalizationConfig):
    eps: float = 1e-5
    momentum: float = 0.1  # running-statistics update rate, as torch.nn.BatchNorm1d


@dataclass
class WeightNormConfig(NormalizationConfig):
    eps: float = 1e-8  # added inside the square root of ||v||^2; 0 = the unguarded division
    g_init: float = 1.0
    output_layer: bool = True  # the output layer is weight-normalized too (as the seed critic)


# ---------------------------------------------------------------- clipping
@dataclass
class ClippingConfig:
    name: str = MISSING


@dataclass
class NormClipConfig(ClippingConfig):
    max_norm: float = 1.0


@dataclass
class ValueClipConfig(ClippingConfig):
    clip_value: float = 1.0


@dataclass
class AGCConfig(ClippingConfig):
    clip_factor: float = 0.01  # lambda: max ||G_i|| / max(||W_i||, eps)
    eps: float = 1e-3


# ---------------------------------------------------------------- optimizer
@dataclass
class OptimizerConfig:
    name: str = MISSING
    lr: float = 1e-3
    weight_decay: float = 0.0


@dataclass
class AdamConfig(OptimizerConfig):
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8


@dataclass
class RMSpropConfig(OptimizerConfig):
    alpha: float = 0.99
    eps: float = 1e-8
    momentum: float = 0.0
    centered: bool = False


@dataclass
class RMSpropTFConfig(OptimizerConfig):
    decay: float = 0.9
    momentum: float = 0.0
    epsilon: float = 1e-10


@dataclass
class SGDConfig(OptimizerConfig):
    momentum: float = 0.0
    nesterov: bool = False


# ---------------------------------------------------------------- network, regularization
@dataclass
class NetworkConfig:
    name: str = MISSING
    hidden: List[int] = field(default_factory=lambda: [64, 64])
    residual: bool = False  # hidden layers of equal width become x + act(norm(fc(x)))
    output_scale: float = 1.0  # the output layer's result is multiplied by this
    linear_last_hidden: bool = False  # the last hidden layer has no activation (the seed critic's "32 (linear)")


@dataclass
class RegularizationConfig:
    l1: float = 0.0  # loss += l1 * sum |w|, per member
    l2: float = 0.0  # loss += l2 * sum w^2, per member
    weights_only: bool = True  # false: biases, gains and norm parameters too


# ---------------------------------------------------------------- algo, env
@dataclass
class AlgoConfig:
    name: str = MISSING


@dataclass
class DQNConfig(AlgoConfig):
    buffer_size: int = 100_000  # transitions per member
    batch_size: int = 128
    gamma: float = 0.99
    learning_starts: int = 1_000  # env steps per member before the first update
    train_frequency: int = 16  # env steps between update phases
    gradient_steps: int = 4  # updates per phase
    start_e: float = 1.0
    end_e: float = 0.04
    exploration_fraction: float = 0.16  # of total_steps, for the linear epsilon decay
    target_network: bool = True  # false: bootstrap from the online network (DQN 3.0 target_q off)
    target_update: str = "hard"  # hard | soft
    target_update_period: int = 16  # env steps between hard copies
    tau: float = 0.005  # soft: target <- (1 - tau) target + tau online, every update
    double: bool = False
    loss: str = "mse"  # mse | huber
    huber_delta: float = 1.0
    clip_delta: float = 0.0  # > 0: the TD error reaching Q(s,a) is clipped to +-clip_delta
    rescale_r: bool = False  # divide rewards by r_max (max |r| seen so far, at least r_max)
    r_max: float = 1.0
    terminal_masking: bool = True  # false: bootstrap through terminations too


@dataclass
class ActorCriticConfig(AlgoConfig):
    """PPO and A2C (A2C = one epoch over one minibatch, where the clipped ratio is always 1)."""

    num_steps: int = 128  # env steps per environment between updates (the rollout length)
    gamma: float = 0.99
    gae_lambda: float = 0.95  # 1.0 = discounted returns bootstrapped at the rollout's end
    update_epochs: int = 4
    num_minibatches: int = 4
    clip_coef: float = 0.2  # surrogate clipping: ratio kept in [1 - clip, 1 + clip]
    clip_vloss: bool = True  # value loss clipped around the old values by clip_coef
    norm_adv: bool = True  # advantages normalized per minibatch (per member)
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    anneal_lr: bool = True  # learning rate decays linearly to 0 ...
    anneal_steps: Optional[int] = None  # ... over this many env steps per member (null = total_steps)


@dataclass
class TD3Config(AlgoConfig):
    """DDPG and TD3 (DDPG = one critic, no target smoothing, actor updated every step)."""

    buffer_size: int = 200_000  # transitions per member
    batch_size: int = 256
    gamma: float = 0.98
    learning_starts: int = 10_000  # env steps per member of uniform random actions before learning
    train_frequency: int = 1  # env steps between update phases
    gradient_steps: int = 1  # critic updates per phase
    tau: float = 0.005  # EMA target update: target <- (1 - tau) target + tau online (0.001 = the seed's DDPG)
    exploration_noise: float = 0.1  # Gaussian action noise std, as a fraction of the half action range
    twin: bool = True  # TD3: two critics, the target takes their minimum
    policy_delay: int = 2  # TD3: actor and target updates every policy_delay critic updates
    target_noise: float = 0.2  # TD3 target policy smoothing std (fraction of the half range); 0 = off
    target_noise_clip: float = 0.5  # ... clipped to +- this (fraction of the half range)


@dataclass
class NetOverrideConfig:
    """One network of an actor-critic algorithm; every null field falls back to the shared group."""

    activation: Optional[str] = None  # an option of the activation group, with its default parameters
    init: Optional[str] = None  # an option of the init group
    normalization: Optional[str] = None  # an option of the normalization group
    hidden: Optional[List[int]] = None  # network.hidden
    linear_last_hidden: Optional[bool] = None  # network.linear_last_hidden
    last_layer_gain: Optional[float] = None  # the output layer's init gain (init.last_layer_gain)


@dataclass
class CriticConfig(NetOverrideConfig):
    action_layer: int = 0  # DDPG/TD3: the action joins the input (0) or the k-th hidden layer's output (k)


@dataclass
class ObsNormConfig:
    enabled: bool = False  # (x - mean) / (std + 1e-8) with running statistics per member
    clip: float = 10.0  # normalized observations are clipped to +- clip


@dataclass
class RewardNormConfig:
    enabled: bool = False  # rewards divided by the running std of the discounted return, per member
    clip: float = 10.0  # scaled rewards are clipped to +- clip


@dataclass
class EnvConfig:
    id: str = MISSING
    num_envs: int = 1  # environments per member
    max_episode_steps: Optional[int] = None
    kwargs: Dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- instruments, divergence, debugging
@dataclass
class DiagnosticsConfig:
    every: int = 50  # updates between instrument records (per-layer statistics); 0 = off
    histogram_every: int = 1_000  # updates between W&B histograms of gradients and activations; 0 = off
    dormant_tau: float = 0.025  # a unit is tau-dormant when E|h_i| / mean_k E|h_k| <= tau


@dataclass
class DivergenceConfig:
    name: str = MISSING
    q_bound_factor: float = 100.0  # value_explosion: |Q| > factor * r_max / (1 - gamma) ...
    grad_norm_bound: float = 1.0e6  # grad_explosion: a member's gradient norm > this ...
    patience: int = 3  # ... on this many consecutive instrument records


@dataclass
class InjectConfig:
    member: int = -1  # the member to poison (-1 = none)
    step: int = -1  # env step at (or first update at/after) which to poison it
    what: str = "none"  # none | param | grad | obs


@dataclass
class DebugConfig:
    inject: InjectConfig = field(default_factory=InjectConfig)
    crash_at_step: int = -1  # raise a RuntimeError at this env step: tests failure isolation (-1 = never)


# ---------------------------------------------------------------- logging, top level
@dataclass
class LoggerConfig:
    mode: Optional[str] = None  # offline | online | disabled; null = $WANDB_MODE, else offline
    project: str = "rlexp"
    entity: Optional[str] = None
    log_every: int = 1_000  # env steps per member between log records
    progress: str = "auto"  # auto | rich | plain | off
    init_timeout: float = 20.0  # seconds an online W&B run may wait for the server


@dataclass
class Config:
    activation: ActivationConfig = MISSING
    init: InitConfig = MISSING
    normalization: NormalizationConfig = MISSING
    clipping: ClippingConfig = MISSING
    optimizer: OptimizerConfig = MISSING
    network: NetworkConfig = MISSING
    algo: AlgoConfig = MISSING
    env: EnvConfig = MISSING
    divergence: DivergenceConfig = MISSING
    regularization: RegularizationConfig = field(default_factory=RegularizationConfig)
    actor: NetOverrideConfig = field(default_factory=lambda: NetOverrideConfig(last_layer_gain=0.01))
    critic: CriticConfig = field(default_factory=lambda: CriticConfig(last_layer_gain=1.0))
    obs_norm: ObsNormConfig = field(default_factory=ObsNormConfig)
    reward_norm: RewardNormConfig = field(default_factory=RewardNormConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    total_steps: int = 50_000  # environment steps per member
    seed: int = 0  # member k uses seed + k
    num_seeds: int = 1  # population size P
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 1  # torch intra-op threads; 0 = leave torch's default; -1 = by population size
    resume: bool = False  # skip jobs whose dir holds a finished job (else starting there is refused)


SCHEMAS: Dict[str, Dict[str, type]] = {
    "activation": {
        "relu": ActivationConfig,
        "leaky_relu": LeakyReLUConfig,
        "elu": ELUConfig,
        "gelu": ActivationConfig,
        "silu": ActivationConfig,
        "tanh": ActivationConfig,
        "softsign": ActivationConfig,
        "sigmoid": ActivationConfig,
        "mish": ActivationConfig,
    },
    "init": {
        "default": InitConfig,
        "xavier": GainInitConfig,
        "xavier_uniform": GainInitConfig,
        "xavier_normal": GainInitConfig,
        "he": GainInitConfig,
        "he_uniform": GainInitConfig,
        "he_normal": GainInitConfig,
        "orthogonal": GainInitConfig,
        "lecun": InitConfig,
    },
    "normalization": {
        "none": NormalizationConfig,
        "layer": LayerNormConfig,
        "batch": BatchNormConfig,
        "weight": WeightNormConfig,
        "rms": LayerNormConfig,
        "spectral": NormalizationConfig,
    },
    "clipping": {
        "none": ClippingConfig,
        "global_norm": NormClipConfig,
        "per_tensor": NormClipConfig,
        "value": ValueClipConfig,
        "agc": AGCConfig,
    },
    "optimizer": {
        "adam": AdamConfig,
        "adamw": AdamConfig,
        "rmsprop": RMSpropConfig,
        "rmsprop_tf": RMSpropTFConfig,
        "sgd": SGDConfig,
    },
    "network": {"mlp": NetworkConfig},
    "algo": {"dqn": DQNConfig, "ppo": ActorCriticConfig, "a2c": ActorCriticConfig, "ddpg": TD3Config,
             "td3": TD3Config},
    "env": {"base": EnvConfig},
    "divergence": {"on": DivergenceConfig, "off": DivergenceConfig},
}


def register_configs() -> None:
    """Store the top-level schema and every option's schema in Hydra's ConfigStore."""
    cs = ConfigStore.instance()
    cs.store(name="schema", node=Config)
    for group, options in SCHEMAS.items():
        for option, schema in options.items():
            cs.store(group=f"schema/{group}", name=option, node=schema)


register_configs()
