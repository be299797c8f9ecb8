"""Value checks, once, before any work: each failure is a ConfigError naming the key and the fix.

Hydra's structured configs already refuse unknown keys and wrong types. ``validate`` refuses a
non-finite float anywhere, walks the config groups and calls each registry's own check
(``check_clipping`` beside the clippers, ...), then checks every other key's domain and the
combinations that cannot work. Every numeric key has a domain, whichever option or algorithm reads it:
``tests/compose/test_config.py`` tries a value outside it for each.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import resource
from collections.abc import Callable, Iterable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.nodes import ValueNode

from rlexp.algos import ALGOS
from rlexp.compose.plugins import load_plugins
from rlexp.compose.registry import SCHEMAS, own_key_fix
from rlexp.config.schema import ConfigError, require, require_choice
from rlexp.data.buffers import FrameStackReplay
from rlexp.diagnostics.interventions import check_intervention
from rlexp.envs.gym import check_env_id, frame_stack, make_env
from rlexp.envs.marl import AgentSpace, MultiAgentPopulationEnv, check_marl_env, is_multi_agent
from rlexp.envs.shift import check_shift, check_shift_spaces
from rlexp.nn.activations import check_activation
from rlexp.nn.init import check_init
from rlexp.nn.nets import check_normalization
from rlexp.nn.networks import check_observations
from rlexp.optim.optimizers import check_optimizer
from rlexp.optim.pipeline import check_clipping
from rlexp.run.loggers import WANDB_MODES, resolve_wandb_mode
from rlexp.run.pbt import check_pbt


def _positive(cfg: DictConfig, prefix: str, keys: Iterable[str]) -> None:
    for k in keys:
        require(cfg[k] > 0, f"{prefix}.{k}", cfg[k], "a value > 0")


def _non_negative(cfg: DictConfig, prefix: str, keys: Iterable[str]) -> None:
    for k in keys:
        require(cfg[k] >= 0, f"{prefix}.{k}", cfg[k], "a value >= 0")


def resolve_device(name: str) -> torch.device:
    """auto -> cuda when available, else cpu; a CUDA request without CUDA is a ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise ConfigError("device", f"unknown device {name!r}", "use auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device", "CUDA is not available on this machine", "use device=cpu or device=auto")
    return torch.device(name)


