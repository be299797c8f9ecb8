"""Interventions against loss of plasticity (the ``intervention`` config group).

An intervention acts every ``intervention.every`` updates on every network an algorithm trains (its
``Subject``: the network, its gradient pipeline, its target copies), member by member: each member's
fresh weights come from a fresh draw of the whole network (``PopMLP.fresh``, the network's own
initializer) from a generator of that member and network with a purpose of its own (100 + the
network's index), so training's streams are untouched and a member's draws depend on its seed alone.
Members that diverged stay frozen; no other member's parameters or optimizer state change.

* ``none``: nothing.
* ``redo`` (Sokar et al. 2023): on the update's batch, each hidden unit whose tau-dormant score
  (``diagnostics.dormant_scores``, the instruments' definition) is <= tau gets fresh incoming weights
  (its row of the layer's weight, bias and weight norm's g), zero outgoing weights (its columns of the
  next layer, both halves for crelu) and zero optimizer moments for both. Adam's step count is one per
  pipeline, shared by every member and element: it stays, as in ReDo's reference implementation.
* ``shrink_perturb`` (Ash & Adams 2020): every parameter of the network theta <- shrink * theta +
  perturb * theta_fresh (norm affines included, PPO's state-independent log-std excluded); the
  optimizer state stays.
* ``reset`` (Nikishin et al. 2022): the last ``layers`` linear layers (with their norms and buffers)
  become the fresh draw's, their optimizer state a fresh optimizer's, and the target copies take the
  same values (the agent restarts those layers); the replay buffer is kept.

redo and shrink_perturb leave the target copies to follow through the algorithm's own target updates.
Counts per member (cumulative, in each log record): ``intervention/count`` (interventions applied),
``intervention/recycled/<net>.<layer>`` (redo's units recycled per hidden layer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from rlexp.config.members import require_same
from rlexp.config.schema import (
    InterventionConfig,
    ReDoConfig,
    ResetConfig,
    ShrinkPerturbConfig,
    require,
    require_choice,
)
from rlexp.diagnostics.instruments import dormant_scores, hidden_outputs
from rlexp.envs.streams import member_generator
from rlexp.nn.nets import PopMLP
from rlexp.optim.pipeline import GradientPipeline, Health

PURPOSE = 100  # member_generator purpose of the first network's fresh draws (the next network's: 101, ...)

Counts = dict[str, torch.Tensor]  # metric name -> [P] cumulative counts, on the host


@dataclass
class Subject:
    """One trained network: ``name`` its instruments' prefix (q, actor, critic, critic2), ``net`` the
    network, ``pipeline`` the gradient pipeline holding its parameters, ``targets`` its target copies."""

    name: str
    net: PopMLP
    pipeline: GradientPipeline
    targets: tuple[PopMLP, ...] = ()


# (subject, its fresh draw, members to change, config, inputs [P, B, in], extra [P, B, extra] or None, counts)
Apply = Callable[[Subject, PopMLP, list[int], InterventionConfig, torch.Tensor, torch.Tensor | None, Counts], None]


def _none(*args: object) -> None:
    """Nothing."""


def dormant_units(net: PopMLP, x: torch.Tensor, extra: torch.Tensor | None, tau: float) -> list[torch.Tensor]:
    """Per hidden layer, the tau-dormant units of its linear layer [P, H] (bool) on the batch x
    [P, B, in]: a unit whose output (each of its outputs, for an activation of width 2) scores <= tau."""
    with torch.no_grad():
        hidden = hidden_outputs(net, x, extra)[1]
    units = []
    for i, h in enumerate(hidden):
        dormant = dormant_scores(h) <= tau  # [P, k * H]: k outputs per unit (crelu: 2, unit j's are j and H + j)
        units.append(dormant.view(dormant.shape[0], -1, net.layers[i].weight.shape[1]).all(1))  # [P, H]
    return units


@torch.no_grad()
def redo(
    subject: Subject,
    fresh: PopMLP,
    members: list[int],
    cfg: InterventionConfig,
    x: torch.Tensor,
    extra: torch.Tensor | None,
    counts: Counts,
) -> None:
    """Recycle each member's tau-dormant hidden units (see the module docstring)."""
    net, pipeline = subject.net, subject.pipeline
    for i, dormant in enumerate(dormant_units(net, x, extra, cfg.tau)):
        layer, fresh_layer, following = net.layers[i], fresh.layers[i], net.layers[i + 1]
        units = layer.weight.shape[1]
        outputs = following.weight.shape[2] - (net.extra_in if net.extra_at == i + 1 else 0)  # k * units
        name = f"intervention/recycled/{subject.name}.{i}"
        counts.setdefault(name, torch.zeros(dormant.shape[0]))
        for k in members:
            rows = dormant[k].nonzero().flatten()  # the units recycled
            if len(rows) == 0:
                continue
            cols = (rows + torch.arange(0, outputs, units, device=rows.device).unsqueeze(1)).flatten()
            for p, f in zip(layer.parameters(), fresh_layer.parameters()):
                p[k, rows] = f[k, rows]  # incoming: weight rows, bias, g
                pipeline.reset_state(p, k, (rows,))
            following.weight[k, :, cols] = 0.0  # outgoing
            pipeline.reset_state(following.weight, k, (slice(None), cols))
            counts[name][k] += len(rows)


