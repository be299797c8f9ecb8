"""Checkpoints: everything a job needs to continue, one file per member (``seed_<k>/checkpoint.pt``).

The population's state is gathered as one flat dict ``{"<part>/<name>": value}``. A tensor or array
with a leading member dimension [P, ...] is split across the members' files, as is a ``PerMember``
list; anything else (counters, a stream's position, a ``Shared`` tensor) belongs to the population
and goes into every file. Loading stacks the members' files back into the population's state, bit
for bit. A file holds tensors, numbers, strings, lists and dicts only:
``torch.load(path, weights_only=True)`` reads it. Files are written atomically (a temporary file,
then a rename).

Parts: ``env/`` (the training environments: CartPoles' arrays, each gymnasium environment's Python
state and random generator (a MinAtar game's objects, sticky action and generator), a PettingZoo
environment's objects, a VMAS environment's tensors and random state, the episode bookkeeping),
``streams/`` and ``eval_streams/`` (the members' torch generators and their drawn pools),
``obs_norm/``, ``reward_norm/``, ``recorder/`` (health, divergence records, the latest instruments,
counters), ``torch_rng``, and what the algorithm hands over (``ctx.checkpoint_state``): ``<object>/...``
for its networks, pipelines (optimizer state) and, with ``checkpoint.replay``, its replay buffer;
``loop/<name>`` for its loop's variables.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlexp.config.schema import ConfigError
from rlexp.data.buffers import FrameStackReplay, ReplayBuffer
from rlexp.diagnostics.interventions import Interventions
from rlexp.envs.gym import PopulationEnv
from rlexp.envs.normalize import RunningMeanStd
from rlexp.envs.streams import MemberStreams
from rlexp.optim.pipeline import GradientPipeline
from rlexp.run.jobs import config_difference
from rlexp.run.recorder import Recorder

FORMAT = "rlexp-checkpoint/1"
FILE = "checkpoint.pt"
KEYS = ("member", "members", "step", "replay", "config", "state", "shared")  # besides format
# keys that may differ between the job that wrote a checkpoint and the one continuing from it
CONTINUE_IGNORES = ("debug.crash_at_step",)
PLAIN = (bool, int, float, str, type(None))


class PerMember(list):
    """One entry per member (Python values): entry k goes into member k's file."""


@dataclass
class Shared:
    """A tensor or array without a member dimension: the population's, in every file."""

    value: Any


class CheckpointError(Exception):
    """A checkpoint that cannot be read: ``<file>: <what is wrong>`` (the file relative to the job dir)."""


# ---------------------------------------------------------------- values in files
def _plain(value: Any) -> Any:
    """``value`` as what ``torch.load(weights_only=True)`` reads: CPU tensors, numbers, strings, lists, dicts."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone(memory_format=torch.contiguous_format)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value)).clone()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, deque)):
        return [_plain(v) for v in value]
    if isinstance(value, PLAIN):
        return value
    raise TypeError(f"a checkpoint cannot hold {type(value).__name__}")


def split(state: dict[str, Any], members: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The population's flat ``state`` as each member's entries and the shared ones."""
    own: list[dict[str, Any]] = [{} for _ in range(members)]
    shared: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, Shared):
            shared[key] = _plain(value.value)
        elif isinstance(value, PerMember) or (isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim >= 1):
            assert len(value) == members, f"{key}: {len(value)} entries for {members} members"
            if isinstance(value, np.ndarray):  # member k's entry of a [P] array stays a (0-dim) tensor
                value = torch.from_numpy(np.ascontiguousarray(value))
            for k in range(members):
                own[k][key] = _plain(value[k])
        else:
            shared[key] = _plain(value)
    return own, shared


def stack(own: list[dict[str, Any]], shared: dict[str, Any]) -> dict[str, Any]:
    """The population's flat state from each member's entries (tensors stacked, others listed) and the shared."""
    state = dict(shared)
    for key in own[0]:
        values = [entries[key] for entries in own]
        state[key] = torch.stack(values) if all(isinstance(v, torch.Tensor) for v in values) else values
    return state


