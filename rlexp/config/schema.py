"""Structured-config schemas: the dataclasses behind every config group, and the one list of
keys that do not define a grid cell.

Every option schema of a group carries the union of the group's keys, so a preset that sets one
option's keys never locks its group: options differ only in default values (a subclass changes
the defaults where an option's differ), and a key an option does not read is ignored. Each field's
``help`` says what it does and which options read it; ``rlexp.compose.config_doc`` turns them into
``docs/configuration.md`` and the ``--help`` text. Each default is written here once; the yamls
in ``conf/`` name their schema and option. Value checks live beside each registry (``rlexp.compose.validate``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hydra.errors import CompactHydraException
from omegaconf import MISSING

# Seeds make the members of a cell; the other keys pick the machine, the console or what is stored. Left out of a
# job's cell (rlexp.config.cells: the report's cell and the W&B group; Hydra's override_dirname) and, all but
# SEED_KEYS and checkpoint.replay (a checkpoint holds the replay buffer or not), of the config a resumed job must match.
SEED_KEYS = ("seed", "num_seeds")
NON_CELL_KEYS = (
    *SEED_KEYS, "device", "threads", "resume", "logger.mode", "logger.progress", "logger.sweep",
    "checkpoint.every", "checkpoint.replay", "plugins",
)  # fmt: skip


def error_line(err: BaseException) -> str:
    """``<type>: <the first line of its message>`` of an error (its type alone repeated when it says nothing):
    how a one-line refusal quotes an error raised by someone else's code."""
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [type(err).__name__])[0]}"


class ConfigError(CompactHydraException):
    """A bad config value. Hydra prints its message as one line (no traceback) and exits non-zero."""

    def __init__(self, key: str, problem: str, fix: str) -> None:
        super().__init__(f"config error: {key}: {problem}; {fix}")
        self.key = key


def require(ok: bool, key: str, value: Any, rule: str) -> None:
    """Raise a ConfigError for ``key`` unless ``ok``: ``value`` is out of range, ``rule`` says what fits."""
    if not ok:
        raise ConfigError(key, f"{value!r} is out of range", f"set {key} to {rule}")


def require_choice(value: str, key: str, options: Iterable[str]) -> None:
    """Raise a ConfigError unless ``value`` is one of ``options``."""
    options = list(options)
    if value not in options:
        raise ConfigError(key, f"unknown value {value!r}", f"use one of: {', '.join(options)}")


def knob(default: Any, help: str) -> Any:
    """A dataclass field with its default and one line of meaning (``metadata['help']``)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"help": help})
    if callable(default):  # a nested schema
        return field(default_factory=default, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def field_help(schema: type, name: str) -> str:
    """The help of field ``name`` of ``schema``: its own, else the nearest base class's."""
    for cls in schema.__mro__:
        fields = getattr(cls, "__dataclass_fields__", {})
        if name in fields and fields[name].metadata.get("help"):
            return fields[name].metadata["help"]
    return ""


NAME_HELP = "the option (the yaml's name in its group)"


# ---------------------------------------------------------------- activation
@dataclass
class ActivationConfig:
    """Activation of every hidden layer."""

    name: str = knob(MISSING, NAME_HELP)
    negative_slope: float = knob(0.01, "leaky_relu: slope for x < 0")
    alpha: float = knob(1.0, "elu: alpha * (exp(x) - 1) for x < 0")


@dataclass
class LeakyReLUConfig(ActivationConfig):
    """leaky_relu: reads negative_slope."""


@dataclass
class ELUConfig(ActivationConfig):
    """elu: reads alpha."""


# ---------------------------------------------------------------- init
@dataclass
class InitConfig:
    """Weight and bias initialization of every linear layer."""

    name: str = knob(MISSING, NAME_HELP)
    gain: float | None = knob(
        None, "all but default, lecun: weight gain; null = 1 for xavier*, the activation's gain for he* and orthogonal"
    )
    bias: float | None = knob(0.0, "constant for every bias; null = the scheme's own (default only)")
    last_layer: str = knob("same", "output layer: same (the scheme) | uniform (U(+-last_layer_scale))")
    last_layer_scale: float = knob(0.01, "last_layer=uniform: output weight and bias ~ U(-scale, scale)")
    last_layer_gain: float | None = knob(None, "last_layer=same: gain of the output layer (null = the scheme's)")


