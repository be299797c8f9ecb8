"""Convolutional torsos (rlexp/nn/conv.py) against torch.nn written here: P separate Conv2d/Linear stacks,
BatchNorm2d per member, LayerNorm over [C, H, W], weight norm per filter; member isolation for every
normalization; dormant channels and ReDo per channel; divergence located at a convolution; uint8 replay
frames; image environments' bad input (one line, the key, the install command) and one smoke run per
image family (skipped without its extra)."""

from __future__ import annotations

import re
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from composing import compose_config
from torch import nn

from rlexp.config.schema import (
    ActivationConfig,
    BatchNormConfig,
    CNNConfig,
    DefaultInitConfig,
    InterventionConfig,
    LayerNormConfig,
    NatureCNNConfig,
    NormalizationConfig,
    WeightNormConfig,
)
from rlexp.diagnostics.instruments import activation_stats, hidden_outputs
from rlexp.diagnostics.interventions import dormant_units
from rlexp.nn.conv import PopCNN

P, B = 3, 5
MINATAR = gym.spaces.Box(0, 1, (4, 10, 10), dtype=bool)


def make(normalization="none", activation="relu", network=None, space=MINATAR, members=P) -> PopCNN:
    norm = {"batch": BatchNormConfig, "layer": LayerNormConfig, "weight": WeightNormConfig}.get(
        normalization, NormalizationConfig
    )(name=normalization)
    net = PopCNN(
        members,
        int(torch.tensor(space.shape).prod()),
        6,
        network or CNNConfig(name="cnn"),
        ActivationConfig(name=activation),
        norm,
        DefaultInitConfig(name="default"),
        [torch.Generator().manual_seed(10 + k) for k in range(members)],
        observation_space=space,
    )
    return net.double()


def twin(net: PopCNN, member: int, shape: tuple[int, int, int], norm: str = "none") -> nn.Sequential:
    """Member ``member`` of ``net`` as torch.nn: Conv2d (weights [out, C, k, k] from the patch rows),
    per-layer norm, ReLU, ..., Flatten in channels-last order, Linear, ReLU, Linear."""
    modules: list[nn.Module] = []
    channels = shape[0]
    convs = [layer for layer in net.layers if hasattr(layer, "geometry")]
    for layer in convs:
        g = layer.geometry
        conv = nn.Conv2d(channels, layer.weight.shape[1], g.kernel, g.stride).double()
        w = layer.effective_weight()[member].detach()  # [out, k*k*C], patch order row, column, channel
        conv.weight.data = w.view(-1, g.kernel, g.kernel, channels).permute(0, 3, 1, 2).contiguous()
        conv.bias.data = layer.bias[member].detach().clone()
        modules.append(conv)
        if norm == "batch":
            bn = nn.BatchNorm2d(conv.out_channels, eps=1e-5).double()
            modules.append(bn)
        elif norm == "layer":
            ln = nn.LayerNorm([conv.out_channels, g.out_height, g.out_width]).double()
            modules.append(ln)
        modules.append(nn.ReLU())
        channels = conv.out_channels
    modules.append(nn.Flatten(2))  # [N, C, H*W]
    modules.append(Transpose())  # channels-last flatten, as the population's maps
    for j, layer in enumerate(net.layers[len(convs) :]):
        linear = nn.Linear(layer.weight.shape[2], layer.weight.shape[1]).double()
        linear.weight.data = layer.weight[member].detach().clone()
        linear.bias.data = layer.bias[member].detach().clone()
        modules.append(linear)
        if j < len(net.layers) - len(convs) - 1:
            modules.append(nn.ReLU())
    return nn.Sequential(*modules)


class Transpose(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).flatten(1)