@torch.no_grad()
def shrink_perturb(
    subject: Subject,
    fresh: PopMLP,
    members: list[int],
    cfg: InterventionConfig,
    x: torch.Tensor,
    extra: torch.Tensor | None,
    counts: Counts,
) -> None:
    """theta <- shrink * theta + perturb * theta_fresh for each member's parameters."""
    rows = torch.tensor(members)
    for p, f in zip(subject.net.parameters(), fresh.parameters()):
        p[rows] = cfg.shrink * p[rows] + cfg.perturb * f[rows]


@torch.no_grad()
def reset(
    subject: Subject,
    fresh: PopMLP,
    members: list[int],
    cfg: InterventionConfig,
    x: torch.Tensor,
    extra: torch.Tensor | None,
    counts: Counts,
) -> None:
    """The last ``layers`` linear layers (and their norms) of each member, and its target copies',
    become the fresh draw's; their optimizer state a fresh optimizer's."""
    net, rows = subject.net, torch.tensor(members)
    first = len(net.layers) - cfg.layers
    for copy in (net, *subject.targets):
        for i in range(first, len(net.layers)):
            modules = [(copy.layers[i], fresh.layers[i])]
            if i < len(net.norms):
                modules.append((copy.norms[i], fresh.norms[i]))
            for module, fresh_module in modules:
                for p, f in zip(module.parameters(), fresh_module.parameters()):
                    p[rows] = f[rows]
                    if copy is net:
                        for k in members:
                            subject.pipeline.reset_state(p, k)
                for b, f in zip(module.buffers(), fresh_module.buffers()):
                    b[rows] = f[rows]


@dataclass(frozen=True)
class Intervention:
    """An intervention option: ``apply`` changes chosen members of one network; its config's schema."""

    schema: type
    apply: Apply


INTERVENTIONS: dict[str, Intervention] = {
    "none": Intervention(InterventionConfig, _none),
    "redo": Intervention(ReDoConfig, redo),
    "shrink_perturb": Intervention(ShrinkPerturbConfig, shrink_perturb),
    "reset": Intervention(ResetConfig, reset),
}