@dataclass
class DefaultInitConfig(InitConfig):
    """default: PyTorch's own nn.Linear init, biases included."""

    bias: float | None = None


@dataclass
class GainInitConfig(InitConfig):
    """he, he_normal, he_uniform, orthogonal: the gain defaults to the activation's."""


@dataclass
class XavierInitConfig(GainInitConfig):
    """xavier, xavier_uniform, xavier_normal: gain 1."""

    gain: float | None = 1.0


# ---------------------------------------------------------------- normalization
@dataclass
class NormalizationConfig:
    """Normalization of every hidden layer (weight: of every linear layer)."""

    name: str = knob(MISSING, NAME_HELP)
    eps: float = knob(
        1e-5,
        "layer, batch: added to the variance; weight: inside the sqrt of ||v||^2 "
        "(0 = the unguarded division, every option)",
    )
    momentum: float = knob(0.1, "batch: running-statistics update rate, as torch.nn.BatchNorm1d")
    g_init: float = knob(1.0, "weight: initial gain g of w = g * v / ||v||")
    output_layer: bool = knob(True, "weight: the output layer is weight-normalized too (as the seed critic)")
    power_iterations: int = knob(1, "spectral: power iterations per forward for the largest singular value")


@dataclass
class LayerNormConfig(NormalizationConfig):
    """layer: LayerNorm per sample."""


@dataclass
class BatchNormConfig(NormalizationConfig):
    """batch: BatchNorm over each member's batch."""


@dataclass
class WeightNormConfig(NormalizationConfig):
    """weight: weight-normalized linear layers."""

    eps: float = 1e-8


# ---------------------------------------------------------------- clipping
@dataclass
class ClippingConfig:
    """Gradient clipping, per member."""

    name: str = knob(MISSING, NAME_HELP)
    max_norm: float = knob(1.0, "global_norm: bound of the joint L2 norm; per_tensor: of each tensor's")
    clip_value: float = knob(1.0, "value: every element clamped to +-clip_value")
    clip_factor: float = knob(0.01, "agc: lambda, max ||G_i|| / max(||W_i||, eps) per unit")
    eps: float = knob(1e-3, "agc: floor of the weight norm")


@dataclass
class NormClipConfig(ClippingConfig):
    """global_norm: reads max_norm."""


@dataclass
class PerTensorClipConfig(NormClipConfig):
    """per_tensor: max_norm 5 (TensorFlow's clip_by_norm as the seed critic used it)."""

    max_norm: float = 5.0


@dataclass
class ValueClipConfig(ClippingConfig):
    """value: reads clip_value."""


@dataclass
class AGCConfig(ClippingConfig):
    """agc: reads clip_factor and eps."""


# ---------------------------------------------------------------- optimizer
@dataclass
class OptimizerConfig:
    """The optimizer of every network (an algorithm sets lr: conf/algo)."""

    name: str = knob(MISSING, NAME_HELP)
    lr: float = knob(1e-3, "learning rate (the algorithm's yaml sets it for every optimizer)")
    weight_decay: float = knob(0.0, "L2 penalty in the gradient; adamw: decoupled decay")
    beta1: float = knob(0.9, "adam, adamw: first-moment decay")
    beta2: float = knob(0.999, "adam, adamw: second-moment decay")
    eps: float = knob(1e-8, "adam, adamw, rmsprop: added to the denominator's sqrt")
    alpha: float = knob(0.99, "rmsprop: squared-gradient average decay")
    centered: bool = knob(False, "rmsprop: divide by the gradient's variance estimate")
    decay: float = knob(0.9, "rmsprop_tf: squared-gradient average decay")
    epsilon: float = knob(1e-10, "rmsprop_tf: added inside the sqrt")
    momentum: float = knob(0.0, "rmsprop, rmsprop_tf, sgd: momentum")
    nesterov: bool = knob(False, "sgd: Nesterov momentum (needs momentum > 0)")


@dataclass
class AdamConfig(OptimizerConfig):
    """adam: reads beta1, beta2, eps."""


@dataclass
class AdamWConfig(AdamConfig):
    """adamw: Adam with decoupled weight decay 0.01."""

    weight_decay: float = 0.01


@dataclass
class RMSpropConfig(OptimizerConfig):
    """rmsprop: torch.optim.RMSprop; reads alpha, eps, momentum, centered."""


@dataclass
class RMSpropTFConfig(OptimizerConfig):
    """rmsprop_tf: tf.train.RMSPropOptimizer; reads decay, epsilon, momentum."""


