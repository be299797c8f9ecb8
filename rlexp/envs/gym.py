"""Population environments: P x E gymnasium environments, each member seeded on its own.

Every step is one transition of every environment, as Stable-Baselines3 and CleanRL count them
(gymnasium's SAME_STEP autoreset): an environment whose episode ends at a step is reset within it, so the
step returns both the episode's final observation (``obs``, what a truncated episode bootstraps from) and
the next episode's first (``next_obs``, what the next step acts on). No step is spent on a reset. Each
member's episode bookkeeping is kept in the same pass. Everything stays on the host as numpy
arrays ([P, E, ...]): the per-step path does no tensor work, and the algorithm moves what it needs.

Two ways of stepping, with the same results (tests step both against gymnasium's SyncVectorEnv with
SAME_STEP autoreset):
- one environment after another (any environment), a bare loop without SyncVectorEnv's overhead;
- CartPole's physics for all P * E environments at once in numpy (``CartPoles``), from 4 environments
  up, where it is the faster of the two: the same float64 arithmetic in the same order as gymnasium's CartPoleEnv, so
  observations, rewards and flags are bit for bit the single environment's, and resets still go
  through each environment's own seeded gymnasium object.
"""

from __future__ import annotations

import difflib
import importlib
import json
import logging
import sys
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.wrappers import (
    AtariPreprocessing,
    FrameStackObservation,
    OrderEnforcing,
    PassiveEnvChecker,
    TimeLimit,
    TransformReward,
)

from rlexp.config.schema import ConfigError, EnvConfig, error_line
from rlexp.config.state import PLAIN, PerMember

EXTRAS = {"box2d": "box2d", "mujoco": "mujoco"}  # gymnasium dependency name -> rlexp extra that installs it


class ChannelsFirst(gym.ObservationWrapper):
    """MinAtar's boolean [10, 10, C] state as uint8 [C, 10, 10] (0 or 1)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        height, width, channels = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 1, (channels, height, width), dtype=np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(observation, -1, 0), dtype=np.uint8)


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode (terminated) while the game goes on: the next reset continues the
    game with a no-op step and resets it only once it is over (Mnih et al. 2015's training protocol)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives, self.game_over = 0, True

    def step(self, action: int) -> tuple:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        terminated = terminated or 0 < lives < self.lives
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs) -> tuple:
        if not self.game_over:
            obs, _, terminated, truncated, info = self.env.step(0)
            if not (terminated or truncated):
                self.lives = self.env.unwrapped.ale.lives()
                return obs, info
        obs, info = self.env.reset(**kwargs)
        self.lives, self.game_over = self.env.unwrapped.ale.lives(), False
        return obs, info


def _register_minatar() -> None:
    """Register MinAtar's ids (MinAtar/<Game>-v0: all 6 actions, -v1: the game's minimal set)."""
    # minatar imports seaborn (pandas, scipy, matplotlib: seconds) only to draw frames, and warns when it
    # is missing: training never draws, so the import is skipped (MinAtar's rgb_array rendering is not
    # available here)
    logging.disable(logging.WARNING)
    skip = "seaborn" not in sys.modules
    if skip:
        sys.modules["seaborn"] = None  # type: ignore[assignment]  # `import seaborn` raises ImportError
    try:
        import minatar.gym
    except ImportError:
        raise ConfigError("env.id", "MinAtar needs the minatar package", "pip install -e '.[minatar]'") from None
    finally:
        logging.disable(logging.NOTSET)
        if skip:
            del sys.modules["seaborn"]
    if "MinAtar/Breakout-v0" not in gym.registry:
        minatar.gym.register_envs()


def _register_atari() -> None:
    """Register ale-py's ids (ALE/<Game>-v5)."""
    try:
        import ale_py
    except ImportError:
        raise ConfigError("env.id", "Atari needs ale-py", "pip install -e '.[atari]'") from None
    gym.register_envs(ale_py)


MINATAR_LIMIT = 10_000  # MinAtar's own episode limit here (the games set none; a greedy policy may never lose)


