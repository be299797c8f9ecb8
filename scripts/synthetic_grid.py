"""A full stability grid on disk without training it, for measuring the report: 192 job dirs of 8
members, built from one real job (the same files, keys and sizes: summary.json, .hydra/, metrics.jsonl,
the W&B offline run dirs hard-linked), with returns scaled per cell and ~57 diverged members in ~21
jobs as the real grid has (docs/grids.md).

    python -m rlexp.train +experiment=stability_grid activation=relu init=he normalization=none \\
        clipping=none optimizer=adam hydra.sweep.dir=/tmp/template             # one real job, ~20-60 s
    python scripts/synthetic_grid.py /tmp/template/0 /tmp/synthetic_grid      # 192 jobs
    python -m rlexp.report /tmp/synthetic_grid
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
from pathlib import Path

GRID = {
    "activation": ["relu", "elu", "tanh", "softsign"],
    "init": ["xavier", "he", "orthogonal"],
    "normalization": ["none", "batch", "layer", "weight"],
    "clipping": ["none", "global_norm"],
    "optimizer": ["adam", "rmsprop"],
}
RETURNS = ("episode/return", "episode/return_last10", "eval/return")


def link_tree(src: Path, dst: Path) -> None:
    """A copy of ``src`` whose files are hard links (same sizes, no extra disk)."""
    for path in src.rglob("*"):
        target = dst / path.relative_to(src)
        if path.is_dir() and not path.is_symlink():
            target.mkdir(parents=True, exist_ok=True)
        elif path.is_file() and not path.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, target)


def scaled(line: str, factor: float) -> str:
    record = json.loads(line)
    for key in RETURNS:
        if isinstance(record.get(key), float):
            record[key] *= factor
    return json.dumps(record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("template", type=Path, help="a finished job dir of the stability grid (8 members)")
    parser.add_argument("out", type=Path, help="the sweep dir to write (must not exist)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    template = json.loads((args.template / "summary.json").read_text())
    healthy = [m for m in template["members"] if m["status"] == "ok"]
    broken = next((m for m in template["members"] if m["status"] == "diverged"), None)
    if broken is None:
        raise SystemExit("the template job needs a diverged member (its divergence record is copied)")
    lines = {m["member"]: (args.template / f"seed_{m['member']}" / "metrics.jsonl").read_text().splitlines()
             for m in template["members"]}  # fmt: skip
    args.out.mkdir(parents=True)
    shutil.copy(args.template.parent / "multirun.yaml", args.out / "multirun.yaml")
    for k, values in enumerate(itertools.product(*GRID.values())):
        choices = dict(zip(GRID, values))
        job = args.out / str(k)
        shutil.copytree(args.template / ".hydra", job / ".hydra")
        overrides = [f"- {key}={value}\n" for key, value in choices.items()] + ["- +experiment=stability_grid\n"]
        (job / ".hydra" / "overrides.yaml").write_text("".join(overrides))
        factor = rng.uniform(0.2, 1.2)
        diverging = set(rng.sample(range(8), rng.randint(1, 5))) if rng.random() < 21 / 192 else set()
        members = []
        for member in range(8):
            source = broken if member in diverging else healthy[member % len(healthy)]
            summary = {**source, "member": member, "seed": member}
            for key in ("final_return", "eval_return"):
                summary[key] = None if source[key] is None else source[key] * factor
            member_dir = job / f"seed_{member}"
            member_dir.mkdir()
            text = [scaled(line, factor) for line in lines[source["member"]]]
            (member_dir / "metrics.jsonl").write_text("\n".join(text) + "\n")
            (member_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            run = next((args.template / f"seed_{source['member']}" / "wandb").glob("offline-run-*"))
            run_id = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8))
            link_tree(run, member_dir / "wandb" / f"{run.name.rsplit('-', 1)[0]}-{run_id}")
            members.append(summary)
        statuses = [m["status"] for m in members]
        job_summary = {
            **template,
            "status": "diverged" if diverging else "ok",
            "cell": ",".join(["+experiment=stability_grid", *(f"{key}={value}" for key, value in choices.items())]),
            "choices": {**template["choices"], **choices},
            "members": members,
            "counts": {s: statuses.count(s) for s in ("ok", "diverged", "crashed")},
        }
        (job / "summary.json").write_text(json.dumps(job_summary, indent=2))
    print(f"wrote 192 jobs to {args.out}")


if __name__ == "__main__":
    main()
