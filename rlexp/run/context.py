"""The run context: all an algorithm sees of a job.

An algorithm is ``train(ctx: RunContext) -> None``. The context holds the typed config, the device,
the population's seeds, environments, random streams and normalizers, factories for networks and
gradient pipelines, the evaluator (evaluation's own environments and stream) and the recorder
(steps, statistics, divergence, instruments, evaluations). The job runner
(``rlexp.run.runner``) builds it; an algorithm never imports the runner or the entry point.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from rlexp.config.members import member_runs
from rlexp.config.schema import (
    ActivationConfig,
    Config,
    InitConfig,
    NetworkConfig,
    NormalizationConfig,
)
from rlexp.config.state import Stateful
from rlexp.data.buffers import ReplayBuffer
from rlexp.diagnostics.instruments import keep_initial
from rlexp.diagnostics.interventions import Interventions, Subject
from rlexp.envs.gym import PopulationEnv
from rlexp.envs.marl import MultiAgentPopulationEnv, MultiAgentStep, population_env
from rlexp.envs.normalize import ObsNormalizer, RewardRange, RewardScaler
from rlexp.envs.shift import ShiftedEnv, TaskShift
from rlexp.envs.streams import MemberStreams, member_generator
from rlexp.nn.nets import PopMLP, plain_paths, weight_parameters
from rlexp.nn.networks import NETWORKS
from rlexp.optim.pipeline import GradientPipeline, gradient_pipeline
from rlexp.run.checkpoint import Checkpoints, Loop, LoopState, PopulationCheckpoints, TorchGenerator
from rlexp.run.evaluation import Evaluator
from rlexp.run.pbt import PopulationBasedTraining, initial_configs
from rlexp.run.recorder import Recorder


def option_schema(group: str, option: str) -> type:
    """The config dataclass of a group's option, as the config layer stored it in Hydra's ConfigStore
    (``schema/<group>/<option>``, which every composed config's yaml names)."""
    return OmegaConf.get_type(ConfigStore.instance().load(f"schema/{group}/{option}.yaml").node)


def network_groups(
    cfg: Config, role: str | None
) -> tuple[ActivationConfig, InitConfig, NormalizationConfig, NetworkConfig]:
    """(activation, init, normalization, network) configs for a network: the shared groups, with
    the actor's or critic's overrides (an overriding option takes its default parameters)."""
    groups = {"activation": cfg.activation, "init": cfg.init, "normalization": cfg.normalization}
    network = cfg.network
    if role is not None:
        override = getattr(cfg, role)
        for group, shared in groups.items():
            name = getattr(override, group)
            if name is not None and name != shared.name:
                groups[group] = option_schema(group, name)(name=name)
        if override.last_layer_gain is not None:
            groups["init"] = dataclasses.replace(groups["init"], last_layer_gain=override.last_layer_gain)
        if override.hidden is not None:
            network = dataclasses.replace(network, hidden=list(override.hidden))
        if override.linear_last_hidden is not None:
            network = dataclasses.replace(network, linear_last_hidden=override.linear_last_hidden)
    return groups["activation"], groups["init"], groups["normalization"], network


@dataclass
class RunContext:
    """What an algorithm sees of a job: a population of ``members`` trained together."""

    cfg: Config  # the population's shared config (member 0's; its per-member keys: see member_cfgs)
    device: torch.device
    seeds: list[int]  # member k's seed: cfg.seed + k, or its cell's seed + its index in a pack
    env: PopulationEnv | ShiftedEnv | MultiAgentPopulationEnv  # P x E environments; numpy [P, E, ...], on the host
    streams: MemberStreams  # each member's uniform numbers (actions, sampling, shuffling)
    obs_norm: ObsNormalizer  # identity unless obs_norm is on
    reward_norm: RewardScaler  # identity unless reward_norm is on
    reward_range: RewardRange  # [P] the largest |r| each member has met (step_env keeps it)
    evaluator: Evaluator  # eval.*: evaluation's environments and random stream, never training's
    recorder: Recorder  # steps, statistics, divergence, instruments, evaluations, output files
    member_cfgs: list[Config] = field(default_factory=list)  # [P] member k's config (cfg repeated by default)
    nets_made: int = field(default=0, init=False)  # each network built takes the next generator stream
    # set by the job lifecycle (checkpoint.*; rlexp.evaluate: one job's files)
    checkpoints: Checkpoints | PopulationCheckpoints | None = field(default=None, init=False)

    @classmethod
    def create(
        cls,
        cfg: Config,
        device: torch.device,
        member_cfgs: list[Config] | None = None,
        seeds: list[int] | None = None,
    ) -> RunContext:
        """Seed torch's global generator, then build the population's environments, streams,
        normalizers, evaluator and recorder from ``cfg``.

        ``member_cfgs`` and ``seeds`` (a pack of cells, ``rlexp.run.pack``): each member's config and seed;
        they agree with ``cfg`` but for the per-member keys (``rlexp.config.members``). By default member k
        has ``cfg`` and seed ``cfg.seed + k``, for ``cfg.num_seeds`` members; with ``pbt.interval`` > 0,
        ``cfg`` with PBT's initial draws of its hyperparameters (``rlexp.run.pbt.initial_configs``).
        """
        seeds = [cfg.seed + k for k in range(cfg.num_seeds)] if seeds is None else seeds
        if member_cfgs is None:
            member_cfgs = initial_configs(cfg, len(seeds)) if cfg.pbt.interval > 0 else [cfg] * len(seeds)
        torch.manual_seed(cfg.seed)
        env = population_env(cfg.env, seeds, together=cfg.fast_paths)
        shift = TaskShift.of(cfg.env.shift, env, seeds, cfg.total_steps)  # env.shift: None unless a kind is set
        if shift is not None:
            env = ShiftedEnv(env, shift, counts=True)
        gamma = member_values(member_cfgs, "algo.gamma")
        gamma = gamma[0] if len(set(gamma)) == 1 else np.array(gamma)[:, None]  # float or [P, 1]
        obs_norm = ObsNormalizer(cfg.obs_norm, len(seeds), env.obs_dim)
        reward_norm = RewardScaler(cfg.reward_norm, len(seeds), env.num_envs, gamma)
        evaluator = Evaluator(cfg, seeds, obs_norm, shift)
        recorder = Recorder(cfg, env, seeds, device, obs_norm, reward_norm, evaluator, gamma)
        streams = MemberStreams(seeds)
        reward_range = RewardRange(len(seeds), cfg.algo.r_max)
        return cls(
            cfg, device, seeds, env, streams, obs_norm, reward_norm, reward_range, evaluator, recorder, member_cfgs
        )

    def member_values(self, key: str) -> list[Any]:
        """Each member's value of the dotted config key (``"algo.gamma"``): [P] Python values."""
        return member_values(self.member_cfgs or [self.cfg] * self.members, key)

    def shared(self, *keys: str) -> bool:
        """True when every member has the same value of each key (the population's scalar path) and
        population-based training does not vary it (``pbt.hyperparameters``)."""
        if self.cfg.pbt.interval > 0:
            varied = self.cfg.pbt.hyperparameters
            if any(v == k or v.startswith(f"{k}.") for k in keys for v in varied):
                return False
        return all(len({repr(v) for v in self.member_values(k)}) == 1 for k in keys)

    def hyper(self, key: str, form: str = "tensor", dtype: torch.dtype = torch.float32) -> Any:
        """A hyperparameter that may differ between members, read one way: the config's own value when
        every member has it (``shared``: the scalar path, bit for bit a lone member's arithmetic), else
        each member's, as ``form`` says: "tensor" a [P, 1] tensor of ``dtype`` on the device, "array" a
        float64 [P, 1] host array, "runs" ``member_runs``' [(a, b, value)] runs of equal members."""
        if self.shared(key):
            return self.member_values(key)[0]
        if form == "tensor":
            return self.member_tensor(key, dtype).unsqueeze(1)
        if form == "array":
            return self.member_array(key)
        if form == "runs":
            return member_runs(self.member_values(key), self.members)
        raise ValueError(f"form {form!r}: use tensor, array or runs")

    def member_tensor(self, key: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Each member's value of a numeric key as a [P] tensor on the device (a value computed in
        float64 first, such as 1 - gamma, is best formed from ``member_values``)."""
        return torch.tensor(self.member_values(key), dtype=dtype, device=self.device)

    def member_array(self, key: str) -> np.ndarray:
        """Each member's value of a numeric key as a float64 [P, 1] array (host arithmetic on [P, E])."""
        return np.array(self.member_values(key), dtype=np.float64)[:, None]

    @property
    def members(self) -> int:
        """P, the population's size (num_seeds)."""
        return len(self.seeds)

    def make_net(self, n_in: int, n_out: int, role: str | None = None, extra_in: int = 0) -> PopMLP:
        """A population network [P, B, n_in] -> [P, B, n_out] (``network``'s option: NETWORKS) from the
        config groups; each member's weights from its own generator.

        ``role`` "actor" or "critic" applies that network's overrides (``actor.activation=...``);
        a critic takes ``extra_in`` action inputs at layer ``critic.action_layer``. With ``fast_paths``
        off, the network trains through autograd and acts through torch's forward (``plain_paths``).
        """
        purpose = 10 + self.nets_made  # a distinct stream per network built
        self.nets_made += 1
        generators = [member_generator(s, purpose) for s in self.seeds]
        activation, init, normalization, network = network_groups(self.cfg, role)
        if not self.shared("init") or (role is not None and not self.shared(f"{role}.last_layer_gain")):
            init = [network_groups(c, role)[1] for c in self.member_cfgs]  # one per member
        extra_at = self.cfg.critic.action_layer if role == "critic" else 0
        net = NETWORKS[network.name].build(
            self.members,
            n_in,
            n_out,
            network,
            activation,
            normalization,
            init,
            generators,
            extra_in=extra_in,
            extra_at=extra_at,
            observation_space=self.env.observation_space,
        )
        net = net.to(self.device)
        if not self.cfg.fast_paths:
            plain_paths(net)
        if self.cfg.diagnostics.every > 0:
            keep_initial(net)  # theta_0 of the weight_change instruments
        return net

    def make_pipeline(self, net: torch.nn.Module) -> GradientPipeline:
        """The gradient pipeline (the configured optimizer, clipping, penalties, divergence checks)
        for one network (or a ModuleList of networks trained by one loss, such as TD3's twin
        critics); ``pipeline.optimizer`` is its optimizer. With ``fast_paths`` off, a ``PlainPipeline``
        (per-tensor, torch.optim's optimizers)."""
        cfg, members = self.cfg, self.member_cfgs
        params = [p for p in net.parameters() if p.requires_grad]
        optimizer, clipping, regularization = cfg.optimizer, cfg.clipping, cfg.regularization
        if not self.shared("optimizer", "clipping", "regularization"):  # one config per member
            optimizer, clipping = [c.optimizer for c in members], [c.clipping for c in members]
            regularization = [c.regularization for c in members]
        weights, health = weight_parameters(net), self.recorder.health
        pipeline = gradient_pipeline(params, optimizer, clipping, regularization, weights, health, cfg.fast_paths)
        if cfg.debug.inject.what == "grad":
            pipeline.after_backward = self.recorder.inject_grad
        return pipeline

    def interventions(self, *subjects: Subject) -> Interventions:
        """The configured intervention (``intervention.*``) over the networks the algorithm trains; the
        recorder logs its per-member counts. Call it once per update: ``intervene(updates, x, extra)``."""
        cfg = self.cfg.intervention if self.shared("intervention") else self.member_values("intervention")
        interventions = Interventions(cfg, list(subjects), self.seeds, self.recorder.health)
        self.recorder.counts = interventions.counts
        return interventions

    def population_based_training(
        self, objects: dict[str, Stateful | None], values: dict[str, np.ndarray | None]
    ) -> PopulationBasedTraining | None:
        """PBT over the algorithm's state (``pbt.*``; None when ``pbt.interval`` is 0), once its networks
        are built: ``objects`` as handed to ``checkpoint_state``, ``values`` each varied algo key's
        [P, 1] array the algorithm reads (changed in place). The recorder runs its rounds at log steps."""
        if self.cfg.pbt.interval == 0:
            return None
        statistics = [self.obs_norm.stats, self.reward_norm.stats]
        pbt = PopulationBasedTraining(self.cfg, self.member_cfgs, objects, statistics, values, self.recorder.health)
        self.recorder.population = pbt
        for k in range(len(self.recorder.outputs.logs)):  # each member's W&B config: its own starting values
            self.recorder.outputs.update_wandb_config(k, pbt.wandb_config(k))
        return pbt

    def step_env(self, actions: Any, step: int) -> tuple[Any, np.ndarray]:
        """One vector step of the training environments, as every algorithm takes it: the result
        checked (fault injection, non-finite observations), the observation statistics updated, and
        the reward the algorithm learns from, whose largest magnitude ``reward_range`` keeps: the
        team reward [P, E] scaled by ``reward_norm``, or a multi-agent
        world's per-agent rewards [P, E, N] as they are. Returns (the env's step result, that reward)."""
        result = self.env.step(actions)
        self.recorder.check_observations(result.obs, step)
        self.obs_norm.update(result.obs)
        if isinstance(result, MultiAgentStep):
            reward = result.agent_reward
            self.reward_range.update(np.abs(reward).max((1, 2)))
        else:
            reward = self.reward_norm(result.reward, result.terminated | result.truncated)
            self.reward_range.update(np.abs(reward).max(1))
        return result, reward

    def state_parts(self) -> dict[str, Stateful]:
        """The context's parts with state, by the name their checkpoint entries start with."""
        return {
            "torch_rng": TorchGenerator(),
            "env": self.env,
            "streams": self.streams,
            "obs_norm": self.obs_norm,
            "reward_norm": self.reward_norm,
            "reward_range": self.reward_range,
            "evaluator": self.evaluator,
            "recorder": self.recorder,
        }

    def checkpoint_state(self, objects: dict[str, Stateful | None], loop: Loop) -> dict[str, Any] | None:
        """Hand the algorithm's state to the checkpoints, once its networks are built and before its loop.

        ``objects``: its networks, pipelines (their optimizers' state), interventions and replay buffer
        (saved with ``checkpoint.replay``), each ``Stateful``, restored in place; ``loop()``: its loop's
        variables by name, read at each checkpoint (arrays and tensors with a leading member dimension
        are restored in place, so pass a view [P, ...] of a [T, P, ...] array). Returns the restored
        loop variables when the job continues from a checkpoint, else None.
        """
        checkpoints = self.checkpoints
        if checkpoints is None:
            return None
        replay = self.cfg.checkpoint.replay
        loop_state = LoopState(loop)
        algorithm: dict[str, Stateful] = {
            name: obj
            for name, obj in objects.items()
            if obj is not None and (replay or not isinstance(obj, ReplayBuffer))
        }
        algorithm["loop"] = loop_state
        if self.cfg.checkpoint.every > 0:
            self.recorder.checkpoint = lambda step: checkpoints.save(step, self.state_parts() | algorithm, self.members)
        if checkpoints.saved is None:
            return None
        # the recorder's state was restored by the job runner, before the members' logs opened
        context = {name: part for name, part in self.state_parts().items() if name != "recorder"}
        checkpoints.restore(context | algorithm)
        # bitwise as uninterrupted when every part was restored: the replay (if the algorithm keeps one)
        # and the environments (not restarted)
        keeps_replay = any(isinstance(obj, ReplayBuffer) for obj in objects.values())
        self.recorder.resumed = {
            "from_step": checkpoints.step,
            "replay_restored": keeps_replay and replay,
            "as_uninterrupted": (replay or not keeps_replay) and not self.env.restarted,
        }
        restored = loop_state.restored
        if self.env.restarted:  # one line: the job goes on, its interrupted episodes dropped
            print(
                f"resume: {self.cfg.env.id} cannot be saved exactly (its state is not plain attributes and it has no "
                "state_dict/load_state_dict); its episodes restart at the checkpoint",
                file=sys.stderr,
                flush=True,
            )
        if self.env.restarted and isinstance(restored.get("obs"), np.ndarray):
            restored["obs"][...] = self.env.observations().reshape(restored["obs"].shape)  # new episodes' first
        return restored


def member_values(member_cfgs: list[Config], key: str) -> list[Any]:
    """Each member config's value of the dotted key (``"algo.gamma"``, ``"optimizer"``)."""
    values = []
    for cfg in member_cfgs:
        value: Any = cfg
        for part in key.split("."):
            value = getattr(value, part)
        values.append(value)
    return values


Algorithm = Callable[[RunContext], None]  # an algorithm's train function
