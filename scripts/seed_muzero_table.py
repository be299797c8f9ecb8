"""The tables of docs/muzero.md from a finished grid of +experiment=seed_muzero:

    python -m rlexp.train +experiment=seed_muzero
    python scripts/seed_muzero_table.py outputs/grids/seed_muzero

Per cell (algo.dynamics_grad_scale x clipping), over its seeds: the gradient norm each unroll step's
loss sends into the representation network (grad_norm/unroll_<k>/repr, before clipping), averaged over
every written instrument record of every member; the whole update's gradient norm before and after
clipping (train/grad_norm, train/grad_norm_post_clip: means over the run) and its largest value
(train/grad_norm_max); the largest |v_hat| seen; the members that diverged; and the final evaluation
return (mean, and the members >= 475).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from omegaconf import OmegaConf


def member_figures(member_dir: Path, unroll: int) -> dict[str, float]:
    """One member's figures (see the module docstring)."""
    records = [json.loads(line) for line in (member_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((member_dir / "summary.json").read_text())
    row = {"return": summary.get("eval_return") or float("nan"), "diverged": float(summary["status"] == "diverged")}
    for k in range(unroll + 1):
        values = [r[f"grad_norm/unroll_{k}/repr"] for r in records if f"grad_norm/unroll_{k}/repr" in r]
        row[f"unroll_{k}"] = statistics.fmean(values) if values else float("nan")
    train = [r for r in records if "train/grad_norm" in r]
    row["grad_norm"] = statistics.fmean(r["train/grad_norm"] for r in train)
    row["grad_norm_post"] = statistics.fmean(r["train/grad_norm_post_clip"] for r in train)
    row["grad_norm_max"] = max(r["train/grad_norm_max"] for r in train)
    row["v_abs_max"] = max((r["v/abs_max"] for r in records if "v/abs_max" in r), default=float("nan"))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", type=Path, help="the grid's sweep dir (outputs/grids/seed_muzero)")
    args = parser.parse_args()
    rows = []
    jobs = [p for p in args.grid.iterdir() if p.name.isdigit() and (p / "summary.json").exists()]  # finished
    for job in sorted(jobs, key=lambda p: int(p.name)):
        cfg = OmegaConf.load(job / ".hydra" / "config.yaml")
        unroll = cfg.algo.unroll_steps
        members = [member_figures(d, unroll) for d in sorted(job.glob("seed_*"))]
        mean = {k: statistics.fmean(m[k] for m in members) for k in members[0]}
        mean["grad_norm_max"] = max(m["grad_norm_max"] for m in members)
        mean["v_abs_max"] = max(m["v_abs_max"] for m in members)
        mean["diverged"] = sum(m["diverged"] for m in members)
        mean["passed"] = sum(m["return"] >= 475 for m in members)
        rows.append((cfg.algo.dynamics_grad_scale, cfg.clipping.name, len(members), unroll, mean))

    unroll = rows[0][3]
    head = ["grad scale", "clipping"] + [f"k={k}" for k in range(unroll + 1)] + [f"k={unroll} / k=1"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for scale, clipping, _, _, m in rows:
        cells = [f"{scale}", clipping] + [f"{m[f'unroll_{k}']:.3g}" for k in range(unroll + 1)]
        cells.append(f"{m[f'unroll_{unroll}'] / m['unroll_1']:.3g}")
        print("| " + " | ".join(cells) + " |")
    print()
    head = ["grad scale", "clipping", "seeds", "diverged", "‖g‖ mean", "‖g‖ after clipping", "‖g‖ max"]
    head += ["max \\|v̂\\|", "eval return", "eval >= 475"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for scale, clipping, seeds, _, m in rows:
        cells = [f"{scale}", clipping, str(seeds), f"{m['diverged']:.0f}", f"{m['grad_norm']:.3g}"]
        cells += [f"{m['grad_norm_post']:.3g}", f"{m['grad_norm_max']:.3g}", f"{m['v_abs_max']:.3g}"]
        cells += [f"{m['return']:.0f}", f"{m['passed']}/{seeds}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
