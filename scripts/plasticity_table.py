"""The table of docs/plasticity.md from a finished grid of +experiment=plasticity:

    python -m rlexp.train +experiment=plasticity hydra/launcher=rlexp_joblib
    python scripts/plasticity_table.py outputs/grids/plasticity
    python scripts/plasticity_table.py outputs/findings/dormant_redo --by algo.gradient_steps --end 20000

Per cell (intervention x ``--by``, default the activation), over its seeds: the members that diverged,
the mean of each member's last evaluation return (a diverged member's is its last before it diverged),
of each member's instruments averaged over its records in the ``--window`` env steps up to ``--end``
(default the end of training; dormant fraction and feature rank of each hidden layer of q; members
that diverged before the window are left out) and of the units redo recycled per member.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from omegaconf import OmegaConf

LAYERS = ("q.0", "q.1")


def member_row(member_dir: Path, window: int, end: int) -> dict[str, float]:
    """One member's figures: its last eval return, instruments averaged over the window up to env step
    ``end``, units recycled."""
    records = [json.loads(line) for line in (member_dir / "metrics.jsonl").read_text().splitlines()]
    late = [r for r in records if end - window < r["step"] <= end and f"dormant/{LAYERS[0]}" in r]
    summary = json.loads((member_dir / "summary.json").read_text())
    row = {"return": summary["eval_return"], "diverged": float(summary["status"] == "diverged")}
    for metric in ("dormant", "srank"):
        for layer in LAYERS:
            values = [r[f"{metric}/{layer}"] for r in late if isinstance(r.get(f"{metric}/{layer}"), float)]
            row[f"{metric}/{layer}"] = statistics.fmean(values) if values else float("nan")
    last = records[-1]
    row["recycled"] = sum(v for k, v in last.items() if k.startswith("intervention/recycled/"))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", type=Path, help="the grid's sweep dir (outputs/grids/plasticity)")
    parser.add_argument("--window", type=int, default=10_000, help="env steps the instruments average")
    parser.add_argument("--end", type=int, help="the window's last env step (default: the end of training)")
    parser.add_argument("--by", default="activation.name", help="the second key of a cell (default activation)")
    args = parser.parse_args()
    rows = []
    for job in sorted((p for p in args.grid.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        cfg = OmegaConf.load(job / ".hydra" / "config.yaml")
        end = cfg.total_steps if args.end is None else args.end
        members = [member_row(d, args.window, end) for d in sorted(job.glob("seed_*"))]
        mean = {k: statistics.fmean([m[k] for m in members if m[k] == m[k]] or [float("nan")]) for k in members[0]}
        mean["diverged"] *= len(members)
        rows.append((cfg.intervention.name, str(OmegaConf.select(cfg, args.by)), len(members), mean))
    head = ["intervention", args.by.removesuffix(".name"), "seeds", "diverged", "eval return"]
    head += [f"dormant {layer}" for layer in LAYERS] + [f"srank {layer}" for layer in LAYERS]
    head += ["units recycled"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, second, seeds, m in rows:
        cells = [name, second, str(seeds), f"{m['diverged']:.0f}", f"{m['return']:.0f}"]
        cells += [f"{m[f'dormant/{layer}']:.2f}" for layer in LAYERS]
        cells += [f"{m[f'srank/{layer}']:.1f}" for layer in LAYERS]
        cells += [f"{m['recycled']:.0f}" if name == "redo" else "-"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
