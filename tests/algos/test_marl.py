"""MADDPG and MAPPO (rlexp/algos/maddpg.py, mappo.py), in pieces: the critics' targets and losses against
direct computations, Gumbel-softmax's gradient, the exploration noise, sharing refused across agents of
different spaces, bad input."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

pytest.importorskip("pettingzoo", reason="pip install -e '.[marl]'")
pytest.importorskip("mpe2", reason="pip install -e '.[marl]'")
pytest.importorskip("vmas", reason="pip install -e '.[marl]'")

from composing import compose_config

from rlexp.algos.common import ScaledTanh  # noqa: E402
from rlexp.algos.maddpg import Agent, critic_target, gumbel_softmax, joint_target  # noqa: E402
from rlexp.compose.validate import validate  # noqa: E402
from rlexp.config.schema import ConfigError  # noqa: E402
from rlexp.envs.marl import AgentSpace  # noqa: E402

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
QUIET = ["logger.mode=disabled", "logger.progress=off", "device=cpu", "threads=1"]
TINY = ["algo=maddpg", "network.hidden=[16,16]", "algo.batch_size=32", "eval.episodes=1", "eval.every=0", *QUIET]


# ====================================================================== losses
def test_centralized_critic_target_is_the_direct_computation():
    torch.manual_seed(0)
    P, B, D, A = 2, 8, 6, 4
    critic = torch.nn.Linear(D + A, 1)

    class Holder:  # an agent's target critic: (x', a') -> Q'
        def critic_target(self, x, a):
            return critic(torch.cat([x, a], -1))

    next_obs, next_actions = torch.randn(P, B, D), torch.randn(P, B, A)
    reward, terminated = torch.randn(P, B), (torch.rand(P, B) < 0.3).float()
    y = critic_target(Holder(), next_obs, next_actions, reward, terminated, 0.95)
    for p in range(P):
        for b in range(B):
            q = critic(torch.cat([next_obs[p, b], next_actions[p, b]])).item()
            expected = reward[p, b].item() + (0.0 if terminated[p, b] else 0.95 * q)
            assert y[p, b].item() == pytest.approx(expected, rel=1e-6, abs=1e-6)
    assert not y.requires_grad


@pytest.mark.parametrize("delayed", [True, False], ids=["target_actor", "current_actor"])
def test_the_targets_joint_action_comes_from_the_target_or_the_current_actors(delayed):
    """a' of a discrete agent (one-hot argmax) and a continuous one (in its box [-2, 2]) from the target
    actors, or with ``algo.target_actor=false`` from the current ones, side by side."""
    torch.manual_seed(0)
    P, B = 2, 5
    spaces = [AgentSpace("a", 3, True, 4), AgentSpace("b", 2, False, 2, np.full(2, -2.0), np.full(2, 2.0))]
    agents, start = [], 0
    for space in spaces:
        agent = Agent.__new__(Agent)  # the parts target_action reads
        agent.space, agent.obs = space, slice(start, start + space.obs_dim)
        agent.actor, agent.actor_target = (torch.nn.Linear(space.obs_dim, space.action_dim) for _ in range(2))
        agent.squash = None if space.discrete else ScaledTanh(space.low, space.high, torch.device("cpu"))
        agents.append(agent)
        start += space.obs_dim
    next_obs = torch.randn(P, B, 5)
    got = joint_target(agents, next_obs, delayed)
    pick = (lambda a: a.actor_target) if delayed else (lambda a: a.actor)
    for p in range(P):
        for b in range(B):
            logits = pick(agents[0])(next_obs[p, b, :3])
            expected = [1.0 if k == logits.argmax().item() else 0.0 for k in range(4)]
            expected += [2.0 * math.tanh(v) for v in pick(agents[1])(next_obs[p, b, 3:]).tolist()]
            assert got[p, b].tolist() == pytest.approx(expected, abs=1e-6)
    assert not got.requires_grad


@pytest.mark.parametrize("hard", [True, False])
def test_gumbel_softmax_gradient_is_the_soft_samples(hard):
    """The straight-through sample's forward is the one-hot argmax and its gradient the soft sample's:
    d softmax(z/t)_k / d logit_j = s_k (delta_kj - s_j) / t."""
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 5, requires_grad=True)
    noise = -torch.log(-torch.log(torch.rand(2, 3, 5)))
    weights = torch.randn(2, 3, 5)
    t = 0.7
    sample = gumbel_softmax(logits, noise, t, hard)
    (sample * weights).sum().backward()
    soft = torch.softmax((logits.detach() + noise) / t, -1)
    if hard:
        assert torch.equal(sample.detach(), F.one_hot(soft.argmax(-1), 5).float())
    else:
        assert torch.allclose(sample.detach(), soft)
    jacobian = (torch.diag_embed(soft) - soft[..., :, None] * soft[..., None, :]) / t  # [.., k, j]
    expected = (weights[..., :, None] * jacobian).sum(-2)
    assert torch.allclose(logits.grad, expected, atol=1e-6)


# ====================================================================== MADDPG with shared networks
def _shared_maddpg(env: str):
    """A population of 2 with shared MADDPG networks on ``env``: (context, the agents, the config)."""
    from omegaconf import OmegaConf

    from rlexp.algos.maddpg import Agent
    from rlexp.run.context import RunContext

    cfg = compose_config(TINY + [f"env={env}", "num_seeds=2", "algo.share_parameters=true", "algo.policy_reg=0.01"])
    ctx = RunContext.create(OmegaConf.to_object(cfg), torch.device("cpu"))
    env_ = ctx.env
    joint = sum(a.action_dim for a in env_.agents)
    first = Agent(ctx, 0, env_.agents[0], env_.slices[0], env_.obs_dim, joint, name="shared")
    agents = [first] + [
        Agent(ctx, i, a, env_.slices[i], env_.obs_dim, joint, first) for i, a in enumerate(env_.agents) if i
    ]
    return ctx, agents, ctx.cfg.algo


@pytest.mark.parametrize("env", ["simple_spread", "vmas_navigation"])
def test_shared_maddpg_losses_are_the_direct_computation(env):
    """The shared critic's loss: the mean over agents and samples of (Q(x, a) - y_i)^2 with y_i each
    agent's own reward's target; the shared actor's: -Q(x, every agent's action from the actor), plus
    the logits penalty (discrete). Computed sample by sample with the networks' plain forward."""
    from rlexp.algos.maddpg import policy_actions, shared_actor_loss, shared_critic_loss
    from rlexp.data.buffers import Batch

    ctx, agents, algo = _shared_maddpg(env)
    net, n, P, B, D = agents[0], len(agents), 2, 8, ctx.env.obs_dim
    assert all(a.actor is net.actor and a.critic_target is net.critic_target for a in agents)
    gen = torch.Generator().manual_seed(0)
    joint = sum(a.space.action_dim for a in agents)
    batch = Batch(
        torch.randn(P, B, D, generator=gen),
        torch.randn(P, B, joint, generator=gen),
        torch.randn(P, B, generator=gen),
        torch.randn(P, B, D, generator=gen),
        (torch.rand(P, B, generator=gen) < 0.3).float(),
    )
    rewards, next_actions = torch.randn(P, B, n, generator=gen), torch.randn(P, B, joint, generator=gen)
    loss, q, target = shared_critic_loss(net, batch, batch.actions, next_actions, rewards, 0.95)
    total = [0.0] * P
    with torch.no_grad():
        for b in range(B):  # one sample at a time, every member's networks at once
            q_b = net.critic(batch.obs[:, b : b + 1], batch.actions[:, b : b + 1])[:, 0, 0]  # [P]
            next_q = net.critic_target(batch.next_obs[:, b : b + 1], next_actions[:, b : b + 1])[:, 0, 0]
            for p in range(P):
                for i in range(n):
                    y = rewards[p, b, i].item() + 0.95 * (1 - batch.terminated[p, b].item()) * next_q[p].item()
                    total[p] += (q_b[p].item() - y) ** 2
    assert loss.tolist() == pytest.approx([t / (B * n) for t in total], rel=1e-5)
    assert target.shape == (P, B, n) and not target.requires_grad and q.shape == (P, B)

    noises = [torch.rand(P, B * a.space.action_dim, generator=gen) for a in agents]
    actor_loss = shared_actor_loss(net, agents, batch.obs, noises, algo)
    with torch.no_grad():
        outs = [net.actor(batch.obs[..., a.obs]) for a in agents]
        actions = [policy_actions(a, o, z.reshape(o.shape), algo) for a, o, z in zip(agents, outs, noises)]
        want = -net.critic(batch.obs, torch.cat(actions, -1)).squeeze(-1).mean(1)
        if net.squash is None:
            want = want + algo.policy_reg * sum(o.square().mean((1, 2)) for o in outs) / n
    assert torch.allclose(actor_loss, want, rtol=1e-5, atol=1e-6)
    actor_loss.sum().backward()
    assert all(p.grad is not None for p in net.actor.parameters())
    ctx.env.close(), ctx.evaluator.close()


