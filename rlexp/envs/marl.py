"""Multi-agent population environments: PettingZoo's parallel API and VMAS, P members x E environments.

``env.api`` picks the world: ``gymnasium`` (``rlexp.envs.gym.PopulationEnv``), ``pettingzoo`` (``env.id`` a
module with a ``parallel_env`` constructor, e.g. ``mpe2.simple_spread_v3`` or
``pettingzoo.sisl.multiwalker_v9``) or ``vmas`` (``env.id`` a VMAS scenario, e.g. ``navigation``).
``population_env`` builds either kind; the run context and evaluation call it.

The agents of a member are laid out side by side: the joint observation is the concatenation of the
agents' observations, ``[P, E, D]`` with ``D = sum_i obs_i`` (agent i reads ``obs[..., slices[i]]``), so
observation normalization, the finiteness checks and evaluation treat it as one vector. Actions go in
as a list with one array per agent (``[P, E]`` integers for a discrete agent, ``[P, E, A_i]`` for a
continuous one). Rewards come back per agent (``agent_reward`` [P, E, N]) and as the team's sum
(``reward`` [P, E]: the episode return a member reports is the sum over agents).

Episodes end for all agents at once (any agent terminated: terminated; all truncated: truncated) and
reset at the same step (``next_obs`` holds the first observation of the next episode where one ended,
``obs`` the last of the finished one), so every step is a transition, as in the single-agent worlds.
Seeding is per member: a PettingZoo environment is reset with its ``env_seeds`` seed first and its own
generator afterwards; each member's VMAS batch (E environments) is made and reset with the member's
seed and draws from a random state of its own, swapped in around its calls (VMAS keeps one for all its
environments).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import json
import pkgutil
from collections import deque
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlexp.config.schema import ConfigError, EnvConfig, error_line
from rlexp.config.state import PLAIN, PerMember
from rlexp.envs.gym import TRAINING, EnvStep, PopulationEnv, env_seeds, episode_ends

APIS = ("gymnasium", "pettingzoo", "vmas")
MARL_EXTRA = "pip install -e '.[marl]'"
PETTINGZOO_PACKAGES = ("mpe2", "pettingzoo.butterfly", "pettingzoo.sisl", "pettingzoo.classic", "pettingzoo.atari")


def is_multi_agent(cfg: EnvConfig) -> bool:
    """Whether ``cfg`` names a multi-agent world (env.api pettingzoo or vmas)."""
    return cfg.api != "gymnasium"


def pettingzoo_ids() -> list[str]:
    """Every versioned PettingZoo environment module installed (``mpe2.simple_spread_v3``, ...), found
    without importing the environments."""
    ids = []
    for package in PETTINGZOO_PACKAGES:
        try:
            spec = importlib.util.find_spec(package)
        except ModuleNotFoundError:
            continue
        if spec is None or spec.submodule_search_locations is None:
            continue
        for module in pkgutil.iter_modules(spec.submodule_search_locations):
            name = module.name
            if "_v" in name and name.rsplit("_v", 1)[1].isdigit():
                ids.append(f"{package}.{name}")
    return sorted(ids)


def _require_extra(module: str) -> Any:
    """Import ``module``, or a ConfigError naming the install command of the marl extra."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        raise ConfigError("env.api", f"{err.name} is not installed", MARL_EXTRA) from None


