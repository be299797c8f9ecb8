"""A MuZero-lite job: a member poisoned with NaN diverges alone and the others are bitwise unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from composing import compose_config

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra)
from rlexp.train import run_job

torch.set_num_threads(1)


QUIET = ["logger.mode=disabled", "logger.progress=off", "device=cpu", "threads=1"]


# ---------------------------------------------------------------- end to end
RUN = ["algo=muzero_lite", "total_steps=700", "algo.learning_starts=300", "algo.batch_size=16"]
RUN += ["network.hidden=[16]", "algo.state_dim=8", "num_seeds=3", "logger.log_every=200", "diagnostics.every=5"]


def read_metrics(out: Path, k: int) -> list[dict]:
    rows = [json.loads(line) for line in (out / f"seed_{k}" / "metrics.jsonl").read_text().splitlines()]
    return [{key: v for key, v in row.items() if not key.startswith("perf/")} for row in rows]


def test_poisoned_member_diverges_alone_and_the_others_are_bitwise_unchanged(tmp_path):
    runs = {}
    for name, extra in (
        ("base", []),
        ("poisoned", ["debug.inject.member=1", "debug.inject.step=400", "debug.inject.what=param"]),
    ):
        runs[name] = (tmp_path / name, run_job(compose_config(RUN + QUIET + extra), tmp_path / name))
    (base_out, base_job), (out, job) = runs["base"], runs["poisoned"]
    assert base_job["counts"]["ok"] == 3
    assert job["counts"] == {"ok": 2, "diverged": 1, "crashed": 0}
    member = job["members"][1]
    assert member["divergence"]["cause"] == "nonfinite_param"
    assert member["divergence"]["where"] == "repr.0.weight"
    for k in (0, 2):
        records = read_metrics(out, k)
        assert records == read_metrics(base_out, k), k
        assert any("grad_norm/unroll_3/repr" in r and "grad_norm/hidden_5" in r for r in records)
