"""The report (rlexp/report) on synthetic sweeps written here: IQM, CIs, profiles and PoI against rliable
and direct computations, the eval return as the score, instrument curves, scoring rules, two envs with an
empty metrics file and a crashed job, normalization falling back to the grid."""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rliable", reason="pip install -e '.[report]'")

from rlexp.report.html import render_html
from rlexp.report.main import build_report, instrument_panels, write_outputs
from rlexp.report.stats import (
    NORMALIZATION,
    bootstrap_iqm,
    bootstrap_mean,
    iqm_fast,
    normalizations,
    performance_profiles,
    poi_fast,
)


def grid(root: Path) -> list[dict[str, str]]:
    with open(root / "grid.csv", newline="") as f:
        return list(csv.DictReader(f))


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


def unwritten_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report draws every figure and writes none as a PNG file."""
    from rlexp.report import plots

    monkeypatch.setattr(plots, "_png", lambda fig, path: plots._plt().close(fig))


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


def test_iqm_ci_profile_and_poi_match_rliable(synthetic):
    from rliable import library, metrics
    from scipy.stats import trim_mean

    report = build_report(synthetic, reps=300, seed=7, draw=False)
    by_cell = {s.cell: s for s in report.cells}
    a = by_cell["activation=relu,init=he"]  # optimizer follows init here: it names no cell of its own
    assert report.keys == ["activation", "init"] and report.varying == ["activation", "init", "optimizer"]
    assert a.iqm == pytest.approx(np.mean([30, 40, 50, 60])) == pytest.approx(45.0)
    assert by_cell["activation=tanh,init=he"].iqm == pytest.approx(4.5)
    x = np.array(A).reshape(-1, 1)  # [runs, tasks]
    assert iqm_fast(x) == pytest.approx(metrics.aggregate_iqm(x)) == pytest.approx(trim_mean(A, 0.25))
    np.random.seed(7)  # rliable's own bootstrap with its own IQM, on the same resamples
    _, ci = library.get_interval_estimates({"a": x}, lambda s: np.array([metrics.aggregate_iqm(s)]), reps=300)
    assert a.ci == pytest.approx((ci["a"][0, 0], ci["a"][1, 0]))
    assert a.ci[0] < a.iqm < a.ci[1]

    tanh_he = by_cell["activation=tanh,init=he"]
    assert (tanh_he.diverged, tanh_he.divergence_rate, tanh_he.median_diverged_step) == (2, 0.25, 650.0)
    assert tanh_he.causes == {"nonfinite_loss@loss": 2}
    assert report.best.cell == "activation=relu,init=he" and report.worst.cell == "activation=relu,init=xavier"
    worst = np.array(B[:4]).reshape(-1, 1)
    assert report.best.cell == "activation=relu,init=he"
    p = poi_fast(x, np.array(B[:4]).reshape(-1, 1))
    assert p == pytest.approx(metrics.probability_of_improvement(x, worst)) == 1.0  # every run of A beats B[:4]
    u, v = np.array([[1.0], [2.0], [3.0]]), np.array([[2.0], [2.0], [0.0]])  # ties count half: 6 of 9 pairs
    assert poi_fast(u, v) == pytest.approx(metrics.probability_of_improvement(u, v)) == pytest.approx(6 / 9)

    taus = np.linspace(0, 100, 11)
    profiles, _ = performance_profiles({"a": x}, taus, reps=50)
    expected, _ = library.create_performance_profile({"a": x}, taus, reps=50)
    assert profiles["a"] == pytest.approx(expected["a"])
    assert profiles["a"][1] == pytest.approx(7 / 8)  # 7 of A's 8 runs score above 10


def test_eval_return_is_the_score_when_the_jobs_evaluated(synthetic, tmp_path):
    """Jobs that evaluated are scored by eval_return (a member without one is not scored), and the page
    and grid.csv say so; jobs without evaluation keep the training final_return."""
    from scipy.stats import trim_mean

    root = tmp_path / "evaluated"
    evals = [100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, None]  # the last member never evaluated
    write_job(root, "0", {"activation": "relu"}, A, eval_returns=evals)
    write_job(root, "1", {"activation": "tanh"}, B, diverged=(0,), eval_returns=[1.0] * 8)
    report = build_report(root, reps=50, draw=False)
    by_cell = {s.cell: s for s in report.cells}
    assert report.score_key == "eval_return"
    assert by_cell["activation=relu"].iqm == pytest.approx(trim_mean(evals[:7], 0.25))
    assert by_cell["activation=relu"].scored == 7 and by_cell["activation=relu"].median_return == 400.0
    assert by_cell["activation=tanh"].iqm == 1.0
    write_outputs(report)
    html = (root / "report.html").read_text()
    assert "Score: <b>eval return</b>" in html and "median eval return" in html
    assert [r["eval_return"] for r in grid(root) if r["job"] == "0"] == [*(str(v) for v in evals[:7]), ""]

    plain = build_report(synthetic, reps=50, draw=False)
    assert plain.score_key == "final_return"
    assert {s.cell: s.median_return for s in plain.cells}["activation=relu,init=he"] == np.median(A)
    assert "Score: <b>final return</b>" in render_html(plain)


def test_instrument_curves_draw_each_members_records_per_cell(synthetic, tmp_path):
    root = tmp_path / "sweep"
    shutil.copytree(synthetic, root)
    report = build_report(root, reps=50, curves=["srank/q.1"])
    path = report.figures["curve/srank/q.1"]
    assert path == root / "curve_srank_q.1.png" and path.stat().st_size > 1000
    panels = instrument_panels(report, ["srank/q.1"])["srank/q.1"]
    assert [title for title, _ in panels] == report.shown
    relu_he = dict(panels)["activation=relu,init=he"]  # job 0: 8 members, written as step + member
    assert len(relu_he) == 8
    for k, (steps, values, diverged, _) in enumerate(relu_he):
        assert steps.tolist() == [250, 500, 1000] and values.tolist() == [250 + k, 500 + k, 1000 + k] and not diverged
    assert [d for _, _, d, _ in dict(panels)["activation=tanh,init=he"]] == [k in (0, 3) for k in range(8)]
    html = render_html(report)
    assert "<h2>Instrument curves</h2>" in html and "<h3>srank/q.1</h3>" in html


def test_scoring_rule_switches_how_diverged_members_count(synthetic):
    """--diverged-score: frozen keeps a diverged member's score, zero gives it the random policy's
    return (CartPole-v1's in NORMALIZATION), drop leaves it out; n scored/total says how many entered."""
    from scipy.stats import trim_mean

    cell = "activation=tanh,init=he"  # B, members 0 and 3 diverged
    random = NORMALIZATION["CartPole-v1"][0]
    expected = {
        "frozen": (B, 8),
        "zero": ([random, *B[1:3], random, *B[4:]], 8),
        "drop": ([b for k, b in enumerate(B) if k not in (0, 3)], 6),
    }
    for rule, (scores, n) in expected.items():
        report = build_report(synthetic, reps=20, diverged_score=rule, draw=False)
        stats = {s.cell: s for s in report.cells}[cell]
        assert stats.iqm == pytest.approx(trim_mean(scores, 0.25)) and (stats.scored, stats.total) == (n, 8)
        assert stats.divergence_rate == 0.25  # the rule never changes the divergence rate
        assert f"--diverged-score {rule}</code>" in render_html(report)


def test_interval_estimates_poi_matrix_and_curves_match_direct_computations(synthetic, monkeypatch):
    from rliable import library, metrics
    from scipy.stats import trim_mean

    unwritten_figures(monkeypatch)
    report = build_report(synthetic, reps=100, seed=3)
    x = np.array(A).reshape(-1, 1)
    gamma = NORMALIZATION["CartPole-v1"][1]  # CartPole-v1's reference return: the optimality gap's threshold

    def four(s: np.ndarray) -> np.ndarray:
        return np.array(
            [
                metrics.aggregate_median(s),
                metrics.aggregate_iqm(s),
                metrics.aggregate_mean(s),
                metrics.aggregate_optimality_gap(s, gamma),
            ]
        )

    np.random.seed(3)
    points, ci = library.get_interval_estimates({"a": x}, four, reps=100)
    stats = {s.cell: s for s in report.cells}["activation=relu,init=he"]
    for i, name in enumerate(("median", "IQM", "mean", "optimality gap")):
        assert stats.estimates[name] == pytest.approx((points["a"][i], ci["a"][0, i], ci["a"][1, i]))

    p, low, high = report.poi_matrix  # over the top cells by IQM
    scores = {c: np.array(v).reshape(-1, 1) for c, v in {"activation=relu,init=he": A, "activation=tanh,init=he": B,
              "activation=relu,init=xavier": B[:4], "activation=tanh,init=xavier": A[:4]}.items()}  # fmt: skip
    cells = report.poi_cells
    assert cells[0] == "activation=relu,init=he" and len(cells) == 4
    for i, a in enumerate(cells):
        for j, b in enumerate(cells):
            if i != j:
                assert p[i, j] == pytest.approx(metrics.probability_of_improvement(scores[a], scores[b]))
                assert (p[i, j] + p[j, i], low[i, j] + high[j, i]) == pytest.approx((1.0, 1.0))
    assert report.poi[0][:2] == (cells[0], cells[1])  # best against runner-up, not best against worst
    np.random.seed(3)  # rliable's own stratified independent bootstrap of P(cell 0 > cell 1)
    pair = [scores[cells[0]], scores[cells[1]]]
    _, ci = library.get_interval_estimates({"p": pair}, lambda a, b: np.array([poi_fast(a, b)]), reps=100)
    assert (low[0, 1], high[0, 1]) == pytest.approx((ci["p"][0, 0], ci["p"][1, 0]))

    curve = next(c for c in report.curves if c.cell == "activation=tanh,init=he")
    assert curve.steps == [250, 500, 1000] and curve.n == [8, 8, 8]
    frozen = [b * (0.5 if k in (0, 3) else 1.0) for k, b in enumerate(B)]  # members 0, 3 stopped at step 500
    assert curve.iqm[2] == pytest.approx(trim_mean(frozen, 0.25))
    assert curve.low[2] <= curve.iqm[2] <= curve.high[2]

    groups = [np.array(A), np.array(B[:5])]  # the band: a stratified bootstrap, each task on its own
    got = bootstrap_iqm(groups, 200, np.random.default_rng(11))
    rng = np.random.default_rng(11)
    stats_direct = trim_mean(
        np.concatenate([g[rng.integers(0, len(g), size=(200, len(g)))] for g in groups], 1), 0.25, 1
    )
    assert got == pytest.approx((trim_mean(np.concatenate(groups), 0.25), *np.percentile(stats_direct, [2.5, 97.5])))
    got = bootstrap_mean(groups, 200, np.random.default_rng(11))  # the same resamples, their means
    rng = np.random.default_rng(11)
    means_direct = np.concatenate([g[rng.integers(0, len(g), size=(200, len(g)))] for g in groups], 1).mean(1)
    assert got == pytest.approx((np.concatenate(groups).mean(), *np.percentile(means_direct, [2.5, 97.5])))


def test_two_envs_an_empty_metrics_file_and_a_crashed_job_label_every_figure_honestly(tmp_path):
    from scipy.stats import trim_mean

    root = tmp_path / "sweep"
    acro = [-500.0, -400.0, -300.0, -200.0, -150.0, -120.0, -110.0, -100.0]
    write_job(root, "0", {"activation": "relu"}, A, empty=(2,))
    write_job(root, "1", {"activation": "tanh"}, B, diverged=(0,))
    write_job(root, "2", {"activation": "relu"}, acro, env="Acrobot-v1")
    write_job(root, "3", {"activation": "tanh"}, acro[::-1], env="Acrobot-v1")
    write_job(root, "4", {"activation": "relu"}, A)
    job = json.loads((root / "4" / "summary.json").read_text())
    job.update(status="crashed", error="RuntimeError: out of memory")
    (root / "4" / "summary.json").write_text(json.dumps(job))
    report = build_report(root, reps=50)
    write_outputs(report)
    assert report.tasks == ["Acrobot-v1", "CartPole-v1"] and report.normalized
    relu = {s.cell: s for s in report.cells}["activation=relu"]
    (cart_random, cart_ref), (acro_random, acro_ref) = NORMALIZATION["CartPole-v1"], NORMALIZATION["Acrobot-v1"]
    normalized = [(a - cart_random) / (cart_ref - cart_random) for a in A]
    normalized += [(r - acro_random) / (acro_ref - acro_random) for r in acro]
    assert relu.iqm == pytest.approx(trim_mean(normalized, 0.25))
    assert (relu.total, relu.members, relu.scored) == (24, 16, 16)
    assert relu.median_by_task == {"CartPole-v1": np.median(A), "Acrobot-v1": np.median(acro)}
    assert report.curve_metric == "episode/return_last10"  # the empty metrics.jsonl adds no second name

    html = (root / "report.html").read_text()
    for label in (
        "Several tasks: the statistics are of normalized scores",
        "<th>IQM normalized final return [95% CI]</th>",
        "<th>median raw final return · Acrobot-v1</th>",
        "<th>median raw final return · CartPole-v1</th>",
        f'<td>Acrobot-v1</td><td class="num">{acro_random:.2f}</td><td class="num">{acro_ref:.2f}</td>',
        f'<td>CartPole-v1</td><td class="num">{cart_random:.2f}</td><td class="num">{cart_ref:.2f}</td>',
        '<td class="num">16/24</td>',  # n ran/total and n scored/total of relu
        "--diverged-score frozen</code>",
        "members of a crashed job are left out of every statistic",
        "RuntimeError: out of memory",
        "srank/q.1 1 -&gt; 20 (steps 250-500)",  # first_moved of tanh's diverged member
        "detail of 0",
        "IQM of episode/return_last10 across each cell",
        "episode/return_last10 against env steps, one line per member",
    ):
        assert label in html, label
    assert "<th>median final return</th>" not in html  # raw returns never pooled across envs
    assert report.figures["divergence_windows"].stat().st_size > 1000
    cells = {r["cell"]: r for r in csv.DictReader(open(root / "cells.csv"))}
    assert cells["activation=relu"]["wandb_runs"].split() == [f"run{j}m{k}" for j in (0, 2, 4) for k in range(8)]
    assert [r["wandb_run"] for r in grid(root) if r["job"] == "1"] == [f"run1m{k}" for k in range(8)]


def test_normalization_falls_back_to_the_grid_where_the_table_has_no_reference():
    """A table entry with a reference: both from the table; a random return without one: the grid's
    largest score as reference; an env not in the table: the grid's smallest and largest score."""
    rows = [
        {"env": env, "status": status, "final": value}
        for env in ("CartPole-v1", "MinAtar/Breakout-v0", "Unknown-v0")
        for status, value in (("ok", 3.0), ("diverged", 9.0), ("crashed", 50.0), ("ok", float("nan")))
    ]
    norms = normalizations(rows, ["CartPole-v1", "MinAtar/Breakout-v0", "Unknown-v0"], "final")
    breakout = NORMALIZATION["MinAtar/Breakout-v0"]
    assert breakout[1] is None
    assert [(n.random, n.reference, n.source) for n in norms.values()] == [
        (*NORMALIZATION["CartPole-v1"], "table"),
        (breakout[0], 9.0, "random"),
        (3.0, 9.0, "grid"),
    ]


def test_a_missing_report_extra_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """Without the report extra (here rliable hidden from the import system) the command names what is
    missing and the extra in one line, exit code 2, before it reads or writes anything."""
    import importlib.util

    from rlexp.report.main import main

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "rliable" else find_spec(name, *a)
    )
    (tmp_path / "0").mkdir()
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["report: error: needs rliable; pip install -e '.[report]'"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0"]  # nothing written


def test_every_figure_gives_a_cell_one_colour_and_one_evaluation_shows_as_points(tmp_path, monkeypatch):
    """Three cells evaluated once (at their last step): the IQM curve of each is a point with its interval,
    and each cell's colour is the same in the interval estimates, the profiles and the curves."""
    from matplotlib.colors import to_hex
    from matplotlib.container import ErrorbarContainer

    from rlexp.report import plots

    for name, act, returns in (("0", "relu", A), ("1", "tanh", B), ("2", "elu", A[:4])):
        write_job(tmp_path, name, {"activation": act}, returns)
        for member_dir in (tmp_path / name).glob("seed_*"):
            with open(member_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": 1000, "eval/return": float(member_dir.name[-1])}) + "\n")
    drawn: dict[str, dict[str, set[str]]] = {}  # figure -> cell -> colours

    def keep(fig, path):
        colours = drawn.setdefault(path.stem, {})
        for ax in fig.axes:
            labels = [t.get_text() for t in ax.get_yticklabels()]
            for line in ax.get_lines():
                if not line.get_label().startswith("_"):
                    colours.setdefault(line.get_label(), set()).add(to_hex(line.get_color()))
            if path.stem == "interval_estimates" and labels:
                for k, bar in enumerate(ax.patches):
                    colours.setdefault(labels[k], set()).add(to_hex(bar.get_facecolor()))
            for bars in ax.containers:  # an errorbar: a point and its interval
                if isinstance(bars, ErrorbarContainer):
                    colours.setdefault(bars.get_label(), set()).add(to_hex(bars.lines[0].get_color()))
                    colours.setdefault("(points)", set()).add(bars.get_label())
        plots._plt().close(fig)

    monkeypatch.setattr(plots, "_png", keep)
    build_report(tmp_path, reps=50)
    cells = ["activation=relu", "activation=tanh", "activation=elu"]
    assert drawn["aggregate_curves"]["(points)"] == set(cells)  # one evaluation: a point each, not an empty line
    for cell in cells:
        seen = [drawn[figure][cell] for figure in ("interval_estimates", "performance_profile", "aggregate_curves")]
        assert all(len(s) == 1 for s in seen) and seen[0] == seen[1] == seen[2], (cell, seen)
    assert len({next(iter(drawn["aggregate_curves"][c])) for c in cells}) == 3