def test_maddpg_exploration_noise_falls_linearly_then_stays():
    """noise_std: exploration_noise at step 0, linear to exploration_noise_end at exploration_anneal_steps,
    then constant; in steps of exploration_anneal_every when set; constant without a decay; the end
    defaults to the start."""
    from rlexp.algos.maddpg import noise_std
    from rlexp.config.schema import MADDPGConfig

    algo = MADDPGConfig(name="maddpg", exploration_noise=0.8, exploration_noise_end=0.01, exploration_anneal_steps=40)
    for step, want in [(0, 0.8), (10, 0.8 - 0.79 / 4), (20, 0.8 - 0.79 / 2), (40, 0.01), (1000, 0.01)]:
        assert noise_std(step, algo) == pytest.approx(want, abs=1e-12), step
    batched = MADDPGConfig(
        name="maddpg",
        exploration_noise=0.8,
        exploration_noise_end=0.01,
        exploration_anneal_steps=40,
        exploration_anneal_every=20,
    )  # stepped once per batch of 20: the value at the batch's first step holds through the batch
    for step, want in [(0, 0.8), (19, 0.8), (20, 0.8 - 0.79 / 2), (39, 0.8 - 0.79 / 2), (40, 0.01), (95, 0.01)]:
        assert noise_std(step, batched) == pytest.approx(want, abs=1e-12), step
    assert noise_std(30, MADDPGConfig(name="maddpg", exploration_noise=0.3)) == 0.3
    assert noise_std(30, MADDPGConfig(name="maddpg", exploration_noise=0.3, exploration_anneal_steps=10)) == 0.3


