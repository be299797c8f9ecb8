"""network=lstm: the population LSTM against torch.nn.LSTMCell per member, unrolls with resets, member
isolation, instruments and divergence location, and the Monte-Carlo value target."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from rlexp.config.schema import DiagnosticsConfig, LSTMNetworkConfig, NormalizationConfig, XavierInitConfig
from rlexp.diagnostics.instruments import activity_instruments, locate_nonfinite, parameter_names, resolve
from rlexp.nn.activations import ACTIVATIONS
from rlexp.nn.nets import NORMALIZATIONS, weight_parameters
from rlexp.nn.recurrent import RecurrentNet, mc_returns, reset_state_, take_sequences

P, N_IN, CELL, N_OUT, T, N = 3, 5, 6, 2, 7, 4


def make_net(normalization: str = "none", encoder: tuple[int, ...] = (), activation: str = "tanh") -> RecurrentNet:
    gens = [torch.Generator().manual_seed(20 + k) for k in range(P)]
    act = OmegaConf.structured(ACTIVATIONS[activation].schema(name=activation))
    norm: NormalizationConfig = OmegaConf.structured(NORMALIZATIONS[normalization].schema(name=normalization))
    network = LSTMNetworkConfig(name="lstm", encoder=list(encoder), cell_size=CELL, hidden=[8, 8])
    return RecurrentNet(P, N_IN, N_OUT, network, act, norm, XavierInitConfig(name="xavier", bias=0.1), gens)


def twin_lstm(net: RecurrentNet, k: int):
    """Member k's LSTM as torch.nn.LSTMCell, run over sequences x [T, N, in] from (h, c), zeroing the rows
    where starts [T, N] is set before their step: (outputs [T, N, H], (h, c) at the end)."""
    cell = nn.LSTMCell(N_IN, CELL)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(cell, name).copy_(getattr(net.lstm, name)[k])

    def run(x: torch.Tensor, hc: tuple[torch.Tensor, torch.Tensor], starts: torch.Tensor | None = None):
        out = []
        with torch.no_grad():
            for t in range(x.shape[0]):
                if starts is not None:
                    hc = tuple(v.masked_fill(starts[t, :, None], 0.0) for v in hc)
                hc = cell(x[t], hc)
                out.append(hc[0])
        return torch.stack(out), hc

    return run


def test_lstm_equals_torch_lstm_cell_per_member_bit_for_bit():
    """Each member's unrolled outputs are torch.nn.LSTMCell's on its weights (same ops, same order: equal bits),
    for a sequence from a given state and one acting step at a time; the weights and biases come from the
    init group (xavier, bias 0.1)."""
    net = make_net()
    assert torch.equal(net.lstm.bias_ih, torch.full_like(net.lstm.bias_ih, 0.1))
    x = torch.randn(P, T, N, N_IN, generator=torch.Generator().manual_seed(1))
    state = torch.randn(P, N, 2, CELL, generator=torch.Generator().manual_seed(2))
    starts = torch.zeros(P, T, N, dtype=torch.bool)
    with torch.no_grad(), net.unroll(state, starts):
        h = net.lstm(x.reshape(P, T * N, N_IN)).view(P, T, N, CELL)
    acting = state.clone()
    for t in range(T):
        net.step(x[:, t], acting)
    for k in range(P):
        with torch.no_grad():
            out, (h_n, c_n) = twin_lstm(net, k)(x[k], (state[k, :, 0], state[k, :, 1]))
        assert torch.equal(h[k], out)
        assert torch.equal(acting[k, :, 0], h_n) and torch.equal(acting[k, :, 1], c_n)


def test_starts_reset_the_state_before_their_step():
    """A sequence with a start at step s equals a fresh torch.nn.LSTMCell run from zero from step s on."""
    net = make_net()
    x = torch.randn(P, T, N, N_IN, generator=torch.Generator().manual_seed(3))
    state = torch.randn(P, N, 2, CELL, generator=torch.Generator().manual_seed(4))
    starts = torch.zeros(P, T, N, dtype=torch.bool)
    starts[:, 3, 1] = True
    starts[0, 5, 2] = True
    with torch.no_grad(), net.unroll(state, starts):
        h = net.lstm(x.reshape(P, T * N, N_IN)).view(P, T, N, CELL)
    for k in range(P):
        out, _ = twin_lstm(net, k)(x[k], (state[k, :, 0], state[k, :, 1]), starts[k])
        assert torch.equal(h[k], out)
    with torch.no_grad(), net.unroll(state, torch.zeros_like(starts)):
        carried_on = net.lstm(x.reshape(P, T * N, N_IN)).view(P, T, N, CELL)
    assert torch.equal(carried_on[:, :3], h[:, :3]) and not torch.equal(carried_on[:, 3, 1], h[:, 3, 1])
    carried = state.clone()
    reset_state_(carried, starts[:, 3])
    assert (carried[:, 1] == 0).all() and torch.equal(carried[:, 0], state[:, 0])


@pytest.mark.parametrize("normalization", ["none", "layer", "weight"])
def test_members_never_mix(normalization):
    """Perturbing member k's parameters changes member k's outputs and gradients only, bitwise."""
    net = make_net(normalization, encoder=(8,))
    x = torch.randn(P, T * N, N_IN, generator=torch.Generator().manual_seed(5))
    state = torch.randn(P, N, 2, CELL, generator=torch.Generator().manual_seed(6))
    starts = torch.rand(P, T, N, generator=torch.Generator().manual_seed(7)) < 0.2

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        net.zero_grad()
        with net.unroll(state, starts):
            out = net(x)
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in net.parameters()]

    out, grads = run()
    k = 1
    with torch.no_grad():
        for p in net.parameters():
            p[k].mul_(1.5)
    out2, grads2 = run()
    others = [m for m in range(P) if m != k]
    assert torch.equal(out[others], out2[others]) and not torch.equal(out[k], out2[k])
    for g, g2 in zip(grads, grads2):
        assert torch.equal(g[others], g2[others])


def test_every_group_reaches_the_encoder_and_the_head_and_weights_are_listed():
    net = make_net("layer", encoder=(8,), activation="relu")
    names = parameter_names(net, "critic")
    assert "critic.1.weight_ih" in names and "critic.1.weight_hh" in names
    assert "critic.0.norm.weight" in names and "critic.2.norm.weight" in names and "critic.3.norm.weight" in names
    assert len(net.layers) == 5  # encoder linear, LSTM, head: two hidden, one output
    assert len(net.activations) == 3 and all(a.cfg.name == "relu" for a in net.activations)
    listed = {id(w) for w in weight_parameters(net)}
    assert id(net.lstm.weight_ih) in listed and id(net.lstm.weight_hh) in listed and id(net.lstm.bias_ih) not in listed


def test_instruments_and_location_see_the_lstm_output():
    """Instruments name the LSTM's output as a hidden layer; a NaN in member k's recurrent weights is
    located there for member k and nowhere for the others; a non-finite carried state at the LSTM's output."""
    net = make_net(encoder=(8,))
    x = torch.randn(P, T * N, N_IN, generator=torch.Generator().manual_seed(8))
    state = torch.zeros(P, N, 2, CELL)
    starts = torch.zeros(P, T, N, dtype=torch.bool)
    with net.unroll(state, starts):
        out, stats = activity_instruments(net, "critic", x, DiagnosticsConfig())
        stats = resolve(stats)
        assert out.shape == (P, T * N, N_OUT)
        assert stats["act_std/critic.1"].shape == (P,) and "feature_norm/critic.3" in stats
        k = 2
        with torch.no_grad():
            net.lstm.weight_hh[k, 0, 0] = float("inf")
            net.lstm.bias_hh[k, 0] = -float("inf")  # inf - inf: the gate turns NaN
        found = {m: locate_nonfinite(net, "critic", m, x[m], "rollout.obs") for m in range(P)}
    assert found[k] == ("nonfinite_param", "critic.1.weight_hh", f"1 of {4 * CELL * CELL} values non-finite")
    assert found[0] is None and found[1] is None
    with torch.no_grad():
        net.lstm.weight_hh[k, 0, 0] = 0.0
        net.lstm.bias_hh[k, 0] = 0.0
    state[k, 0, 1, 0] = float("nan")  # a carried cell state gone non-finite: finite parameters and inputs
    with net.unroll(state, starts):
        found = locate_nonfinite(net, "critic", k, x[k], "rollout.obs")
    assert found is not None and found[:2] == ("nonfinite_loss", "critic.1.lstm"), found


