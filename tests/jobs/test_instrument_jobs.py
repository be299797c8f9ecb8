"""Instruments and divergence recording in jobs: an injected fault located, the other members bitwise
unchanged; plasticity instruments in every member's metrics; a value explosion after ``patience``
records; all members diverged end the job early and the table names cause and place."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import pytest
import torch
from composing import compose_config

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra before compose)
from rlexp.run.recorder import Recorder
from rlexp.train import run_job

torch.set_num_threads(1)


# ====================================================================== end to end (Hydra + run_job)
TOTAL, STARTS, LOG_EVERY, SEEDS = 2000, 1000, 200, 4
INJECT_MEMBER, INJECT_STEP = 2, 1216  # a multiple of train_frequency (16) after learning starts, not a log step
BASE = [
    f"num_seeds={SEEDS}",
    f"total_steps={TOTAL}",
    "network.hidden=[16,16]",
    f"algo.learning_starts={STARTS}",
    "logger.mode=disabled",
    "logger.progress=off",
    f"logger.log_every={LOG_EVERY}",
]


def read_metrics(out: Path, k: int) -> list[dict]:
    return [json.loads(line) for line in (out / f"seed_{k}" / "metrics.jsonl").read_text().splitlines()]


def read_summary(out: Path, k: int) -> dict:
    return json.loads((out / f"seed_{k}" / "summary.json").read_text())


def without_perf(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in records]


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory):
    cfg = compose_config(BASE)
    assert cfg.algo.train_frequency == 16 and INJECT_STEP % 16 == 0 and INJECT_STEP > STARTS
    out = tmp_path_factory.mktemp("baseline")
    job = run_job(cfg, out)
    return out, job


@pytest.fixture(scope="module", params=["param", "grad", "obs"])
def injected_run(request, tmp_path_factory):
    what = request.param
    cfg = compose_config(
        BASE + [f"debug.inject.member={INJECT_MEMBER}", f"debug.inject.step={INJECT_STEP}", f"debug.inject.what={what}"]
    )
    out = tmp_path_factory.mktemp(f"inject_{what}")
    job = run_job(cfg, out)
    return what, out, job


def test_fault_injection_is_located_and_leaves_other_members_bitwise_unchanged(baseline_run, injected_run):
    base_out, base_job = baseline_run
    what, out, job = injected_run
    assert base_job["counts"] == {"ok": SEEDS, "diverged": 0, "crashed": 0}
    assert job["status"] == "diverged" and job["counts"] == {"ok": SEEDS - 1, "diverged": 1, "crashed": 0}

    member = read_summary(out, INJECT_MEMBER)
    assert member["status"] == "diverged"
    assert member["diverged_at_step"] == INJECT_STEP
    expected = {
        "param": ("nonfinite_param", "q.0.weight"),
        "grad": ("nonfinite_grad", "q.0.weight"),
        "obs": ("nonfinite_obs", "env.obs"),
    }[what]
    assert (member["divergence"]["cause"], member["divergence"]["where"]) == expected
    assert member == job["members"][INJECT_MEMBER]

    # member 2 logs up to the first log step at or after the injection, then stops
    first_log = -(-INJECT_STEP // LOG_EVERY) * LOG_EVERY
    steps = [r["step"] for r in read_metrics(out, INJECT_MEMBER)]
    assert steps == list(range(LOG_EVERY, first_log + 1, LOG_EVERY))
    assert member["steps"] == first_log
    # ... and its records before the injection are those of the run without injection
    base_records = without_perf(read_metrics(base_out, INJECT_MEMBER))
    assert without_perf(read_metrics(out, INJECT_MEMBER))[:-1] == base_records[: len(steps) - 1]

    # the other members are bitwise unchanged
    for k in range(SEEDS):
        if k == INJECT_MEMBER:
            continue
        records = without_perf(read_metrics(out, k))
        assert records == without_perf(read_metrics(base_out, k)), k
        assert records[-1]["step"] == TOTAL and any("grad_norm/q.0" in r for r in records)
        assert read_summary(out, k)["status"] == "ok"


def test_plasticity_instruments_are_in_every_members_metrics(baseline_run):
    out, _ = baseline_run
    for k in range(SEEDS):
        last = read_metrics(out, k)[-1]
        for metric in ("srank", "erank", "active", "feature_norm"):
            for i in range(2):  # the hidden layers
                assert math.isfinite(last[f"{metric}/q.{i}"]), (k, metric, i)
        assert 1 <= last["srank/q.0"] <= 16 and 1 <= last["erank/q.0"] <= 16
        for i in range(3):  # every linear layer
            assert last[f"weight_magnitude/q.{i}"] > 0 and last[f"weight_change/q.{i}"] > 0


# ---------------------------------------------------------------- value explosion
Q_FACTOR = 0.01  # bound = 0.01 * r_max / (1 - gamma) = 1.0 on CartPole: Q values a little trained exceed it


def _spy_record_instruments(monkeypatch) -> list[tuple]:
    """Wrap Recorder.record_instruments: record (step, q_abs_max, reward_scale, grad_norm) of every call."""
    calls: list[tuple] = []
    original = Recorder.record_instruments
    signature = inspect.signature(original)

    def spy(self, *args, **kwargs):
        a = signature.bind(self, *args, **kwargs).arguments
        calls.append(
            (a["step"], a["q_abs_max"].tolist(), torch.as_tensor(a["reward_scale"]).tolist(), a["grad_norm"].tolist())
        )
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Recorder, "record_instruments", spy)
    return calls


@pytest.mark.parametrize("divergence", ["on", "off"])
def test_value_explosion_after_patience_consecutive_records(divergence, tmp_path, monkeypatch):
    calls = _spy_record_instruments(monkeypatch)
    cfg = compose_config(BASE + [f"divergence={divergence}", f"divergence.q_bound_factor={Q_FACTOR}"])
    patience, gamma, g_bound = cfg.divergence.patience, cfg.algo.gamma, cfg.divergence.grad_norm_bound
    job = run_job(cfg, tmp_path)
    reward_scale = max(cfg.algo.r_max, 1.0)  # CartPole rewards are 1
    bound = Q_FACTOR * reward_scale / (1.0 - gamma)
    assert calls and all(c[2] == pytest.approx([reward_scale] * SEEDS) for c in calls)
    assert all(max(c[3]) < g_bound for c in calls)  # no gradient explosion in the way

    # direct computation: per member, the first record ending `patience` consecutive |Q| > bound
    expected_step = {}
    for k in range(SEEDS):
        run = 0
        for step, q_abs, _, _ in calls:
            run = run + 1 if q_abs[k] > bound else 0
            if run >= patience:
                expected_step[k] = step
                break
    assert len(expected_step) == SEEDS  # the setting really exceeds the bound in every member
    assert all(step > calls[patience - 2][0] for step in expected_step.values())  # not before `patience` records

    last_layer = f"q.{len(cfg.network.hidden)}"
    for k in range(SEEDS):
        summary = read_summary(tmp_path, k)
        steps = [r["step"] for r in read_metrics(tmp_path, k)]
        if divergence == "off":
            assert summary["status"] == "ok" and summary["divergence"] is None
            assert steps[-1] == TOTAL
            continue
        assert summary["status"] == "diverged"
        assert summary["diverged_at_step"] == expected_step[k]
        assert summary["divergence"]["cause"] == "value_explosion"
        assert summary["divergence"]["where"] == f"{last_layer}.output"
        assert steps[-1] == summary["steps"] == -(-expected_step[k] // LOG_EVERY) * LOG_EVERY
    if divergence == "off":
        assert job["counts"] == {"ok": SEEDS, "diverged": 0, "crashed": 0}


# ---------------------------------------------------------------- a population that diverges entirely
def test_all_members_diverged_ends_early_and_the_table_names_cause_and_where(tmp_path, capsys, monkeypatch):
    seeds = 2
    logged: list[int] = []
    original_record = Recorder._record

    def spy_record(self, log):
        logged.append(log.step)
        return original_record(self, log)

    monkeypatch.setattr(Recorder, "_record", spy_record)
    cfg = compose_config(BASE + [f"num_seeds={seeds}", "divergence.q_bound_factor=0.001"])
    job = run_job(cfg, tmp_path)  # returns normally
    printed = capsys.readouterr().out
    assert job["status"] == "diverged" and job["counts"] == {"ok": 0, "diverged": seeds, "crashed": 0}
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"
    last_steps = []
    for k in range(seeds):
        summary = read_summary(tmp_path, k)
        assert summary["status"] == "diverged"
        assert summary["steps"] < TOTAL
        assert read_metrics(tmp_path, k)[-1]["step"] == summary["steps"]
        last_steps.append(summary["steps"])
        div = summary["divergence"]
        rows = [line.split() for line in printed.splitlines()]
        row = next(r for r in rows if r[:2] == [str(summary["seed"]), "diverged"])
        assert div["cause"] == "value_explosion"
        assert div["cause"] in row and div["where"] in row
        assert str(summary["diverged_at_step"]) in row
    # the step loop stopped at the log step where the last member diverged
    assert logged == list(range(LOG_EVERY, max(last_steps) + 1, LOG_EVERY))
    assert job["members"] == [read_summary(tmp_path, k) for k in range(seeds)]
