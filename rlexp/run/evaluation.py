"""Evaluation as the field reports it: deterministic episodes on environments of evaluation's own.

Every member plays ``eval.episodes`` episodes with its algorithm's deterministic policy (DQN greedy,
PPO/A2C the distribution's mode or mean, DDPG/TD3 the actor without noise), all members as one
batch: a PopulationEnv with one environment per episode and member. Each environment counts its
first episode only, so short episodes never crowd out long ones, and every evaluation resets each
environment with the same seed (``env_seeds(member_seed, episodes, EVALUATION)``): a member meets
the same start states at every evaluation, and members of equal seeds in different cells too.

Under a task shift (``env.shift``) each member is evaluated on its current task, the permutation its
training environments apply at the time of the evaluation.

Evaluation touches nothing training reads: not the training environments, not the members' random
streams (``eval.epsilon`` > 0 draws from a stream of its own), not the observation statistics
(observations are normalized with the current ones, never folded in), not the networks' mode (they
act in eval mode between updates, batch norm with its running statistics).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlexp.config.schema import Config
from rlexp.envs.gym import EVALUATION
from rlexp.envs.marl import population_env
from rlexp.envs.normalize import ObsNormalizer
from rlexp.envs.shift import ShiftedEnv, TaskShift
from rlexp.envs.streams import MemberStreams

Policy = Callable[[np.ndarray], np.ndarray]  # normalized observations [P, N, obs] -> actions [P, N] or [P, N, A]
STREAM = 4  # member_generator purpose of evaluation's random numbers


@dataclass
class Networks:
    """An algorithm's networks as its ``build(ctx)`` makes them, before any training: ``nets`` by the
    names its checkpoints save them under, and the deterministic ``policy`` evaluation plays with them
    (``rlexp.evaluate`` builds these, restores ``nets`` from a checkpoint and plays ``policy``)."""

    nets: dict[str, Any]  # name -> a torch module (a population network, or a module of several)
    policy: Policy


@dataclass
class Evaluation:
    """One evaluation's episodes, [P, N] each (N = eval.episodes); rows of skipped members are 0."""

    returns: np.ndarray
    lengths: np.ndarray


class Evaluator:
    """The evaluation environments of a population and when they are played."""

    def __init__(
        self, cfg: Config, member_seeds: list[int], obs_norm: ObsNormalizer, shift: TaskShift | None = None
    ) -> None:
        """``shift``: training's task shift (env.shift), whose current task the evaluation environments see."""
        self.every = cfg.eval.every
        self.episodes = cfg.eval.episodes
        self.total_steps = cfg.total_steps
        self.obs_norm = obs_norm
        self.seeds = member_seeds
        self.env = None  # PopulationEnv or MultiAgentPopulationEnv
        if self.episodes > 0:
            # one environment per episode; whole games (Atari) with their own rewards
            env_cfg = dataclasses.replace(cfg.env, num_envs=self.episodes, episodic_life=False, clip_reward=False)
            self.env = population_env(env_cfg, member_seeds, EVALUATION, together=cfg.fast_paths)
            if shift is not None:
                self.env = ShiftedEnv(self.env, shift, counts=False)
        self._streams: MemberStreams | None = None  # made at the first draw (eval.epsilon > 0)

    def due(self, step: int, last_log_step: int) -> bool:
        """Whether the log step ``step`` evaluates: the first log step at or after a multiple of
        ``eval.every`` (``last_log_step`` is the one before), and the last one (``total_steps``)."""
        if self.env is None:
            return False
        return step >= self.total_steps or (self.every > 0 and step // self.every > last_log_step // self.every)

    def uniform(self, n: int) -> np.ndarray:
        """The next ``n`` numbers of every member's evaluation stream: [P, n] float64 in [0, 1)."""
        if self._streams is None:
            self._streams = MemberStreams(self.seeds, block=4_096, purpose=STREAM)
        return self._streams.uniform(n)

    def state_dict(self) -> dict[str, Any]:
        """Evaluation's stream, once made (its environments start every evaluation from their seeds)."""
        return {} if self._streams is None else {"streams": self._streams.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "streams" in state:
            self.uniform(0)  # makes the stream
            self._streams.load_state_dict(state["streams"])

    def run(self, policy: Policy, members: np.ndarray) -> Evaluation:
        """Play one episode in each evaluation environment of the ``members`` [P] (bool) with ``policy``;
        the other members' environments step along (the population steps as one) and are not counted."""
        assert self.env is not None, "eval.episodes=0: no evaluation environments"
        obs = self.env.reset()  # [P, N, obs] raw; every environment with its evaluation seed
        reset = getattr(policy, "reset", None)  # a recurrent policy's state starts anew
        if reset is not None:
            reset()
        returns = np.zeros(obs.shape[:2])  # [P, N]
        lengths = np.zeros(obs.shape[:2], dtype=np.int64)
        running = np.repeat(members[:, None], self.episodes, axis=1)  # [P, N] first episode not over yet
        while running.any():
            result = self.env.step(policy(self.obs_norm(obs)))
            returns += np.where(running, result.reward, 0.0)
            lengths += running
            running &= ~(result.terminated | result.truncated)
            obs = result.next_obs
        self.env.take_episodes()  # the environments' own record of episodes is not kept
        return Evaluation(returns, lengths)

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