def check_marl_env(cfg: EnvConfig) -> None:
    """Raise ConfigError for an unknown api, a missing extra, or an id the api does not know (with close
    matches)."""
    if cfg.api not in APIS:
        raise ConfigError("env.api", f"unknown value {cfg.api!r}", f"use one of: {', '.join(APIS)}")
    if cfg.api == "pettingzoo":
        _require_extra("pettingzoo")
        _require_extra("mpe2")
        known = pettingzoo_ids()
        if cfg.id not in known and _own_world(cfg, "parallel_env") is not None:
            return
    elif cfg.api == "vmas":
        vmas = _require_extra("vmas")
        known = sorted(vmas.scenarios)
        if ":" in cfg.id:
            scenario = _own_world(cfg, "")
            base = importlib.import_module("vmas.simulator.scenario").BaseScenario
            if scenario is None:
                module = cfg.id.rpartition(":")[0]
                raise ConfigError("env.id", f"no module {module!r} to import", "put the module on PYTHONPATH")
            if not (isinstance(scenario, type) and issubclass(scenario, base)):
                raise ConfigError("env.id", f"{cfg.id} is not a VMAS scenario class", "name a BaseScenario subclass")
            return
    else:
        return
    if cfg.id not in known:
        close = difflib.get_close_matches(cfg.id, known, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(known[:12])}, ..."
        raise ConfigError("env.id", f"unknown {cfg.api} environment '{cfg.id}'", hint)


def _own_world(cfg: EnvConfig, attribute: str) -> Any:
    """A user's world: pettingzoo's ``module`` (its ``attribute``, parallel_env), vmas's ``module:Scenario``
    (the class); None when a pettingzoo id names no importable module (the caller names close matches).
    A module that fails to import, or lacks the attribute, is a ConfigError."""
    module, colon, name = cfg.id.rpartition(":") if cfg.api == "vmas" else (cfg.id, "", attribute)
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        imported = importlib.import_module(module)
    except Exception as err:  # the user's module: any error while importing it is the config's problem
        raise ConfigError("env.id", f"cannot import module {module!r} ({error_line(err)})", "fix the module") from None
    world = getattr(imported, name, None)
    if world is None:
        raise ConfigError("env.id", f"module {module!r} has no {name}", f"define {name} in {module}")
    return world


@dataclass
class AgentSpace:
    """One agent's observation size and action space."""

    name: str
    obs_dim: int
    discrete: bool
    action_dim: int  # the number of actions (discrete) or the action vector's length (continuous)
    low: np.ndarray | None = None  # [A] continuous bounds
    high: np.ndarray | None = None


def _agent_space(name: str, obs_space: gym.Space, action_space: gym.Space) -> AgentSpace:
    obs_dim = int(np.prod(obs_space.shape))
    kind = type(action_space).__name__  # VMAS builds gym's spaces, PettingZoo gymnasium's
    if kind == "Discrete":
        return AgentSpace(name, obs_dim, True, int(action_space.n))
    if kind == "Box":
        low, high = action_space.low.astype(np.float32).ravel(), action_space.high.astype(np.float32).ravel()
        return AgentSpace(name, obs_dim, False, int(np.prod(action_space.shape)), low, high)
    raise ConfigError("env.id", f"agent {name} has a {kind} action space", "use Discrete or Box")


@dataclass
class MultiAgentStep(EnvStep):
    """``EnvStep`` of a multi-agent population; ``reward`` is the team's sum over agents."""

    agent_reward: np.ndarray  # [P, E, N]


