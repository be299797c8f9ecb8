"""Jobs on image environments: Atari DQN keeps each frame once and trains as with the plain replay; one
smoke run per image family (skipped without its extra)."""

from __future__ import annotations

import pytest
from composing import compose_config


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
