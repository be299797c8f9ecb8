"""Value checks, once, before any work: each failure is a ConfigError naming the key and the fix.

Hydra's structured configs already refuse unknown keys and wrong types; this module refuses values
out of range, names missing from a registry, and combinations that cannot work.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable

import gymnasium as gym
import torch
from omegaconf import DictConfig, OmegaConf

from rlexp.algos import ALGOS
from rlexp.config import ConfigError
from rlexp.envs import check_env_id, make_env
from rlexp.grad import CLIPPERS
from rlexp.init import INITIALIZERS
from rlexp.loggers import WANDB_MODES
from rlexp.nets import ACTIVATIONS, NORMALIZATIONS
from rlexp.optim import OPTIMIZERS

REGISTRIES = {
    "activation": ACTIVATIONS,
    "init": INITIALIZERS,
    "normalization": NORMALIZATIONS,
    "clipping": CLIPPERS,
    "optimizer": OPTIMIZERS,
    "algo": ALGOS,
    "divergence": ("on", "off"),  # explosion checks on or off (the non-finite checks always run)
}


def _require(ok: bool, key: str, value: Any, rule: str) -> None:
    if not ok:
        raise ConfigError(key, f"{value!r} is out of range", f"set {key} to {rule}")


def _positive(cfg: DictConfig, prefix: str, keys: Iterable[str]) -> None:
    for k in keys:
        if k in cfg:
            _require(cfg[k] > 0, f"{prefix}.{k}", cfg[k], "a value > 0")


def _non_negative(cfg: DictConfig, prefix: str, keys: Iterable[str]) -> None:
    for k in keys:
        if k in cfg:
            _require(cfg[k] >= 0, f"{prefix}.{k}", cfg[k], "a value >= 0")


def _fraction(cfg: DictConfig, prefix: str, keys: Iterable[str], closed_high: bool = False) -> None:
    for k in keys:
        if k in cfg:
            ok = 0 <= cfg[k] <= 1 if closed_high else 0 <= cfg[k] < 1
            _require(ok, f"{prefix}.{k}", cfg[k], "a value in [0, 1]" if closed_high else "a value in [0, 1)")


def _choice(value: str, key: str, options: Iterable[str]) -> None:
    options = list(options)
    if value not in options:
        raise ConfigError(key, f"unknown value {value!r}", f"use one of: {', '.join(options)}")


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
            raise ConfigError(path, "unknown key", f"remove it; {prefix.rstrip('.') or 'the top level'} "
                              f"takes: {', '.join(known)}")
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            _check_known_keys(child, f"{path}.")


def validate(cfg: DictConfig) -> None:
    """Check every value of a composed config; raises ConfigError on the first bad one."""
    _check_known_keys(cfg)
    for group, registry in REGISTRIES.items():
        _choice(cfg[group].name, f"{group}.name", registry)

    _require(cfg.total_steps >= 1, "total_steps", cfg.total_steps, "an integer >= 1")
    _require(cfg.num_seeds >= 1, "num_seeds", cfg.num_seeds, "an integer >= 1")
    _require(cfg.seed >= 0, "seed", cfg.seed, "an integer >= 0")
    _require(cfg.threads >= -1, "threads", cfg.threads,
             "an integer >= -1 (0 = torch's default, -1 = by population size)")
    resolve_device(cfg.device)

    init = cfg.init
    _choice(init.last_layer, "init.last_layer", ("same", "uniform"))
    _positive(init, "init", ("last_layer_scale",))
    for k in ("gain", "last_layer_gain"):
        if init.get(k) is not None:
            _require(init[k] > 0, f"init.{k}", init[k], "a value > 0 (or null)")

    norm = cfg.normalization
    _non_negative(norm, "normalization", ("eps",) if norm.name == "weight" else ())
    _positive(norm, "normalization", ("eps", "g_init") if norm.name != "weight" else ("g_init",))
    if "momentum" in norm:
        _require(0 < norm.momentum <= 1, "normalization.momentum", norm.momentum, "a value in (0, 1]")

    _positive(cfg.clipping, "clipping", ("max_norm", "clip_value", "clip_factor", "eps"))

    opt = cfg.optimizer
    _positive(opt, "optimizer", ("lr",))
    _non_negative(opt, "optimizer", ("weight_decay", "eps", "epsilon", "momentum"))
    _fraction(opt, "optimizer", ("beta1", "beta2", "alpha", "decay"))
    if opt.get("nesterov"):
        _require(opt.momentum > 0, "optimizer.momentum", opt.momentum, "a value > 0 (nesterov needs momentum)")

    _non_negative(cfg.regularization, "regularization", ("l1", "l2"))

    net = cfg.network
    _require(all(h >= 1 for h in net.hidden), "network.hidden", list(net.hidden), "a list of widths >= 1")
    _require(net.output_scale != 0, "network.output_scale", net.output_scale, "a non-zero factor")

    log = cfg.logger
    if log.mode is not None:
        _choice(log.mode, "logger.mode", WANDB_MODES)
    _choice(log.progress, "logger.progress", ("auto", "rich", "plain", "off"))
    _require(log.log_every >= 1, "logger.log_every", log.log_every, "an integer >= 1 (env steps)")

    _require(cfg.env.num_envs >= 1, "env.num_envs", cfg.env.num_envs, "an integer >= 1")
    diag, div, inject = cfg.diagnostics, cfg.divergence, cfg.debug.inject
    _require(diag.every >= 0, "diagnostics.every", diag.every, "an integer >= 0 (0 = off)")
    _require(diag.histogram_every >= 0, "diagnostics.histogram_every", diag.histogram_every, "an integer >= 0")
    _require(0 <= diag.dormant_tau < 1, "diagnostics.dormant_tau", diag.dormant_tau, "a value in [0, 1)")
    _positive(div, "divergence", ("q_bound_factor", "grad_norm_bound", "patience"))
    _choice(inject.what, "debug.inject.what", ("none", "param", "grad", "obs"))
    if inject.what != "none":
        _require(0 <= inject.member < cfg.num_seeds, "debug.inject.member", inject.member,
                 f"a member index in [0, {cfg.num_seeds})")
        _require(0 <= inject.step < cfg.total_steps, "debug.inject.step", inject.step,
                 f"an env step in [0, {cfg.total_steps})")
    crash_at = cfg.debug.crash_at_step
    _require(crash_at == -1 or 0 <= crash_at < cfg.total_steps, "debug.crash_at_step", crash_at,
             f"-1 (never) or an env step in [0, {cfg.total_steps})")
    for key in ("obs_norm", "reward_norm"):
        _positive(cfg[key], key, ("clip",))
    _validate_networks(cfg)
    check_env_id(cfg.env.id)
    {"dqn": _validate_dqn, "ppo": _validate_actor_critic, "a2c": _validate_actor_critic, "ddpg": _validate_td3,
     "td3": _validate_td3}[cfg.algo.name](cfg)
    _validate_action_space(cfg)


def _validate_networks(cfg: DictConfig) -> None:
    """The actor's and critic's overrides name known options and sensible sizes."""
    for role in ("actor", "critic"):
        node = cfg[role]
        for group in ("activation", "init", "normalization"):
            if node[group] is not None:
                _choice(node[group], f"{role}.{group}", REGISTRIES[group])
        if node.hidden is not None:
            _require(all(h >= 1 for h in node.hidden), f"{role}.hidden", list(node.hidden),
                     "a list of widths >= 1 (or null for network.hidden)")
        if node.last_layer_gain is not None:
            _require(node.last_layer_gain > 0, f"{role}.last_layer_gain", node.last_layer_gain, "a value > 0 (or null)")
    depth = len(cfg.critic.hidden if cfg.critic.hidden is not None else cfg.network.hidden)
    _require(0 <= cfg.critic.action_layer <= depth, "critic.action_layer", cfg.critic.action_layer,
             f"an index in [0, {depth}]: 0 joins the action to the input, k to the k-th hidden layer's output")


def _uses_batch_norm(cfg: DictConfig) -> bool:
    return "batch" in (cfg.normalization.name, cfg.actor.normalization, cfg.critic.normalization)


def _require_batch_statistics(cfg: DictConfig, key: str, batch: int) -> None:
    """Batch normalization trains on each member's batch statistics: a batch needs two samples."""
    if _uses_batch_norm(cfg) and batch < 2:
        raise ConfigError(key, f"a batch of {batch} sample has no batch statistics for normalization=batch",
                          f"raise {key} (batches of at least 2 samples) or use another normalization")