def test_the_update_unrolls_the_rollout_as_acting_stepped_it_and_the_mc_loss_is_direct():
    """Values acting computed step by step (states carried, zeroed after an episode's end) are what the
    update's unroll of a minibatch of environment sequences gives again; the critic loss on Monte-Carlo
    returns is vf_coef * 0.5 * mean over the samples of (V - R)^2."""
    from rlexp.algos.common import Minibatch, ppo_losses
    from rlexp.config.schema import A2CConfig
    from rlexp.nn.recurrent import RolloutMemory

    net = make_net(encoder=(8,))
    memory = RolloutMemory({"critic": net}, T, N)
    gen = torch.Generator().manual_seed(9)
    obs = torch.randn(T, P, N, N_IN, generator=gen)
    done = torch.rand(T, P, N, generator=gen) < 0.25
    rewards = torch.randn(T, P, N, generator=gen)
    values = torch.zeros(T, P, N)
    forward = memory.stepper("critic")
    for t in range(T):
        memory.begin(t)
        values[t] = forward(obs[t]).squeeze(-1)[..., 0]
        memory.end(done[t].numpy())
    assert memory.starts[1:].any() and not memory.starts[1:].all()

    def flat(x: torch.Tensor) -> torch.Tensor:  # [T, P, N, ...] -> [P, T*N, ...]
        return x.transpose(0, 1).reshape(P, T * N, *x.shape[3:])

    returns = mc_returns(rewards, done.float(), 0.9)
    envs = torch.tensor([[2, 0], [1, 3], [3, 2]])
    mb_obs, mb_values, mb_returns = (take_sequences(flat(x), envs, T) for x in (obs, values, returns))
    with memory.unroll(envs):
        new_values = net(mb_obs)[..., 0]
    # the same arithmetic on other row counts (the matmuls' blocking differs): equal to rounding, and far
    # from an unroll that ignores the starts
    torch.testing.assert_close(new_values.detach(), mb_values, rtol=1e-5, atol=1e-6)
    memory.starts[:] = False
    with memory.unroll(envs):
        assert not torch.allclose(net(mb_obs)[..., 0].detach(), mb_values, rtol=1e-3, atol=1e-4)
    mb = Minibatch(mb_obs, mb_values, mb_values, mb_returns - mb_values, mb_returns, mb_values)
    algo = A2CConfig(name="a2c", vf_coef=2.0)
    losses = ppo_losses(torch.zeros_like(mb_values), torch.zeros_like(mb_values), new_values, mb, algo)
    for k in range(P):
        direct = ((new_values[k] - mb_returns[k]) ** 2).mean()  # the seed's mean squared advantage
        torch.testing.assert_close(losses["critic_loss"][k], direct, rtol=1e-6, atol=0)


