"""Packed training: cells trained as one population write what each cell's own job writes.

Every cell here is trained twice, for real (CartPole, a tiny budget): alone through the job runner, and
packed with other cells through ``rlexp.run.pack.run_pack``; each member's metrics.jsonl records (every
training statistic, instrument, episode and evaluation figure; not the wall-clock ones) and summary must
be the same, bit for bit, in both.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from composing import compose_config
from launching import CONF, Launch, describe, file_hashes, job_dirs, message_lines, read_json, read_jsonl, run_cli
from omegaconf import OmegaConf
from test_grid import CRASH, CRASHED, SMALL, check_crashed_job, check_finished_job, wait_for

from rlexp.algos import ALGOS
from rlexp.cli import check_command_line
from rlexp.config.schema import ConfigError
from rlexp.run.pack import Cell, plan_packs, run_pack
from rlexp.run.runner import run_population
from rlexp.train import prepare

BUDGET = ["total_steps=600", "algo.learning_starts=200", "logger.log_every=300", "logger.progress=off"]
DQN = ["algo=dqn", "env=cartpole", "num_seeds=2", "algo.target_update_period=16", *BUDGET]
CLOCKS = ("perf/steps_per_s",)  # wall-clock figures: the only ones that may differ
MEMBER_CLOCKS = ("wall_s",)


def member_keys(algo: str) -> tuple[str, ...]:
    return ALGOS[algo].member_keys


def cells_of(root: Path, base: list[str], variants: list[list[str]], mode: str = "disabled") -> list[Cell]:
    return [
        Cell(compose_config([*base, *v, f"logger.mode={mode}"]), root / str(i), ",".join(v) or "default")
        for i, v in enumerate(variants)
    ]


def member_records(job_dir: Path, k: int) -> tuple[list[dict], dict]:
    rows = [
        {n: v for n, v in r.items() if n not in CLOCKS} for r in read_jsonl(job_dir / f"seed_{k}" / "metrics.jsonl")
    ]
    summary = json.loads((job_dir / f"seed_{k}" / "summary.json").read_text())
    return rows, {n: v for n, v in summary.items() if n not in MEMBER_CLOCKS}


def assert_packed_equals_alone(tmp_path: Path, base: list[str], variants: list[list[str]]) -> list[dict]:
    """Train each variant alone and all of them packed; every member's records must be equal."""
    alone = cells_of(tmp_path / "alone", base, variants)
    packed = cells_of(tmp_path / "packed", base, variants)
    for cell in alone:
        run_population(cell.cfg, cell.out_dir, prepare, cell.name)
    assert len(plan_packs(packed, member_keys, 64)) == 1  # one population
    jobs = run_pack(packed, prepare)
    for a, p, job in zip(alone, packed, jobs):
        assert isinstance(job, dict), job
        assert job["packed_with"] == len(variants)
        for k in range(a.cfg.num_seeds):
            rows_alone, summary_alone = member_records(a.out_dir, k)
            rows_packed, summary_packed = member_records(p.out_dir, k)
            assert rows_alone and rows_packed == rows_alone, (p.name, k)
            assert summary_packed == summary_alone, (p.name, k)
    return jobs


@pytest.mark.compat
def test_dqn_members_differing_in_every_per_member_key_train_in_a_pack_as_alone(tmp_path):
    variants = [
        [],
        ["optimizer=rmsprop", "clipping=global_norm", "init=orthogonal", "algo.gamma=0.95"],
        ["clipping=value", "init=he", "algo.tau=0.1", "algo.target_update=hard", "algo.target_update_period=48"],
        ["regularization.l2=0.001", "algo.start_e=0.5", "algo.exploration_fraction=0.3", "optimizer.lr=0.01"],
    ]
    assert_packed_equals_alone(tmp_path, DQN, variants)