@dataclass
class SGDConfig(OptimizerConfig):
    """sgd: lr 1e-2; reads momentum, nesterov."""

    lr: float = 1e-2


# ---------------------------------------------------------------- network, regularization
@dataclass
class NetworkConfig:
    """The network's shape, shared by every network of a job."""

    name: str = knob(MISSING, NAME_HELP)
    hidden: list[int] = knob([64, 64], "widths of the hidden layers (at least one)")
    residual: bool = knob(False, "hidden layers of equal width become x + act(norm(fc(x)))")
    output_scale: float = knob(1.0, "the output layer's result is multiplied by this")
    linear_last_hidden: bool = knob(False, "the last hidden layer has no activation (the seed critic's)")
    encoder: list[int] = knob([], "lstm: widths of the layers before the LSTM (linear, normalization, activation)")
    cell_size: int = knob(64, "lstm: units of the LSTM cell; hidden then gives the head's layers after it")

    conv: list[list[int]] = knob(
        [], "cnn, nature_cnn: convolutional layers before the hidden ones, each [channels, kernel, stride] (no padding)"
    )


@dataclass
class LSTMNetworkConfig(NetworkConfig):
    """lstm: encoder -> LSTM(cell_size) -> the MLP head (hidden), for ppo and a2c."""

    hidden: list[int] = field(default_factory=lambda: [64])


@dataclass
class CNNConfig(NetworkConfig):
    """cnn: MinAtar's torso (Young & Tian 2019): a 3x3 convolution of 16 channels, then 128 units."""

    conv: list[list[int]] = field(default_factory=lambda: [[16, 3, 1]])
    hidden: list[int] = field(default_factory=lambda: [128])


@dataclass
class NatureCNNConfig(NetworkConfig):
    """nature_cnn: Nature DQN's torso for 84x84 frames (Mnih et al. 2015): 32 8x8/4, 64 4x4/2, 64 3x3/1, 512."""

    conv: list[list[int]] = field(default_factory=lambda: [[32, 8, 4], [64, 4, 2], [64, 3, 1]])
    hidden: list[int] = field(default_factory=lambda: [512])


@dataclass
class RegularizationConfig:
    l1: float = knob(0.0, "loss += l1 * sum |w|, per member")
    l2: float = knob(0.0, "loss += l2 * sum w^2, per member")
    l2_init: float = knob(
        0.0, "loss += l2_init * sum (w - w_0)^2, w_0 the member's initial values (regenerative regularization)"
    )
    weights_only: bool = knob(True, "false: biases, gains and norm parameters are penalized too")


# ---------------------------------------------------------------- intervention
@dataclass
class InterventionConfig:
    """A periodic intervention against loss of plasticity, on every trained network and member."""

    name: str = knob(MISSING, NAME_HELP)
    every: int = knob(
        1_000, "updates between interventions (dqn: gradient steps; ppo, a2c: minibatch updates; ddpg, td3: critic's)"
    )
    tau: float = knob(0.1, "redo: a hidden unit whose tau-dormant score is <= tau is recycled")
    shrink: float = knob(0.8, "shrink_perturb: lambda of theta <- lambda * theta + sigma * theta_fresh")
    perturb: float = knob(0.2, "shrink_perturb: sigma of theta <- lambda * theta + sigma * theta_fresh")
    layers: int = knob(1, "reset: the last k linear layers are re-initialized (1 = the output layer)")


@dataclass
class ReDoConfig(InterventionConfig):
    """redo: recycle tau-dormant units (Sokar et al. 2023); reads tau."""


@dataclass
class ShrinkPerturbConfig(InterventionConfig):
    """shrink_perturb: theta <- shrink * theta + perturb * theta_fresh (Ash & Adams 2020); reads shrink, perturb."""


@dataclass
class ResetConfig(InterventionConfig):
    """reset: re-initialize the last k layers and their optimizer state (Nikishin et al. 2022); reads layers."""


