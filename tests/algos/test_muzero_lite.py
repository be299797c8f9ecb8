"""MuZero-lite (rlexp/algos/muzero_lite.py), in pieces: scale_gradient against a direct computation and
against clipping, the replay of trajectories, the unroll's targets and scaled losses written out here
with plain loops, the gradient scaling inside the unroll, bad input, the seed_muzero preset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from composing import compose_config
from hydra import compose, initialize_config_dir

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra)
from rlexp.algos.muzero_lite import Model, representation_grad_norms, step_losses, unroll, unroll_targets
from rlexp.compose.validate import validate
from rlexp.config.schema import (
    ActivationConfig,
    ConfigError,
    GainInitConfig,
    MuZeroLiteConfig,
    NetworkConfig,
    NormalizationConfig,
    NormClipConfig,
)
from rlexp.data.buffers import SequenceBatch, SequenceReplay
from rlexp.nn.nets import PopMLP, scale_gradient
from rlexp.optim.pipeline import CLIPPERS

torch.set_num_threads(1)
CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


OBS, ACTIONS, STATE = 3, 2, 5


def model(members: int = 2, seed: int = 0) -> Model:
    def net(n_in: int, n_out: int, extra_in: int = 0, offset: int = 0) -> PopMLP:
        gens = [torch.Generator().manual_seed(100 * seed + 10 * offset + k) for k in range(members)]
        cfgs = (NetworkConfig(name="mlp", hidden=[8]), ActivationConfig(name="tanh"), NormalizationConfig(name="none"))
        return PopMLP(members, n_in, n_out, *cfgs, GainInitConfig(name="xavier"), gens, extra_in=extra_in)

    return Model(net(OBS, STATE), net(STATE, STATE + 1, ACTIONS, 1), net(STATE, ACTIONS + 1, offset=2), ACTIONS)


# ---------------------------------------------------------------- scale_gradient
def test_scale_gradient_is_the_identity_forward_and_scales_the_backward_exactly():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 3, generator=gen).requires_grad_()
    c = torch.randn(2, 4, 3, generator=gen)
    for scale in (0.5, 0.25, 1.0, 0.3):
        x.grad = None
        y = scale_gradient(x, scale)
        assert torch.equal(y, x)
        (y * c).sum().backward()
        assert torch.equal(x.grad, c * scale)  # d/dx of sum(y * c) is c, times the scale


def test_scale_gradient_is_not_clipping_on_a_constructed_case():
    # gradients of norm 10 and 0.1; clipping to norm 1 caps the first and leaves the second, scaling halves both
    for norm, clipped_norm in ((10.0, 1.0), (0.1, 0.1)):
        x = torch.zeros(1, 2, requires_grad=True)
        c = torch.tensor([[0.6, 0.8]]) * norm  # ||c|| = norm
        (scale_gradient(x, 0.5) * c).sum().backward()
        clipped = [c.clone()]
        CLIPPERS["global_norm"]([x.detach()], clipped, NormClipConfig(name="global_norm", max_norm=1.0))
        assert torch.equal(x.grad, c * 0.5)
        torch.testing.assert_close(clipped[0].norm(), torch.tensor(clipped_norm))
        assert not torch.allclose(x.grad, clipped[0])


def test_the_unroll_scales_the_gradient_through_each_dynamics_step():
    """The gradient step k's value loss sends into s_0 is scale^(k-1) times the unscaled one (exactly:
    the backward is linear in the incoming gradient and the scales are powers of two)."""
    net = model()
    gen = torch.Generator().manual_seed(1)
    obs = torch.randn(2, 4, OBS, generator=gen)
    actions = torch.randint(0, ACTIONS, (2, 4, 3), generator=gen)

    def grad_at_root(scale: float, k: int) -> torch.Tensor:
        out = unroll(net, obs, actions, scale)
        return torch.autograd.grad(out.values[..., k].sum(), out.states[0])[0]

    for k in (1, 2, 3):
        plain = grad_at_root(1.0, k)
        assert plain.abs().sum() > 0
        for scale in (0.5, 0.25):
            assert torch.equal(grad_at_root(scale, k), plain * scale ** (k - 1))


# ---------------------------------------------------------------- replay of trajectories
def test_windows_are_consecutive_steps_of_one_environment():
    buffer = SequenceReplay(members=2, capacity=12, num_envs=2, obs_dim=1, device=torch.device("cpu"))
    for t in range(9):  # env 1 of member 0 ends an episode at t = 4: its next row is the next episode's first
        done = np.zeros((2, 2))
        done[0, 1] = t == 4
        obs = np.full((2, 2, 1), float(t)) + np.array([[0.0, 100.0], [200.0, 300.0]])[..., None]
        buffer.add(obs, np.zeros((2, 2)), obs[..., 0], obs + 1, np.zeros((2, 2)), done)
    assert buffer.ptr.tolist() == [[9, 9], [9, 9]] and buffer.size.tolist() == [[6, 6], [6, 6]]
    u = np.array([[0.99, 0.0], [0.0, 0.99]])  # one window each: (env, start); member 0: env 1 from its oldest row
    batch = buffer.sample_windows(u, 4)
    # member 0, env 1 holds steps t = 3 ... 8, the episode's end at t = 4 marked by ``done``
    assert batch.obs[0, 0, :, 0].tolist() == [103.0, 104.0, 105.0, 106.0]
    assert batch.done[0, 0].tolist() == [0.0, 1.0, 0.0, 0.0]
    # member 1, env 0: the newest row starts the window; the rest is not stored yet
    assert batch.obs[1, 0, 0, 0].item() == 208.0
    assert batch.stored[1, 0].tolist() == [True, False, False, False]
    assert batch.stored[0, 0].tolist() == [True] * 4


# ---------------------------------------------------------------- targets and losses, written out
def window_batch() -> SequenceBatch:
    """P = 2, B = 3 windows of L = 6 steps: a termination at j = 2 (member 0, window 0), a truncation at
    j = 1 (member 0, window 1), steps not stored from j = 4 (member 1, window 2)."""
    gen = torch.Generator().manual_seed(2)
    P, B, L = 2, 3, 6
    terminated, done, stored = torch.zeros(P, B, L), torch.zeros(P, B, L), torch.ones(P, B, L, dtype=torch.bool)
    terminated[0, 0, 2] = done[0, 0, 2] = 1.0
    done[0, 1, 1] = 1.0
    stored[1, 2, 4:] = False
    return SequenceBatch(
        obs=torch.randn(P, B, L, OBS, generator=gen),
        actions=torch.randint(0, ACTIONS, (P, B, L), generator=gen),
        rewards=torch.rand(P, B, L, generator=gen) + 0.5,
        next_obs=torch.randn(P, B, L, OBS, generator=gen),
        terminated=terminated,
        done=done,
        stored=stored,
    )


def direct_targets(target: Model, batch: SequenceBatch, algo: MuZeroLiteConfig):
    """z, u, pi and their weights with plain loops over members, windows and steps."""
    K, n, gamma = algo.unroll_steps, algo.td_steps, algo.gamma
    P, B, L = batch.rewards.shape
    with torch.no_grad():
        boot = target.predict(target.represent(batch.next_obs.reshape(P, -1, OBS)))[1].view(P, B, L)
        q = target.lookahead(batch.obs.reshape(P, -1, OBS), gamma).view(P, B, L, ACTIONS)
    z, wz = torch.zeros(P, B, K + 1), torch.zeros(P, B, K + 1)
    u, wu = torch.zeros(P, B, K), torch.zeros(P, B, K)
    pi, wp = torch.zeros(P, B, K + 1, ACTIONS), torch.zeros(P, B, K + 1)
    for p in range(P):
        for b in range(B):
            live, absorbing, ended, terminated = [], [], False, False
            for j in range(L):
                live.append(bool(batch.stored[p, b, : j + 1].all()) and not ended)
                absorbing.append(terminated)
                if live[j] and batch.done[p, b, j]:
                    ended, terminated = True, bool(batch.terminated[p, b, j])
            for k in range(K + 1):
                if live[k]:
                    total, m = 0.0, 0
                    while m < n and k + m < L and live[k + m]:
                        total += gamma**m * float(batch.rewards[p, b, k + m])
                        m += 1
                    last = k + m - 1
                    total += gamma**m * (1 - float(batch.terminated[p, b, last])) * float(boot[p, b, last])
                    z[p, b, k], wz[p, b, k] = total, 1.0
                    pi[p, b, k], wp[p, b, k] = torch.softmax(q[p, b, k] / algo.policy_temperature, -1), 1.0
                elif absorbing[k]:
                    wz[p, b, k] = 1.0
                if k < K and (live[k] or absorbing[k]):
                    u[p, b, k], wu[p, b, k] = (float(batch.rewards[p, b, k]) if live[k] else 0.0), 1.0
    return z, wz, u, wu, pi, wp


def test_unroll_targets_and_scaled_losses_match_a_direct_computation():
    algo = MuZeroLiteConfig(name="muzero_lite", unroll_steps=3, td_steps=3, gamma=0.9, policy_temperature=0.5)
    net, target = model(seed=0), model(seed=1)
    batch = window_batch()
    targets = unroll_targets(target, batch, algo)
    z, wz, u, wu, pi, wp = direct_targets(target, batch, algo)
    policy = targets.policy * wp.unsqueeze(-1)  # where it is weighted
    for got, want in ((targets.value, z), (targets.reward, u), (policy, pi)):
        torch.testing.assert_close(got, want)
    for got, want in ((targets.value_weight, wz), (targets.reward_weight, wu), (targets.policy_weight, wp)):
        assert torch.equal(got, want)
    assert wz[0, 0].tolist() == [1.0, 1.0, 1.0, 1.0] and z[0, 0, 3] == 0.0  # absorbing after the termination
    assert wz[0, 1].tolist() == [1.0, 1.0, 0.0, 0.0]  # unknown past the truncation
    assert wz[1, 2].tolist() == [1.0, 1.0, 1.0, 1.0] and wp[1, 2].tolist() == [1.0] * 4

    K = algo.unroll_steps
    out = unroll(net, batch.obs[:, :, 0], batch.actions[:, :, :K], 0.5)
    losses = step_losses(out, targets, algo)  # [K + 1, P]
    P, B = 2, 3
    v, r, logits = out.values.detach(), out.rewards.detach(), out.logits.detach()
    for p in range(P):
        for k in range(K + 1):
            total = 0.0
            for b in range(B):
                total += algo.value_coef * wz[p, b, k] * (v[p, b, k] - z[p, b, k]) ** 2
                if k > 0:
                    total += wu[p, b, k - 1] * (r[p, b, k - 1] - u[p, b, k - 1]) ** 2
                log_probs = logits[p, b, k] - torch.logsumexp(logits[p, b, k], 0)
                total += algo.policy_coef * wp[p, b, k] * -(pi[p, b, k] * log_probs).sum()
            want = total / B * (1.0 if k == 0 else 1.0 / K)  # each unroll step's loss scaled by 1/K
            torch.testing.assert_close(losses[k, p].detach(), want)
    norms = representation_grad_norms(losses, out.states[0])  # [K + 1, P]
    for k in range(K + 1):
        grad = torch.autograd.grad(losses[k].sum(), out.states[0], retain_graph=True)[0]
        assert torch.equal(norms[k], grad.flatten(1).norm(dim=1))


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["algo=muzero_lite", "env=pendulum"], "algo"),  # a continuous action space
        (["algo=muzero_lite", "intervention=redo"], "intervention"),
        (["algo=muzero_lite", "algo.dynamics_grad_scale=1.5"], "algo.dynamics_grad_scale"),
        (["algo=muzero_lite", "algo.unroll_steps=0"], "algo.unroll_steps"),
    ],
)
def test_bad_muzero_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        validate(compose_config(overrides))
    assert err.value.key == key


def test_seed_muzero_preset_is_six_valid_cells_of_grad_scale_and_clipping():
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        hydra_cfg = compose(config_name="config", overrides=["+experiment=seed_muzero"], return_hydra_config=True)
    params = hydra_cfg.hydra.sweeper.params
    assert params["algo.dynamics_grad_scale"] == "1.0,0.5,0.25" and params["clipping"] == "none,global_norm"
    cfg = compose_config(["+experiment=seed_muzero", "algo.dynamics_grad_scale=0.25", "clipping=global_norm"])
    validate(cfg)
    assert cfg.algo.name == "muzero_lite" and cfg.algo.dynamics_grad_scale == 0.25