@pytest.mark.parametrize("layout", ["cnn", "nature_cnn"])
def test_population_equals_separate_conv2d(layout):
    """Each member's Q-values are those of its own torch.nn.Conv2d/Linear stack: the same greedy
    action, values equal up to the summation order of the two matmul kernels."""
    if layout == "cnn":
        space, network, members = MINATAR, CNNConfig(name="cnn"), P
    else:
        space, network, members = gym.spaces.Box(0, 255, (4, 84, 84), dtype="uint8"), NatureCNNConfig(name="n"), 2
    net = make(network=network, space=space, members=members)
    x = torch.randint(0, 2 if layout == "cnn" else 256, (members, B, *space.shape)).double()
    out = net(x.flatten(2))  # [P, B, 6]
    scale = 1.0 if layout == "cnn" else 1 / 255
    for k in range(members):
        ref = twin(net, k, space.shape)(x[k] * scale)
        torch.testing.assert_close(out[k], ref, rtol=1e-9, atol=1e-9)
        assert torch.equal(out[k].argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_conv_norms_as_torch(norm):
    """The convolution's block, per member: batch norm takes channel statistics over the batch and the
    positions (BatchNorm2d), layer norm normalizes each sample's [C, H, W] (LayerNorm)."""
    net = make(norm)
    net.train()
    x = torch.rand(P, B, 400, dtype=torch.float64)
    block = hidden_outputs(net, x)[1][0]  # [P, B, 64, 16]
    for k in range(P):
        ref = twin(net, k, MINATAR.shape, norm)[:3].train()(x[k].view(B, 4, 10, 10))  # conv, norm, relu
        torch.testing.assert_close(block[k], ref.flatten(2).transpose(1, 2), rtol=1e-9, atol=1e-9)


def test_init_fan_in_and_weight_norm_per_filter():
    """default init: |w| <= 1/sqrt(in_channels * kh * kw); weight norm: each filter's effective norm is
    g ||v|| / sqrt(||v||^2 + eps), per filter."""
    net = make()
    assert net.layers[0].weight.shape == (P, 16, 4 * 3 * 3)
    assert net.layers[0].weight.abs().max() <= 1 / 6
    wn = make("weight")
    layer = wn.layers[0]
    v = layer.weight.detach().norm(dim=-1)  # [P, 16], one per filter
    expected = layer.g.detach() * v / torch.sqrt(v.square() + layer.eps)
    torch.testing.assert_close(layer.effective_weight().norm(dim=-1), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("norm", ["none", "batch", "layer", "rms", "weight", "spectral"])
def test_members_never_mix(norm):
    """Perturbing member 1's parameters and inputs leaves the others' outputs and gradients bitwise unchanged."""
    x = torch.rand(P, B, 400, dtype=torch.float64)
    results = []
    for perturb in (False, True):
        net = make(norm)
        net.train()
        xs = x.clone()
        if perturb:
            with torch.no_grad():
                for p in net.parameters():
                    p[1] += 0.3
            xs[1] += 1.0
        out = net(xs)
        out.square().sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in net.parameters()]))
    (a, ga), (b, gb) = results
    for k in (0, 2):
        assert torch.equal(a[k], b[k])
        assert all(torch.equal(g1[k], g2[k]) for g1, g2 in zip(ga, gb))
    assert not torch.equal(a[1], b[1])


TWO_CONVS = CNNConfig(name="cnn", conv=[[8, 3, 1], [6, 3, 2]], hidden=[12])  # 10x10 -> 8x8 -> 3x3


@pytest.mark.parametrize("members", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize(
    "norm,activation,network,space",
    [
        ("none", "relu", None, MINATAR),
        ("none", "tanh", TWO_CONVS, gym.spaces.Box(0, 255, (3, 10, 10), dtype="uint8")),
        ("weight", "relu", TWO_CONVS, MINATAR),
        ("layer", "elu", TWO_CONVS, MINATAR),
    ],
    ids=["cnn", "two_convs_frames", "weight_norm", "layer_norm"],
)
def test_written_backward_is_autograd_bit_for_bit(members, dtype, norm, activation, network, space):
    """forward_saved + backward_to_grads against autograd on the same network: outputs and every
    parameter's gradient bitwise equal (convolutions after the first get their input's gradient too)."""
    net = make(norm, activation, network, space, members).to(dtype)
    assert net.written_backward
    with torch.no_grad():  # biases of both signs, so every activation's derivative is exercised
        for p in net.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=dtype))
    g = torch.Generator().manual_seed(3)
    high = 255 if space.dtype == "uint8" else 1
    x = torch.randint(0, high + 1, (members, 32, space.shape[0] * 100), generator=g).to(dtype)
    grad_out = torch.randn(members, 32, 6, generator=g, dtype=dtype)
    expected = net(x)
    expected.backward(grad_out)
    autograd = [p.grad.clone() for p in net.parameters()]
    for p in net.parameters():  # stale values must be overwritten, not added to
        p.grad.fill_(123.0)
    out, saved = net.forward_saved(x)
    assert not out.requires_grad and torch.equal(out, expected.detach())
    net.backward_to_grads(saved, grad_out)
    for (name, p), e in zip(net.named_parameters(), autograd):
        assert torch.equal(p.grad, e), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("norm,activation", [("spectral", "relu"), ("batch", "relu"), ("none", "crelu")])