@pytest.mark.parametrize("algo", ["sac", "ppo"])
def test_a_population_of_one_trains_as_that_member_in_a_larger_one(tmp_path, algo):
    """Seed 1 alone and as member 1 of seeds 0-2: the same records, bit for bit, with value heads of one
    output (torch's single-matrix kernels round a matrix times a vector otherwise)."""
    base = {
        "sac": ["algo=sac", "env=pendulum", "total_steps=400", "algo.learning_starts=200", "algo.batch_size=64"],
        "ppo": ["algo=ppo", "env=cartpole", "total_steps=512", "algo.num_steps=64"],
    }[algo]
    base += ["network.hidden=[32,32]", "logger.log_every=200", "logger.progress=off", "logger.mode=disabled"]
    alone, three = tmp_path / "alone", tmp_path / "three"
    run_population(compose_config([*base, "seed=1", "num_seeds=1"]), alone, prepare)
    run_population(compose_config([*base, "seed=0", "num_seeds=3"]), three, prepare)
    rows_alone, summary_alone = member_records(alone, 0)
    rows_three, summary_three = member_records(three, 1)
    assert rows_alone and rows_three == rows_alone
    assert {**summary_three, "member": 0} == summary_alone


def test_a_diverging_member_leaves_its_pack_mates_as_alone(tmp_path):
    variants = [["clipping=global_norm"], ["optimizer=sgd", "optimizer.lr=1e30"], ["init=xavier"]]
    jobs = assert_packed_equals_alone(tmp_path, DQN, variants)
    assert [j["status"] for j in jobs] == ["ok", "diverged", "ok"]


@pytest.mark.slow
def test_fault_injection_poisons_that_member_of_each_cell_in_a_pack(tmp_path):
    inject = ["debug.inject.what=grad", "debug.inject.member=1", "debug.inject.step=350"]
    jobs = assert_packed_equals_alone(tmp_path, [*DQN, *inject], [["optimizer=rmsprop"], ["init=he"]])
    assert [j["counts"]["diverged"] for j in jobs] == [1, 1]


@pytest.mark.slow
@pytest.mark.parametrize(
    "option,variants",
    [
        ("shrink_perturb", [["intervention.shrink=0.5"], ["intervention.perturb=0.05", "optimizer=rmsprop"]]),
        ("redo", [["intervention.tau=0.05"], ["intervention.tau=0.2", "optimizer=rmsprop"]]),
    ],
)
def test_members_differing_in_intervention_numbers_train_in_a_pack_as_alone(tmp_path, option, variants):
    base = [*DQN, f"intervention={option}", "intervention.every=8"]
    jobs = assert_packed_equals_alone(tmp_path, base, variants)
    assert all(m["status"] == "ok" for j in jobs for m in j["members"])


# ====================================================================== checkpoints and resume
CHECKPOINTED = [  # checkpoints every 200 env steps with the replay; member 1 of each cell diverges at 350
    *DQN,
    "total_steps=600",
    "logger.log_every=100",
    "checkpoint.every=200",
    "checkpoint.replay=true",
    "eval.every=200",
    "eval.episodes=2",
    "debug.inject.what=param",
    "debug.inject.member=1",
    "debug.inject.step=350",
]


def without_env(state: dict) -> dict:
    return {key: value for key, value in state.items() if not key.startswith("env/")}