# ---------------------------------------------------------------- algo
@dataclass
class AlgoConfig:
    """The algorithm and its numbers (counts in env steps are per member)."""

    name: str = knob(MISSING, NAME_HELP)
    gamma: float = knob(0.99, "discount factor")
    # replay: dqn, ddpg, td3, sac, muzero_lite
    buffer_size: int = knob(100_000, "dqn, ddpg, td3, sac, muzero_lite: replay transitions per member")
    batch_size: int = knob(128, "dqn, ddpg, td3, sac, muzero_lite: transitions per update")
    learning_starts: int = knob(
        1_000,
        "dqn, ddpg, td3, sac, muzero_lite: env steps before the first update (ddpg, td3, sac: uniform random actions)",
    )
    train_frequency: int = knob(16, "dqn, ddpg, td3, sac, muzero_lite: env steps between update phases")
    gradient_steps: int = knob(4, "dqn, ddpg, td3, sac, muzero_lite: (critic) updates per phase")
    tau: float = knob(0.005, "dqn (soft), ddpg, td3, sac, muzero_lite: target <- (1 - tau) target + tau online")
    # dqn
    start_e: float = knob(1.0, "dqn, muzero_lite: initial epsilon")
    end_e: float = knob(0.04, "dqn, muzero_lite: final epsilon")
    exploration_fraction: float = knob(0.16, "dqn, muzero_lite: fraction of total_steps of the linear epsilon decay")
    target_network: bool = knob(True, "dqn: false bootstraps from the online network")
    target_update: str = knob("hard", "dqn: hard | soft")
    target_update_period: int = knob(100, "dqn: env steps between hard copies")
    double: bool = knob(False, "dqn: double Q-learning")
    loss: str = knob("mse", "dqn: mse | huber")
    huber_delta: float = knob(1.0, "dqn: the huber loss's delta")
    clip_delta: float = knob(0.0, "dqn: > 0 clips the TD error reaching Q(s,a) to +-clip_delta")
    rescale_r: bool = knob(False, "dqn: divide rewards by r_max (max |r| seen so far, at least r_max)")
    r_max: float = knob(1.0, "the least reward scale r_max: divergence's value bound; dqn's rescale_r")
    terminal_masking: bool = knob(True, "dqn: false bootstraps through terminations too")
    # ppo, a2c
    num_steps: int = knob(128, "ppo, a2c: env steps per environment between updates (the rollout)")
    gae_lambda: float = knob(0.95, "ppo, a2c: GAE lambda (1.0 = discounted returns bootstrapped at the end)")
    update_epochs: int = knob(4, "ppo, a2c: epochs over each rollout")
    num_minibatches: int = knob(4, "ppo, a2c: minibatches per epoch")
    clip_coef: float = knob(0.2, "ppo, a2c: surrogate clipping, ratio kept in [1 - clip, 1 + clip]")
    clip_vloss: bool = knob(True, "ppo, a2c: value loss clipped around the old values by clip_coef")
    norm_adv: bool = knob(True, "ppo, a2c: advantages normalized per minibatch (per member)")
    ent_coef: float = knob(0.01, "ppo, a2c: entropy bonus coefficient")
    vf_coef: float = knob(0.5, "ppo, a2c: value loss coefficient")
    anneal_lr: bool = knob(True, "ppo, a2c: learning rate decays linearly to 0 over anneal_steps")
    anneal_steps: int | None = knob(None, "ppo, a2c: env steps per member of the decay (null = total_steps)")
    value_target: str = knob(
        "gae", "ppo, a2c: gae (GAE returns, bootstrapped) | mc (discounted rewards to the episode's or rollout's end)"
    )
    continuous_policy: str = knob(
        "gaussian",
        "ppo, a2c, mappo: continuous actions' distribution: gaussian (a state-independent log-std, samples "
        "clipped to the box) | tanh_normal (the network outputs a location and a scale, samples squashed into "
        "the box by tanh; evaluation plays the squashed location)",
    )
    min_std: float = knob(0.01, "ppo, a2c, mappo: tanh_normal's std = softplus(s + b) + min_std (its floor)")
    init_std: float = knob(1.0, "ppo, a2c, mappo: tanh_normal's std where the scale output s is 0 (sets b)")
    # ddpg, td3
    exploration_noise: float = knob(
        0.1, "ddpg, td3, maddpg: Gaussian action noise std (fraction of the half range; maddpg: at the start)"
    )
    exploration_noise_end: float | None = knob(
        None, "maddpg: the noise std reached after exploration_anneal_steps, linearly (null = exploration_noise)"
    )
    exploration_anneal_steps: int = knob(0, "maddpg: env steps per member of the noise's decay (0 = constant noise)")
    exploration_anneal_every: int = knob(
        0, "maddpg: the decay moves once per this many env steps per member, as a collector's batch (0 = every step)"
    )
    twin: bool = knob(True, "ddpg, td3: two critics, the target takes their minimum")
    policy_delay: int = knob(2, "ddpg, td3: actor and target updates every policy_delay critic updates")
    target_noise: float = knob(0.2, "ddpg, td3: target policy smoothing std (fraction of the half range); 0 = off")
    target_noise_clip: float = knob(0.5, "ddpg, td3: ... clipped to +- this (fraction of the half range)")
    # sac
    alpha: float = knob(1.0, "sac: the entropy coefficient's initial value (its fixed value with autotune=false)")
    autotune: bool = knob(True, "sac: tune alpha towards target_entropy (one log alpha per member, Adam)")
    target_entropy: float | None = knob(None, "sac: the entropy alpha's tuning aims at [nats] (null = -|A|)")
    log_std_min: float = knob(-20.0, "sac: the actor's log standard deviation is clamped to [min, max]")
    log_std_max: float = knob(2.0, "sac: ... its upper end")
    # muzero_lite
    unroll_steps: int = knob(5, "muzero_lite: K, dynamics steps unrolled from each replayed state")
    td_steps: int = knob(10, "muzero_lite: n of the n-step value targets (bootstrapped from the target model)")
    dynamics_grad_scale: float = knob(
        0.5, "muzero_lite: scale_gradient on the hidden state after each dynamics step (MuZero: 0.5)"
    )
    state_dim: int = knob(64, "muzero_lite: width of the hidden state s = h(o)")
    value_coef: float = knob(0.25, "muzero_lite: weight of the value loss (MuZero: 0.25)")
    policy_coef: float = knob(1.0, "muzero_lite: weight of the policy loss")
    policy_temperature: float = knob(
        1.0, "muzero_lite: policy target softmax((r_hat + gamma v_hat) / temperature) over the actions"
    )
    # maddpg
    gumbel_temperature: float = knob(
        1.0, "maddpg: temperature of the Gumbel-softmax of a discrete agent's actor update"
    )
    gumbel_hard: bool = knob(True, "maddpg: the critic sees the one-hot sample, with the soft sample's gradient")
    policy_reg: float = knob(1e-3, "maddpg: actor loss += policy_reg * mean logits^2 (discrete agents)")
    target_actor: bool = knob(
        True,
        "maddpg: the critics' target takes a' from the EMA target actor (false: from the current actor, no "
        "gradient, as TorchRL's DDPG loss without delay_actor, BenchMARL's MADDPG)",
    )
    actor_first: bool = knob(
        False,
        "maddpg: each gradient step moves the actor against the critic as it was before that step's critic "
        "update (TorchRL's DDPG loss, BenchMARL's MADDPG; false: after it, as the MADDPG paper's code)",
    )
    # mappo
    share_parameters: bool = knob(
        True,
        "mappo: one policy for every agent (input: its observation, and its index); maddpg: one actor and one "
        "critic, a single Q trained on every agent's reward, for every agent (BenchMARL's MADDPG)",
    )
    agent_index: bool = knob(True, "mappo: a shared policy also sees its agent's one-hot index")
    shared_value: bool = knob(
        False, "mappo: the centralized critic outputs one value for every agent (else one per agent, its own reward's)"
    )