def test_autograd_where_no_written_backward(norm, activation):
    """Spectral norm, batch norm over channels and crelu on maps have no written backward: autograd trains."""
    assert not make(norm, activation).written_backward


def test_dormant_channels_and_redo_per_channel():
    """A channel whose bias keeps it at 0 is dormant (scored over batch and positions); redo gives it fresh
    incoming weights and zeroes its columns in the next layer (every position's)."""
    from rlexp.config.schema import AdamConfig, ClippingConfig, RegularizationConfig
    from rlexp.diagnostics.interventions import Interventions, Subject
    from rlexp.optim.pipeline import GradientPipeline, Health

    net = make()
    with torch.no_grad():
        net.layers[0].bias[2, 5] = -100.0
    x = torch.rand(P, 32, 400, dtype=torch.float64)
    hidden = hidden_outputs(net, x)[1]
    assert hidden[0].shape == (P, 32, 64, 16)  # [P, B, positions, channels]
    stats = activation_stats(hidden, "q", 0.025, 0.01)
    assert stats["dormant/q.0"][2] >= 1 / 16 and stats["dead/q.0"][2] >= 1 / 16
    health = Health(P, torch.device("cpu"))
    params = list(net.parameters())
    pipeline = GradientPipeline(
        params, AdamConfig(name="adam"), ClippingConfig(name="none"), RegularizationConfig(), [], health
    )
    redo = InterventionConfig(name="redo", every=1)
    dormant = dormant_units(net, x, None, redo.tau)
    assert dormant[0][2, 5]
    kept = ~dormant[1][2]  # rows of the next layer that redo leaves (its own dormant units get fresh rows)
    interventions = Interventions(redo, [Subject("q", net, pipeline)], [0, 1, 2], health)
    interventions(1, x)
    following = net.layers[1].weight.detach()  # [P, 128, 64 * 16], channel c at columns c, c + 16, ...
    columns = following[2, kept][:, 5::16]
    assert torch.equal(columns, torch.zeros_like(columns))
    assert net.layers[0].bias[2, 5] != -100.0


def test_divergence_location_names_the_convolution():
    """A member whose convolution overflows is located at that layer's linear output (q.0.linear)."""
    from rlexp.diagnostics.instruments import locate_nonfinite

    net = make().float()
    with torch.no_grad():
        net.layers[0].weight[1] = 1e38  # 36 inputs of 1 per patch: the sum overflows float32
    x = torch.ones(B, 400)
    assert locate_nonfinite(net, "q", 0, x, "replay.obs") is None
    cause, where, _ = locate_nonfinite(net, "q", 1, x, "replay.obs")
    assert (cause, where) == ("nonfinite_loss", "q.0.linear")