def test_a_killed_packed_grid_resumed_from_its_checkpoints_ends_as_uninterrupted_and_as_each_cell_alone(tmp_path):
    """A pack of three cells writes each member's checkpoint into its own cell's seed_<k>/; interrupted
    at env step 550 (after the checkpoint at 400) and resumed, every cell ends bitwise as in the
    uninterrupted pack (metrics, summaries, checkpoints) and as the cell's own job (metrics, summaries,
    the members' own checkpoint entries but the environments': a population of 6 CartPoles keeps them in
    another form than one of 2, stepping the same numbers)."""
    from test_checkpoints import assert_same_job, checkpoint, member_summary, metrics, same

    variants = [[], ["optimizer=rmsprop", "init=he"], ["clipping=global_norm", "algo.gamma=0.95"]]
    whole = run_pack(cells_of(tmp_path / "whole", CHECKPOINTED, variants), prepare)
    cut = run_pack(cells_of(tmp_path / "cut", [*CHECKPOINTED, "debug.crash_at_step=550"], variants), prepare)
    assert [job["status"] for job in cut] == ["crashed"] * 3  # every cell of the pack
    for i in range(3):
        saved = checkpoint(tmp_path / "cut" / str(i) / "seed_1")
        assert (saved["step"], saved["member"], saved["members"]) == (400, 1, 2)  # the cell's own member 1
        assert max(r["step"] for r in metrics(tmp_path / "cut" / str(i) / "seed_0")) == 500  # past it, dropped
    resumed = run_pack(cells_of(tmp_path / "cut", [*CHECKPOINTED, "resume=true"], variants), prepare)
    assert [job["counts"] for job in resumed] == [job["counts"] for job in whole]
    assert [job["counts"]["diverged"] for job in resumed] == [1, 1, 1] and resumed[0]["packed_with"] == 3
    alone = cells_of(tmp_path / "alone", CHECKPOINTED, variants)
    for i, cell in enumerate(alone):
        run_population(cell.cfg, cell.out_dir, prepare, cell.name)
        continued = tmp_path / "cut" / str(i)
        assert_same_job(tmp_path / "whole" / str(i), continued, 2)
        assert sorted(p.name for p in (continued / "attempt_1").iterdir()) == ["error.txt", "summary.json"]
        for k in range(2):
            member_dir = continued / f"seed_{k}"
            assert metrics(member_dir) == metrics(cell.out_dir / f"seed_{k}"), (i, k)
            assert member_summary(member_dir) == member_summary(cell.out_dir / f"seed_{k}")
            packed, own = (checkpoint(d)["state"] for d in (member_dir, cell.out_dir / f"seed_{k}"))
            assert same(without_env(packed), without_env(own)), (i, k)


def test_a_resumed_pack_trains_the_cells_of_each_starting_point_as_one_population(tmp_path, capsys):
    """Resumed, the cells of an interrupted pack that kept their checkpoints continue together and a cell
    without one (its files lost) starts afresh in a population of its own; each ends as uninterrupted."""
    from test_checkpoints import checkpoint, member_summary, metrics, same

    variants = [[], ["optimizer=rmsprop"], ["init=he"]]
    run_pack(cells_of(tmp_path / "whole", CHECKPOINTED, variants), prepare)
    run_pack(cells_of(tmp_path / "cut", [*CHECKPOINTED, "debug.crash_at_step=550"], variants), prepare)
    for k in range(2):
        (tmp_path / "cut" / "2" / f"seed_{k}" / "checkpoint.pt").unlink()
    capsys.readouterr()
    resumed = run_pack(cells_of(tmp_path / "cut", [*CHECKPOINTED, "resume=true"], variants), prepare)
    out = capsys.readouterr().out
    assert [job["packed_with"] for job in resumed] == [2, 2, 1]  # two populations
    assert "cut/2: the files of an unfinished earlier attempt moved to attempt_1/" in out
    assert out.count("continues from its checkpoint at env step 400") == 2
    for i in range(3):  # the environments' state takes another form in populations of other sizes
        for k in range(2):
            whole, cut = tmp_path / "whole" / str(i) / f"seed_{k}", tmp_path / "cut" / str(i) / f"seed_{k}"
            assert metrics(cut) == metrics(whole) and member_summary(cut) == member_summary(whole), (i, k)
            assert same(without_env(checkpoint(cut)["state"]), without_env(checkpoint(whole)["state"])), (i, k)


PPO = ["algo=ppo", "env=cartpole", "total_steps=512", "num_seeds=2", "network.hidden=[16,16]", "algo.num_steps=16"]
PPO += ["logger.log_every=256", "logger.progress=off"]
TD3 = ["algo=td3", "env=pendulum", "total_steps=300", "num_seeds=2", "network.hidden=[16,16]"]
TD3 += ["algo.learning_starts=100", "algo.batch_size=32", "logger.log_every=150", "logger.progress=off"]
SAC = ["algo=sac", *TD3[1:]]
MUZERO = ["algo=muzero_lite", "env=cartpole", "total_steps=400", "num_seeds=2", "algo.learning_starts=200"]
MUZERO += ["algo.batch_size=16", "logger.log_every=200", "logger.progress=off"]
GRID = [  # the stability grid's init x clipping x optimizer options
    [f"init={i}", f"clipping={c}", f"optimizer={o}"]
    for i in ("xavier", "he", "orthogonal")
    for c in ("none", "global_norm")
    for o in ("adam", "rmsprop")
]