def test_the_seed_critic_preset_builds_the_posts_critic():
    """+experiment=seed_critic: LSTM(cell_size) -> 32 -> 32 -> 32 (linear) -> 1, the head weight-normalized
    (g = 1, bias 0.1, v Xavier-uniform), the LSTM's weights Xavier-uniform, TF's RMSProp, per-tensor
    clipping at 5, L1 0.005 on weights only, Monte-Carlo targets, the mean squared advantage."""
    import math
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rlexp.compose.registry import register
    from rlexp.compose.validate import validate
    from rlexp.nn.activations import PopActivation
    from rlexp.nn.nets import PopWeightNormLinear
    from rlexp.run.context import RunContext

    register()
    conf = str(Path(__file__).resolve().parents[2] / "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        raw = compose(config_name="config", overrides=["+experiment=seed_critic", "num_seeds=2"])
    validate(raw)
    cfg = OmegaConf.to_object(raw)
    assert (cfg.optimizer.name, cfg.optimizer.lr, cfg.optimizer.decay, cfg.optimizer.epsilon) == (
        "rmsprop_tf",
        1e-4,
        0.99,
        1e-6,
    )
    assert (cfg.clipping.name, cfg.clipping.max_norm) == ("per_tensor", 5.0)
    assert (cfg.regularization.l1, cfg.regularization.weights_only) == (0.005, True)
    assert (cfg.algo.name, cfg.algo.value_target, cfg.algo.vf_coef) == ("a2c", "mc", 2.0)  # 2 * 0.5 * mean (R-V)^2
    ctx = RunContext.create(cfg, torch.device("cpu"))
    critic = ctx.make_net(4, 1, role="critic")
    ctx.env.close()
    assert isinstance(critic, RecurrentNet) and not critic.encoder and critic.lstm.cell == 64
    head = critic.layers[1:]
    assert [layer.weight.shape[1:] for layer in head] == [(32, 64), (32, 32), (32, 32), (1, 32)]
    assert all(isinstance(layer, PopWeightNormLinear) and layer.eps == 0.0 for layer in head)
    assert all(torch.equal(layer.g, torch.ones_like(layer.g)) for layer in head)
    assert all(torch.equal(layer.bias, torch.full_like(layer.bias, 0.1)) for layer in head)
    acts = [m for m in critic.head.modules() if isinstance(m, PopActivation)]
    assert len(acts) == 2 and all(a.cfg.name == "tanh" for a in acts)  # the third 32-unit layer is linear
    for w in (critic.lstm.weight_hh, head[1].weight):  # Xavier-uniform bounds
        bound = math.sqrt(6.0 / sum(w.shape[1:]))
        assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["algo=a2c", "algo.value_target=td"], "algo.value_target"),
        (["algo=dqn", "network=lstm"], "algo"),
        (["algo=ppo", "network=lstm", "env.num_envs=2", "algo.num_minibatches=4"], "algo.num_minibatches"),
        (["algo=ppo", "network=lstm", "intervention=redo"], "intervention"),
    ],
)
def test_bad_recurrent_settings_are_refused_naming_the_key(overrides, key):
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from rlexp.compose.registry import register
    from rlexp.compose.validate import validate
    from rlexp.config.schema import ConfigError

    register()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.key == key