def _put(target: torch.Tensor | np.ndarray, value: torch.Tensor) -> None:
    """Copy ``value`` into ``target`` in place (views of it see the change)."""
    if isinstance(target, torch.Tensor):
        with torch.no_grad():
            target.copy_(value.to(target.device))
    else:
        target[...] = value.numpy()


def _prefixed(state: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}


# ---------------------------------------------------------------- the parts
def _streams_state(streams: MemberStreams) -> dict[str, Any]:
    return {
        "generators": torch.stack([g.get_state() for g in streams.generators]),  # [P, S] uint8
        "pool": streams.pool,  # [P, n] float64, the numbers drawn and not used yet
        "pos": streams.pos,
    }


def _load_streams(streams: MemberStreams, state: dict[str, Any]) -> None:
    for generator, generator_state in zip(streams.generators, state["generators"]):
        generator.set_state(generator_state.clone())
    streams.pool = state["pool"].numpy().copy()
    streams.pos = int(state["pos"])


def _stats_state(stats: RunningMeanStd) -> dict[str, Any]:
    return {"mean": stats.mean, "var": stats.var, "count": stats.count}  # [P, D], [P, D], [P]


def _load_stats(stats: RunningMeanStd, state: dict[str, Any]) -> None:
    stats.mean, stats.var, stats.count = (state[k].numpy().copy() for k in ("mean", "var", "count"))


def _exact(env: gym.Env) -> bool:
    """True when the environment's whole state is Python attributes (gymnasium's classic control, MinAtar)."""
    return type(env.unwrapped).__module__.startswith("gymnasium.envs.classic_control") or _minatar(env) is not None


def _minatar(env: gym.Env) -> Any:
    """The MinAtar ``Environment`` behind a gymnasium environment (its game, sticky action and generator), or None."""
    game = getattr(env.unwrapped, "game", None)
    return game if type(game).__module__ == "minatar.environment" else None


def _minatar_state(game: Any) -> dict[str, Any]:
    """A MinAtar game's state: its last (sticky) action, its generator (JSON) and the game's attributes
    (ints, bools, arrays and lists of them; the generator the game shares with its wrapper aside)."""
    name, keys, pos, has_gauss, cached = game.random.get_state()
    return {
        "last_action": game.last_action,
        "random": json.dumps([name, keys.tolist(), pos, has_gauss, cached]),
        "game": {key: value for key, value in vars(game.env).items() if key != "random"},
    }


def _load_minatar(game: Any, state: dict[str, Any]) -> None:
    game.last_action = state["last_action"]
    name, keys, pos, has_gauss, cached = json.loads(state["random"])
    game.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    game.env.random = game.random  # one generator for the sticky actions and the game, as MinAtar's seed() sets it
    for key, value in state["game"].items():
        setattr(game.env, key, value.numpy().copy() if isinstance(value, torch.Tensor) else value)


def _gym_state(env: gym.Env) -> dict[str, Any]:
    """One gymnasium environment's random generator (JSON) and its wrappers' and its own plain attributes."""
    state: dict[str, Any] = {}
    level, layer = 0, env
    while True:
        for name, value in vars(layer).items():
            if isinstance(value, np.generic):  # a numpy scalar keeps its dtype: a 0-dim tensor
                state[f"{level}.{name}"] = np.asarray(value)
            elif isinstance(value, PLAIN) or (isinstance(value, np.ndarray) and name == "state"):
                state[f"{level}.{name}"] = value
        if not isinstance(layer, gym.Wrapper):
            break
        layer, level = layer.env, level + 1
    generator = env.unwrapped._np_random
    state["np_random"] = None if generator is None else json.dumps(generator.bit_generator.state)
    if (game := _minatar(env)) is not None:
        state["minatar"] = _minatar_state(game)
    return state


def _load_gym(env: gym.Env, state: dict[str, Any]) -> None:
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    for key, value in state.items():
        if key == "np_random":
            if value is not None:
                env.unwrapped.np_random.bit_generator.state = json.loads(value)
            continue
        if key == "minatar":
            _load_minatar(_minatar(env), value)
            continue
        level, name = key.split(".", 1)
        if isinstance(value, torch.Tensor):
            value = value.numpy().dtype.type(value.item()) if value.ndim == 0 else value.numpy().copy()
        setattr(layers[int(level)], name, value)