@dataclass
class DQNConfig(AlgoConfig):
    """dqn: DQN with DQN 3.0's switches; a CartPole setting that learns in 50k steps."""


@dataclass
class ActorCriticConfig(AlgoConfig):
    """ppo: CleanRL ppo.py's settings."""


@dataclass
class A2CConfig(ActorCriticConfig):
    """a2c: the PPO code path with one epoch over one minibatch (the ratio is always 1); SB3's defaults."""

    num_steps: int = 5
    gae_lambda: float = 1.0
    update_epochs: int = 1
    num_minibatches: int = 1
    clip_vloss: bool = False
    norm_adv: bool = False
    ent_coef: float = 0.0
    anneal_lr: bool = False


@dataclass
class TD3Config(AlgoConfig):
    """td3: rl-baselines3-zoo's Pendulum-v1 settings."""

    buffer_size: int = 200_000
    batch_size: int = 256
    gamma: float = 0.98
    learning_starts: int = 10_000
    train_frequency: int = 1
    gradient_steps: int = 1


@dataclass
class DDPGConfig(TD3Config):
    """ddpg: one critic, no target smoothing, actor updated every step."""

    twin: bool = False
    policy_delay: int = 1
    target_noise: float = 0.0


@dataclass
class SACConfig(AlgoConfig):
    """sac: Stable-Baselines3's SAC defaults (rl-baselines3-zoo's Pendulum-v1 entry sets only lr 1e-3)."""

    buffer_size: int = 1_000_000
    batch_size: int = 256
    learning_starts: int = 100
    train_frequency: int = 1
    gradient_steps: int = 1