@pytest.mark.parametrize(
    "base,variants",
    [
        pytest.param(
            PPO,
            [
                [],
                ["optimizer=rmsprop", "clipping=none", "init=orthogonal"],
                ["optimizer.lr=0.01", "regularization.l2=0.01", "algo.gamma=0.9", "algo.gae_lambda=0.8"],
            ],
            marks=pytest.mark.compat,
        ),
        pytest.param(
            TD3,
            [[], ["optimizer=rmsprop", "clipping=global_norm", "init=he"], ["algo.gamma=0.9", "algo.tau=0.05"]],
            marks=pytest.mark.slow,
        ),
        (
            SAC,  # alpha's Adam takes each member's optimizer.lr
            [[], ["optimizer=rmsprop", "clipping=global_norm", "init=he"], ["algo.gamma=0.9", "algo.tau=0.05"]]
            + [["optimizer.lr=0.002", "regularization.l2=0.01"]],
        ),
        pytest.param(
            MUZERO,
            [[], ["optimizer=rmsprop", "clipping=global_norm", "init=he"]]
            + [["optimizer.lr=0.002", "regularization.l2=0.01"]],
            marks=pytest.mark.compat,
        ),
    ],
    ids=["ppo", "td3", "sac", "muzero_lite"],
)
def test_actor_critic_members_train_in_a_pack_as_alone(tmp_path, base, variants):
    assert_packed_equals_alone(tmp_path, base, variants)


@pytest.mark.slow
@pytest.mark.parametrize("base", [DQN, PPO, TD3], ids=["dqn", "ppo", "td3"])
def test_every_stability_grid_option_trains_in_a_pack_as_alone(tmp_path, base):
    assert_packed_equals_alone(tmp_path, base, GRID)


# ====================================================================== the launcher, for real
PACKED = ["hydra/launcher=rlexp_packed", "hydra.launcher.n_jobs=2"]


@pytest.fixture(scope="module")
def packed_grid(tmp_path_factory):
    """The small grid's relu cells by init {he, xavier}, each as is and forced to crash at env step 400:
    two packs of two cells (a crash's cells are a pack of their own: debug.* is not per member)."""
    base = tmp_path_factory.mktemp("packed")
    args = [*SMALL, *PACKED, "activation=relu", "clipping=none", "init=he,xavier", "logger.mode=offline"]
    proc = run_cli([*args, "debug.crash_at_step=-1,400", f"hydra.sweep.dir={base / 'sweep'}"], base)
    return proc, base / "sweep", args


def test_packed_launcher_writes_every_job_dir_and_isolates_a_crashing_pack(packed_grid):
    proc, sweep, _ = packed_grid
    assert proc.returncode != 0, describe(proc)  # the crashed cells are failed jobs
    assert "4 jobs in 2 packs" in proc.stdout + proc.stderr, describe(proc)
    jobs = {d: read_json(d / "summary.json") for d in job_dirs(sweep)}
    assert len(jobs) == 4 and all((d / ".hydra" / "config.yaml").is_file() for d in jobs)
    fine = [d for d, j in jobs.items() if CRASH not in j["cell"]]
    crashed = [d for d, j in jobs.items() if CRASH in j["cell"]]
    assert sorted(check_finished_job(d, wandb=True)["choices"]["init"] for d in fine) == ["he", "xavier"]
    assert sorted(check_crashed_job(d, CRASHED)["choices"]["init"] for d in crashed) == ["he", "xavier"]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(str(sweep))]
    assert sorted(ln.split(":")[0] for ln in lines) == sorted(str(d) for d in jobs)  # one line per cell


@pytest.mark.slow
def test_packed_launcher_resume_skips_finished_cells_and_repacks_the_rest(packed_grid, tmp_path):
    proc, sweep, args = packed_grid
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy)
    fine = sorted(d for d in job_dirs(copy) if CRASH not in read_json(d / "summary.json")["cell"])
    kept = file_hashes(fine[0])
    shutil.rmtree(fine[1] / "seed_1")  # an unfinished cell
    again = run_cli([*args, "debug.crash_at_step=-1,400", "resume=true", f"hydra.sweep.dir={copy}"], tmp_path)
    assert f"resume: {fine[0]} is finished" in again.stdout and file_hashes(fine[0]) == kept, describe(again)
    assert "3 jobs in 2 packs" in again.stdout + again.stderr, describe(again)  # the finished cell is not packed
    check_finished_job(fine[1], wandb=True)


