"""Benchmarks, measured side by side in one invocation (alternating A/B, medians of repeats).

    python scripts/bench.py                # diagnostics at their default rate vs off, DQN CartPole 50k
    python scripts/bench.py --quick        # a reduced version (10k steps, 3 repeats)
    python scripts/bench.py --steps 2000 --repeats 1   # a smoke run

Each measurement is a fresh `python -m rlexp.train` process (W&B disabled, no progress output);
the figure is the training loop's wall time, read from the job's summary.json (start-up excluded).
Writes bench.json (medians, ratios, every sample, machine, versions) next to this script's repo root
unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]


def run_once(overrides: List[str], workdir: Path) -> float:
    """One training job in a fresh process; returns its loop wall time in seconds."""
    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    command = [sys.executable, "-m", "rlexp.train", *overrides, "logger.mode=disabled", "logger.progress=off",
               f"hydra.run.dir={run_dir}"]
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "WANDB_SILENT": "true"})
    return json.loads((run_dir / "summary.json").read_text())["wall_s"]


def versions() -> Dict[str, str]:
    import gymnasium
    import hydra
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "hydra": hydra.__version__,
            "gymnasium": gymnasium.__version__}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10k steps, 3 repeats")
    parser.add_argument("--steps", type=int, help="env steps per run (default 50k; 10k with --quick)")
    parser.add_argument("--repeats", type=int, help="A/B pairs (default 5; 3 with --quick)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench.json")
    args = parser.parse_args()
    steps = args.steps or (10_000 if args.quick else 50_000)
    repeats = args.repeats or (3 if args.quick else 5)

    # name -> overrides; measured alternately, case after case, in every repeat. The explosion checks
    # are off in both cases so that no member can be stopped early: both do the same training work.
    cases = {
        "diagnostics_default": [f"total_steps={steps}", "divergence=off"],
        "diagnostics_off": [f"total_steps={steps}", "divergence=off", "diagnostics.every=0"],
    }
    samples: Dict[str, List[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as workdir:
        for r in range(repeats):
            for name, overrides in cases.items():
                samples[name].append(run_once(overrides, Path(workdir)))
                print(f"[{r + 1}/{repeats}] {name}: {samples[name][-1]:.2f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    overhead = medians["diagnostics_default"] / medians["diagnostics_off"] - 1.0
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor()},
        "versions": versions(),
        "steps": steps,
        "repeats": repeats,
        "medians_s": medians,
        "samples_s": samples,
        "ratios": {"diagnostics_overhead": overhead},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'case':24s} {'median s':>9s}")
    for name, value in medians.items():
        print(f"{name:24s} {value:9.2f}")
    print(f"diagnostics overhead (default rate vs off): {overhead * 100:+.1f}%  -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
