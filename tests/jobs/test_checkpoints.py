"""Checkpoints (rlexp/run/checkpoint.py), continuing a job from one (resume=true), and rlexp.evaluate.

A job interrupted by ``debug.crash_at_step`` and resumed from its checkpoint (with the replay saved)
ends bitwise as the uninterrupted job: every metrics record (perf/ aside), every member summary
(wall time aside) and every tensor of the final checkpoint, for DQN (a member diverged before the
checkpoint, gymnasium's CartPole stepped one by one), PPO (a checkpoint inside a rollout, CartPoles
stepped together, observation and reward normalization), DQN on MinAtar Breakout (its game objects,
sticky action and generator; a conv network; uint8 frames in the replay), TD3 (Pendulum), MADDPG and MAPPO on
PettingZoo's simple_spread (checkpoints inside an episode; MAPPO's inside a rollout) and MADDPG on VMAS's
navigation (inside an episode); DQN with shrink-and-perturb and SAC also with the fast paths off
(``fast_paths=false``: torch.optim's optimizers, the per-tensor pipeline). A member's file alone
loads as a population of one and evaluates as the member did in its population. Bad input: a
checkpoint of another config is refused in one line, a cut-off one is moved aside and the job runs
again from scratch, and rlexp.evaluate on a dir without checkpoints says how to write them. A
continued member logs its whole history to one new W&B run; rlexp.evaluate records a video and logs
it. Its pieces are in tests/run/test_checkpoint_format.py.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from composing import compose_config
from launching import read_wandb_records

from rlexp import evaluate
from rlexp.config.schema import ConfigError
from rlexp.optim.optimizers import fast_kernels_run
from rlexp.run.checkpoint import FILE
from rlexp.train import run_job

QUIET = ["logger.mode=disabled", "logger.progress=off", "device=cpu", "threads=1", "checkpoint.replay=true"]
DQN = [  # a small DQN with a checkpoint every 200 env steps
    "total_steps=600",
    "num_seeds=2",
    "network.hidden=[16,16]",
    "algo.learning_starts=200",
    "algo.train_frequency=10",
    "algo.batch_size=32",
    "logger.log_every=100",
    "checkpoint.every=200",
]
DQN_EVAL = [*DQN, "eval.every=200", "eval.episodes=3"]  # both members healthy, the final evaluation at 600
RUNS = {  # (overrides, crash step, checkpoint step continued from)
    "dqn": (
        [
            *DQN_EVAL,
            "debug.inject.what=param",  # member 1 diverges at step 350, before the checkpoint at 400
            "debug.inject.member=1",
            "debug.inject.step=350",
        ],
        550,
        400,
    ),
    # MinAtar's game objects, sticky action and generator; uint8 frames in the replay; a conv network
    "dqn_minatar": (
        [
            "+experiment=minatar_dqn",
            *DQN_EVAL,
            "network.hidden=[16]",
            "network.conv=[[4,3,1]]",
            "algo.target_update_period=100",
        ],
        550,
        400,
    ),
    # the interventions' fresh draws and counts continue too
    "dqn_shrink_perturb": ([*DQN, "eval.episodes=0", "intervention=shrink_perturb", "intervention.every=8"], 550, 400),
    "ppo": (
        [
            "algo=ppo",
            "total_steps=512",
            "num_seeds=2",
            "network.hidden=[16,16]",
            "algo.num_steps=16",  # 64 env steps per member a rollout: the checkpoint at 96 is inside one
            "logger.log_every=32",
            "checkpoint.every=96",
            "eval.every=256",
            "eval.episodes=2",
            "obs_norm.enabled=true",
            "reward_norm.enabled=true",
        ],
        150,
        96,
    ),
    "ppo_lstm": (  # the hidden states (acting's, the rollout's first) and start flags reach the checkpoint
        [
            "algo=ppo",
            "network=lstm",
            "total_steps=256",
            "num_seeds=2",
            "network.cell_size=8",
            "network.hidden=[8]",
            "algo.num_steps=16",
            "logger.log_every=32",
            "checkpoint.every=96",
            "eval.every=128",
            "eval.episodes=2",
        ],
        150,
        96,
    ),
    "td3": (
        [
            "algo=td3",
            "env=pendulum",
            "total_steps=300",
            "num_seeds=2",
            "network.hidden=[16,16]",
            "algo.learning_starts=100",
            "algo.batch_size=32",
            "logger.log_every=50",
            "checkpoint.every=150",
            "eval.episodes=0",
        ],
        250,
        150,
    ),
    "sac": (
        [
            "algo=sac",
            "env=pendulum",
            "total_steps=300",
            "num_seeds=2",
            "network.hidden=[16,16]",
            "algo.learning_starts=100",
            "algo.batch_size=32",
            "logger.log_every=50",
            "checkpoint.every=150",
            "eval.every=150",
            "eval.episodes=2",
        ],
        250,
        150,
    ),
    "maddpg": (  # every agent's networks, targets and pipelines, and the action window's state
        [
            "algo=maddpg",
            "env=simple_spread",
            "total_steps=300",
            "num_seeds=2",
            "network.hidden=[16,16]",
            "algo.learning_starts=100",
            "algo.batch_size=32",
            "logger.log_every=40",
            "checkpoint.every=120",  # inside an episode (25 steps)
            "eval.every=150",
            "eval.episodes=1",
        ],
        210,
        120,
    ),
    "maddpg_vmas": (  # VMAS's tensors (entities, goals, lidar) and each member's random state; shared networks
        [
            "algo=maddpg",
            "algo.share_parameters=true",
            "env=vmas_navigation",
            "env.num_envs=2",
            "env.max_episode_steps=25",
            "total_steps=240",
            "num_seeds=2",
            "network.hidden=[16,16]",
            "algo.learning_starts=60",
            "algo.batch_size=16",
            "logger.log_every=40",
            "checkpoint.every=120",  # inside an episode (25 steps of 2 environments)
            "eval.every=120",
            "eval.episodes=1",
        ],
        180,
        120,
    ),
    "mappo": (  # separate policies, a checkpoint inside a rollout, observation normalization
        [
            "algo=mappo",
            "env=simple_spread",
            "total_steps=256",
            "num_seeds=2",
            "network.hidden=[16,16]",
            "algo.num_steps=16",
            "algo.num_minibatches=2",
            "algo.update_epochs=2",
            "logger.log_every=24",
            "checkpoint.every=72",  # inside an episode (25 steps)
            "eval.every=128",
            "eval.episodes=1",
            "obs_norm.enabled=true",
        ],
        130,
        72,
    ),
    "muzero_lite": (
        [
            "algo=muzero_lite",
            "total_steps=500",
            "num_seeds=2",
            "network.hidden=[16]",
            "algo.state_dim=8",
            "algo.learning_starts=100",
            "algo.batch_size=16",
            "logger.log_every=100",
            "checkpoint.every=200",
            "eval.episodes=2",
        ],
        350,
        200,
    ),
}

# with the fast paths off (torch.optim's optimizers, the per-tensor pipeline, autograd): interventions reset
# torch.optim's state, SAC's entropy coefficient has a plain pipeline of its own
RUNS["dqn_plain"] = (
    [*DQN, "eval.episodes=0", "intervention=shrink_perturb", "intervention.every=8", "fast_paths=false"],
    550,
    400,
)
RUNS["sac_plain"] = ([*RUNS["sac"][0], "fast_paths=false"], *RUNS["sac"][1:])


def run(overrides: list[str], out_dir: Path) -> dict:
    return run_job(compose_config([*QUIET, *overrides]), out_dir)


def crash(overrides: list[str], out_dir: Path, at: int) -> None:
    with pytest.raises(RuntimeError, match="debug.crash_at_step"):
        run([*overrides, f"debug.crash_at_step={at}"], out_dir)


def metrics(member_dir: Path) -> list[dict]:
    """Every metrics record without perf/ (wall time); NaN as its string (JSON keeps it so)."""
    lines = (member_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")} for line in lines]


def member_summary(member_dir: Path) -> dict:
    """A member's summary less what differs between an uninterrupted and a resumed job by design."""
    summary = json.loads((member_dir / "summary.json").read_text())
    return {k: v for k, v in summary.items() if k not in ("wall_s", "resumed")}