def _minatar(cfg: EnvConfig, kwargs: dict) -> gym.Env:
    """A MinAtar game (sticky actions 0.1, difficulty ramping: MinAtar's defaults) with [C, 10, 10] states,
    episodes cut at ``env.max_episode_steps`` (null: MINATAR_LIMIT)."""
    kwargs.setdefault("max_episode_steps", MINATAR_LIMIT)
    with warnings.catch_warnings():  # gymnasium calls -v0 (all 6 actions, the paper's) out of date beside -v1
        warnings.simplefilter("ignore", DeprecationWarning)
        return ChannelsFirst(gym.make(cfg.id, **kwargs))


def _atari(cfg: EnvConfig, kwargs: dict) -> gym.Env:
    """An ALE game (v5: sticky actions 0.25) with the standard wrappers: up to 30 no-ops at reset, frame
    skip 4 (the max of the last two frames), 84x84 grey, a lost life ends the episode
    (``env.episodic_life``), rewards clipped to their sign (``env.clip_reward``), the last 4 frames
    stacked: uint8 [4, 84, 84]."""
    env = gym.make(cfg.id, frameskip=1, **kwargs)
    try:
        env = AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True)
    except gym.error.DependencyNotInstalled:  # its resizing needs OpenCV
        raise ConfigError("env.id", f"{cfg.id} needs OpenCV", "pip install -e '.[atari]'") from None
    if cfg.episodic_life:
        env = EpisodicLife(env)
    if cfg.clip_reward:
        env = TransformReward(env, np.sign)
    return FrameStackObservation(env, 4)


# id prefix -> (register the family's ids, make one environment); other ids are gymnasium's own
FAMILIES = {"MinAtar/": (_register_minatar, _minatar), "ALE/": (_register_atari, _atari)}


def _family(env_id: str) -> tuple | None:
    return next((family for prefix, family in FAMILIES.items() if env_id.startswith(prefix)), None)


def import_env_module(env_id: str) -> str:
    """The id of ``env_id`` in gymnasium's registry: ``module:EnvId`` (gymnasium.make's form) has its
    module imported first, which registers the id; a module that cannot be imported is a ConfigError."""
    module, colon, name = env_id.rpartition(":")
    if not colon:
        return env_id
    try:
        importlib.import_module(module)
    except Exception as err:  # the user's module: any error while importing it is the config's problem
        raise ConfigError(
            "env.id",
            f"cannot import module {module!r} of {env_id!r} ({error_line(err)})",
            "put the module on PYTHONPATH (env.id=module:EnvId imports it, then makes EnvId)",
        ) from None
    return name


def check_env_id(env_id: str) -> None:
    """Raise ConfigError for an id gymnasium does not know, naming close matches (or for a family whose
    package is missing, naming its extra); ``module:EnvId`` imports the module first."""
    env_id = import_env_module(env_id)
    family = _family(env_id)
    if family is not None:
        family[0]()
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry.keys()), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "see gymnasium.registry for the known ids"
    raise ConfigError("env.id", f"unknown environment '{env_id}'", hint)


def frame_stack(env: gym.Env) -> int:
    """How many frames an observation stacks along its first axis (oldest first) when ``env`` is
    gymnasium's FrameStackObservation padding an episode's first stack with its first frame (the
    Atari family's), else 1: a replay memory may then keep each frame once (``FrameStackReplay``)."""
    if isinstance(env, FrameStackObservation) and env.padding_type == "reset":
        return int(env.stack_size)
    return 1


def make_env(cfg: EnvConfig) -> gym.Env:
    """One environment cfg.id with cfg.kwargs and cfg.max_episode_steps (ConfigError for an unknown
    id or a missing optional extra)."""
    check_env_id(cfg.id)
    kwargs = dict(cfg.kwargs)
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    family = _family(cfg.id)
    if family is not None:
        return family[1](cfg, kwargs)
    try:
        return gym.make(cfg.id, **kwargs)
    except gym.error.DependencyNotInstalled as err:
        extra = next((e for dep, e in EXTRAS.items() if dep.lower() in str(err).lower()), None)
        fix = f"pip install -e '.[{extra}]'" if extra else str(err)
        raise ConfigError("env.id", f"{cfg.id} needs an optional dependency", fix) from None


