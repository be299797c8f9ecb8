"""PBT jobs: a round changes only the copied member (DQN, TD3) and its lineage reaches metrics.jsonl,
summary.json, the W&B run and the report; a PBT job is never packed."""

from __future__ import annotations

import json

import pytest
from composing import compose_config
from launching import read_jsonl, wandb_run_dir
from launching import wandb_items as _items

from rlexp.config.schema import ConfigError
from rlexp.report.html import render_html
from rlexp.report.main import build_report
from rlexp.run.pack import Cell, run_pack
from rlexp.run.runner import run_population
from rlexp.run.wandb_files import read_records
from rlexp.train import prepare

P = 4


DQN = ["algo=dqn", "env=cartpole", "num_seeds=4", "total_steps=1200", "algo.learning_starts=200"]
DQN += ["algo.target_update_period=16", "logger.log_every=300", "eval.every=300", "eval.episodes=2"]
TD3 = ["algo=td3", "env=pendulum", "num_seeds=4", "total_steps=600", "network.hidden=[16,16]"]
TD3 += ["algo.learning_starts=100", "algo.batch_size=32", "logger.log_every=150", "eval.every=150"]
TD3 += ["eval.episodes=1", "env.max_episode_steps=50", "pbt.hyperparameters=[optimizer.lr]"]
CLOCKS = ("perf/steps_per_s",)


def records(job_dir, k: int) -> list[dict]:
    return [
        {n: v for n, v in r.items() if n not in CLOCKS and not n.startswith("pbt/")}
        for r in read_jsonl(job_dir / f"seed_{k}" / "metrics.jsonl")
    ]


def one_round(tmp_path, base: list[str], interval: int, mode: str = "disabled") -> tuple:
    """A population with one PBT round at env step ``interval`` and its twin without one (its first round
    would come after the end); every member that was not copied writes the same records in both, the
    copied one the same up to the round's record (the round follows it), then its parent's state.
    Returns (the PBT job dir, member summaries, the copied member, its copy)."""
    pbt_dir, twin_dir = tmp_path / "pbt", tmp_path / "twin"
    base = [*base, "pbt.fraction=0.25", "logger.progress=off"]
    run_population(compose_config([*base, f"pbt.interval={interval}", f"logger.mode={mode}"]), pbt_dir, prepare)
    run_population(compose_config([*base, f"pbt.interval={10 * interval}", "logger.mode=disabled"]), twin_dir, prepare)
    summaries = [json.loads((pbt_dir / f"seed_{k}" / "summary.json").read_text()) for k in range(P)]
    copied = [k for k, s in enumerate(summaries) if s["pbt"]["lineage"]]
    assert len(copied) == 1  # int(0.25 * 4) members copy
    k = copied[0]
    (event,) = summaries[k]["pbt"]["lineage"]
    assert event["round"] == 1 and event["step"] == interval and event["parent"] != k
    parent = summaries[event["parent"]]["pbt"]
    assert summaries[k]["pbt"]["hyperparameters"] == event["new"]
    for key, value in event["new"].items():  # the parent's value times a factor
        ratio = value / parent["hyperparameters"][key]
        assert any(abs(ratio - f) < 1e-12 for f in (0.8, 1.25)) or value == 1.0, (key, ratio)
    at = next(i for i, r in enumerate(records(pbt_dir, k)) if r["step"] == interval) + 1
    for m in range(P):
        mine, twin = records(pbt_dir, m), records(twin_dir, m)
        if m == k:
            assert mine[:at] == twin[:at] and mine[at:] != twin[at:]
        else:
            assert mine == twin, m
    return pbt_dir, summaries, k, event


def test_a_dqn_round_changes_only_the_copied_member_and_logs_its_lineage(tmp_path):
    pbt_dir, summaries, k, event = one_round(tmp_path, DQN, 600, mode="offline")
    # metrics.jsonl: every member's values at the round; the copied member's parent and old values
    rounds = {m: [r for r in read_jsonl(pbt_dir / f"seed_{m}" / "metrics.jsonl") if "pbt/round" in r] for m in range(P)}
    assert all(len(r) == 1 and r[0]["step"] == 600 for r in rounds.values())
    (row,) = rounds[k]
    assert row["pbt/parent"] == event["parent"] and row["pbt/lr"] == event["new"]["optimizer.lr"]
    assert row["pbt/old/exploration_fraction"] == event["old"]["algo.exploration_fraction"]
    # the W&B run's config follows the round (an update made while the run opens waits for it: the latest wins)
    (log,) = sorted(wandb_run_dir(pbt_dir / f"seed_{k}").glob("run-*.wandb"))
    updates = [_items(r.config.update) for r in read_records(log) if r.WhichOneof("record_type") == "config"]
    member = [u["pbt_member"] for u in updates if "pbt_member" in u]
    assert member and member[-1]["parent"] == event["parent"] and member[-1]["lr"] == event["new"]["optimizer.lr"]
    # the report's lineage table
    html = render_html(build_report(pbt_dir, draw=False, reps=50))
    assert "Population-based training" in html and f"{event['old']['optimizer.lr']:.3g}" in html


@pytest.mark.slow
def test_a_td3_round_changes_only_the_copied_member(tmp_path):
    one_round(tmp_path, TD3, 300)


def test_a_pbt_job_is_never_packed(tmp_path):
    cfg = compose_config(["num_seeds=2", "pbt.interval=1000", "eval.every=1000", "logger.mode=disabled"])
    (result,) = run_pack([Cell(cfg, tmp_path / "0")], prepare)
    assert isinstance(result, ConfigError) and result.key == "pbt.interval", result