class MultiAgentPopulationEnv:
    """P members x E multi-agent environments (PettingZoo parallel or VMAS); see the module docstring."""

    def __init__(self, cfg: EnvConfig, member_seeds: list[int], purpose: int = TRAINING) -> None:
        check_marl_env(cfg)
        self.api = cfg.api
        self.members = len(member_seeds)
        self.num_envs = cfg.num_envs
        self.timeout_terminal = cfg.timeout_terminal
        n = self.members * self.num_envs
        self.seeds = [s for m in member_seeds for s in env_seeds(m, cfg.num_envs, purpose)]
        if self.api == "pettingzoo":
            module = importlib.import_module(cfg.id)
            kwargs = dict(cfg.kwargs)
            if cfg.max_episode_steps is not None:
                kwargs["max_cycles"] = cfg.max_episode_steps
            self.envs = [module.parallel_env(**kwargs) for _ in range(n)]
            probe = self.envs[0]
            self.agent_names = list(probe.possible_agents)
            self.agents = [_agent_space(a, probe.observation_space(a), probe.action_space(a)) for a in self.agent_names]
        else:
            vmas = importlib.import_module("vmas")
            kwargs = {"continuous_actions": True, **dict(cfg.kwargs)}
            self._rng: list[list[Any]] = []  # each member's VMAS random state (torch, numpy, python)
            self.envs = []
            scenario = _own_world(cfg, "") if ":" in cfg.id else None  # module:Scenario, a user's class
            for k in range(self.members):
                self.envs.append(
                    vmas.make_env(
                        cfg.id if scenario is None else scenario(),
                        num_envs=self.num_envs,
                        device="cpu",
                        seed=self.seeds[k * self.num_envs],
                        max_steps=cfg.max_episode_steps,
                        terminated_truncated=True,
                        **kwargs,
                    )
                )
                self._rng.append(list(self._vmas_state()))
            probe = self.envs[0]
            self.agent_names = [a.name for a in probe.agents]
            self.agents = [
                _agent_space(a, o, s)
                for a, o, s in zip(self.agent_names, probe.observation_space, probe.action_space, strict=True)
            ]
        self.num_agents = len(self.agents)
        widths = np.cumsum([0] + [a.obs_dim for a in self.agents])
        self.slices = [slice(int(a), int(b)) for a, b in zip(widths[:-1], widths[1:])]  # agent i's part of obs
        self.obs_dim = int(widths[-1])
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self.obs_dim,), np.float32)
        self.action_space = None  # per agent: ``agents``
        self._ep_return = np.zeros((n, self.num_agents))
        self._ep_length = np.zeros(n, dtype=np.int64)
        self.episodes: list[list[tuple[float, int]]] = [[] for _ in range(self.members)]
        self.agent_episodes: list[list[np.ndarray]] = [[] for _ in range(self.members)]  # per-agent returns [N]
        self.agent_taken: list[list[np.ndarray]] = [[] for _ in range(self.members)]
        self.last_returns = [deque(maxlen=10) for _ in range(self.members)]
        self.episode_count = np.zeros(self.members, dtype=np.int64)
        self.restarted = False  # every world's state is saved exactly: load_state_dict never restarts episodes

    def _shaped(self, flat: np.ndarray) -> np.ndarray:
        return flat.reshape(self.members, self.num_envs, *flat.shape[1:])

    def _pz_obs(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """A PettingZoo observation dict as the joint vector [D] (an absent agent's part is zero)."""
        return np.concatenate(
            [np.ravel(obs.get(a, np.zeros(s.obs_dim))) for a, s in zip(self.agent_names, self.agents)]
        ).astype(np.float32)

    def _vmas_state(self) -> list[Any]:
        """VMAS's random state: one list (torch's, numpy's and python's generator states) that every VMAS
        environment swaps in around its calls, whatever the instance."""
        return type(self.envs[0]).vmas_random_state

    def _vmas_call(self, member: int, call: Any) -> Any:
        """Run ``call()`` with member's own VMAS random state in place of the shared one."""
        shared = self._vmas_state()
        shared[:] = self._rng[member]
        out = call()
        self._rng[member] = list(shared)
        return out

    def reset(self) -> np.ndarray:
        """Reset every environment, each member's from its own seeds (so every evaluation meets the same
        episodes); returns observations [P, E, D]."""
        n = self.members * self.num_envs
        obs = np.zeros((n, self.obs_dim), dtype=np.float32)
        if self.api == "pettingzoo":
            for i, (env, seed) in enumerate(zip(self.envs, self.seeds)):
                obs[i] = self._pz_obs(env.reset(seed=seed)[0])
        else:
            for k, env in enumerate(self.envs):
                seed = self.seeds[k * self.num_envs]  # as a PettingZoo environment, from its seed again
                parts = self._vmas_call(k, lambda env=env, seed=seed: env.reset(seed=seed))
                obs[k * self.num_envs : (k + 1) * self.num_envs] = torch.cat(parts, -1).numpy()
        self._ep_return[:] = 0.0
        self._ep_length[:] = 0
        return self._shaped(obs)

    def _finish_episode(self, i: int) -> None:
        member = i // self.num_envs
        returns = self._ep_return[i].copy()
        self.episodes[member].append((float(returns.sum()), int(self._ep_length[i])))
        self.agent_episodes[member].append(returns)
        self.last_returns[member].append(float(returns.sum()))
        self.episode_count[member] += 1
        self._ep_return[i] = 0.0
        self._ep_length[i] = 0

    def step(self, actions: list[np.ndarray]) -> MultiAgentStep:
        """Step every environment with one action array per agent ([P, E] or [P, E, A_i]); environments
        whose episode ended are reset at once (``next_obs``)."""
        n = self.members * self.num_envs
        flat = [
            np.asarray(a).reshape(n, *(() if s.discrete else (s.action_dim,))) for a, s in zip(actions, self.agents)
        ]
        obs = np.zeros((n, self.obs_dim), dtype=np.float32)
        agent_reward = np.zeros((n, self.num_agents))
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        if self.api == "pettingzoo":
            for i, env in enumerate(self.envs):
                act = {a: (int(f[i]) if s.discrete else f[i]) for a, f, s in zip(self.agent_names, flat, self.agents)}
                o, r, term, trunc, _ = env.step({a: v for a, v in act.items() if a in env.agents})
                obs[i] = self._pz_obs(o)
                agent_reward[i] = [r.get(a, 0.0) for a in self.agent_names]
                terminated[i] = any(term.values())
                truncated[i] = not terminated[i] and (all(trunc.values()) or not env.agents)
        else:
            e = self.num_envs
            for k, env in enumerate(self.envs):
                rows = slice(k * e, (k + 1) * e)
                act = [
                    torch.from_numpy(f[rows]) if s.discrete else torch.from_numpy(f[rows]).float()
                    for f, s in zip(flat, self.agents)
                ]
                o, r, term, trunc, _ = self._vmas_call(k, lambda env=env, act=act: env.step(act))
                obs[rows] = torch.cat(o, -1).numpy()
                agent_reward[rows] = torch.stack(r, -1).numpy()
                terminated[rows] = term.numpy()
                truncated[rows] = trunc.numpy() & ~term.numpy()
        self._ep_return += agent_reward
        self._ep_length += 1
        next_obs = obs.copy()
        for i in np.flatnonzero(terminated | truncated):
            self._finish_episode(i)
            if self.api == "pettingzoo":
                next_obs[i] = self._pz_obs(self.envs[i].reset()[0])
            else:
                k, j = divmod(int(i), self.num_envs)
                parts = self._vmas_call(k, lambda k=k, j=j: self.envs[k].reset_at(j))
                next_obs[i] = torch.cat([p[j] for p in parts], -1).numpy()
        terminated, truncated = episode_ends(terminated, truncated, self.timeout_terminal)
        return MultiAgentStep(
            self._shaped(obs),
            self._shaped(agent_reward.sum(1)),
            self._shaped(terminated),
            self._shaped(truncated),
            self._shaped(next_obs),
            self._shaped(agent_reward),
        )

    def take_episodes(self) -> list[list[tuple[float, int]]]:
        """Episodes (team return, length) finished since the last call, per member."""
        episodes, self.episodes = self.episodes, [[] for _ in range(self.members)]
        self.agent_taken, self.agent_episodes = self.agent_episodes, [[] for _ in range(self.members)]
        return episodes

    def agent_returns(self) -> list[list[np.ndarray]]:
        """The per-agent returns [N] of the episodes the last ``take_episodes`` took, per member."""
        return self.agent_taken

    def state_dict(self) -> dict[str, Any]:
        """Episode counters and every environment's objects (PettingZoo: the env, its world and
        entities; VMAS: every tensor of the environment and its scenario, and each member's random
        state)."""
        P, E = self.members, self.num_envs
        state = {
            "ep_return": self._ep_return.reshape(P, E, -1),
            "ep_length": self._ep_length.reshape(P, E),
            "episodes": PerMember(self.episodes),
            "last_returns": PerMember(self.last_returns),
            "episode_count": self.episode_count,
        }
        if self.api == "pettingzoo":
            pz = [{path: value for path, _, _, value in _pz_parts(e, "env", set())} for e in self.envs]
            state["pz"] = PerMember([pz[k * E : (k + 1) * E] for k in range(P)])
        else:
            state["vmas"] = PerMember(
                {"objects": {path: _saved(v) for path, _, _, v in _vmas_parts(e, "env", set())}, "rng": _vmas_rng(rng)}
                for e, rng in zip(self.envs, self._rng)
            )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``'s values, every environment exactly."""
        n = self.members * self.num_envs
        self._ep_return = state["ep_return"].numpy().reshape(n, -1).copy()
        self._ep_length = state["ep_length"].numpy().reshape(n).copy()
        self.episodes = [[tuple(e) for e in member] for member in state["episodes"]]
        self.last_returns = [deque(r, maxlen=d.maxlen) for r, d in zip(state["last_returns"], self.last_returns)]
        self.episode_count = state["episode_count"].numpy().copy()
        if self.api == "vmas":
            for k, (env, saved) in enumerate(zip(self.envs, state["vmas"])):
                for path, holder, key, current in _vmas_parts(env, "env", set()):
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
                self._rng[k] = _vmas_rng_back(saved["rng"])
            return
        for env, saved in zip(self.envs, (s for member in state["pz"] for s in member)):
            for path, holder, key, _ in _pz_parts(env, "env", set()):
                if path in saved:
                    setattr(holder, key, _pz_value(saved[path], getattr(holder, key)))

    def close(self) -> None:
        if self.api == "pettingzoo":
            for env in self.envs:
                env.close()


# ---------------------------------------------------------------- the worlds' objects, for state_dict
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
        elif _from_packages(value, ("mpe2", "pettingzoo")):
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


def _from_packages(value: Any, packages: tuple[str, ...]) -> bool:
    """Whether ``value``'s class or one it derives from (a user's scenario or world) is of ``packages``."""
    return any(cls.__module__.split(".")[0] in packages for cls in type(value).__mro__)


def _is_vmas(value: Any) -> bool:
    return _from_packages(value, ("vmas",))


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


def _saved(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def _vmas_rng(state: list[Any]) -> str:
    """A member's VMAS random state (torch's, numpy's and python's generators) as JSON."""
    torch_state, (name, keys, pos, has_gauss, cached), py_state = state
    return json.dumps([torch_state.tolist(), [name, keys.tolist(), pos, has_gauss, cached], py_state])


def _vmas_rng_back(text: str) -> list[Any]:
    torch_state, (name, keys, pos, has_gauss, cached), (version, internal, gauss) = json.loads(text)
    numpy_state = (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached)
    return [torch.tensor(torch_state, dtype=torch.uint8), numpy_state, (version, tuple(internal), gauss)]


def population_env(
    cfg: EnvConfig, member_seeds: list[int], purpose: int = TRAINING, together: bool = True
) -> PopulationEnv | MultiAgentPopulationEnv:
    """The population's environments for ``cfg``: single-agent (gymnasium) or multi-agent (env.api);
    ``together`` False steps gymnasium environments one by one (``PopulationEnv``)."""
    if is_multi_agent(cfg):
        return MultiAgentPopulationEnv(cfg, member_seeds, purpose)
    return PopulationEnv(cfg, member_seeds, purpose, together)