def checkpoint(member_dir: Path) -> dict:
    """A member's checkpoint, its finished summary's wall time and resume record aside."""
    content = torch.load(member_dir / FILE, weights_only=True)
    summary = content["state"]["recorder/outputs"]["summaries"]
    if summary is not None:
        summary.pop("wall_s")
        summary.pop("resumed")
    return content


def same(a: object, b: object) -> bool:
    """Equal, bit for bit for tensors (NaN equal to NaN), recursively."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


def assert_same_job(done: Path, other: Path, members: int) -> None:
    for k in range(members):
        a, b = done / f"seed_{k}", other / f"seed_{k}"
        assert metrics(a) == metrics(b), f"seed_{k}/metrics.jsonl"
        assert member_summary(a) == member_summary(b)
        final_a, final_b = checkpoint(a), checkpoint(b)
        assert final_a["step"] == final_b["step"]
        assert same(final_a["state"], final_b["state"]) and same(final_a["shared"], final_b["shared"])


# ====================================================================== resume
# the smoke subset (-m compat): every algorithm, and DQN with the fast paths off
COMPAT = {"dqn", "dqn_plain", "ppo", "td3", "sac", "maddpg", "mappo", "muzero_lite"}
ALGOS = [pytest.param(a, marks=pytest.mark.compat) if a in COMPAT else a for a in sorted(RUNS)]


@pytest.mark.parametrize("algo", ALGOS)
def test_an_interrupted_job_resumed_from_its_checkpoint_ends_bitwise_as_the_uninterrupted_one(algo, tmp_path):
    overrides, crash_at, saved_at = RUNS[algo]
    if algo == "dqn_minatar":
        pytest.importorskip("minatar", reason="pip install -e '.[minatar]'")
    run(overrides, tmp_path / "whole")
    job = tmp_path / "cut"
    crash(overrides, job, crash_at)
    assert checkpoint(job / "seed_0")["step"] == saved_at
    assert max(r["step"] for r in metrics(job / "seed_0")) > saved_at  # records past the checkpoint, dropped
    summary = run([*overrides, "resume=true"], job)
    assert summary["status"] in ("ok", "diverged") and summary["counts"]["crashed"] == 0
    assert_same_job(tmp_path / "whole", job, 2)
    resumed = summary["resumed"]  # recorded as what it is: bitwise as the uninterrupted job
    assert resumed["from_step"] == saved_at and resumed["as_uninterrupted"] is True
    for k in range(2):  # a member that finished before the checkpoint keeps its summary as written then
        member = json.loads((job / f"seed_{k}" / "summary.json").read_text())
        before = member["diverged_at_step"] is not None and member["diverged_at_step"] < saved_at
        assert member["resumed"] == (None if before else resumed), k
    assert json.loads((tmp_path / "whole" / "summary.json").read_text())["resumed"] is None
    assert sorted(p.name for p in (job / "attempt_1").iterdir()) == ["error.txt", "summary.json"]  # the crash record
    assert json.loads((job / "attempt_1" / "summary.json").read_text())["status"] == "crashed"


def test_without_the_replay_a_resumed_dqn_refills_it_and_logs_to_a_new_wandb_run(tmp_path):
    overrides = [*DQN_EVAL, "num_seeds=1", "checkpoint.replay=false", "logger.mode=offline"]
    crash(overrides, tmp_path, 450)
    job = run([*overrides, "resume=true"], tmp_path)
    # recorded as not equal to an uninterrupted run: the replay was not restored
    assert job["resumed"] == {"from_step": 400, "replay_restored": False, "as_uninterrupted": False}
    records = metrics(tmp_path / "seed_0")
    assert [r["step"] for r in records] == [100, 200, 300, 400, 500, 600]
    updates = {r["step"]: r["train/updates"] for r in records}
    assert updates[300] > 0 and updates[400] > updates[300]
    assert updates[500] == updates[600] == updates[400]  # learning_starts (200) steps of refilling from 400
    # the interrupted attempt's run is renamed out of sync's way; the new one holds the whole history
    assert len(list((tmp_path / "seed_0" / "wandb").glob("attempt-offline-run-*"))) == 1
    (continued,) = wandb_runs(tmp_path / "seed_0")
    config = next(r.run.config for r in continued if r.WhichOneof("record_type") == "run")
    assert {item.key: json.loads(item.value_json) for item in config.update}["continued_from"] == 400
    rows = [r.history for r in continued if r.WhichOneof("record_type") == "history"]
    logged = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in row.item} for row in rows]
    assert [row["_step"] for row in logged] == [r["step"] for r in records]
    assert [row["train/updates"] for row in logged] == [r["train/updates"] for r in records]


def test_members_with_different_optimizers_resume_bitwise(tmp_path, monkeypatch):
    """A population whose pipelines hold several optimizer runs (members 0-1 adam, 2 rmsprop with
    momentum, 3 sgd with momentum, as a pack of cells builds them): each member's file holds its own
    run's state, and the job interrupted and continued ends bitwise as the uninterrupted one."""
    import dataclasses

    from omegaconf import OmegaConf

    from rlexp.run.context import RunContext

    overrides = [*DQN_EVAL, "num_seeds=4"]
    variants = [[], [], ["optimizer=rmsprop", "optimizer.momentum=0.5"], ["optimizer=sgd", "optimizer.momentum=0.9"]]
    optimizers = [OmegaConf.to_object(compose_config([*QUIET, *overrides, *v])).optimizer for v in variants]
    create = RunContext.create.__func__

    def mixed(cls, cfg, device, member_cfgs=None, seeds=None):  # the job's members, each its optimizer
        return create(cls, cfg, device, [dataclasses.replace(cfg, optimizer=o) for o in optimizers], seeds)

    monkeypatch.setattr(RunContext, "create", classmethod(mixed))
    run(overrides, tmp_path / "whole")
    job = tmp_path / "cut"
    crash(overrides, job, 550)
    saved = [checkpoint(job / f"seed_{k}") for k in range(4)]
    assert [c["step"] for c in saved] == [400] * 4
    slots = [set(c["state"]["pipeline/optimizer"]) - {"param_groups"} for c in saved]
    fused_sgd = fast_kernels_run("sgd", "cpu")  # else torch.optim's SGD (torch 2.2), which keeps no first-step flag
    assert slots == [{"exp_avg", "exp_avg_sq", "steps"}] * 2 + [
        {"square_avg", "grad_avg", "momentum_buffer"},
        {"momentum_buffer", "first_step"} if fused_sgd else {"momentum_buffer"},
    ]
    if fused_sgd:
        assert saved[3]["state"]["pipeline/optimizer"]["first_step"] is False  # it has stepped
    run([*overrides, "resume=true"], job)
    assert_same_job(tmp_path / "whole", job, 4)