@dataclass
class MADDPGConfig(AlgoConfig):
    """maddpg: the MADDPG paper's particle-world settings (gamma 0.95, tau 0.01; its lr 1e-2: conf/algo)."""

    buffer_size: int = 100_000
    batch_size: int = 256
    gamma: float = 0.95
    tau: float = 0.01
    learning_starts: int = 1_000
    train_frequency: int = 25
    gradient_steps: int = 1
    share_parameters: bool = False


@dataclass
class MuZeroLiteConfig(AlgoConfig):
    """muzero_lite: a value-equivalent model trained on K-step unrolls; a CartPole setting."""

    buffer_size: int = 50_000
    batch_size: int = 128
    learning_starts: int = 1_000
    train_frequency: int = 4
    gradient_steps: int = 1
    tau: float = 0.01
    end_e: float = 0.01
    exploration_fraction: float = 0.2


@dataclass
class MAPPOConfig(ActorCriticConfig):
    """mappo: PPO's settings with a centralized value function; constant lr (anneal_lr is not read)."""

    anneal_lr: bool = False


# ---------------------------------------------------------------- actor, critic, normalizers, env
@dataclass
class NetOverrideConfig:
    """One network of an actor-critic algorithm; every null field falls back to the shared group."""

    activation: str | None = knob(None, "an option of the activation group, with its default parameters")
    init: str | None = knob(None, "an option of the init group, with its default parameters")
    normalization: str | None = knob(None, "an option of the normalization group, with its default parameters")
    hidden: list[int] | None = knob(None, "widths of the hidden layers (null = network.hidden)")
    linear_last_hidden: bool | None = knob(None, "null = network.linear_last_hidden")
    last_layer_gain: float | None = knob(None, "the output layer's init gain (null = init.last_layer_gain)")


@dataclass
class CriticConfig(NetOverrideConfig):
    action_layer: int = knob(0, "ddpg, td3, sac: the action joins the input (0) or the k-th hidden layer's output (k)")


@dataclass
class ObsNormConfig:
    enabled: bool = knob(False, "(x - mean) / (std + 1e-8) with running statistics per member")
    clip: float = knob(10.0, "normalized observations are clipped to +- clip")


@dataclass
class RewardNormConfig:
    enabled: bool = knob(False, "rewards divided by the running std of the discounted return, per member")
    clip: float = knob(10.0, "scaled rewards are clipped to +- clip")


@dataclass
class ShiftConfig:
    """A non-stationary task: the environment's world, seen through a permutation that changes (docs/plasticity.md)."""

    kind: str = knob(
        "none",
        "none | permute_obs (each member's observation features in a fresh random order at each switch) | "
        "permute_actions (discrete actions: the action indices' meanings in a fresh random order at each switch); "
        "the first task is the identity; single-agent envs",
    )
    every: int = knob(10_000, "env steps per member between task switches")


@dataclass
class EnvConfig:
    """A gymnasium environment (one option per id)."""

    id: str = knob(
        MISSING,
        "the gymnasium id (module:EnvId imports module first); api=pettingzoo: a parallel env module "
        "(mpe2.simple_spread_v3); api=vmas: a scenario (module:Scenario: a class of one's own)",
    )
    api: str = knob("gymnasium", "gymnasium | pettingzoo | vmas (multi-agent: rlexp/envs/marl.py)")
    num_envs: int = knob(1, "environments per member (ppo, a2c set their own: conf/algo)")
    max_episode_steps: int | None = knob(
        None, "episode step limit (null = the env's own); pettingzoo: max_cycles; vmas: max_steps"
    )
    kwargs: dict[str, Any] = knob({}, "keyword arguments of gymnasium.make")
    timeout_terminal: bool = knob(
        False,
        "an episode cut by the step limit ends terminated, not truncated: no bootstrap from its last "
        "observation (TorchRL's VMAS wrapper does so; Pardo et al. 2018 on what it costs)",
    )
    clip_reward: bool = knob(True, "atari (ALE/ ids): rewards clipped to their sign")
    episodic_life: bool = knob(True, "atari (ALE/ ids): a lost life ends the training episode (the game goes on)")
    shift: ShiftConfig = knob(
        ShiftConfig, "a non-stationary task: the world seen through a changing permutation (docs/plasticity.md)"
    )