def test_packed_launcher_refuses_max_members_below_one(tmp_path):
    """The command line's check, in process (the launcher's refusal as a process: the bad backend's test below)."""
    with pytest.raises(ConfigError) as refused:
        check_command_line([*SMALL, *PACKED, "hydra.launcher.max_members=0", f"hydra.sweep.dir={tmp_path / 's'}"], CONF)
    assert str(refused.value) == "config error: hydra.launcher.max_members: 0 is below 1; give a value >= 1"
    assert not (tmp_path / "s").exists()


def test_packed_launcher_refuses_a_bad_backend_in_one_line_writing_nothing(tmp_path):
    """As a process: the one line, exit code 2, no sweep dir. (The other refusals of the launcher's settings,
    a backend without its extra among them, in process: tests/plugins/test_packed_launcher.py and above.)"""
    line = "config error: hydra.launcher.backend: unknown backend 'joblibb'; "
    line += "use one of: local, submitit_local, slurm, ray"
    proc = run_cli([*SMALL, *PACKED, "hydra.launcher.backend=joblibb", f"hydra.sweep.dir={tmp_path / 's'}"], tmp_path)
    assert proc.returncode == 2 and message_lines(proc) == [line], describe(proc)
    assert not (tmp_path / "s").exists()


def test_a_dry_run_prints_the_plan_and_makes_no_job_dir(tmp_path):
    sweep = tmp_path / "s"
    proc = run_cli([*SMALL, *PACKED, "hydra.launcher.dry_run=true", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert message_lines(proc) == [
        "rlexp_packed: 4 jobs in 2 packs (max_members=96, backend=local)",
        "pack 1: 4 members, 2 cells: jobs 1, 0",  # relu: global_norm, then none (clipping in order)
        "pack 2: 4 members, 2 cells: jobs 3, 2",
        f"dry run: nothing trained, no job dir made; written: {sweep}/multirun.yaml",
    ], describe(proc)
    assert sorted(p.name for p in sweep.iterdir()) == ["multirun.yaml"]


# ====================================================================== packs as submitit jobs
SUBMITIT = ["hydra/launcher=rlexp_packed", "hydra.launcher.backend=submitit_local", "logger.mode=disabled"]


def assert_each_cell_as_alone(sweep: Path, tmp_path: Path) -> None:
    """Each job dir of ``sweep``: its members' records equal those of the cell's own job, trained alone."""
    for job_dir in job_dirs(sweep):
        overrides = [str(x) for x in OmegaConf.load(job_dir / ".hydra" / "overrides.yaml")]
        alone = tmp_path / "alone" / job_dir.name
        run_population(compose_config(overrides), alone, prepare, read_json(job_dir / "summary.json")["cell"])
        for k in range(2):
            rows, summary = member_records(job_dir, k)
            assert rows and (rows, summary) == member_records(alone, k), (job_dir, k)


def test_packs_as_submitit_jobs_train_each_member_as_its_own_job(tmp_path):
    """The small grid's relu cells as one pack, a submitit job of its own (submitit's local executor):
    every job dir written as its own job writes it, each member bitwise as alone."""
    sweep = tmp_path / "sweep"
    proc = run_cli([*SMALL, *SUBMITIT, "activation=relu", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert "2 jobs in 1 packs" in proc.stdout, describe(proc)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(str(sweep))]
    assert sorted(ln.split(":")[0] for ln in lines) == [str(sweep / "0"), str(sweep / "1")]  # one line per cell
    for job_dir in job_dirs(sweep):
        assert check_finished_job(job_dir)["packed_with"] == 2
        assert (job_dir / ".hydra" / "config.yaml").is_file() and (job_dir / ".hydra" / "hydra.yaml").is_file()
    assert len(list((sweep / ".submitit").iterdir())) == 1  # one submitit job: the pack
    assert_each_cell_as_alone(sweep, tmp_path)


@pytest.mark.heavy
def test_a_killed_submitit_pack_runs_again_on_resume_and_no_other_packs_file_changes(tmp_path):
    """Two packs (relu, tanh) of two cells, each a submitit job: the tanh pack's job is killed (SIGKILL)
    once it has written records; its cells fail, the relu pack ends. resume=true runs the tanh cells again
    (the killed attempts moved aside) and leaves every file of the relu cells as it was, bytes and mtimes;
    every member ends as in its own job."""
    sweep = tmp_path / "sweep"
    budget = ["total_steps=2000", "algo.learning_starts=200", "logger.log_every=1000", "logger.progress=off"]
    args = ["+experiment=stability_grid_small", *budget, *SUBMITIT, "clipping=none", "init=he,xavier"]
    args.append(f"hydra.sweep.dir={sweep}")
    first = Launch(args, tmp_path / "first")
    try:
        rows = sweep / "2" / "seed_0" / "metrics.jsonl"  # job 2: activation=tanh, init=he
        wait_for([rows], first.proc)
        pid = json.loads((sweep / "2" / ".lock").read_bytes().split(b"\0", 1)[0])["pid"]
        os.kill(pid, signal.SIGKILL)  # the tanh pack's submitit job (a child of the grid's process)
        killed = first.result()
    finally:
        first.stop()
    assert killed.returncode != 0 and "a pack of 2 cells failed: submitit job" in killed.stderr, describe(killed)
    relu = [sweep / "0", sweep / "1"]
    kept = {d: (file_hashes(d), {p: p.stat().st_mtime_ns for p in d.rglob("*")}) for d in relu}
    assert all(check_finished_job(d)["choices"]["activation"] == "relu" for d in relu)
    assert not (sweep / "2" / "summary.json").exists() and not (sweep / "3" / "summary.json").exists()

    again = run_cli([*args, "resume=true"], tmp_path / "second")
    assert again.returncode == 0 and "2 jobs in 1 packs" in again.stdout, describe(again)
    assert {d: (file_hashes(d), {p: p.stat().st_mtime_ns for p in d.rglob("*")}) for d in relu} == kept
    assert (sweep / "2" / "attempt_1" / "seed_0" / "metrics.jsonl").is_file()  # the killed attempt, kept
    assert_each_cell_as_alone(sweep, tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(
    not importlib.util.find_spec("ray"),
    reason="needs the ray extra in its own environment (python -m venv; pip install -e '.[ray]' pytest; see .ci/run)",
)
def test_packs_as_ray_tasks_train_each_member_as_its_own_job_and_isolate_a_crash(tmp_path):
    """The small grid, each cell as is and forced to crash, as four packs (activation x crash), each a
    task of a local Ray cluster (Ray's files under tmp dirs, as tests/jobs/test_grid.py's Ray test)."""
    sweep = tmp_path / "sweep"
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    args = [*SMALL, "hydra/launcher=rlexp_packed", "hydra.launcher.backend=ray", "logger.mode=disabled"]
    try:
        proc = run_cli(
            [*args, "debug.crash_at_step=-1,400", f"hydra.sweep.dir={sweep}"],
            tmp_path,
            HOME=str(tmp_path / "home"),
            RAY_TMPDIR=ray_tmp,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode != 0 and "8 jobs in 4 packs" in proc.stdout, describe(proc)  # the crashed cells fail
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(str(sweep))]
    assert sorted(ln.split(":")[0] for ln in lines) == sorted(str(d) for d in job_dirs(sweep))  # one per cell
    crashed = [d for d in job_dirs(sweep) if CRASH in read_json(d / "summary.json")["cell"]]
    assert len(crashed) == 4 and all(check_crashed_job(d, CRASHED)["packed_with"] == 2 for d in crashed)
    fine = [d for d in job_dirs(sweep) if d not in crashed]
    assert all(check_finished_job(d)["packed_with"] == 2 and (d / ".hydra" / "hydra.yaml").is_file() for d in fine)
    for d in crashed:
        shutil.rmtree(d)
    assert_each_cell_as_alone(sweep, tmp_path)
