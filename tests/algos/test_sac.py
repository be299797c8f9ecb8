"""SAC (rlexp/algos/sac.py): its losses against direct computations, and bad input.

The squashed Gaussian's log-probability against torch.distributions' Normal minus log(1 - tanh^2)
written out, finite far in tanh's tails; the entropy-regularized twin-minimum target against a
written-out forward of each member; alpha's loss gradient against its formula; ``algo=sac`` on a
discrete action space refused in one line naming ``algo``. Population independence end to end and
bitwise checkpoint continuation are in tests/jobs/test_actor_critic_jobs.py and tests/jobs/test_checkpoints.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_actor_critic import compose_config, pop_mlp, ref_forward, td3_batch

from rlexp.algos.common import ScaledTanh
from rlexp.algos.sac import LogAlpha, sac_target, squashed_sample
from rlexp.compose.validate import validate
from rlexp.config.schema import ConfigError, SACConfig

torch.set_num_threads(1)


def test_squashed_log_prob_is_the_gaussian_minus_the_tanh_jacobian():
    P, B, A = 2, 64, 3
    g = torch.Generator().manual_seed(0)
    out = torch.randn(P, B, 2 * A, generator=g)
    out[..., A:] = out[..., A:] * 3  # log std past both clamps
    noise = torch.randn(P, B, A, generator=g)
    action, log_prob = squashed_sample(out, noise, -2.0, 0.5)
    mean, log_std = out[..., :A].double(), out[..., A:].double().clamp(-2.0, 0.5)
    u = mean + log_std.exp() * noise.double()
    direct = torch.distributions.Normal(mean, log_std.exp()).log_prob(u).sum(-1)
    direct = direct - torch.log(torch.cosh(u) ** -2).sum(-1)  # log(1 - tanh(u)^2) = log sech(u)^2
    torch.testing.assert_close(log_prob.double(), direct, rtol=1e-5, atol=1e-4)
    assert torch.equal(action, torch.tanh(out[..., :A] + out[..., A:].clamp(-2.0, 0.5).exp() * noise))
    assert (log_std == -2.0).any() and (log_std == 0.5).any()


def test_squashing_correction_stays_finite_where_tanh_saturates():
    """At u = +-15, 1 - tanh(u)^2 rounds to 0 in float32; the exact log is -2 |u| + 2 log 2 - ..."""
    u = torch.tensor([[[-15.0, 15.0, 0.3]]])
    out = torch.cat([u, torch.full_like(u, -20.0)], -1)  # std ~ 2e-9: u is the mean
    _, log_prob = squashed_sample(out, torch.zeros_like(u), -20.0, 2.0)
    u64 = u.double()
    exact = 20.0 - 0.5 * math.log(2 * math.pi) - (2 * (math.log(2) - u64 - torch.nn.functional.softplus(-2 * u64)))
    assert torch.isfinite(log_prob).all()
    torch.testing.assert_close(log_prob.double(), exact.sum(-1), rtol=1e-5, atol=1e-4)


def test_sac_target_is_the_entropy_regularized_twin_minimum():
    P, B, O, A = 2, 32, 3, 2
    low, high = np.array([-2.0, -1.0], dtype=np.float32), np.array([2.0, 3.0], dtype=np.float32)
    squash = ScaledTanh(low, high, torch.device("cpu"))
    actor = pop_mlp(P, O, 2 * A, seed=1)
    critics = [pop_mlp(P, O, 1, seed=2 + i, extra_in=A, extra_at=1) for i in range(2)]
    algo = SACConfig(name="sac", gamma=0.9)
    batch = td3_batch(P, B, O, A)
    alpha = torch.tensor([0.5, 0.05])
    noise = torch.randn(P, B, A, generator=torch.Generator().manual_seed(9))
    y = sac_target(actor, critics, squash, batch, algo, alpha, noise)
    half, center = torch.tensor((high - low) / 2), torch.tensor((high + low) / 2)
    for k in range(P):
        out = ref_forward(actor, k, batch.next_obs[k]).double()
        mean, log_std = out[:, :A], out[:, A:].clamp(-20.0, 2.0)
        u = mean + log_std.exp() * noise[k].double()
        log_prob = torch.distributions.Normal(mean, log_std.exp()).log_prob(u).sum(-1)
        log_prob = (log_prob - torch.log(torch.cosh(u) ** -2).sum(-1)).float()  # log(1 - tanh^2) = log sech^2
        a = center + half * torch.tanh(u).float()
        qs = [ref_forward(c, k, batch.next_obs[k], a)[:, 0] for c in critics]
        soft = torch.min(torch.stack(qs), 0).values - alpha[k] * log_prob
        expected = batch.rewards[k] + 0.9 * (1 - batch.terminated[k]) * soft
        torch.testing.assert_close(y[k], expected, rtol=1e-5, atol=1e-4)
    assert not torch.allclose(qs[0], qs[1])  # the minimum is taken from each critic somewhere


def test_alpha_loss_gradient_pushes_entropy_towards_its_target():
    """d/dlog_alpha of -mean(log_alpha (log pi + target)) = -mean(log pi + target), per member: alpha
    falls when the entropy -log pi is above the target and rises when it is below."""
    log_alpha = LogAlpha(2, 1.0, torch.device("cpu"))
    log_prob, target = torch.tensor([[-3.0, -2.0], [0.5, 1.5]]), -1.0  # entropies 2.5 and -1
    loss = -(log_alpha.value * (log_prob + target)).mean(1)
    loss.sum().backward()
    torch.testing.assert_close(log_alpha.value.grad, torch.tensor([[3.5], [0.0]]))
    assert log_alpha.value.grad[0, 0] > 0  # gradient descent lowers alpha for the high-entropy member


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["algo=sac"], "algo"),  # CartPole's discrete actions
        (["algo=sac", "env=pendulum", "algo.alpha=0"], "algo.alpha"),
        (["algo=sac", "env=pendulum", "algo.log_std_max=-30"], "algo.log_std_max"),
    ],
)
def test_bad_sac_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        validate(compose_config(overrides))
    assert err.value.key == key