TRAINING, EVALUATION = 1, 3  # purposes of environment seeds (streams.py: 0 weights, 2 stream, 4 evaluation's)


def env_seeds(member_seed: int, num_envs: int, purpose: int = TRAINING) -> list[int]:
    """Seeds of one member's environments for ``purpose`` (training or evaluation), derived from its
    seed (no overlap between members or purposes)."""
    return [int(s) for s in np.random.SeedSequence([member_seed, purpose]).generate_state(num_envs)]


def time_limit(env: gym.Env) -> int:
    """Steps after which env's TimeLimit truncates an episode (the largest int64 without one)."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, TimeLimit):
            return env._max_episode_steps
        env = env.env
    return int(np.iinfo(np.int64).max)


@dataclass
class EnvStep:
    """One step of every environment; arrays are [P, E]."""

    obs: np.ndarray  # [P, E, obs] float32 observation after the step (the episode's final one where it ended)
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    next_obs: np.ndarray  # [P, E, obs] what the next step acts on: the next episode's first where one ended


def episode_ends(
    terminated: np.ndarray, truncated: np.ndarray, timeout_terminal: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(terminated, truncated) [n] as the learner sees them: with ``timeout_terminal`` a truncation is a
    termination (env.timeout_terminal)."""
    if not timeout_terminal:
        return terminated, truncated
    return terminated | truncated, np.zeros_like(truncated)