# ---------------------------------------------------------------- evaluation
@dataclass
class EvalConfig:
    """Evaluation as the field reports it: deterministic episodes on environments of its own."""

    every: int = knob(
        10_000,
        "env steps per member between evaluations (each at the first log step at or after a multiple); "
        "0 = at the end only",
    )
    episodes: int = knob(10, "episodes per member and evaluation, one per evaluation environment; 0 = no evaluation")
    epsilon: float = knob(0.0, "dqn: epsilon-greedy evaluation (0 = greedy), from evaluation's own random stream")


# ---------------------------------------------------------------- instruments, divergence, debugging
@dataclass
class DiagnosticsConfig:
    every: int = knob(50, "updates between instrument records (per-layer statistics); 0 = off")
    histogram_every: int = knob(1_000, "updates between W&B histograms of gradients and activations; 0 = off")
    dormant_tau: float = knob(0.025, "a unit is tau-dormant when E|h_i| / mean_k E|h_k| <= tau")
    srank_delta: float = knob(0.01, "feature rank srank: the fewest singular values holding 1 - delta of their sum")
    collapse_repeat: float = knob(
        0.95, "multi-agent: an agent collapsed when its action repeat rate over a log window is >= this"
    )
    collapse_entropy: float = knob(
        0.05, "multi-agent: ... or its action histogram's entropy over log(actions) is <= this"
    )


@dataclass
class DivergenceConfig:
    """Divergence checks: non-finite values always; on: explosions too."""

    name: str = knob(MISSING, NAME_HELP)
    q_bound_factor: float = knob(100.0, "on: value explosion when |Q| > factor * r_max / (1 - gamma) ...")
    grad_norm_bound: float = knob(1.0e6, "on: gradient explosion when a member's gradient norm > this ...")
    patience: int = knob(3, "on: ... on this many consecutive instrument records")


@dataclass
class InjectConfig:
    member: int = knob(-1, "the member to poison (-1 = none)")
    step: int = knob(-1, "env step at (or first update at/after) which to poison it (-1 = none)")
    what: str = knob("none", "none | param | grad | obs")


@dataclass
class DebugConfig:
    inject: InjectConfig = knob(InjectConfig, "fault injection: make a member non-finite on purpose")
    crash_at_step: int = knob(-1, "raise a RuntimeError at this env step: tests failure isolation (-1 = never)")


@dataclass
class CheckpointConfig:
    """Checkpoints: per member, everything a job needs to continue (docs/outputs.md#checkpoint)."""

    every: int = knob(
        0,
        "env steps per member between checkpoints (each at the first log step at or after a multiple, and at the "
        "end); 0 = off",
    )
    replay: bool = knob(False, "save the replay buffer too: a resumed run then ends bitwise as an uninterrupted one")


# ---------------------------------------------------------------- population-based training
@dataclass
class PBTConfig:
    """Population-based training (Jaderberg et al. 2017) inside one population: docs/pbt.md."""

    interval: int = knob(
        0,
        "env steps per member between PBT rounds (each at the first log step at or after a multiple, never at the "
        "end); 0 = off",
    )
    fraction: float = knob(
        0.25, "the bottom fraction of the ranked members; each copies a member of the top fraction; in (0, 0.5]"
    )
    window: int = knob(1, "a member's score: the mean of its latest `window` evaluations since its last copy")
    hyperparameters: list[str] = knob(
        ["optimizer.lr", "algo.exploration_fraction"],
        "the keys sampled per member and perturbed after a copy (dqn: optimizer.lr, algo.exploration_fraction; "
        "td3, ddpg: optimizer.lr)",
    )
    factors: list[float] = knob([0.8, 1.25], "a copied member's value times one of these, drawn uniformly (each > 0)")
    lr: list[float] = knob([1.0e-4, 1.0e-2], "optimizer.lr's initial range [low, high], sampled log-uniformly")
    exploration_fraction: list[float] = knob(
        [0.05, 0.5], "algo.exploration_fraction's initial range [low, high], sampled uniformly"
    )