def check_intervention(cfg: DictConfig, key: str = "intervention") -> None:
    """Refuse an unknown option and numbers out of range, whichever option is chosen (ConfigError at
    ``key``.<field>); that reset's layers exist is checked with the networks (rlexp.compose.validate)."""
    require_choice(cfg.name, f"{key}.name", INTERVENTIONS)
    require(cfg.every >= 1, f"{key}.every", cfg.every, "an integer >= 1 (updates between interventions)")
    require(0 < cfg.tau <= 1, f"{key}.tau", cfg.tau, "a value in (0, 1]: units scoring <= tau are recycled")
    require(0 <= cfg.shrink <= 1, f"{key}.shrink", cfg.shrink, "a value in [0, 1] (lambda, the share kept)")
    require(cfg.perturb >= 0, f"{key}.perturb", cfg.perturb, "a value >= 0 (sigma, the fresh draw's share)")
    require(cfg.layers >= 1, f"{key}.layers", cfg.layers, "an integer >= 1 (1 = the output layer)")


class Interventions:
    """The configured intervention over an algorithm's trained networks: call it once per update with
    the number of updates done and the update's inputs."""

    def __init__(
        self,
        cfg: InterventionConfig | list[InterventionConfig],
        subjects: list[Subject],
        seeds: list[int],
        health: Health,
    ) -> None:
        """``cfg``: the intervention, or one per member (members may differ in its numbers: tau, shrink,
        perturb, layers; never in the option or ``every``)."""
        require_same(cfg, "name", "intervention.name")
        require_same(cfg, "every", "intervention.every")
        configs = cfg if isinstance(cfg, list) else [cfg]
        # each distinct config and the members that have it (one group when they all agree)
        self.groups: list[tuple[InterventionConfig, set[int]]] = []
        for k, config in enumerate(configs):
            group = next((g for c, g in self.groups if c == config), None)
            if group is None:
                self.groups.append((config, set()))
                group = self.groups[-1][1]
            group.add(k)
        cfg = configs[0]
        self.cfg = cfg
        self.entry = INTERVENTIONS[cfg.name]
        self.subjects = subjects
        self.health = health
        self.active = cfg.name != "none"
        # per network, each member's generator of fresh draws
        self.generators = [[member_generator(s, PURPOSE + j) for s in seeds] for j in range(len(subjects))]
        self.counts: Counts = {"intervention/count": torch.zeros(len(seeds))} if self.active else {}

    def __call__(
        self, updates: int, x: torch.Tensor, extra: torch.Tensor | None = None, members: list[int] | None = None
    ) -> bool:
        """After ``updates`` updates (a multiple of ``every``), intervene on every network for the
        members alive (or ``members``); x [P, B, in] the update's inputs, ``extra`` [P, B, extra_in]
        those of networks that take a second input (critics' actions). True when it acted."""
        if not self.active or updates == 0 or updates % self.cfg.every != 0:
            return False
        if members is None:
            members = self.health.alive.nonzero().flatten().tolist()
        for subject, generators in zip(self.subjects, self.generators):
            fresh = subject.net.fresh(generators)  # every member draws, intervened on or not
            inputs_extra = extra if subject.net.extra_in else None
            if len(self.groups) == 1:
                self.entry.apply(subject, fresh, members, self.cfg, x, inputs_extra, self.counts)
                continue
            for config, group in self.groups:  # members with numbers of their own: each group by its config
                chosen = [k for k in members if k in group]
                if chosen:
                    self.entry.apply(subject, fresh, chosen, config, x, inputs_extra, self.counts)
        self.counts["intervention/count"][members] += 1
        return True

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The counts [P] and each network's generators' states [P, S]; nothing when no intervention
        is configured."""
        if not self.active:
            return {}
        state = {f"counts/{name}": values for name, values in self.counts.items()}
        for j, generators in enumerate(self.generators):
            state[f"generators/{j}"] = torch.stack([g.get_state() for g in generators])
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Continue from ``state_dict()`` (counts in place: the recorder logs the same tensors)."""
        if not self.active:
            return
        for name, values in self.counts.items():
            values.copy_(state[f"counts/{name}"])
        for j, generators in enumerate(self.generators):
            for generator, generator_state in zip(generators, state[f"generators/{j}"]):
                generator.set_state(generator_state.clone())