_PZ_SKIP = {"scenario", "viewer", "screen", "game_font", "action_spaces", "observation_spaces", "state_space"}


def _pz_parts(obj: Any, path: str, seen: set[int]) -> list[tuple[str, Any, Any, Any]]:
    """Every value a PettingZoo environment's objects hold (the env, its wrappers, its world and the
    world's entities): (path, holder, key, value) with plain values, arrays and random generators."""
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    parts = []
    for key, value in vars(obj).items():
        if key in _PZ_SKIP or key.startswith("_ezpickle"):
            continue
        here = f"{path}.{key}"
        if isinstance(value, np.random.Generator):
            parts.append((here, obj, key, json.dumps(value.bit_generator.state)))
        elif type(value).__module__.split(".")[0] in ("mpe2", "pettingzoo"):
            parts += _pz_parts(value, here, seen)
        elif isinstance(value, list) and value and all(hasattr(v, "__dict__") for v in value):
            for i, item in enumerate(value):
                parts += _pz_parts(item, f"{here}.{i}", seen)
        elif isinstance(value, (np.ndarray, np.generic, *PLAIN, list, dict)):
            parts.append((here, obj, key, np.asarray(value) if isinstance(value, np.generic) else value))
    return parts


def _pz_value(value: Any, current: Any) -> Any:
    """A saved PettingZoo value as the environment holds it (arrays and numpy scalars back from tensors)."""
    if isinstance(current, np.random.Generator):
        current.bit_generator.state = json.loads(value)
        return current
    if isinstance(value, torch.Tensor):
        array = value.numpy().copy()
        return array.dtype.type(array.item()) if isinstance(current, np.generic) else array
    if isinstance(value, list):
        return [v.numpy().copy() if isinstance(v, torch.Tensor) else v for v in value]
    return value