def test_maddpg_sharing_refuses_agents_of_different_spaces():
    with pytest.raises(ConfigError) as err:
        validate(compose_config(["algo=maddpg", "env=simple_adversary", "algo.share_parameters=true"]))
    assert err.value.key == "algo.share_parameters"


# ====================================================================== bad input
@pytest.mark.parametrize(
    "overrides,key,text",
    [
        (["algo=td3", "env=simple_spread"], "algo", "use algo=maddpg"),
        (["algo=maddpg", "env=simple_spread", "env.id=mpe2.simple_sprad_v3"], "env.id", "mpe2.simple_spread_v3"),
        (["algo=maddpg", "env=vmas_navigation", "env.id=navigaton"], "env.id", "navigation"),
        (["algo=maddpg"], "algo", "multi-agent env"),
        (["algo=maddpg", "env=simple_spread", "diagnostics.collapse_repeat=2"], "diagnostics.collapse_repeat", ""),
    ],
)
def test_bad_multi_agent_input_is_one_line(overrides, key, text):
    with pytest.raises(ConfigError) as err:
        validate(compose_config(overrides))
    assert err.value.key == key and text in str(err.value) and "\n" not in str(err.value)


# ====================================================================== MAPPO
@pytest.mark.parametrize("shared", [True, False])
def test_mappo_clipped_objective_is_the_direct_computation(shared):
    """Each agent's clipped surrogate (advantages normalized per member) minus the entropy bonus, from
    torch.distributions; shared: their mean for the one policy; separate: agent i's for policy i."""
    from omegaconf import OmegaConf

    from rlexp.algos.common import Minibatch
    from rlexp.algos.mappo import Policies, mappo_losses
    from rlexp.run.context import RunContext

    overrides = ["algo=mappo", "env=simple_spread", "num_seeds=2", f"algo.share_parameters={shared}", *QUIET]
    ctx = RunContext.create(OmegaConf.to_object(compose_config(overrides)), torch.device("cpu"))
    policies, algo = Policies(ctx, shared), ctx.cfg.algo
    gen = torch.Generator().manual_seed(0)
    P, M, n = 2, 16, 3
    obs = torch.randn(P, M, ctx.env.obs_dim, generator=gen)
    mbs = [
        Minibatch(
            obs,
            torch.randint(0, 5, (P, M), generator=gen),
            -1.6 + 0.3 * torch.randn(P, M, generator=gen),
            torch.randn(P, M, generator=gen),
            torch.randn(P, M, generator=gen),
            torch.randn(P, M, generator=gen),
        )
        for _ in range(n)
    ]
    actor_losses, _ = mappo_losses(policies, obs, mbs, torch.randn(P, M, n, generator=gen), algo)
    expected = []
    for i, mb in enumerate(mbs):
        own = obs[..., ctx.env.slices[i]]
        net_in = torch.cat([own, F.one_hot(torch.tensor(i), n).float().expand(P, M, n)], -1) if shared else own
        dist = torch.distributions.Categorical(logits=policies.actor(i).net(net_in))
        ratio = torch.exp(dist.log_prob(mb.actions) - mb.log_probs)
        adv = (mb.advantages - mb.advantages.mean(1, keepdim=True)) / (mb.advantages.std(1, keepdim=True) + 1e-8)
        clipped = ratio.clamp(1 - algo.clip_coef, 1 + algo.clip_coef)
        surrogate = torch.maximum(-adv * ratio, -adv * clipped).mean(1)
        expected.append(surrogate - algo.ent_coef * dist.entropy().mean(1))
    if shared:
        expected = [torch.stack(expected).mean(0)]
    assert len(actor_losses) == len(expected) == len(policies.actors)
    for got, want in zip(actor_losses, expected):
        assert torch.allclose(got, want, atol=1e-6)
    if not shared:  # agent 0's loss reaches only agent 0's policy
        actor_losses[0].sum().backward()
        assert all(p.grad is None or not p.grad.any() for p in policies.actors[1].parameters())
    ctx.env.close(), ctx.evaluator.close()