# ---------------------------------------------------------------- logging, top level
@dataclass
class LoggerConfig:
    mode: str | None = knob(None, "W&B: offline | online | disabled; null = $WANDB_MODE, else offline")
    project: str = knob("rlexp", "W&B project: 1 to 128 characters, none of / \\ # ? % :")
    entity: str | None = knob(None, "W&B entity (null = your default); the same rule as logger.project")
    log_every: int = knob(1_000, "env steps per member between log records")
    progress: str = knob("auto", "console progress: auto | rich | plain | off")
    init_timeout: float = knob(20.0, "seconds an online W&B run may wait for the server")
    sweep: str | None = knob(
        None,
        "the sweep's name in W&B: group <sweep>/<cell>, tag sweep:<sweep>; null = in a multirun <its dir's name>-<6 "
        "hex of its path>, alone none; 1 to 48 of A-Z a-z 0-9 . _ -",
    )


@dataclass
class Config:
    activation: ActivationConfig = knob(MISSING, "activation of the hidden layers")
    init: InitConfig = knob(MISSING, "weight and bias initialization")
    normalization: NormalizationConfig = knob(MISSING, "normalization of the hidden layers")
    clipping: ClippingConfig = knob(MISSING, "gradient clipping")
    optimizer: OptimizerConfig = knob(MISSING, "optimizer")
    network: NetworkConfig = knob(MISSING, "network shape")
    algo: AlgoConfig = knob(MISSING, "algorithm")
    env: EnvConfig = knob(MISSING, "environment")
    divergence: DivergenceConfig = knob(MISSING, "divergence checks")
    intervention: InterventionConfig = knob(MISSING, "periodic intervention against loss of plasticity")
    regularization: RegularizationConfig = knob(RegularizationConfig, "L1/L2 weight penalties, L2 towards the init")
    actor: NetOverrideConfig = knob(
        lambda: NetOverrideConfig(last_layer_gain=0.01),
        "actor-critic algorithms: the actor's overrides of the shared groups",
    )
    critic: CriticConfig = knob(
        lambda: CriticConfig(last_layer_gain=1.0),
        "actor-critic algorithms: the critic's overrides of the shared groups",
    )
    obs_norm: ObsNormConfig = knob(ObsNormConfig, "running observation normalization, every algorithm")
    reward_norm: RewardNormConfig = knob(RewardNormConfig, "running reward scaling, every algorithm")
    eval: EvalConfig = knob(EvalConfig, "evaluation: deterministic episodes on separate environments, every algorithm")
    diagnostics: DiagnosticsConfig = knob(DiagnosticsConfig, "instruments: per-layer statistics, histograms")
    debug: DebugConfig = knob(DebugConfig, "fault injection and crashes, for tests")
    pbt: PBTConfig = knob(PBTConfig, "population-based training over the population's members (dqn, td3, ddpg)")
    checkpoint: CheckpointConfig = knob(CheckpointConfig, "checkpoints to continue a job from (resume=true)")
    logger: LoggerConfig = knob(LoggerConfig, "W&B and console")
    total_steps: int = knob(50_000, "environment steps per member")
    seed: int = knob(0, "member k is seeded with seed + k")
    num_seeds: int = knob(1, "population size P: members trained together in one process")
    device: str = knob("auto", "auto | cpu | cuda | cuda:N")
    threads: int = knob(
        1, "torch intra-op threads, at most the cores this process may use; 0 = torch's default; -1 = one per 8 members"
    )
    fast_paths: bool = knob(
        True,
        "false: plain torch throughout (autograd, torch.optim's optimizers, a per-tensor pipeline, torch acting, "
        "environments one by one): the fast paths' reference, equal up to float rounding, slower",
    )
    flush_denormal: bool = knob(
        False,
        "true: the CPU flushes subnormal floats to zero while the job runs (x86 FTZ/DAZ, AArch64 FZ; TensorFlow and "
        "XLA run so on CPUs), where an optimizer's averages decaying through them cost ~50x per operation "
        "(minatar_dqn sets it); false: IEEE's gradual underflow, torch's default",
    )
    plugins: list[str] = knob(
        [],
        "modules imported before the config is validated, each registering its options (docs/extending.md); "
        "installed plugins (entry points rlexp.plugins) need no naming",
    )
    resume: bool = knob(
        False,
        "skip jobs whose dir holds a finished job (else starting there is refused); continue unfinished ones from "
        "their checkpoint",
    )