def _is_vmas(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "vmas"


def _vmas_parts(obj: Any, path: str, seen: set[int]) -> list[tuple[str, Any, Any, Any]]:
    """Every tensor and plain value a VMAS environment's objects hold (the environment, its scenario,
    world, entities, their states and sensors): (path, holder, key, value)."""
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    parts = []
    for key, value in vars(obj).items():
        here = f"{path}.{key}"
        if isinstance(value, (torch.Tensor, *PLAIN)):
            parts.append((here, obj, key, value))
        elif _is_vmas(value):
            parts += _vmas_parts(value, here, seen)
        elif isinstance(value, list | dict):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, item in items:
                if isinstance(item, torch.Tensor) and isinstance(value, list):
                    parts.append((f"{here}.{k}", value, k, item))
                elif _is_vmas(item):
                    parts += _vmas_parts(item, f"{here}.{k}", seen)
    return parts


def _vmas_rng(state: list[Any]) -> str:
    """A member's VMAS random state (torch's, numpy's and python's generators) as JSON."""
    torch_state, (name, keys, pos, has_gauss, cached), py_state = state
    return json.dumps([torch_state.tolist(), [name, keys.tolist(), pos, has_gauss, cached], py_state])


def _vmas_rng_back(text: str) -> list[Any]:
    torch_state, (name, keys, pos, has_gauss, cached), (version, internal, gauss) = json.loads(text)
    numpy_state = (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached)
    return [torch.tensor(torch_state, dtype=torch.uint8), numpy_state, (version, tuple(internal), gauss)]


def _marl_env_state(env: Any) -> dict[str, Any]:
    """A multi-agent population's state: episode counters and every environment's objects (PettingZoo:
    the env, its world and entities; VMAS: every tensor of the environment and its scenario, and each
    member's random state)."""
    P, E = env.members, env.num_envs
    state = {
        "ep_return": env._ep_return.reshape(P, E, -1),
        "ep_length": env._ep_length.reshape(P, E),
        "episodes": PerMember(env.episodes),
        "last_returns": PerMember(env.last_returns),
        "episode_count": env.episode_count,
    }
    if env.api == "pettingzoo":
        pz = [{path: value for path, _, _, value in _pz_parts(e, "env", set())} for e in env.envs]
        state["pz"] = PerMember([pz[k * E : (k + 1) * E] for k in range(P)])
    else:
        state["vmas"] = PerMember(
            {"objects": {path: _saved(v) for path, _, _, v in _vmas_parts(e, "env", set())}, "rng": _vmas_rng(rng)}
            for e, rng in zip(env.envs, env._rng)
        )
    return state


def _saved(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def _load_marl_env(env: Any, state: dict[str, Any]) -> bool:
    n = env.members * env.num_envs
    env._ep_return = state["ep_return"].numpy().reshape(n, -1).copy()
    env._ep_length = state["ep_length"].numpy().reshape(n).copy()
    env.episodes = [[tuple(e) for e in member] for member in state["episodes"]]
    env.last_returns = [deque(r, maxlen=d.maxlen) for r, d in zip(state["last_returns"], env.last_returns)]
    env.episode_count = state["episode_count"].numpy().copy()
    if env.api == "vmas":
        if "vmas" not in state:  # written before VMAS environments were saved: new episodes
            env._obs = env.reset().reshape(n, -1)  # the loop's observations are replaced by these
            return False
        for k, (e, saved) in enumerate(zip(env.envs, state["vmas"])):
            for path, holder, key, current in _vmas_parts(e, "env", set()):
                value = saved["objects"].get(path, current)
                if (
                    isinstance(current, torch.Tensor)
                    and isinstance(value, torch.Tensor)
                    and current.shape == value.shape
                ):
                    current.copy_(value)  # in place: the tensors the objects share stay shared
                elif isinstance(holder, list):
                    holder[key] = value
                else:
                    setattr(holder, key, value)
            env._rng[k] = _vmas_rng_back(saved["rng"])
        return True
    for e, saved in zip(env.envs, (s for member in state["pz"] for s in member)):
        for path, holder, key, _ in _pz_parts(e, "env", set()):
            if path in saved:
                setattr(holder, key, _pz_value(saved[path], getattr(holder, key)))
    return True


def _env_state(env: PopulationEnv) -> dict[str, Any]:
    if hasattr(env, "agent_names"):
        return _marl_env_state(env)
    P, E = env.members, env.num_envs
    state = {
        "done": env._done.reshape(P, E),
        "ep_return": env._ep_return.reshape(P, E),
        "ep_length": env._ep_length.reshape(P, E),
        "obs": env._obs.reshape(P, E, -1),
        "episodes": PerMember(env.episodes),
        "last_returns": PerMember(env.last_returns),
        "episode_count": env.episode_count,
        "gym": PerMember([[_gym_state(e) for e in env.envs[k * E : (k + 1) * E]] for k in range(P)]),
    }
    if env.cartpoles is not None:
        state["cartpoles"] = env.cartpoles.state.T.reshape(P, E, 4)  # [P, E, 4]: x, x_dot, theta, theta_dot
    return state


def _load_env(env: PopulationEnv, state: dict[str, Any]) -> bool:
    """Restore the training environments; False when some environment's state is not all Python
    attributes (MuJoCo, Box2D): those start new episodes instead, from their restored generators."""
    if hasattr(env, "agent_names"):
        return _load_marl_env(env, state)
    n = env.members * env.num_envs
    env._done = state["done"].numpy().reshape(n).copy()
    env._ep_return = state["ep_return"].numpy().reshape(n).copy()
    env._ep_length = state["ep_length"].numpy().reshape(n).copy()
    env._obs = state["obs"].numpy().reshape(n, -1).copy()
    env.episodes = [[tuple(e) for e in member] for member in state["episodes"]]
    env.last_returns = [deque(r, maxlen=d.maxlen) for r, d in zip(state["last_returns"], env.last_returns)]
    env.episode_count = state["episode_count"].numpy().copy()
    for i, gym_state in enumerate(s for member in state["gym"] for s in member):
        _load_gym(env.envs[i], gym_state)
    if env.cartpoles is not None:
        env.cartpoles.state = np.ascontiguousarray(state["cartpoles"].numpy().reshape(n, 4).T)
    if all(_exact(e) for e in env.envs):
        return True
    for i in range(n):
        env._reset_env(i)  # an episode boundary: the interrupted episodes are dropped
    return False


def _recorder_state(recorder: Recorder) -> dict[str, Any]:
    health, explosions = recorder.health, recorder.explosions
    state = {
        "alive": health.alive,
        "diverged_at": health.diverged_at,
        "cause": health.cause,
        "q_strikes": explosions.q_strikes,
        "grad_strikes": explosions.grad_strikes,
        "histories": PerMember([list(h.records) for h in recorder.histories]),
        "divergence": PerMember([recorder.divergence.get(k) for k in range(recorder.members)]),
        "member_done": PerMember(recorder.member_done),
        "member_summaries": PerMember(recorder.member_summaries),
        "eval_returns": PerMember(recorder.eval_returns),
        "updates_total": recorder._updates_total,
        "notes": recorder._notes,
        "injected": recorder._injected,
        "last_log_step": recorder._last_log_step,
    }
    # [P] each, computed: a checkpoint follows the log record that resolved them
    state.update({f"instruments/{name}": value for name, value in recorder._instruments.items()})
    return state


def _load_recorder(recorder: Recorder, state: dict[str, Any]) -> None:
    for name in ("alive", "diverged_at", "cause"):
        setattr(recorder.health, name, state[name].to(recorder.device))
    recorder.explosions.q_strikes = state["q_strikes"].to(recorder.device)
    recorder.explosions.grad_strikes = state["grad_strikes"].to(recorder.device)
    for history, records in zip(recorder.histories, state["histories"]):
        history.records.extend((step, record) for step, record in records)
    recorder.divergence = {k: d for k, d in enumerate(state["divergence"]) if d is not None}
    recorder.member_done = list(state["member_done"])
    recorder.member_summaries = list(state["member_summaries"])
    recorder.eval_returns = list(state["eval_returns"])
    recorder._updates_total = state["updates_total"]
    recorder._notes = dict(state["notes"])
    recorder._injected = state["injected"]
    recorder._last_log_step = state["last_log_step"]
    recorder._instruments = {k: v.to(recorder.device) for k, v in _prefixed(state, "instruments/").items()}


def _optimizer_state(pipeline: GradientPipeline) -> dict[str, Any]:
    """The optimizer's state tensors ([P, N'] moments, rows padded; 0-dim step counts, shared), flags
    and hyperparameters."""
    optimizer = pipeline.optimizer
    state: dict[str, Any] = {
        "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    }
    for name, value in vars(optimizer).items():
        if name in ("params", "param_groups"):
            continue
        if isinstance(value, (torch.Tensor, bool, int, float)):
            state[name] = value
        elif isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value):
            state.update({f"{name}.{i}": v for i, v in enumerate(value)})
    return state


def _load_optimizer(pipeline: GradientPipeline, state: dict[str, Any]) -> None:
    optimizer = pipeline.optimizer
    for group, saved in zip(optimizer.param_groups, state["param_groups"]):
        group.update(saved)
    for key, value in state.items():
        if key == "param_groups":
            continue
        name, _, index = key.partition(".")
        current = getattr(optimizer, name)
        if index:
            _put(current[int(index)], value)
        elif isinstance(current, torch.Tensor):
            _put(current, value)
        else:
            setattr(optimizer, name, value)


FRAME_LINKS = ("prev", "last", "count")  # FrameStackReplay's host arrays, [P, ...] each


def _buffer_state(buffer: ReplayBuffer) -> dict[str, Any]:
    frames = {} if buffer.frames is None else {"frames": buffer.frames}
    if isinstance(buffer, FrameStackReplay):
        frames |= {name: getattr(buffer, name) for name in FRAME_LINKS}
    return {"data": buffer.data, "ptr": buffer.ptr, "size": buffer.size, "filling": buffer._filling} | frames


def _load_buffer(buffer: ReplayBuffer, state: dict[str, Any]) -> None:
    _put(buffer.data, state["data"])  # in place: the host view of it stays valid
    if buffer.frames is not None:
        _put(buffer.frames, state["frames"])
    buffer.ptr, buffer.size = state["ptr"].numpy().copy(), state["size"].numpy().copy()
    buffer._filling = state["filling"]
    if isinstance(buffer, FrameStackReplay):
        for name in FRAME_LINKS:
            setattr(buffer, name, state[name].numpy().copy())


Part = nn.Module | GradientPipeline | ReplayBuffer | Interventions | None  # what an algorithm hands over by name
Loop = Callable[[], dict[str, Any]]  # the algorithm's loop variables, read when a checkpoint is written


def _object_state(obj: Part, replay: bool) -> dict[str, Any]:
    if isinstance(obj, nn.Module):
        return dict(obj.state_dict())
    if isinstance(obj, GradientPipeline):
        return _optimizer_state(obj)
    if isinstance(obj, ReplayBuffer):
        return _buffer_state(obj) if replay else {}
    if isinstance(obj, Interventions):
        return obj.state() if obj.active else {}
    return {}


def _load_object(obj: Part, state: dict[str, Any]) -> None:
    if isinstance(obj, nn.Module):
        obj.load_state_dict(state)
    elif isinstance(obj, GradientPipeline):
        _load_optimizer(obj, state)
    elif isinstance(obj, ReplayBuffer) and state:
        _load_buffer(obj, state)
    elif isinstance(obj, Interventions) and state:
        obj.load_state(state)


# ---------------------------------------------------------------- a job's checkpoints
class Checkpoints:
    """A job's checkpoints: where they go (``<job dir>/seed_<k>/checkpoint.pt``), what they hold, and
    the state a continued job starts from (``saved``)."""

    def __init__(self, out_dir: Path, config: dict[str, Any], replay: bool) -> None:
        self.dir = out_dir
        self.config = config  # the job's resolved config, kept in every file
        self.replay = replay
        self.saved: dict[str, Any] | None = None  # the population's flat state, when continuing
        self.step = 0  # the env step (per member) of the checkpoint continued from
        self.exact_envs = True  # every training environment's state was restored
        self.policy_only = False  # rlexp.evaluate: restore the networks, then stop (PolicyLoaded)

    def path(self, member: int) -> Path:
        return self.dir / f"seed_{member}" / FILE

    # ---- writing
    def context_state(self, ctx: Any) -> dict[str, Any]:
        """The run context's state (environments, streams, normalizers, recorder) as a flat dict."""
        state: dict[str, Any] = {"torch_rng": Shared(torch.get_rng_state())}
        parts = {
            "env": _env_state(ctx.env),
            "streams": _streams_state(ctx.streams),
            "obs_norm": _stats_state(ctx.obs_norm.stats),
            "reward_norm": {**_stats_state(ctx.reward_norm.stats), "returns": ctx.reward_norm.returns},
            "recorder": _recorder_state(ctx.recorder),
        }
        if ctx.evaluator._streams is not None:
            parts["eval_streams"] = _streams_state(ctx.evaluator._streams)
        for part, values in parts.items():
            state.update({f"{part}/{k}": v for k, v in values.items()})
        return state

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Write each member's file of the population's flat ``state`` at env step ``step``."""
        members = len(state["recorder/member_done"])
        own, shared = split(state, members)
        config = json.dumps(self.config)
        for k in range(members):
            content = {
                "format": FORMAT,
                "member": k,
                "members": members,
                "step": step,
                "replay": self.replay,
                "config": config,
                "state": own[k],
                "shared": shared,
            }
            path = self.path(k)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{FILE}.")
            try:
                with os.fdopen(fd, "wb") as f:
                    torch.save(content, f)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    # ---- reading
    def load(self, members: int) -> int | None:
        """Read the members' files into ``saved``; the step they were written at, or None when there is
        no checkpoint. CheckpointError for a file that is missing (while another member's exists), cut
        off, not a checkpoint, or at another step; ConfigError when they were written with another config."""
        paths = [self.path(k) for k in range(members)]
        if not any(p.exists() for p in paths):
            return None
        found = next(p for p in paths if p.exists())
        first = read(found, self.dir)
        differs = config_difference(json.loads(first["config"]), self.config, CONTINUE_IGNORES)
        if differs is not None:
            key, old, new = differs
            raise ConfigError(
                key,
                f"{found} was written by a job with {key}={old!r}, this run has {new!r}",
                "resume with the config it was started with, or start the job in a new directory",
            )
        contents = [read(p, self.dir) for p in paths]
        for k, content in enumerate(contents):
            name = self.path(k).relative_to(self.dir)
            if content["member"] != k or content["members"] != members:
                written = f"member {content['member']} of {content['members']}"
                raise CheckpointError(f"{name}: {written}, not member {k} of {members}")
            if content["step"] != first["step"]:
                raise CheckpointError(f"{name}: written at step {content['step']}, another member's at {first['step']}")
        self.saved = stack([c["state"] for c in contents], first["shared"])
        self.step = first["step"]
        return self.step

    def restore_recorder(self, recorder: Recorder) -> None:
        """Restore the recorder's state from ``saved`` (before it opens the members' logs)."""
        _load_recorder(recorder, _prefixed(self.saved, "recorder/"))

    def restore_context(self, ctx: Any) -> None:
        """Restore the run context's environments, streams and normalizers from ``saved`` (once the
        algorithm has reset its environments)."""
        state = self.saved
        torch.set_rng_state(state["torch_rng"])
        self.exact_envs = _load_env(ctx.env, _prefixed(state, "env/"))
        _load_streams(ctx.streams, _prefixed(state, "streams/"))
        _load_stats(ctx.obs_norm.stats, _prefixed(state, "obs_norm/"))
        reward = _prefixed(state, "reward_norm/")
        _load_stats(ctx.reward_norm.stats, reward)
        ctx.reward_norm.returns = reward["returns"].numpy().copy()
        if "eval_streams/pos" in state:
            ctx.evaluator.uniform(0)  # makes the stream
            _load_streams(ctx.evaluator._streams, _prefixed(state, "eval_streams/"))

    def algorithm_state(self, objects: dict[str, Part], loop: dict[str, Any]) -> dict[str, Any]:
        """The algorithm's objects' and loop variables' state as a flat dict."""
        state: dict[str, Any] = {}
        for name, obj in objects.items():
            state.update({f"{name}/{k}": v for k, v in _object_state(obj, self.replay).items()})
        state.update({f"loop/{name}": value for name, value in loop.items()})
        return state

    def restore_algorithm(self, objects: dict[str, Part], loop: dict[str, Any], env: PopulationEnv) -> dict[str, Any]:
        """Restore the algorithm's ``objects`` in place; returns its loop variables (arrays and tensors
        restored in place into those of ``loop``, the others as saved)."""
        for name, obj in objects.items():
            _load_object(obj, _prefixed(self.saved, f"{name}/"))
        restored: dict[str, Any] = {}
        for name, current in loop.items():
            value = self.saved[f"loop/{name}"]
            if isinstance(current, (torch.Tensor, np.ndarray)):
                _put(current, value)
                value = current
            restored[name] = value
        if not self.exact_envs and isinstance(restored.get("obs"), np.ndarray):
            restored["obs"][...] = env._obs.reshape(restored["obs"].shape)  # the new episodes' first observations
        return restored


def read(path: Path, job_dir: Path) -> dict[str, Any]:
    """One checkpoint file's content; CheckpointError (``<file>: <what is wrong>``) when it is missing,
    cut off or not a checkpoint."""
    name = path.relative_to(job_dir) if path.is_relative_to(job_dir) else path
    try:
        content = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise CheckpointError(f"{name}: missing") from None
    except Exception as exc:  # cut off, garbage, a pickle of something else
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CheckpointError(f"{name}: not a readable checkpoint ({type(exc).__name__}: {first_line})") from None
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise CheckpointError(f"{name}: not an rlexp checkpoint (no format {FORMAT!r})")
    missing = [key for key in KEYS if key not in content]
    if missing:
        raise CheckpointError(f"{name}: missing key {', '.join(missing)}")
    return content