def test_mappo_sharing_refuses_agents_of_different_spaces():
    with pytest.raises(ConfigError) as err:
        validate(compose_config(["algo=mappo", "env=simple_adversary"]))
    assert err.value.key == "algo.share_parameters"


# ====================================================================== the seed_marl presets
SEED_MARL_CHANGES = {
    "none": set(),
    "clipping_global_norm": {"clipping.name"},
    "last_layer_small": {"init.last_layer"},
    "layer_norm": {"normalization.name"},
    "batch_norm": {"normalization.name"},
    "tanh": {"activation.name"},
    "softsign": {"activation.name"},
    "fewer_layers": {"network.hidden"},
    "obs_norm": {"obs_norm.enabled"},
    "policy_reg": {"algo.policy_reg"},
    "lr_1e-3": {"optimizer.lr"},
}


def flat(cfg, prefix: str = "") -> dict:
    from omegaconf import OmegaConf

    out = {}
    for key, value in (OmegaConf.to_container(cfg) if prefix == "" else cfg).items():
        if isinstance(value, dict):
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_seed_marl_fixes_change_one_thing_each():
    presets = sorted(p.stem for p in (Path(CONF_DIR) / "experiment" / "seed_marl").glob("*.yaml"))
    assert sorted(SEED_MARL_CHANGES) == sorted(p.replace("clip_", "clipping_") for p in presets)
    base_cfg = compose_config(["+experiment=seed_marl"])
    validate(base_cfg)
    base = flat(base_cfg)
    assert (base["algo.name"], base["env.id"], base["activation.name"], base["clipping.name"]) == (
        "maddpg",
        "mpe2.simple_spread_v3",
        "relu",
        "none",
    )
    for preset in presets:
        changed = flat(compose_config([f"+experiment=seed_marl/{preset}"]))
        moved = {k for k in base if changed.get(k) != base[k]}
        assert moved == SEED_MARL_CHANGES[preset.replace("clip_", "clipping_")], preset