# ====================================================================== a member's file alone
def test_a_members_checkpoint_alone_evaluates_as_the_member_did_in_its_population(tmp_path):
    overrides = DQN_EVAL
    summary = run(overrides, tmp_path)
    for k in range(2):
        paths = evaluate.member_files(tmp_path, k)
        ctx, policy, step = evaluate.load_policy(tmp_path, paths, None, video=False)
        assert (ctx.seeds, step) == ([k], 600)
        population = checkpoint(tmp_path / f"seed_{k}")["state"]
        for name, value in ctx.checkpoints.saved.items():  # the population of one holds member k's state
            if name.startswith("q_net/"):
                assert torch.equal(value[0], population[name])
        evaluation = ctx.evaluator.run(policy, np.ones(1, dtype=bool))
        assert float(evaluation.returns[0].mean()) == summary["members"][k]["eval_return"]


# ====================================================================== bad input
def test_a_checkpoint_of_another_config_is_refused_in_one_line(tmp_path):
    overrides, crash_at, _ = RUNS["dqn"]
    crash(overrides, tmp_path, crash_at)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(ConfigError) as err:
        run([*overrides, "algo.batch_size=16", "resume=true"], tmp_path)
    line = str(err.value)
    assert "\n" not in line and "algo.batch_size" in line and str(tmp_path / "seed_0" / FILE) in line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing moved or written


