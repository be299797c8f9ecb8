"""``python -m rlexp.report`` on a real multirun, damaged: grid.csv, divergence rates and IQMs from the
summaries, crashed and damaged jobs, the W&B summary run, heatmap axes, bad input (one line, exit 2), and
the page as headless Chromium renders it."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("rliable", reason="pip install -e '.[report]'")

from launching import cli_env, read_wandb_records, read_wandb_run
from PIL import Image
from scipy.stats import trim_mean

from rlexp.report.main import build_report

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium")


def report_cli(args: Sequence[str], tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlexp.report", *args],
        cwd=ROOT,
        env=cli_env(tmp),
        capture_output=True,
        text=True,
        timeout=120,
    )


# ---------------------------------------------------------------------- a real multirun, then damaged
@pytest.fixture(scope="session")
def multirun(tmp_path_factory) -> Path:
    """2 activations x (no fault, a NaN parameter injected into member 1 at step 400), 3 seeds each."""
    tmp = tmp_path_factory.mktemp("report_multirun")
    sweep = tmp / "sweep"
    args = [
        "-m",
        "activation=relu,tanh",
        "debug.inject.what=none,param",
        "debug.inject.member=1",
        "debug.inject.step=400",
        "total_steps=800",
        "num_seeds=3",
        "algo.learning_starts=200",
        "logger.log_every=200",
        "logger.progress=off",
        "logger.mode=disabled",
        "threads=1",
        f"hydra.sweep.dir={sweep}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "rlexp.train", *args],
        cwd=ROOT,
        env=cli_env(tmp),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return sweep


@pytest.fixture(scope="session")
def damaged(multirun, tmp_path_factory) -> Path:
    """The multirun plus a crashed job (error in summary.json), a job that died before writing its
    summary, a truncated metrics line, "nan"/"inf" strings and a member summary file missing."""
    root = tmp_path_factory.mktemp("report_damaged") / "sweep"
    shutil.copytree(multirun, root)
    shutil.copytree(root / "0", root / "4")  # same cell as job 0: a crash must not change its statistics
    job = json.loads((root / "4" / "summary.json").read_text())
    job.update(status="crashed", error="RuntimeError: injected crash for the report test")
    job["members"] = [{**m, "status": "crashed"} for m in job["members"]]
    (root / "4" / "summary.json").write_text(json.dumps(job))
    shutil.copytree(root / "2", root / "5")  # died before writing anything
    for path in (root / "5").rglob("summary.json"):
        path.unlink()
    with open(root / "0" / "seed_0" / "metrics.jsonl", "a") as f:
        f.write('{"step": 1000, "episode/return_last10": "nan", "train/loss": "inf"}\n{"step": 1200, "episode/ret')
    (root / "3" / "seed_2" / "summary.json").unlink()
    (root / "0" / "seed_1" / "wandb" / "offline-run-20260101_000000-abc123").mkdir(parents=True)  # a member's run
    return root


@pytest.fixture(scope="session")
def damaged_report(damaged, tmp_path_factory) -> subprocess.CompletedProcess:
    done = report_cli([str(damaged), "--reps", "500"], tmp_path_factory.mktemp("report_cli"))
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def grid(root: Path) -> list[dict[str, str]]:
    with open(root / "grid.csv", newline="") as f:
        return list(csv.DictReader(f))


def job_summaries(root: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(root.glob("*/summary.json"))]


def test_grid_csv_one_row_per_member(damaged, damaged_report):
    rows = grid(damaged)
    assert len(rows) == 6 * 3  # 4 jobs that ran + 2 crashed, 3 members each
    assert list(rows[0])[:4] == ["job", "cell", "activation", "debug.inject.what"]
    assert {r["cell"] for r in rows} == {
        f"activation={a},debug.inject.what={w}" for a in ("relu", "tanh") for w in ("none", "param")
    }
    crashed = [r for r in rows if r["status"] == "crashed"]
    assert sorted({r["job"] for r in crashed}) == ["4", "5"] and len(crashed) == 6
    diverged = [r for r in rows if r["status"] == "diverged"]
    assert {(r["debug.inject.what"], r["member"], r["cause"], r["where"]) for r in diverged} == {
        ("param", "1", "nonfinite_param", "q.0.weight")
    }
    assert all(int(r["diverged_at_step"]) >= 400 for r in diverged)
    for path in damaged.glob("*/summary.json"):  # every member's final return as its job summary has it
        for m in json.loads(path.read_text())["members"]:
            row = next(r for r in rows if r["job"] == path.parent.name and r["member"] == str(m["member"]))
            assert float(row["final_return"]) == pytest.approx(m["final_return"])


def test_divergence_rate_and_iqm_per_cell_from_the_summaries(damaged, damaged_report):
    report = build_report(damaged, reps=200, draw=False)
    by_cell = {s.cell: s for s in report.cells}
    for job in job_summaries(damaged):
        if job["status"] == "crashed":
            continue
        choices = job["choices"]
        what = "param" if "debug.inject.what=param" in job["cell"] else "none"
        cell = f"activation={choices['activation']},debug.inject.what={what}"
        stats = by_cell[cell]
        assert stats.members == len(job["members"])  # job 4 (crashed, same cell as job 0) is left out
        assert stats.diverged == job["counts"]["diverged"]
        assert stats.divergence_rate == pytest.approx(job["counts"]["diverged"] / len(job["members"]))
        # the jobs evaluated: the score is each member's eval_return (none for member 1, diverged before it)
        returns = np.array([m["eval_return"] for m in job["members"] if m["eval_return"] is not None])
        assert len(returns) == len(job["members"]) - job["counts"]["diverged"]
        assert stats.iqm == pytest.approx(trim_mean(returns, 0.25))
        assert stats.median_return == pytest.approx(np.median(returns))
    assert by_cell["activation=relu,debug.inject.what=param"].divergence_rate == pytest.approx(1 / 3)
    assert report.status_counts == {"ok": 10, "diverged": 2, "crashed": 6}
    assert report.score_key == "eval_return"


def test_crashed_jobs_and_damage_are_reported(damaged, damaged_report):
    html = (damaged / "report.html").read_text()
    crashed = html.split("<h2>Crashed jobs</h2>")[1]
    assert "RuntimeError: injected crash for the report test" in crashed
    assert "no readable summary.json" in crashed and "<td>5</td>" in crashed
    assert "<b>6</b> jobs (2 crashed)" in html and "ok 10, diverged 2, crashed 6" in html
    assert "nonfinite_param@q.0.weight" in html
    for name in ("heatmap_divergence", "heatmap_iqm", "performance_profile", "learning_curves"):
        assert (damaged / f"{name}.png").stat().st_size > 1000
    assert "report: 6 jobs, 18 members (ok 10, diverged 2, crashed 6), 4 cells" in damaged_report.stdout


def test_every_unreadable_metrics_line_is_named(damaged, damaged_report):
    """The truncated last line of job 0's member 0 is left out of the curves and named, with its file and
    line number, on stderr and in the page."""
    path = damaged / "0" / "seed_0" / "metrics.jsonl"
    number = len(path.read_text().splitlines())  # the truncated line is the last
    assert f"report: warning: {path}: skipped 1 unreadable line(s): {number}" in damaged_report.stderr
    assert damaged_report.stderr.count("unreadable line") == 1  # the other files read whole
    assert f"Unreadable lines left out of the curves: {path}, line {number}." in (damaged / "report.html").read_text()


def test_wandb_summary_run_read_back(damaged, damaged_report):
    runs = sorted((damaged / "report_wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))
    wb = read_wandb_run(damaged / "report_wandb")
    assert wb["group"] == "report" and wb["exit_code"] == 0
    sweep = json.loads((damaged / "0" / "summary.json").read_text())["config"]["logger"]["sweep"]
    assert sweep.startswith("sweep-") and wb["tags"] == [f"sweep:{sweep}"] and wb["config"]["sweep"] == sweep
    run = next(
        r.run for r in read_wandb_records(next(runs[0].glob("run-*.wandb"))) if r.WhichOneof("record_type") == "run"
    )
    assert run.job_type == "report"
    report = build_report(damaged, reps=500, draw=False)
    for stats in report.cells:
        assert wb["summary"][f"iqm/{stats.cell}"] == pytest.approx(stats.iqm)
        assert wb["summary"][f"iqm_ci_low/{stats.cell}"] == pytest.approx(stats.ci[0])
    media = runs[0] / "files" / "media"
    grid_table = json.loads(next((media / "table" / "report").glob("grid_*.table.json")).read_text())
    assert len(grid_table["data"]) == 18 and grid_table["columns"][:2] == ["job", "cell"]
    cells = json.loads(next((media / "table" / "report").glob("cells_*.table.json")).read_text())
    by_cell = {row[0]: dict(zip(cells["columns"], row)) for row in cells["data"]}
    for stats in report.cells:  # the per-cell statistics table: IQM, CI, divergence rate, n
        row = by_cell[stats.cell]
        assert (row["iqm"], row["iqm_ci_low"], row["iqm_ci_high"]) == pytest.approx((stats.iqm, *stats.ci))
        assert row["divergence_rate"] == pytest.approx(stats.divergence_rate)
        assert (row["n_total"], row["n_ran"], row["n_scored"]) == (stats.total, stats.members, stats.scored)
    assert by_cell["activation=relu,debug.inject.what=none"]["n_total"] == 6  # job 4 crashed in this cell
    assert by_cell["activation=relu,debug.inject.what=none"]["wandb_runs"] == "abc123"  # its members' W&B run ids
    panels = {  # native charts: W&B custom-chart panels in the run's config
        "/".join(item.nested_key[2:]): json.loads(item.value_json)["panel_config"]["panelDefId"]
        for r in read_wandb_records(next(runs[0].glob("run-*.wandb")))
        if r.WhichOneof("record_type") == "config"
        for item in r.config.update
        if list(item.nested_key[:2]) == ["_wandb", "visualize"]
    }
    for chart in ("median", "iqm", "mean", "optimality_gap", "divergence_rate"):
        assert panels[f"report/chart/{chart}"] == "wandb/bar/v0"
    assert panels["report/chart/curve/CartPole-v1/eval/return"] == "wandb/lineseries/v0"
    images = {p.name.rsplit("_", 2)[0] for p in (media / "images" / "report").rglob("*.png")}
    assert {"heatmap_iqm", "interval_estimates", "aggregate_curves", "learning_curves"} <= images


# ---------------------------------------------------------------------- exact numbers, hand-written jobs
def write_job(
    root: Path,
    name: str,
    choices: dict[str, str],
    returns: Sequence[float],
    diverged: Sequence[int] = (),
    eval_returns: Sequence[float | None] | None = None,
    env: str = "CartPole-v1",
    empty: Sequence[int] = (),
) -> None:
    """A job dir as the trainer writes it, with known final returns (members in ``diverged`` diverged)
    and, given ``eval_returns``, known evaluation returns; members in ``empty`` have an empty
    metrics.jsonl. Each member has a W&B run dir named as W&B names an offline run (``…-<id>``)."""
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {k}={v}\n" for k, v in choices.items()))
    members = [
        {
            "status": "diverged" if k in diverged else "ok",
            "seed": k,
            "member": k,
            "steps": 1000,
            "final_return": r,
            **({} if eval_returns is None else {"eval_return": eval_returns[k]}),
            "episodes": 10,
            "wall_s": 1.0,
            "diverged_at_step": 500 + 100 * k if k in diverged else None,
            "divergence": {
                "cause": "nonfinite_loss",
                "where": "loss",
                "detail": f"detail of {k}",
                "first_moved": {"instrument": "srank/q.1", "step": 500, "from": 1.0, "to": 20.0, "since_step": 250},
            }
            if k in diverged
            else None,
        }
        for k, r in enumerate(returns)
    ]
    statuses = [m["status"] for m in members]
    (job / "summary.json").write_text(
        json.dumps(
            {
                "status": "diverged" if diverged else "ok",
                "cell": ",".join(f"{k}={v}" for k, v in choices.items()),
                "choices": choices,
                "env": env,
                "members": members,
                "error": None,
                "counts": {s: statuses.count(s) for s in ("ok", "diverged", "crashed")},
            }
        )
    )
    for k, m in enumerate(members):
        (job / f"seed_{m['member']}").mkdir()
        lines = [  # a diverged member stops recording at its divergence
            json.dumps({"step": s, "episode/return_last10": m["final_return"] * s / 1000, "srank/q.1": s + m["member"]})
            for s in ((250, 500) if k in diverged else (250, 500, 1000))
        ]
        (job / f"seed_{m['member']}" / "metrics.jsonl").write_text("" if k in empty else "\n".join(lines) + "\n")
        (job / f"seed_{m['member']}" / "wandb" / f"offline-run-20260101_000000-run{name}m{k}").mkdir(parents=True)


A = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 800.0]  # middle 50%: 30, 40, 50, 60 -> IQM 45
B = [5.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0]  # middle 50%: 3, 4, 5, 6 -> IQM 4.5


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report_synthetic")
    write_job(root, "0", {"activation": "relu", "init": "he", "optimizer": "adam"}, A)
    write_job(root, "1", {"activation": "tanh", "init": "he", "optimizer": "adam"}, B, diverged=(0, 3))
    write_job(root, "2", {"activation": "relu", "init": "xavier", "optimizer": "sgd"}, B[:4])
    write_job(root, "3", {"activation": "tanh", "init": "xavier", "optimizer": "sgd"}, A[:4], diverged=(1,))
    return root


def test_heatmap_axes_overridable_and_pooled(synthetic, tmp_path):
    done = report_cli(
        [
            str(synthetic),
            "--rows",
            "optimizer",
            "--cols",
            "activation",
            "--reps",
            "50",
            "--compare",
            "activation=tanh,init=he",
            "activation=relu,init=he",
            "--wandb-mode",
            "disabled",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    html = (synthetic / "report.html").read_text()
    assert "Rows: optimizer, columns: activation; pooled over init" in html
    assert "P(<b>activation=tanh,init=he</b> &gt; <b>activation=relu,init=he</b>)" in html
    assert not (synthetic / "report_wandb" / "wandb").exists()


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize("case", ["missing", "empty", "rows", "compare", "reps", "curves"])
def test_bad_input_one_line_exit_2(case, synthetic, tmp_path):
    (tmp_path / "empty").mkdir()
    args, names = {
        "missing": ([str(tmp_path / "nope")], "DIR"),
        "empty": ([str(tmp_path / "empty")], "DIR"),
        "rows": ([str(synthetic), "--rows", "normalization"], "--rows"),
        "compare": ([str(synthetic), "--compare", "activation=relu,init=he", "activation=elu"], "--compare"),
        "reps": ([str(synthetic), "--reps", "0"], "--reps"),
        "curves": ([str(synthetic), "--curves", "srank/q.9"], "--curves"),
    }[case]
    done = report_cli([*args, "--wandb-mode", "disabled"], tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in done.stderr, done.stderr
    if case == "curves":
        assert "did you mean srank/q.1?" in lines[0]


@pytest.fixture
def read_only(synthetic, tmp_path):
    """A copy of the synthetic grid in a dir this process cannot write: a read-only bind mount as root
    (whom file modes do not stop), else without write permission."""
    root = tmp_path / "grid"
    shutil.copytree(synthetic, root)
    if os.geteuid() != 0:
        for path in [root, *root.rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
        yield root
        return
    for command in (["mount", "--bind", str(root), str(root)], ["mount", "-o", "remount,ro,bind", str(root)]):
        if subprocess.run(command, capture_output=True).returncode != 0:
            subprocess.run(["umount", str(root)], capture_output=True)
            pytest.skip("needs a read-only bind mount (root with CAP_SYS_ADMIN) or a user that file modes stop")
    try:
        yield root
    finally:
        subprocess.run(["umount", str(root)], check=True)


def test_a_read_only_grid_is_one_line_and_out_writes_the_report_elsewhere(read_only, tmp_path):
    before = {p: p.read_bytes() for p in read_only.rglob("*") if p.is_file()}
    refused = report_cli([str(read_only), "--reps", "50", "--wandb-mode", "disabled"], tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert re.fullmatch(
        rf"report: error: cannot write {read_only}: (EROFS|EACCES) \([^)]+\); pass --out DIR to write the report "
        r"elsewhere\n", refused.stderr), refused.stderr  # fmt: skip
    out = tmp_path / "elsewhere" / "report"
    done = report_cli([str(read_only), "--out", str(out), "--reps", "50", "--wandb-mode", "offline"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert {"report.html", "grid.csv", "cells.csv", "curves.csv", "heatmap_iqm.png", "report_wandb"} <= {
        p.name for p in out.iterdir()
    }
    assert f"wrote {out / 'report.html'}" in done.stdout
    assert {p: p.read_bytes() for p in read_only.rglob("*") if p.is_file()} == before


# ---------------------------------------------------------------------- seen as a person sees it
def chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", *args], capture_output=True, text=True, timeout=120
    )


def test_page_renders_in_headless_chromium(damaged, damaged_report, tmp_path):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium package)")
        pytest.skip("chromium is not installed")
    page, shot = f"file://{damaged / 'report.html'}", tmp_path / "page.png"
    dom = chromium("--dump-dom", f"--screenshot={shot}", "--window-size=1280,4000", page).stdout
    assert "<h1>rlexp report</h1>" in dom
    assert dom.count("<tr") >= 1 + 4 + 1 + 2 + 1 + 2  # cells, causes and crashed jobs tables with headers
    images = re.findall(r'<img src="data:image/png;base64,([^"]+)"', dom)
    assert len(images) >= 7  # heatmaps, interval estimates, poi matrix, profile, learning curves
    for data in images:
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        image.verify()
        assert image.format == "PNG" and image.size[0] > 100 and image.size[1] > 100

    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape == (4000, 1280, 3)
    colours = np.unique(pixels.astype(np.int32) @ np.array([65536, 256, 1], dtype=np.int32))  # [H, W] packed RGB
    assert len(colours) > 50  # text, tables and figures, not a blank page
    assert (pixels[:1500] < 128).any()  # dark text in the upper part of the page