class CartPoles:
    """n gymnasium CartPoleEnv's physics stepped together: states [4, n] float64, one row per variable.

    ``step`` repeats CartPoleEnv.step's float64 arithmetic operation for operation, in its order, on
    arrays, so it returns what n separate environments would, bit for bit (numpy's array sin/cos equal
    its scalar ones; a test checks the whole trajectory against gymnasium). Episode ends are not its
    business: the caller resets an environment through its gymnasium object and hands the state over.
    """

    WRAPPERS = (TimeLimit, OrderEnforcing, PassiveEnvChecker)  # what gym.make adds around CartPoleEnv

    def __init__(self, envs: list[gym.Env]) -> None:
        """``envs``: the n environments."""
        cart = envs[0].unwrapped
        self.sutton_barto_reward = cart._sutton_barto_reward
        self.euler = cart.kinematics_integrator == "euler"
        self.tau, self.gravity = cart.tau, cart.gravity
        self.masspole, self.total_mass, self.length = cart.masspole, cart.total_mass, cart.length
        self.polemass_length = cart.polemass_length
        self.forces = np.array([-cart.force_mag, cart.force_mag])  # by action: push left, push right
        self.x_threshold, self.theta_threshold = cart.x_threshold, cart.theta_threshold_radians
        self.state = np.zeros((4, len(envs)))  # [4, n]: x, x_dot, theta, theta_dot

    @classmethod
    def fits(cls, env: gym.Env) -> bool:
        """True for gymnasium's own CartPoleEnv, not rendered, behind no wrappers but make()'s own."""
        while isinstance(env, gym.Wrapper):
            if type(env) not in cls.WRAPPERS:
                return False
            env = env.env
        return type(env) is CartPoleEnv and env.render_mode is None

    def set_state(self, i: int, env: gym.Env) -> None:
        """Take environment i's state from its gymnasium object (after its reset)."""
        self.state[:, i] = env.unwrapped.state

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One step of every environment with actions [n] in {0, 1}; returns observations [n, 4]
        float32 (C order), rewards [n] float64 and terminated [n] bool (|x| > threshold is the single
        environment's x < -threshold or x > threshold)."""
        x, x_dot, theta, theta_dot = self.state
        force = self.forces[actions]
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        temp = (force + self.polemass_length * np.square(theta_dot) * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * np.square(costheta) / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        if self.euler:
            x = x + self.tau * x_dot
            x_dot = x_dot + self.tau * xacc
            theta = theta + self.tau * theta_dot
            theta_dot = theta_dot + self.tau * thetaacc
        else:  # semi-implicit euler
            x_dot = x_dot + self.tau * xacc
            x = x + self.tau * x_dot
            theta_dot = theta_dot + self.tau * thetaacc
            theta = theta + self.tau * theta_dot
        self.state = np.array((x, x_dot, theta, theta_dot))
        terminated = (np.abs(x) > self.x_threshold) | (np.abs(theta) > self.theta_threshold)
        if self.sutton_barto_reward:
            reward = np.where(terminated, -1.0, 0.0)
        else:
            reward = np.ones(len(x))
        # C order: a member's observations lie as they would in any population (BLAS may round a
        # transposed matrix's product differently)
        return self.state.T.astype(np.float32, order="C"), reward, terminated

    def write_back(self, envs: list[gym.Env], lengths: np.ndarray) -> None:
        """Leave each gymnasium object as stepping it alone would have: its physics (``state``), its
        time limit's count (``lengths`` [n]: the steps of its episode so far) and, after a termination,
        ``steps_beyond_terminated``. A checkpoint then holds one form, whichever way the population
        stepped, and a population that steps one by one continues from it (and the other way round)."""
        x, theta = self.state[0], self.state[2]
        terminated = (np.abs(x) > self.x_threshold) | (np.abs(theta) > self.theta_threshold)
        for i, env in enumerate(envs):
            cart = env.unwrapped
            cart.state = self.state[:, i].copy()
            cart.steps_beyond_terminated = 0 if terminated[i] else None
            layer = env
            while not isinstance(layer, TimeLimit):
                layer = layer.env
            layer._elapsed_steps = int(lengths[i])


class PopulationEnv:
    """P members x E environments; episode returns and lengths tracked per member."""

    MIN_TOGETHER = 4  # CartPoles are stepped together from this many environments up (fewer: slower)

    def __init__(self, cfg: EnvConfig, member_seeds: list[int], purpose: int = TRAINING, together: bool = True) -> None:
        """``together`` False: never ``CartPoles`` (the run's ``fast_paths=false``), every environment its own step."""
        self.members = len(member_seeds)
        self.num_envs = cfg.num_envs
        n = self.members * self.num_envs
        self.envs = [make_env(cfg) for _ in range(n)]  # member k's envs are k * E ... k * E + E - 1
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self.obs_dim = int(np.prod(self.observation_space.shape))
        # uint8 observations (MinAtar's, Atari's frames): a replay memory may keep them as uint8
        self.frames = self.observation_space.dtype == np.uint8
        self.stack = frame_stack(self.envs[0])  # frames per observation (Atari: 4), else 1
        self.seeds = [s for m in member_seeds for s in env_seeds(m, cfg.num_envs, purpose)]
        together = together and n >= self.MIN_TOGETHER and CartPoles.fits(self.envs[0])
        self.cartpoles: CartPoles | None = CartPoles(self.envs) if together else None
        self.max_steps = time_limit(self.envs[0])  # stepping together truncates episodes by it
        self.timeout_terminal = cfg.timeout_terminal
        self._ep_return = np.zeros(n)
        self._ep_length = np.zeros(n, dtype=np.int64)
        self._obs = np.zeros((n, self.obs_dim), dtype=np.float32)
        self.episodes: list[list[tuple[float, int]]] = [[] for _ in range(self.members)]  # since last read
        self.last_returns = [deque(maxlen=10) for _ in range(self.members)]
        self.episode_count = np.zeros(self.members, dtype=np.int64)
        self.restarted = False  # load_state_dict started new episodes (an environment not saved exactly)

    def _shaped(self, flat: np.ndarray) -> np.ndarray:
        return flat.reshape(self.members, self.num_envs, *flat.shape[1:])

    def observations(self) -> np.ndarray:
        """The latest observations [P, E, obs] (a copy): after a step, or the new episodes' first."""
        return self._shaped(self._obs.copy())

    def _reset_env(self, i: int, seed: int | None = None) -> np.ndarray:
        """Start environment i's next episode (from ``seed``, else its own generator); returns its first observation."""
        obs = np.ravel(self.envs[i].reset(seed=seed)[0])
        if self.cartpoles is not None:
            self.cartpoles.set_state(i, self.envs[i])
        self._ep_return[i], self._ep_length[i] = 0.0, 0
        return obs

    def _finish_episodes(self, obs: np.ndarray, ended: np.ndarray) -> np.ndarray:
        """The environments ``ended`` [n] (indices) finished their episode at this step with observations
        ``obs`` [n, obs]: record each for its member and reset it. Returns the observations the next step
        acts on (``obs`` itself when no episode ended)."""
        if len(ended) == 0:
            return obs
        next_obs = obs.copy()
        for i in ended:
            member = i // self.num_envs
            episode = (float(self._ep_return[i]), int(self._ep_length[i]))
            self.episodes[member].append(episode)
            self.last_returns[member].append(episode[0])
            self.episode_count[member] += 1
            next_obs[i] = self._reset_env(i)
        return next_obs

    def reset(self) -> np.ndarray:
        """Reset every environment with its own seed; returns observations [P, E, obs]."""
        self._obs = np.zeros_like(self._obs)  # the last step's observations stay the caller's
        for i, seed in enumerate(self.seeds):
            self._obs[i] = self._reset_env(i, seed)
        return self._shaped(self._obs.copy())

    def step(self, actions: np.ndarray) -> EnvStep:
        """Step every environment with actions [P, E] (or [P, E, A] for Box actions); an environment
        whose episode ends is reset within the step. Records finished episodes per member."""
        n = len(self.envs)
        actions = np.asarray(actions).reshape(n, *self.action_space.shape)
        if self.cartpoles is not None:
            return self._step_together(actions)
        if not self.action_space.shape:
            actions = actions.tolist()  # Python ints: the cheapest to step with
        obs = np.empty_like(self._obs)
        reward = np.zeros(n)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        for i, env in enumerate(self.envs):
            o, reward[i], terminated[i], truncated[i], _ = env.step(actions[i])
            obs[i] = np.ravel(o)
        return self._stepped(obs, reward, terminated, truncated)

    def _step_together(self, actions: np.ndarray) -> EnvStep:
        """``step`` for CartPoles: all physics at once (their time limit applied here), then the resets."""
        obs, reward, terminated = self.cartpoles.step(actions)
        truncated = self._ep_length + 1 >= self.max_steps
        return self._stepped(obs, reward, terminated, truncated)

    def _stepped(self, obs: np.ndarray, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> EnvStep:
        """The step's results [n, ...] (``obs`` a new array): episodes counted, the ended ones recorded and reset."""
        self._ep_return += reward
        self._ep_length += 1
        self._obs = self._finish_episodes(obs, np.flatnonzero(terminated | truncated))
        terminated, truncated = episode_ends(terminated, truncated, self.timeout_terminal)
        return EnvStep(
            self._shaped(obs),
            self._shaped(reward),
            self._shaped(terminated),
            self._shaped(truncated),
            self._shaped(self._obs),
        )

    def take_episodes(self) -> list[list[tuple[float, int]]]:
        """Episodes (return, length) finished since the last call, per member."""
        episodes, self.episodes = self.episodes, [[] for _ in range(self.members)]
        return episodes

    def state_dict(self) -> dict[str, Any]:
        """The episode bookkeeping, the last observations and each environment's state
        (``gym_env_state``; CartPoles stepped together first write their physics back)."""
        P, E = self.members, self.num_envs
        if self.cartpoles is not None:
            self.cartpoles.write_back(self.envs, self._ep_length)
        state = {
            "ep_return": self._ep_return.reshape(P, E),
            "ep_length": self._ep_length.reshape(P, E),
            "obs": self._obs.reshape(P, E, -1),
            "episodes": PerMember(self.episodes),
            "last_returns": PerMember(self.last_returns),
            "episode_count": self.episode_count,
            "gym": PerMember([[gym_env_state(e) for e in self.envs[k * E : (k + 1) * E]] for k in range(P)]),
        }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``'s values. An environment whose state is not all Python
        attributes (MuJoCo, Box2D, Atari) is not saved exactly: then every environment starts a new
        episode from its restored generator (the interrupted ones are dropped) and ``restarted`` is set."""
        n = self.members * self.num_envs
        self._ep_return = state["ep_return"].numpy().reshape(n).copy()
        self._ep_length = state["ep_length"].numpy().reshape(n).copy()
        self._obs = state["obs"].numpy().reshape(n, -1).copy()
        self.episodes = [[tuple(e) for e in member] for member in state["episodes"]]
        self.last_returns = [deque(r, maxlen=d.maxlen) for r, d in zip(state["last_returns"], self.last_returns)]
        self.episode_count = state["episode_count"].numpy().copy()
        for env, env_state in zip(self.envs, (s for member in state["gym"] for s in member)):
            load_gym_env_state(env, env_state)
        if self.cartpoles is not None:
            for i, env in enumerate(self.envs):
                self.cartpoles.set_state(i, env)
        self.restarted = not all(exact_state(e) for e in self.envs)
        if self.restarted:
            for i in range(n):
                self._obs[i] = self._reset_env(i)  # an episode boundary: the interrupted episodes are dropped

    def close(self) -> None:
        for env in self.envs:
            env.close()


# ---------------------------------------------------------------- one gymnasium environment's state
def own_state(env: gym.Env) -> bool:
    """True when the environment itself keeps the ``Stateful`` protocol (``state_dict()`` and
    ``load_state_dict(state)``, rlexp.config.state): a user's environment saved exactly through it."""
    inner = env.unwrapped
    return callable(getattr(inner, "state_dict", None)) and callable(getattr(inner, "load_state_dict", None))


def exact_state(env: gym.Env) -> bool:
    """True when the environment's whole state is Python attributes (gymnasium's classic control,
    MinAtar) or the environment saves its own (``own_state``), so ``gym_env_state`` captures it exactly."""
    classic = type(env.unwrapped).__module__.startswith("gymnasium.envs.classic_control")
    return classic or own_state(env) or _minatar_game(env) is not None


def _minatar_game(env: gym.Env) -> Any:
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


def gym_env_state(env: gym.Env) -> dict[str, Any]:
    """One gymnasium environment's random generator (JSON), its wrappers' and its own plain attributes
    (``<level>.<name>``, level 0 the outermost wrapper), for MinAtar its game's state and, for an
    environment that keeps the ``Stateful`` protocol, its ``state_dict()`` (``own``)."""
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
    generator = env.unwrapped._np_random  # None until the first reset; the np_random property would make one
    state["np_random"] = None if generator is None else json.dumps(generator.bit_generator.state)
    if (game := _minatar_game(env)) is not None:
        state["minatar"] = _minatar_state(game)
    if own_state(env):
        state["own"] = env.unwrapped.state_dict()
    return state


def load_gym_env_state(env: gym.Env, state: dict[str, Any]) -> None:
    """Continue one gymnasium environment from ``gym_env_state``'s values."""
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    for key, value in state.items():
        if key == "np_random":
            if value is not None:
                env.unwrapped.np_random.bit_generator.state = json.loads(value)
            continue
        if key == "minatar":
            _load_minatar(_minatar_game(env), value)
            continue
        if key == "own":
            env.unwrapped.load_state_dict(value)
            continue
        level, name = key.split(".", 1)
        if isinstance(value, torch.Tensor):
            value = value.numpy().dtype.type(value.item()) if value.ndim == 0 else value.numpy().copy()
        setattr(layers[int(level)], name, value)