def test_a_checkpoint_of_another_format_is_refused_in_one_line(tmp_path, capsys):
    overrides, crash_at, _ = RUNS["dqn"]
    crash(overrides, tmp_path, crash_at)
    for k in range(2):  # as an older rlexp wrote them: another layout of keys
        path = tmp_path / f"seed_{k}" / FILE
        content = torch.load(path, weights_only=True)
        torch.save({**content, "format": "rlexp-checkpoint/1"}, path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(ConfigError) as err:
        run([*overrides, "resume=true"], tmp_path)
    line = str(err.value)
    assert "\n" not in line and str(tmp_path / "seed_0" / FILE) in line and "'rlexp-checkpoint/1'" in line
    assert "without resume=true" in line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing moved or written
    assert "'rlexp-checkpoint/1'" in evaluate_refusal([str(tmp_path)], capsys)


def test_a_cut_off_checkpoint_is_moved_aside_and_the_job_runs_again_from_scratch(tmp_path, capsys):
    overrides, crash_at, _ = RUNS["dqn"]
    crash(overrides, tmp_path, crash_at)
    path = tmp_path / "seed_1" / FILE
    path.write_bytes(path.read_bytes()[:1000])
    capsys.readouterr()
    run([*overrides, "resume=true"], tmp_path)
    out = capsys.readouterr().out
    assert f"corrupt: {path}: not a readable checkpoint" in out
    assert (tmp_path / "attempt_1" / "corrupt.txt").read_text().startswith(f"seed_1/{FILE}: not a readable checkpoint")
    assert (tmp_path / "attempt_1" / "seed_1" / FILE).stat().st_size == 1000  # kept as it was
    assert [r["step"] for r in metrics(tmp_path / "seed_0")] == [100, 200, 300, 400, 500, 600]  # from scratch
    assert checkpoint(tmp_path / "seed_1")["step"] == 600


def evaluate_refusal(args: list[str], capsys) -> str:
    """The one line rlexp.evaluate prints for bad input (it exits with code 2)."""
    with pytest.raises(SystemExit) as exit_:
        evaluate.main(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1, lines
    return lines[0]


def test_evaluate_refuses_bad_input_in_one_line(tmp_path, capsys):
    (tmp_path / "seed_0").mkdir()
    assert "checkpoint.every=" in evaluate_refusal([str(tmp_path)], capsys)  # how to write checkpoints
    (tmp_path / "seed_0" / FILE).write_bytes(b"not a checkpoint")
    line = evaluate_refusal([str(tmp_path)], capsys)
    assert line.startswith(f"corrupt: {tmp_path}/seed_0/{FILE}: not a readable checkpoint")
    assert "seed=0" in evaluate_refusal([str(tmp_path), "seed=3"], capsys)  # the members there
    assert "episodes" in evaluate_refusal([str(tmp_path), "episodes=0"], capsys)


# ====================================================================== W&B and video
VIDEO = importlib.util.find_spec("moviepy") is not None and importlib.util.find_spec("pygame") is not None


def wandb_runs(member_dir: Path) -> list[list]:
    """The records of each offline W&B run in the member's dir, oldest first."""
    runs = sorted((member_dir / "wandb").glob("offline-run-*"))
    return [read_wandb_records(next(run.glob("run-*.wandb"))) for run in runs]


def history(records: list) -> dict[tuple[str, ...], object]:
    """Every history item of a run by its (nested) key."""
    rows = [r.history for r in records if r.WhichOneof("record_type") == "history"]
    return {
        (item.key,) if item.key else tuple(item.nested_key): json.loads(item.value_json)
        for row in rows
        for item in row.item
    }


@pytest.mark.skipif(not VIDEO, reason="recording needs moviepy and pygame: pip install -e '.[video]'")
def test_evaluate_records_a_video_and_logs_it_to_a_wandb_run_of_the_member(tmp_path, capsys):
    run([*DQN_EVAL, "num_seeds=1", "logger.mode=offline"], tmp_path)
    evaluate.main([str(tmp_path), "seed=0", "episodes=2", "video=true"])
    assert "seed_0 (seed 0) at step 600: return" in capsys.readouterr().out
    video = tmp_path / "seed_0" / "videos" / "eval_step600-episode-0.mp4"
    assert video.stat().st_size > 0
    assert len(wandb_runs(tmp_path / "seed_0")) == 1  # the training run stays the member's one run
    (evaluation,) = wandb_runs(tmp_path / "seed_0" / "videos")
    assert next(r.run.job_type for r in evaluation if r.WhichOneof("record_type") == "run") == "evaluate"
    logged = history(evaluation)
    assert logged[("eval/video", "_type")] == "video-file" and logged[("eval/video", "size")] == video.stat().st_size
    assert logged[("_step",)] == 600


# ====================================================================== for real: a killed grid, resumed
@pytest.mark.slow
def test_a_killed_grid_resumed_continues_each_job_from_its_checkpoint_bitwise(tmp_path):
    from launching import Launch, describe, run_cli
    from test_grid import wait_for

    sweep = tmp_path / "sweep"
    budget = ["total_steps=12000", "algo.learning_starts=200", "logger.log_every=500", "checkpoint.every=2000"]
    args = ["+experiment=stability_grid_small", *budget, "checkpoint.replay=true", "logger.mode=disabled"]
    args += ["logger.progress=off", f"hydra.sweep.dir={sweep}"]
    first = Launch(args, tmp_path / "first")
    try:
        wait_for([sweep / "1" / "seed_1" / FILE], first.proc)  # job 0 finished, job 1 past a checkpoint
    finally:
        first.stop()  # SIGKILL
    assert not (sweep / "1" / "summary.json").exists()
    resumed = run_cli([*args, "resume=true"], tmp_path / "resumed")
    assert resumed.returncode == 0, describe(resumed)
    assert f"resume: {sweep / '1'} continues from its checkpoint at env step" in resumed.stdout
    whole = run_cli([*args[:-1], f"hydra.sweep.dir={tmp_path / 'whole'}"], tmp_path / "whole_run")
    assert whole.returncode == 0, describe(whole)
    for job in range(4):
        assert_same_job(tmp_path / "whole" / str(job), sweep / str(job), 2)