def _check_known_keys(node: DictConfig, prefix: str = "") -> None:
    """Refuse keys a schema does not declare (Hydra lets ``+key=value`` add them)."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        return  # a free-form dict (env.kwargs)
    known = [f.name for f in dataclasses.fields(schema)]
    for key in node.keys():
        path = f"{prefix}{key}"
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=3, cutoff=0.6)
            value = node._get_node(key)._value() if not isinstance(node._get_node(key), DictConfig) else "{...}"
            fix = (
                f"did you mean {' or '.join(f'{prefix}{c}={value}' for c in close)}?"
                if close
                else f"remove it; {prefix.rstrip('.') or 'the top level'} takes: {', '.join(known)}"
            )
            if prefix == "algo.":
                fix = own_key_fix(str(key)) or fix
            raise ConfigError(path, f"unknown key ({path}={value})", fix)
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            _check_known_keys(child, f"{path}.")


# group -> the value check beside its registry: check(node, dotted key of the node)
GROUP_CHECKS: dict[str, Callable[[DictConfig, str], None]] = {
    "activation": check_activation,
    "init": check_init,
    "normalization": check_normalization,
    "clipping": check_clipping,
    "optimizer": check_optimizer,
    "intervention": check_intervention,
}


def _check_finite(node: DictConfig, prefix: str = "") -> None:
    """Refuse nan and +-inf in every float key (env.kwargs, gymnasium's own, excepted)."""
    for key in node.keys():
        path = f"{prefix}{key}"
        if path in ("hydra", "env.kwargs"):
            continue
        child = node._get_node(key)  # a plain value read as stored (OmegaConf's checked access is most of the cost)
        value = child._value() if isinstance(child, ValueNode) and not child._is_interpolation() else node[key]
        if isinstance(value, DictConfig):
            _check_finite(value, f"{path}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(path, f"{value!r} is not a finite number", f"set {path} to a finite number")


def _check_widths(hidden: Any, key: str, fallback: str = "") -> None:
    """A list of hidden widths: at least one, each >= 1."""
    widths = list(hidden)
    need = "a network needs at least one hidden layer"
    require(len(widths) >= 1, key, widths, f"a list of at least one width{fallback}: {need}")
    require(all(h >= 1 for h in widths), key, widths, f"a list of widths >= 1{fallback}")


SWEEP_NAME = re.compile(r"[A-Za-z0-9._-]{1,48}")  # logger.sweep: a tag (64) and a group prefix (128) with room
WANDB_NAME_FORBIDS = "/\\#?%:"  # characters W&B refuses in a project (or entity) name
WANDB_NAME_MAX = 128


def validate(cfg: DictConfig) -> None:
    """Check every value of a composed config; raises ConfigError on the first bad one. The plugins come
    first: the installed ones and those ``plugins`` names (a launcher's worker process has not loaded them)."""
    load_plugins(cfg.get("plugins") or ())
    _check_known_keys(cfg)
    _check_finite(cfg)
    for group, check in GROUP_CHECKS.items():
        check(cfg[group], group)
    for group in ("network", "algo", "divergence"):
        require_choice(cfg[group].name, f"{group}.name", SCHEMAS[group])

    require(cfg.total_steps >= 1, "total_steps", cfg.total_steps, "an integer >= 1")
    require(cfg.num_seeds >= 1, "num_seeds", cfg.num_seeds, "an integer >= 1")
    require(cfg.seed >= 0, "seed", cfg.seed, "an integer >= 0")
    cores = len(os.sched_getaffinity(0))
    require(
        -1 <= cfg.threads <= cores,
        "threads",
        cfg.threads,
        f"an integer in [-1, {cores}]: at most {cores}, the cores this process may use "
        "(0 = torch's default, -1 = by population size)",
    )
    resolve_device(cfg.device)

    _non_negative(cfg.regularization, "regularization", ("l1", "l2", "l2_init"))

    net = cfg.network
    _check_widths(net.hidden, "network.hidden")
    require(net.output_scale != 0, "network.output_scale", net.output_scale, "a non-zero factor")
    require(net.cell_size >= 1, "network.cell_size", net.cell_size, "an integer >= 1")
    require(all(h >= 1 for h in net.encoder), "network.encoder", list(net.encoder), "a list of widths >= 1 (or [])")
    if net.name == "lstm":
        recurrent = [name for name, spec in ALGOS.items() if spec.recurrent]
        require(ALGOS[cfg.algo.name].recurrent, "algo", cfg.algo.name, f"{' or '.join(recurrent)} with network=lstm")
        require(
            cfg.intervention.name == "none",
            "intervention",
            cfg.intervention.name,
            "none with network=lstm (interventions act on MLP layers)",
        )

    log = cfg.logger
    if log.mode is not None:
        require_choice(log.mode, "logger.mode", WANDB_MODES)
    require_choice(log.progress, "logger.progress", ("auto", "rich", "plain", "off"))
    require(log.log_every >= 1, "logger.log_every", log.log_every, "an integer >= 1 (env steps)")
    require(log.init_timeout > 0, "logger.init_timeout", log.init_timeout, "a value > 0 (seconds)")
    for key, name in (("logger.project", log.project), ("logger.entity", log.entity)):
        if name is not None and not (0 < len(name) <= WANDB_NAME_MAX and not set(name) & set(WANDB_NAME_FORBIDS)):
            raise ConfigError(  # what W&B would refuse once training has started, refused before it
                key,
                f"{name!r} ({len(name)} characters) is not a name W&B accepts",
                f"use 1 to {WANDB_NAME_MAX} characters, none of {' '.join(WANDB_NAME_FORBIDS)}",
            )

    if log.sweep is not None and not SWEEP_NAME.fullmatch(str(log.sweep)):
        raise ConfigError(
            "logger.sweep", f"{log.sweep!r} is not a sweep name", "use 1 to 48 characters of A-Z a-z 0-9 . _ -"
        )

    env = cfg.env
    require(env.num_envs >= 1, "env.num_envs", env.num_envs, "an integer >= 1")
    if env.max_episode_steps is not None:
        require(
            env.max_episode_steps >= 1,
            "env.max_episode_steps",
            env.max_episode_steps,
            "an integer >= 1 (or null for the env's own limit)",
        )
    check_shift(env.shift, env.id, is_multi_agent(env))
    diag, div, inject = cfg.diagnostics, cfg.divergence, cfg.debug.inject
    require(diag.every >= 0, "diagnostics.every", diag.every, "an integer >= 0 (0 = off)")
    require(diag.histogram_every >= 0, "diagnostics.histogram_every", diag.histogram_every, "an integer >= 0")
    require(0 <= diag.dormant_tau < 1, "diagnostics.dormant_tau", diag.dormant_tau, "a value in [0, 1)")
    require(0 < diag.srank_delta < 1, "diagnostics.srank_delta", diag.srank_delta, "a value in (0, 1)")
    for key in ("collapse_repeat", "collapse_entropy"):
        require(0 <= diag[key] <= 1, f"diagnostics.{key}", diag[key], "a value in [0, 1]")
    _positive(div, "divergence", ("q_bound_factor", "grad_norm_bound", "patience"))
    require_choice(inject.what, "debug.inject.what", ("none", "param", "grad", "obs"))
    require(inject.member >= -1, "debug.inject.member", inject.member, "-1 (none) or a member index")
    require(inject.step >= -1, "debug.inject.step", inject.step, "-1 (none) or an env step >= 0")
    if inject.what != "none":
        require(
            0 <= inject.member < cfg.num_seeds,
            "debug.inject.member",
            inject.member,
            f"a member index in [0, {cfg.num_seeds})",
        )
        require(
            0 <= inject.step < cfg.total_steps,
            "debug.inject.step",
            inject.step,
            f"an env step in [0, {cfg.total_steps})",
        )
    crash_at = cfg.debug.crash_at_step
    require(
        crash_at == -1 or 0 <= crash_at < cfg.total_steps,
        "debug.crash_at_step",
        crash_at,
        f"-1 (never) or an env step in [0, {cfg.total_steps})",
    )
    for key in ("obs_norm", "reward_norm"):
        _positive(cfg[key], key, ("clip",))
    evaluation = cfg.eval
    require(evaluation.every >= 0, "eval.every", evaluation.every, "an integer >= 0 (env steps; 0 = at the end only)")
    require(evaluation.episodes >= 0, "eval.episodes", evaluation.episodes, "an integer >= 0 (0 = no evaluation)")
    require(0 <= evaluation.epsilon <= 1, "eval.epsilon", evaluation.epsilon, "a value in [0, 1]")
    every = cfg.checkpoint.every
    require(every >= 0, "checkpoint.every", every, "an integer >= 0 (env steps per member; 0 = off)")
    _validate_networks(cfg)
    _check_algo(cfg.algo)
    check_pbt(cfg, ALGOS[cfg.algo.name].pbt_keys)
    if is_multi_agent(cfg.env):
        check_marl_env(cfg.env)
    else:
        check_env_id(cfg.env.id)
    ALGOS[cfg.algo.name].check(cfg)
    obs_dim, action_dim, frames, stack = _validate_action_space(cfg)
    if cfg.env.shift.kind != "none":  # a single-agent env (check_shift): its spaces, made once
        check_shift_spaces(cfg.env.shift, cfg.env.id, env_spaces(cfg.env).kind, stack)
    check_resources(cfg, obs_dim, action_dim, frames, stack)


def _validate_networks(cfg: DictConfig) -> None:
    """The actor's and critic's overrides name known options and sensible sizes."""
    for role in ("actor", "critic"):
        node = cfg[role]
        for group in ("activation", "init", "normalization"):
            if node[group] is not None:
                require_choice(node[group], f"{role}.{group}", SCHEMAS[group])
        if node.hidden is not None:
            _check_widths(node.hidden, f"{role}.hidden", " (or null for network.hidden)")
        if node.last_layer_gain is not None:
            require(node.last_layer_gain > 0, f"{role}.last_layer_gain", node.last_layer_gain, "a value > 0 (or null)")
    depth = len(cfg.critic.hidden if cfg.critic.hidden is not None else cfg.network.hidden)
    _check_reset_layers(cfg)
    require(
        0 <= cfg.critic.action_layer <= depth,
        "critic.action_layer",
        cfg.critic.action_layer,
        f"an index in [0, {depth}]: 0 joins the action to the input, k to the k-th hidden layer's output",
    )


def _check_reset_layers(cfg: DictConfig) -> None:
    """intervention=reset re-initializes layers every trained network has: at most its linear layers."""
    if cfg.intervention.name != "reset":
        return
    roles = ALGOS[cfg.algo.name].roles
    widths = [cfg[role].hidden if cfg[role].hidden is not None else cfg.network.hidden for role in roles]
    linear = min(len(hidden) for hidden in widths or [cfg.network.hidden]) + 1
    require(
        cfg.intervention.layers <= linear,
        "intervention.layers",
        cfg.intervention.layers,
        f"an integer in [1, {linear}]: a trained network here has {linear} linear layers",
    )


Domain = tuple[Callable[[Any], bool], str]  # (is the value in it?, what fits, for the message)
COUNT: Domain = (lambda v: v >= 1, "an integer >= 1")
STEPS: Domain = (lambda v: v >= 0, "an integer >= 0 (env steps)")
POSITIVE: Domain = (lambda v: v > 0, "a value > 0")
NON_NEGATIVE: Domain = (lambda v: v >= 0, "a value >= 0")
UNIT: Domain = (lambda v: 0 <= v <= 1, "a value in [0, 1]")
UNIT_OPEN_LOW: Domain = (lambda v: 0 < v <= 1, "a value in (0, 1]")

# every numeric algo key -> its domain, checked whichever algorithm runs (a key an algorithm does not
# read keeps its meaning for the one that does)
ALGO_DOMAINS: dict[str, Domain] = {
    "gamma": UNIT,
    "buffer_size": COUNT,
    "batch_size": COUNT,
    "learning_starts": STEPS,
    "train_frequency": COUNT,
    "gradient_steps": COUNT,
    "tau": UNIT_OPEN_LOW,
    "start_e": UNIT,
    "end_e": UNIT,
    "exploration_fraction": UNIT_OPEN_LOW,
    "target_update_period": COUNT,
    "huber_delta": POSITIVE,
    "clip_delta": (lambda v: v >= 0, "a value >= 0 (0 = no clipping)"),
    "r_max": POSITIVE,
    "num_steps": COUNT,
    "gae_lambda": UNIT,
    "update_epochs": COUNT,
    "num_minibatches": COUNT,
    "clip_coef": POSITIVE,
    "ent_coef": NON_NEGATIVE,
    "vf_coef": NON_NEGATIVE,
    "min_std": POSITIVE,
    "init_std": (lambda v: v > 0, "a value > algo.min_std"),
    "anneal_steps": (lambda v: v is None or v >= 1, "an integer >= 1 (or null for total_steps)"),
    "exploration_noise": NON_NEGATIVE,
    "exploration_noise_end": (lambda v: v is None or v >= 0, "a value >= 0 (or null for exploration_noise)"),
    "exploration_anneal_steps": (lambda v: v >= 0, "an integer >= 0 (0 = constant noise)"),
    "exploration_anneal_every": STEPS,
    "policy_delay": COUNT,
    "target_noise": (lambda v: v >= 0, "a value >= 0 (0 = off)"),
    "target_noise_clip": NON_NEGATIVE,
    "alpha": POSITIVE,
    "target_entropy": (lambda v: v is None or math.isfinite(v), "a finite value [nats] (or null for -|A|)"),
    "log_std_min": (lambda v: math.isfinite(v), "a finite value"),
    "log_std_max": (lambda v: math.isfinite(v), "a finite value > algo.log_std_min"),
    "unroll_steps": COUNT,
    "td_steps": COUNT,
    "dynamics_grad_scale": UNIT,
    "state_dim": COUNT,
    "value_coef": NON_NEGATIVE,
    "policy_coef": NON_NEGATIVE,
    "policy_temperature": POSITIVE,
    "gumbel_temperature": POSITIVE,
    "policy_reg": NON_NEGATIVE,
}


def _check_algo(algo: DictConfig) -> None:
    """Every numeric algo key in its domain (``ALGO_DOMAINS``)."""
    for key, (ok, rule) in ALGO_DOMAINS.items():
        require(ok(algo[key]), f"algo.{key}", algo[key], rule)


def action_kind(space: gym.Space) -> str:
    """'discrete' for Discrete, 'continuous' for Box, else the space's class name."""
    if isinstance(space, gym.spaces.Discrete):
        return "discrete"
    if isinstance(space, gym.spaces.Box):
        return "continuous"
    return type(space).__name__


@dataclasses.dataclass(frozen=True)
class EnvSpaces:
    """What validation reads of a gymnasium environment's spaces."""

    obs_shape: tuple[int, ...]
    obs_space: str  # the observation space's class name
    frames: bool  # uint8 observations
    stack: int  # frames an observation stacks (``frame_stack``)
    kind: str  # ``action_kind`` of the action space
    action_dim: int  # the number of actions of a discrete space, the vector's length of a continuous one


# An environment's spaces, by its config (and, for a multi-agent world, the seed it is made with): making the
# environment is most of a validation's cost (an Atari ROM, a MuJoCo model, a VMAS world), and a sweep's check
# (rlexp.cli) or a pack (run_pack) validates every cell of one env. Spaces are a function of the config in a
# process; a failure is raised again on the next call, never kept.
ENV_SPACES: dict[str, Any] = {}


def _env_key(env_cfg: DictConfig, *extra: Any) -> str:
    return json.dumps([OmegaConf.to_container(env_cfg, resolve=True), *extra], sort_keys=True, default=str)


def env_spaces(env_cfg: DictConfig) -> EnvSpaces:
    """The spaces of ``make_env(env_cfg)``, the environment made (and closed) once per config."""
    key = _env_key(env_cfg)
    if key not in ENV_SPACES:
        env = make_env(env_cfg)
        try:
            obs, space = env.observation_space, env.action_space
            discrete = isinstance(space, gym.spaces.Discrete)
            ENV_SPACES[key] = EnvSpaces(
                obs_shape=tuple(obs.shape or ()),
                obs_space=type(obs).__name__,
                frames=obs.dtype == np.uint8,
                stack=frame_stack(env),
                kind=action_kind(space),
                action_dim=int(space.n) if discrete else int(np.prod(space.shape or (1,))),
            )
        finally:
            env.close()
    return ENV_SPACES[key]


def _validate_action_space(cfg: DictConfig) -> tuple[int, int, bool, int]:
    """Refuse an env whose spaces the algorithm or the network cannot handle; returns (observation size,
    action size: the number of actions of a discrete space, the vector's length of a continuous one,
    whether observations are uint8 frames, how many frames an observation stacks)."""
    if is_multi_agent(cfg.env) or ALGOS[cfg.algo.name].multi_agent:
        return (*_validate_agents(cfg), False, 1)  # vector observations
    spaces = env_spaces(cfg.env)
    check_observations(cfg.network, spaces.obs_shape, cfg.env.id)
    if spaces.obs_space != "Box":
        raise ConfigError(
            "env.id",
            f"{cfg.env.id} has a {spaces.obs_space} observation space",
            "use an environment with Box (vector) observations",
        )
    spec, kind = ALGOS[cfg.algo.name], spaces.kind
    if kind not in spec.action_spaces:
        fits = [name for name, s in ALGOS.items() if kind in s.action_spaces and not s.multi_agent]  # a gym env
        fix = f"use algo={' or algo='.join(fits)}" if fits else f"no algorithm here handles {kind} actions yet"
        raise ConfigError("algo", f"algo={cfg.algo.name} cannot handle {cfg.env.id}'s {kind} action space", fix)
    return int(np.prod(spaces.obs_shape or (1,))), spaces.action_dim, spaces.frames, spaces.stack


def _agent_spaces(env_cfg: DictConfig, seed: int) -> tuple[list[AgentSpace], int]:
    """A multi-agent world's agents' spaces and its joint observation size, the world made once per config."""
    key = _env_key(env_cfg, seed)
    if key not in ENV_SPACES:
        env = MultiAgentPopulationEnv(OmegaConf.to_object(env_cfg), [seed])
        try:
            ENV_SPACES[key] = (list(env.agents), env.obs_dim)
        finally:
            env.close()
    return ENV_SPACES[key]


def _validate_agents(cfg: DictConfig) -> tuple[int, int]:
    """A multi-agent algorithm on a multi-agent env whose agents' action spaces it handles; returns (joint
    observation size, joint action size)."""
    spec, env_cfg = ALGOS[cfg.algo.name], cfg.env
    multi = [name for name, s in ALGOS.items() if s.multi_agent]
    if not is_multi_agent(env_cfg):
        raise ConfigError(
            "algo",
            f"algo={cfg.algo.name} is multi-agent and {env_cfg.id} is a gymnasium env",
            "use a multi-agent env "
            "(env=simple_spread, simple_adversary, vmas_navigation, vmas_balance, or env.api=pettingzoo|vmas)",
        )
    agents, obs_dim = _agent_spaces(env_cfg, cfg.seed)
    kinds = sorted({"discrete" if a.discrete else "continuous" for a in agents})
    action_dim = sum(a.action_dim for a in agents)
    if not spec.multi_agent:
        fits = [name for name in multi if set(kinds) <= set(ALGOS[name].action_spaces)]
        raise ConfigError(
            "algo",
            f"algo={cfg.algo.name} cannot handle {env_cfg.id}'s {'/'.join(kinds)} actions of "
            f"{len(agents)} agents (it is single-agent)",
            f"use algo={' or algo='.join(fits)}" if fits else "no multi-agent algorithm here handles them yet",
        )
    if spec.multi_agent and cfg.algo.share_parameters:
        # mappo's tanh_normal squashes into one box; maddpg squashes each agent's output into its own
        tanh = cfg.algo.name == "mappo" and cfg.algo.continuous_policy == "tanh_normal"
        spaces = {
            (a.obs_dim, a.discrete, a.action_dim, *((tuple(a.low), tuple(a.high)) if tanh and not a.discrete else ()))
            for a in agents
        }
        require(
            len(spaces) == 1,
            "algo.share_parameters",
            True,
            f"false: {env_cfg.id}'s agents differ in observation or action space"
            f"{' (or bounds, which tanh_normal squashes into)' if tanh else ''}, so no policy fits them all",
        )
    missing = [k for k in kinds if k not in spec.action_spaces]
    if missing:
        raise ConfigError(
            "algo", f"algo={cfg.algo.name} cannot handle {env_cfg.id}'s {missing[0]} actions", "use another env"
        )
    return obs_dim, action_dim


# ---------------------------------------------------------------- resources, before any work
FILES_RESERVED = 64  # descriptors a job holds besides its members' (Python, torch, W&B's service, Hydra's log)
FLOAT = 4  # bytes of a float32
ENV_BYTES = 64 * 1024  # one environment's state (a CartPole or a Box2D world), generously
COPIES = 5  # per parameter: itself, its gradient, two optimizer moments, a target network's copy


def files_per_member(cfg: DictConfig) -> int:
    """Descriptors a member holds open while it trains: its metrics.jsonl, and with W&B its run's
    connection to W&B's service (which raises its own limit)."""
    return 1 if resolve_wandb_mode(cfg.logger) == "disabled" else 2


def _mlp_params(widths: list[int]) -> int:
    """Weights, biases and per-layer norm parameters of an MLP through ``widths``."""
    return sum(a * b + 3 * b for a, b in zip(widths, widths[1:]))


def memory_per_member(
    cfg: DictConfig, obs_dim: int, action_dim: int, frames: bool = False, stack: int = 1
) -> tuple[int, int]:
    """Bytes one member needs: (replay memory, everything else: networks with gradients, optimizer
    state and targets, one batch's activations, rollouts, environments); ``frames``: the replay keeps
    observations as uint8; ``stack`` > 1 (with frames, DQN): each row keeps two frames of the stack
    (``FrameStackReplay``). The algorithm's spec says how many networks it trains and which replay
    buffer it fills, whose class gives the bytes of its rows."""
    algo, env, spec = cfg.algo, cfg.env, ALGOS[cfg.algo.name]
    hidden = [list(cfg[role].hidden or cfg.network.hidden) for role in ("actor", "critic")]
    widest = max(hidden, key=sum)
    nets = spec.networks * _mlp_params([obs_dim + action_dim, *widest, action_dim + 1])
    replay = 0
    if spec.replay is not None:
        buffer = FrameStackReplay if spec.replay.frame_stacks and frames and stack > 1 else spec.replay.buffer
        stored_actions = action_dim if spec.replay.actions == "vector" else 0
        replay = buffer.member_bytes(algo.buffer_size, obs_dim, stored_actions, frames, stack, env.num_envs)
        batch = algo.batch_size
    else:
        batch = algo.num_steps * env.num_envs
    activations = 4 * batch * (obs_dim + sum(widest) + action_dim) * FLOAT  # forward kept for backward, x2 nets
    rollout = 0 if replay else batch * (obs_dim + action_dim + 6) * FLOAT
    envs = 2 * env.num_envs * ENV_BYTES  # training's and evaluation's
    return replay, COPIES * nets * FLOAT + activations + rollout + envs


def available_memory(device: torch.device) -> int | None:
    """Bytes free for a job: the GPU's free memory on CUDA, else /proc/meminfo's MemAvailable (None
    where neither is known)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def check_resources(cfg: DictConfig, obs_dim: int, action_dim: int, frames: bool = False, stack: int = 1) -> None:
    """Refuse a job that cannot fit the process's open-file limit (RLIMIT_NOFILE, soft) or the
    available memory, naming num_seeds (or algo.buffer_size, when the replay memory is most of it)
    and the largest value that fits."""
    members = cfg.num_seeds
    per_member = files_per_member(cfg)
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    need = FILES_RESERVED + members * per_member
    if limit != resource.RLIM_INFINITY and need > limit:
        fits = max(0, (limit - FILES_RESERVED) // per_member)
        raise ConfigError(
            "num_seeds",
            f"{members} needs ~{need} open files ({per_member} per member; limit {limit}); the largest that "
            f"fits is {fits}",
            "lower num_seeds or raise the limit (ulimit -n)",
        )
    free = available_memory(resolve_device(cfg.device))
    replay, other = memory_per_member(cfg, obs_dim, action_dim, frames, stack)
    if free is None or members * (replay + other) <= free:
        return
    need_text = f"needs ~{_gib(members * (replay + other))} of memory ({_gib(free)} available)"
    if other > free:  # one member's networks alone do not fit: their size is what to change
        role = max(("actor", "critic"), key=lambda r: sum(cfg[r].hidden or cfg.network.hidden))
        key = f"{role}.hidden" if cfg[role].hidden else "network.hidden"
        raise ConfigError(
            key,
            f"{list(OmegaConf.select(cfg, key))}: one member's networks, gradients and optimizer state need "
            f"~{_gib(other)} of memory ({_gib(free)} available)",
            f"lower {key}",
        )
    row = replay // cfg.algo.buffer_size  # bytes a transition takes (a frame stack's few extra rows spread over them)
    if replay > other and free // members - other >= 2 * row:  # the replay memory is what does not fit
        fits = (free // members - other) // row
        raise ConfigError(
            "algo.buffer_size",
            f"{cfg.algo.buffer_size} with num_seeds={members} {need_text}; the largest that fits is {fits}",
            "lower algo.buffer_size or num_seeds",
        )
    raise ConfigError(
        "num_seeds",
        f"{members} {need_text}; the largest that fits is {free // (replay + other)}",
        "lower num_seeds" + (" or algo.buffer_size" if replay else ""),
    )