def test_replay_keeps_frames_as_uint8():
    """frames=True: observations stored as uint8 (no float columns for them), sampled back as float32."""
    from rlexp.data.buffers import ReplayBuffer

    buffer = ReplayBuffer(2, 4, 3, torch.device("cpu"), frames=True)
    assert buffer.frames.dtype == torch.uint8 and buffer.data.shape[-1] == 3  # action | reward | terminated
    obs = torch.tensor([[[0, 1, 255]], [[7, 0, 1]]]).numpy().astype("float32")  # [P, E, obs]
    buffer.add(obs, [[1], [2]], [[0.5], [1.0]], obs[:, :, ::-1].copy(), [[0], [1]], [[True], [True]])
    batch = buffer.sample(torch.zeros(2, 1))
    assert batch.obs.dtype == torch.float32
    assert torch.equal(batch.obs, torch.from_numpy(obs))
    assert torch.equal(batch.next_obs, torch.from_numpy(obs[:, :, ::-1].copy()))
    assert batch.actions.tolist() == [[1], [2]] and batch.terminated.tolist() == [[0.0], [1.0]]


class _Frames(gym.Env):
    """uint8 [2, 3] frames (the step's count, then random bytes) whose episodes end, terminated or
    truncated, with probability 0.25 a step."""

    observation_space = gym.spaces.Box(0, 255, (2, 3), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        end = self.np_random.random() < 0.25
        return self._frame(), 1.0, end and self.t % 2 == 0, end and self.t % 2 == 1, {}

    def _frame(self):
        frame = self.np_random.integers(0, 256, (2, 3), dtype=np.uint8)
        frame[0, 0] = self.t % 256
        return frame


def _stacked_steps(members: int, num_envs: int, steps: int, seed: int = 0):
    """(obs, actions, rewards, next_obs, terminated, valid) of ``steps`` vector steps of gymnasium's
    FrameStackObservation (4 frames, the first repeated at an episode's start) over ``_Frames``, stepped
    as PopulationEnv steps its environments: an episode's end, then an autoreset step (not valid)."""
    from gymnasium.wrappers import FrameStackObservation

    P, E = members, num_envs
    envs = [FrameStackObservation(_Frames(), 4) for _ in range(P * E)]
    obs = np.stack([env.reset(seed=seed + k)[0] for k, env in enumerate(envs)]).reshape(P, E, 24)
    done = np.zeros(P * E, dtype=bool)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        actions, valid = rng.integers(0, 3, (P, E)), ~done.reshape(P, E)
        next_obs, terminated = np.zeros((P * E, 24), np.uint8), np.zeros(P * E, dtype=bool)
        for k, env in enumerate(envs):
            if done[k]:  # the autoreset step: the next episode's first stack, not a transition
                next_obs[k], done[k] = env.reset()[0].reshape(-1), False
            else:
                frame, _, terminated[k], truncated, _ = env.step(actions.flat[k])
                next_obs[k], done[k] = frame.reshape(-1), terminated[k] or truncated
        next_obs = next_obs.reshape(P, E, 24)
        yield obs, actions, rng.random((P, E)), next_obs, terminated.reshape(P, E), valid
        obs = next_obs


def test_frame_stack_replay_samples_what_the_plain_replay_samples_bit_for_bit():
    """Episodes that end often, P = 2 members x E = 3 environments, a capacity of 7 wrapped dozens of
    times: after every step, a minibatch drawn with the same uniform numbers is the same from
    FrameStackReplay as from ReplayBuffer(frames=True), field by field, bit for bit."""
    from gymnasium.wrappers import FrameStackObservation

    from rlexp.data.buffers import FrameStackReplay, ReplayBuffer
    from rlexp.envs.gym import frame_stack

    P, E, C = 2, 3, 7
    assert frame_stack(FrameStackObservation(_Frames(), 4)) == 4
    assert frame_stack(FrameStackObservation(_Frames(), 4, padding_type="zero")) == 1  # not its first frame
    plain = ReplayBuffer(P, C, 24, torch.device("cpu"), frames=True)
    shared = FrameStackReplay(P, C, 24, torch.device("cpu"), stack=4, num_envs=E)
    assert 4 * shared.frames[0, 0].numel() == plain.frames[0, 0].numel()  # a row: 2 frames instead of 8
    rng, resets = np.random.default_rng(1), 0
    for step in _stacked_steps(P, E, 200):
        plain.add(*step)
        shared.add(*step)
        resets += (~step[-1]).sum()
        uniform = rng.random((P, 64))
        want, got = plain.sample(uniform), shared.sample(uniform)
        for field in ("obs", "actions", "rewards", "next_obs", "terminated"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert (shared.count > 20 * C).all()  # wrapped many times
    assert resets > 100 and (shared.prev[:, :-1] == -1).any(1).all()  # many episodes, starts in the rows held


def test_frame_stack_replay_goes_on_bitwise_from_its_checkpoint_state():
    """The replay's state split per member and stacked back (as a checkpoint does) into a new replay:
    both sample the same and go on the same after more steps."""
    from rlexp.data.buffers import FrameStackReplay
    from rlexp.run.checkpoint import split, stack

    P, E = 2, 3
    steps = list(_stacked_steps(P, E, 90, seed=5))
    first = FrameStackReplay(P, 11, 24, torch.device("cpu"), stack=4, num_envs=E)
    for step in steps[:60]:
        first.add(*step)
    second = FrameStackReplay(P, 11, 24, torch.device("cpu"), stack=4, num_envs=E)
    second.load_state_dict(stack(*split(first.state_dict(), P)))
    rng = np.random.default_rng(2)
    for step in steps[60:]:
        first.add(*step)
        second.add(*step)
        uniform = rng.random((P, 32))
        a, b = first.sample(uniform), second.sample(uniform)
        assert torch.equal(a.obs, b.obs) and torch.equal(a.next_obs, b.next_obs) and torch.equal(a.actions, b.actions)


def test_the_memory_check_counts_two_frames_a_row_for_stacked_frames():
    """The replay memory a member of the zoo's Atari DQN needs: 2 of the 4 x 84 x 84 frames, the
    action | reward | terminated floats and the link per row, over buffer_size + 3 x num_envs + 1 rows."""
    from rlexp.compose.validate import memory_per_member

    cfg = compose_config(["+experiment=zoo_dqn_atari"])
    frame, rows = 84 * 84, cfg.algo.buffer_size + 3 * cfg.env.num_envs + 1
    shared, _ = memory_per_member(cfg, 4 * frame, 4, frames=True, stack=4)
    plain, _ = memory_per_member(cfg, 4 * frame, 4, frames=True)
    assert shared == rows * (3 * 4 + 2 * frame + 8)
    assert plain == (cfg.algo.buffer_size + 1) * (3 * 4 + 8 * frame)


def test_atari_dqn_keeps_each_frame_once_and_trains_as_with_the_plain_replay(tmp_path, monkeypatch):
    """The zoo's Atari DQN (on Pong) uses FrameStackReplay; the same job with ReplayBuffer in its place
    logs the same metrics, bit for bit (2 members, a replay of 64 rows wrapped, updates from it)."""
    pytest.importorskip("ale_py", reason="pip install -e '.[atari]'")
    pytest.importorskip("cv2", reason="pip install -e '.[atari]'")
    import json

    from rlexp.algos import dqn
    from rlexp.data.buffers import FrameStackReplay, ReplayBuffer
    from rlexp.train import run_job

    overrides = TINY + ["+experiment=zoo_dqn_atari", "env=atari_pong", "total_steps=120", "algo.learning_starts=40"]
    overrides += ["num_seeds=2", "algo.batch_size=8", "algo.buffer_size=64", "algo.train_frequency=2"]
    overrides += ["logger.log_every=40", "eval.episodes=0"]
    made = []

    def recording(*args, **kwargs):
        made.append(FrameStackReplay(*args, **kwargs))
        return made[-1]

    runs = {}
    for name, replay in (("shared", recording), ("plain", None)):
        with monkeypatch.context() as mp:
            if replay is None:
                mp.setattr(dqn, "FrameStackReplay", lambda m, c, o, d, stack, n: ReplayBuffer(m, c, o, d, frames=True))
            else:
                mp.setattr(dqn, "FrameStackReplay", replay)
            run_job(compose_config(overrides + [f"hydra.run.dir={tmp_path / name}"]), tmp_path / name)
        lines = [(tmp_path / name / f"seed_{k}" / "metrics.jsonl").read_text().splitlines() for k in range(2)]
        runs[name] = [
            [{k: v for k, v in json.loads(ln).items() if not k.startswith("perf/")} for ln in m] for m in lines
        ]
    assert len(made) == 1 and made[0].stack == 4 and made[0].count.tolist() == [120, 120]  # wrapped (64 rows)
    assert runs["shared"] == runs["plain"]
    assert runs["shared"][0][-1]["train/updates"] > 0 and runs["shared"][0] != runs["shared"][1]


TINY = ["logger.mode=disabled", "logger.progress=off", "device=cpu", "threads=1", "eval.episodes=1", "eval.every=0"]


def test_image_env_needs_a_convolutional_torso_and_the_reverse():
    """env=minatar_* with network=mlp, and network=cnn on CartPole: one ConfigError naming network."""
    from rlexp.compose.validate import validate
    from rlexp.config.schema import ConfigError

    pytest.importorskip("minatar", reason="pip install -e '.[minatar]'")
    with pytest.raises(ConfigError, match="network=mlp cannot read MinAtar/Breakout-v0's image") as err:
        validate(compose_config(TINY + ["env=minatar_breakout"]))
    assert err.value.key == "network"
    with pytest.raises(ConfigError, match=r"network=cnn needs image observations \[C, H, W\]"):
        validate(compose_config(TINY + ["network=cnn"]))
    with pytest.raises(ConfigError, match="does not fit the 1x1 map") as err:
        validate(compose_config(TINY + ["env=minatar_breakout", "network=nature_cnn"]))
    assert err.value.key == "network.conv[1]"


@pytest.mark.parametrize(
    ("module", "env", "extra"), [("minatar", "minatar_breakout", "minatar"), ("ale_py", "atari_pong", "atari")]
)
def test_missing_extra_names_its_install_command(monkeypatch, module, env, extra):
    from rlexp.compose.validate import validate
    from rlexp.config.schema import ConfigError

    monkeypatch.setitem(sys.modules, module, None)  # import fails as without the package
    if module == "minatar":
        monkeypatch.setitem(sys.modules, "minatar.gym", None)
    with pytest.raises(ConfigError, match=re.escape(f"pip install -e '.[{extra}]'")) as err:
        validate(compose_config(TINY + [f"env={env}", "network=cnn"]))
    assert err.value.key == "env.id"


@pytest.mark.parametrize("family", ["minatar", "atari"])
def test_dqn_smoke_per_image_family(tmp_path, monkeypatch, family):
    """DQN runs end to end on each image family with instruments, an intervention, clipping (MinAtar) and
    batch norm (Atari) on (tiny budgets); MinAtar's network trains by its written backward, batch norm over
    channels through autograd."""
    from rlexp.nn.nets import PopMLP
    from rlexp.train import run_job

    calls = []
    real = PopMLP.backward_to_grads
    monkeypatch.setattr(PopMLP, "backward_to_grads", lambda self, *a: calls.append(1) or real(self, *a))

    if family == "minatar":
        pytest.importorskip("minatar", reason="pip install -e '.[minatar]'")
        overrides = ["+experiment=minatar_dqn", "total_steps=300", "algo.learning_starts=100", "num_seeds=2"]
        overrides += ["clipping=agc"]  # per filter: a convolution's rows are its filters
    else:
        pytest.importorskip("ale_py", reason="pip install -e '.[atari]'")
        pytest.importorskip("cv2", reason="pip install -e '.[atari]'")
        overrides = ["env=atari_pong", "network=nature_cnn", "total_steps=60", "algo.learning_starts=30"]
        overrides += ["algo.buffer_size=100", "algo.batch_size=4", "env.max_episode_steps=100", "normalization=batch"]
    overrides += ["diagnostics.every=5", "intervention=redo", "intervention.every=10", "logger.log_every=50"]
    job = run_job(compose_config(TINY + overrides), tmp_path)
    assert job["status"] == "ok"
    metrics = (tmp_path / "seed_0" / "metrics.jsonl").read_text()
    assert "dormant/q.0" in metrics and "srank/q.0" in metrics
    assert len(calls) == (200 if family == "minatar" else 0)  # one per update
