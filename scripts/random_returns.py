"""The return of a uniformly random policy on each single-agent env preset of conf/env: the *random*
column of the report's normalization table (rlexp.report.stats.NORMALIZATION, docs/report.md).

    python scripts/random_returns.py                       # 100 episodes per env
    python scripts/random_returns.py --episodes 10 --only cartpole pendulum

Per env: episodes with seeds 0..N-1 (``reset(seed=i)``, the action space seeded i), each action drawn
uniformly from the action space, until the episode ends or the env's own time limit truncates it; the
env is built by rlexp's ``make_env`` from the preset (MinAtar: its episode cut, MINATAR_LIMIT). Skips
the multi-agent presets (api other than gymnasium), the Atari ones (ALE/), and any whose optional
extra is missing (saying so). Prints one line per env and writes --out (default
outputs/random_returns.json): per env id the mean, std (population) and n of the episode returns, the
preset and the mean episode length.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

from rlexp.config.schema import ConfigError, EnvConfig
from rlexp.envs.gym import make_env

ROOT = Path(__file__).resolve().parents[1]


def preset(path: Path) -> EnvConfig:
    """The EnvConfig of one conf/env/<name>.yaml (its own keys over the schema's defaults)."""
    own = OmegaConf.load(path)
    own.pop("defaults", None)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(EnvConfig), own))


def random_returns(cfg: EnvConfig, episodes: int) -> tuple[list[float], list[int]]:
    """Returns and lengths (steps) of ``episodes`` uniformly random episodes, seeds 0..episodes-1."""
    env = make_env(cfg)
    returns, lengths = [], []
    try:
        for seed in range(episodes):
            env.reset(seed=seed)
            env.action_space.seed(seed)
            total, steps, done = 0.0, 0, False
            while not done:
                _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
                total, steps, done = total + float(reward), steps + 1, terminated or truncated
            returns.append(total)
            lengths.append(steps)
    finally:
        env.close()
    return returns, lengths


def main(argv: list[str] | None = None) -> None:
    """Measure every selected preset and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=100, help="episodes per env (default 100)")
    parser.add_argument("--only", nargs="*", default=None, help="preset names (conf/env/<name>.yaml); default all")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "random_returns.json")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        print(f"random_returns.py: --episodes={args.episodes}: must be >= 1", file=sys.stderr)
        sys.exit(2)
    paths = sorted((ROOT / "conf" / "env").glob("*.yaml"))
    unknown = sorted(set(args.only or ()) - {p.stem for p in paths})
    if unknown:
        print(f"random_returns.py: --only {' '.join(unknown)}: no such conf/env preset", file=sys.stderr)
        sys.exit(2)
    results = {}
    for path in paths:
        if args.only is not None and path.stem not in args.only:
            continue
        cfg = preset(path)
        if cfg.api != "gymnasium" or cfg.id.startswith("ALE/"):
            print(f"{path.stem}: skipped ({'multi-agent' if cfg.api != 'gymnasium' else 'Atari'})")
            continue
        n, start = args.episodes, time.perf_counter()
        try:
            returns, lengths = random_returns(cfg, n)
        except ConfigError as err:
            print(f"{path.stem}: skipped ({err})")
            continue
        mean, std = statistics.fmean(returns), statistics.pstdev(returns)
        length = statistics.fmean(lengths)
        results[cfg.id] = {"mean": mean, "std": std, "n": n, "preset": path.stem, "mean_length": length}
        print(f"{cfg.id:28s} mean {mean:10.2f}  std {std:9.2f}  n {n:4d}  ({time.perf_counter() - start:.1f} s)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