def _validate_actor_critic(cfg: DictConfig) -> None:
    algo = cfg.algo
    for k in ("num_steps", "update_epochs", "num_minibatches"):
        _require(algo[k] >= 1, f"algo.{k}", algo[k], "an integer >= 1")
    batch = algo.num_steps * cfg.env.num_envs
    if algo.num_minibatches > batch:
        raise ConfigError("algo.num_minibatches", f"{algo.num_minibatches} exceeds the rollout of "
                          f"{batch} samples (algo.num_steps x env.num_envs)", "lower algo.num_minibatches")
    _require_batch_statistics(cfg, "algo.num_minibatches", batch // algo.num_minibatches)
    _fraction(algo, "algo", ("gamma", "gae_lambda"), closed_high=True)
    if algo.anneal_steps is not None:
        _require(algo.anneal_steps >= 1, "algo.anneal_steps", algo.anneal_steps, "an integer >= 1 (or null)")
    _positive(algo, "algo", ("clip_coef",))
    _non_negative(algo, "algo", ("ent_coef", "vf_coef"))
    if batch > cfg.total_steps:
        raise ConfigError("total_steps", f"{cfg.total_steps} is shorter than one rollout of {batch} steps",
                          "raise total_steps or lower algo.num_steps")


def _validate_replay(cfg: DictConfig, counts: Iterable[str]) -> None:
    """Checks every replay-based algorithm shares: counts >= 1, gamma, tau, the batch, learning_starts."""
    algo = cfg.algo
    for k in ("buffer_size", "batch_size", "train_frequency", "gradient_steps", *counts):
        _require(algo[k] >= 1, f"algo.{k}", algo[k], "an integer >= 1")
    _fraction(algo, "algo", ("gamma",), closed_high=True)
    _require(0 < algo.tau <= 1, "algo.tau", algo.tau, "a value in (0, 1]")
    _require(algo.learning_starts >= 0, "algo.learning_starts", algo.learning_starts, "an integer >= 0")
    if algo.batch_size > algo.buffer_size:
        raise ConfigError("algo.batch_size", f"{algo.batch_size} exceeds algo.buffer_size={algo.buffer_size}",
                          "lower algo.batch_size or raise algo.buffer_size")
    _require_batch_statistics(cfg, "algo.batch_size", algo.batch_size)
    if algo.learning_starts >= cfg.total_steps:
        raise ConfigError("algo.learning_starts", f"{algo.learning_starts} >= total_steps={cfg.total_steps}",
                          "lower algo.learning_starts or raise total_steps, or nothing is ever learned")


def _validate_td3(cfg: DictConfig) -> None:
    _validate_replay(cfg, ("policy_delay",))
    _non_negative(cfg.algo, "algo", ("exploration_noise", "target_noise", "target_noise_clip"))


def _validate_dqn(cfg: DictConfig) -> None:
    _validate_replay(cfg, ("target_update_period",))
    algo = cfg.algo
    _fraction(algo, "algo", ("start_e", "end_e"), closed_high=True)
    _require(0 < algo.exploration_fraction <= 1, "algo.exploration_fraction", algo.exploration_fraction,
             "a value in (0, 1]")
    _choice(algo.target_update, "algo.target_update", ("hard", "soft"))
    _choice(algo.loss, "algo.loss", ("mse", "huber"))
    _positive(algo, "algo", ("huber_delta", "r_max"))
    _non_negative(algo, "algo", ("clip_delta",))

def action_kind(space: gym.Space) -> str:
    """'discrete' for Discrete, 'continuous' for Box, else the space's class name."""
    if isinstance(space, gym.spaces.Discrete):
        return "discrete"
    if isinstance(space, gym.spaces.Box):
        return "continuous"
    return type(space).__name__


def _validate_action_space(cfg: DictConfig) -> None:
    env = make_env(cfg.env)
    try:
        kind = action_kind(env.action_space)
        if not isinstance(env.observation_space, gym.spaces.Box):
            raise ConfigError("env.id", f"{cfg.env.id} has a {type(env.observation_space).__name__} "
                              "observation space", "use an environment with Box (vector) observations")
    finally:
        env.close()
    spec = ALGOS[cfg.algo.name]
    if kind not in spec.action_spaces:
        fits = [name for name, s in ALGOS.items() if kind in s.action_spaces]
        fix = f"use algo={' or algo='.join(fits)}" if fits else f"no algorithm here handles {kind} actions yet"
        raise ConfigError("algo", f"algo={cfg.algo.name} cannot handle {cfg.env.id}'s {kind} action space", fix)
