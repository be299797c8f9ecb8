"""scripts/mujoco_check.py: rlexp and Stable-Baselines3 on MuJoCo, side by side, resumable.

The comparison itself: ``python scripts/mujoco_check.py --jobs 2`` (hours; docs/benchmarks.md). Here:
its refusals, and (slow) a tiny run of both sides that ``--resume`` continues.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mujoco_check.py"
TINY = ["--first-seed", "2", "--algos", "sac", "--envs", "hopper", "--seeds", "1"]
TINY += ["--steps", "300", "--learning-starts", "200"]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[1]), "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True)


def needs_zoo() -> None:
    if importlib.util.find_spec("rl_zoo3") is None:
        pytest.skip("rl_zoo3's hyperparams files are read: pip install --no-deps rl_zoo3")


def refused(done: subprocess.CompletedProcess, key: str) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout.startswith(key) and len(done.stdout.strip().splitlines()) == 1, done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args, key", [(["--seeds", "0"], "--seeds"), (["--jobs", "0"], "--jobs"), (["--first-seed", "-1"], "--first-seed")]
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, key):
    refused(run(*args, "--out", "out.json", cwd=tmp_path), key)
    assert list(tmp_path.iterdir()) == []


def test_a_budget_without_updates_is_refused(tmp_path):
    needs_zoo()
    refused(run("--steps", "100", "--out", "out.json", cwd=tmp_path), "--steps: 100 leaves no update after 10000")
    assert list(tmp_path.iterdir()) == []


def test_an_earlier_invocations_records_are_kept_unless_resumed(tmp_path):
    (tmp_path / "out" / "sac_hopper").mkdir(parents=True)
    (tmp_path / "out" / "sac_hopper" / "rlexp.json").write_text("{}")
    refused(run("--out", "out.json", cwd=tmp_path), f"--out: {tmp_path / 'out'} holds an earlier invocation's")
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_rlexp_side_starts_from_the_linear_init_sb3_uses(algo, monkeypatch):
    """rlexp's side builds every layer as nn.Linear initializes SB3's: weights and biases from
    U(+-1/sqrt(fan_in)), the actor's output layer included (rlexp's actor takes a 0.01 gain there
    unless told). Each weight's largest |w| lies within its layer's bound and near it."""
    import torch
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rlexp.run.context import RunContext

    spec = importlib.util.spec_from_file_location("mujoco_check", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "mujoco_check", script)  # its dataclasses look their module up
    spec.loader.exec_module(script)
    settings = dict(learning_rate=1e-3, net_arch=[64, 64], buffer_size=1000, batch_size=32, learning_starts=100)
    settings |= dict(gamma=0.99, tau=0.005, train_freq=1, gradient_steps=1, noise_std=0.1, policy_delay=2)
    settings |= dict(target_policy_noise=0.2, target_noise_clip=0.5)
    overrides = script.rlexp_overrides(algo, "pendulum", settings) + ["logger.mode=disabled", "device=cpu"]
    with initialize_config_dir(config_dir=str(SCRIPT.parents[1] / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    ctx = RunContext.create(OmegaConf.to_object(cfg), torch.device("cpu"))
    obs, act = ctx.env.obs_dim, 1
    nets = [ctx.make_net(obs, act * (2 if algo == "sac" else 1), role="actor")]
    nets += [ctx.make_net(obs, 1, role="critic", extra_in=act) for _ in range(2)]
    for net in nets:
        assert len(net.layers) == 3
        for layer in net.layers:  # weight [P, out, in], bias [P, out]
            bound = 1 / layer.weight.shape[-1] ** 0.5
            assert 0.8 * bound < layer.weight.abs().max().item() <= bound and layer.bias.abs().max().item() <= bound
    ctx.env.close(), ctx.evaluator.close()


@pytest.mark.slow  # both sides, 300 steps of SAC on Hopper (~30 s)
def test_one_invocation_runs_both_sides_and_resume_runs_only_what_is_missing(tmp_path):
    needs_zoo()
    pytest.importorskip("mujoco", reason="pip install -e '.[mujoco]'")
    pytest.importorskip("stable_baselines3", reason="pip install -e '.[bench]'")
    first = run(*TINY, "--out", "out.json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "2 of 2 processes to run" in first.stdout
    result = json.loads((tmp_path / "out.json").read_text())["results"][0]
    assert result["settings"]["learning_starts"] == 200 and "pending" not in result
    assert "total_steps=300" in result["rlexp"]["command"] and len(result["sb3"]["returns"]) == 1
    assert "num_seeds=1 seed=2" in result["rlexp"]["command"] and " 2 300 200" in result["sb3"]["commands"][0]
    assert result["sb3"]["spread"] == [result["sb3"]["returns"][0]] * 2
    rlexp_record = (tmp_path / "out" / "sac_hopper" / "rlexp.json").read_text()
    (tmp_path / "out" / "sac_hopper" / "sb3_seed2.json").unlink()  # as if stopped while SB3 ran
    again = run(*TINY, "--resume", "--out", "out.json", cwd=tmp_path)
    assert again.returncode == 0 and "1 of 2 processes to run" in again.stdout, again.stdout
    assert "sac_hopper: sb3 seed 2 ..." in again.stdout and "rlexp ..." not in again.stdout
    assert (tmp_path / "out" / "sac_hopper" / "rlexp.json").read_text() == rlexp_record
    assert json.loads((tmp_path / "out.json").read_text())["results"][0]["rlexp"] == result["rlexp"]
    changed = [*TINY[:-3], "400", *TINY[-2:]]  # --steps 400
    refused(run(*changed, "--resume", "--out", "out.json", cwd=tmp_path), "--resume: ")
