"""Evaluate a saved member: ``python -m rlexp.evaluate <run dir> [seed=k] [episodes=N] [video=true]``.

Loads each member's (or member k's) latest checkpoint (``seed_<k>/checkpoint.pt``, written by
``checkpoint.every``; a finished job always leaves its final one), rebuilds its algorithm's networks
from the config stored in it, and plays ``episodes`` evaluation episodes per member with the
Evaluator (``rlexp/run/evaluation.py``: evaluation's own environments and seeds, the deterministic
policy). Prints the mean return per member. ``video=true`` records each member's first episode with
gymnasium's RecordVideo into ``seed_<k>/videos/`` and logs it to a W&B run of the member's name and
group with ``job_type=evaluate`` in ``seed_<k>/videos/wandb/`` (offline unless ``logger.mode``/$WANDB_MODE
say otherwise).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from rlexp.algos import ALGOS
from rlexp.compose.plugins import load_plugins
from rlexp.compose.registry import job_config, register
from rlexp.config.schema import Config, ConfigError
from rlexp.envs.gym import EVALUATION, PopulationEnv
from rlexp.envs.shift import ShiftedEnv
from rlexp.run.checkpoint import FILE, CheckpointError, Checkpoints, read, stack
from rlexp.run.context import RunContext
from rlexp.run.loggers import _fit, resolve_wandb_mode

USAGE = "python -m rlexp.evaluate <run dir> [seed=k] [episodes=N] [video=true]"
VIDEO_INSTALL = "pip install -e '.[video]'"


def parse(args: list[str]) -> tuple[Path, int | None, int | None, bool]:
    """(run dir, member k or None for all, episodes or None for the config's, video) from the command line."""
    if not args or "=" in args[0]:
        raise ConfigError("run dir", "missing", f"usage: {USAGE}")
    options: dict[str, str] = {}
    for arg in args[1:]:
        key, sep, value = arg.partition("=")
        if not sep or key not in ("seed", "episodes", "video"):
            raise ConfigError(key, f"unknown argument {arg!r}", f"usage: {USAGE}")
        options[key] = value
    member = options.get("seed")
    if member is not None and not member.isdigit():
        raise ConfigError("seed", f"{member!r} is not a member index", "seed=k picks seed_<k>/ (k >= 0)")
    episodes = options.get("episodes")
    if episodes is not None and (not episodes.isdigit() or int(episodes) < 1):
        raise ConfigError("episodes", f"{episodes!r}", "an integer >= 1")
    video = options.get("video", "false").lower()
    if video not in ("true", "false"):
        raise ConfigError("video", f"{video!r}", "true or false")
    return (
        Path(args[0]),
        None if member is None else int(member),
        None if episodes is None else int(episodes),
        (video == "true"),
    )


def member_files(run_dir: Path, member: int | None) -> list[Path]:
    """The checkpoint files to load: member k's, or every member's in order; ConfigError when there are none."""
    if not run_dir.is_dir():
        raise ConfigError("run dir", f"{run_dir} is not a directory", f"usage: {USAGE}")
    fix = "train with checkpoint.every=<env steps> (e.g. checkpoint.every=10000); a finished job then leaves one"
    paths = sorted(run_dir.glob(f"seed_*/{FILE}"), key=lambda p: int(p.parent.name.split("_")[1]))
    if not paths:
        raise ConfigError("checkpoint.every", f"{run_dir} holds no checkpoint (seed_<k>/{FILE})", fix)
    if member is None:
        return paths
    path = run_dir / f"seed_{member}" / FILE
    if path not in paths:
        there = ", ".join(f"seed={p.parent.name.split('_')[1]}" for p in paths)
        raise ConfigError("seed", f"{path} does not exist", f"members with a checkpoint: {there}")
    return [path]


def load_policy(run_dir: Path, paths: list[Path], episodes: int | None, video: bool) -> tuple[RunContext, Any, int]:
    """A run context of the members in ``paths`` (one per file), their networks restored from the
    files; returns (context, the deterministic policy, the checkpoints' env step)."""
    contents = [read(p, run_dir) for p in paths]
    steps = {c["step"] for c in contents}
    if len(steps) > 1:
        raise CheckpointError(
            f"{paths[-1].relative_to(run_dir)}: written at another step than {paths[0].parent.name}'s"
        )
    config = json.loads(contents[0]["config"])
    load_plugins(config.get("plugins") or ())  # the job's plugins: its options' entries (ConfigError if one fails)
    try:
        cfg: Config = OmegaConf.to_object(job_config(config))
    except Exception as err:  # a config of another rlexp version
        first_line = str(err).strip().splitlines()[0]
        raise CheckpointError(f"{paths[0].relative_to(run_dir)}: its config does not fit ({first_line})") from None
    cfg.seed, cfg.num_seeds = cfg.seed + contents[0]["member"], len(paths)  # the members' seeds, in order
    cfg.eval = dataclasses.replace(cfg.eval, episodes=episodes or cfg.eval.episodes or 10)
    cfg.checkpoint = dataclasses.replace(cfg.checkpoint, every=0)  # reads, never writes
    ctx = RunContext.create(cfg, torch.device("cpu"))
    if video:  # rendered: stepped one by one through gymnasium's own step
        kwargs = {**cfg.env.kwargs, "render_mode": "rgb_array"}
        ctx.evaluator.env.close()
        env_cfg = dataclasses.replace(cfg.env, num_envs=cfg.eval.episodes, kwargs=kwargs)
        ctx.evaluator.env = PopulationEnv(env_cfg, ctx.seeds, EVALUATION)
        if isinstance(ctx.env, ShiftedEnv):  # env.shift: the members' tasks, as the checkpoint restores them
            ctx.evaluator.env = ShiftedEnv(ctx.evaluator.env, ctx.env.shift, counts=False)
    checkpoints = Checkpoints(run_dir, config, contents[0]["replay"])
    checkpoints.saved = stack([c["state"] for c in contents], contents[0]["shared"])
    ctx.checkpoints = checkpoints  # read only: checkpoint.every is 0
    built = ALGOS[cfg.algo.name].build(ctx)  # the networks as training builds them, then their saved state
    context = {name: part for name, part in ctx.state_parts().items() if name != "recorder"}
    checkpoints.restore(context | built.nets)
    return ctx, built.policy, contents[0]["step"]


def record_videos(ctx: RunContext, paths: list[Path], step: int) -> list[Path]:
    """Wrap each member's first evaluation environment in gymnasium's RecordVideo (its first episode,
    into ``seed_<k>/videos/``); returns where each video will be."""
    from gymnasium.wrappers import RecordVideo

    env, episodes = ctx.evaluator.env, ctx.evaluator.episodes
    videos = []
    for m, path in enumerate(paths):
        folder = path.parent / "videos"
        with warnings.catch_warnings():  # a folder of earlier videos: this one has its own name
            warnings.simplefilter("ignore")
            env.envs[m * episodes] = RecordVideo(
                env.envs[m * episodes],
                video_folder=str(folder),
                episode_trigger=lambda episode: episode == 0,
                name_prefix=f"eval_step{step}",
                disable_logger=True,
            )
        videos.append(folder / f"eval_step{step}-episode-0.mp4")
    return videos


def log_to_wandb(
    ctx: RunContext, run_dir: Path, path: Path, seed: int, step: int, metrics: dict[str, float], video: Path
) -> None:
    """A W&B run of the member's name and group (``job_type=evaluate``, in ``seed_<k>/videos/wandb``) with
    the evaluation's return and its video at the checkpoint's step."""
    mode = resolve_wandb_mode(ctx.cfg.logger)
    if mode == "disabled":
        return
    import wandb

    summary = run_dir / "summary.json"
    cell = json.loads(summary.read_text()).get("cell", "all") if summary.exists() else "all"
    run = wandb.init(
        mode=mode,
        project=ctx.cfg.logger.project,
        entity=ctx.cfg.logger.entity,
        group=_fit(cell, 128),
        name=_fit(f"{cell}/seed={seed}", 128),
        job_type="evaluate",
        config={"checkpoint": str(path), "step": step, "episodes": ctx.evaluator.episodes},
        dir=str(video.parent),  # seed_<k>/videos/wandb: seed_<k>/wandb keeps the one training run
        reinit="create_new",
        settings=wandb.Settings(init_timeout=ctx.cfg.logger.init_timeout, console="off", silent=True),
    )
    try:
        run.log({**metrics, "eval/video": wandb.Video(str(video), format="mp4")}, step=step)
    finally:
        run.finish()


def main(argv: list[str] | None = None) -> None:
    """The command line (see the module docstring); bad input is one line and exit code 2."""
    args = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(args):  # usage, as every command gives it: plain text, exit 0
        print(__doc__.replace("``", ""))
        return
    try:
        run_dir, member, episodes, video = parse(args)
        if video:
            missing = [m for m in ("moviepy", "pygame") if importlib.util.find_spec(m) is None]
            if missing:
                raise ConfigError("video", f"recording needs {' and '.join(missing)}", VIDEO_INSTALL)
        paths = member_files(run_dir, member)
        register()
        ctx, policy, step = load_policy(run_dir, paths, episodes, video)
    except ConfigError as err:
        print(err, file=sys.stderr)
        raise SystemExit(2) from None
    except CheckpointError as err:
        fix = "a new checkpoint needs the job run again (resume=true continues an unfinished one)"
        print(f"corrupt: {run_dir}/{err}; {fix}", file=sys.stderr)
        raise SystemExit(2) from None
    videos = record_videos(ctx, paths, step) if video else []
    evaluation = ctx.evaluator.run(policy, np.ones(ctx.members, dtype=bool))
    ctx.evaluator.close()  # a recording still open is written now
    ctx.env.close()
    for m, path in enumerate(paths):
        returns = evaluation.returns[m]
        metrics = {"eval/return": float(returns.mean()), "eval/return_std": float(returns.std())}
        metrics["eval/length"] = float(evaluation.lengths[m].mean())
        seed = ctx.seeds[m]
        where = f"  video {videos[m]}" if video else ""
        print(
            f"{path.parent.name} (seed {seed}) at step {step}: return {metrics['eval/return']:.2f} "
            f"+- {metrics['eval/return_std']:.2f} over {len(returns)} episodes{where}",
            flush=True,
        )
        if video:
            log_to_wandb(ctx, run_dir, path, seed, step, metrics, videos[m])
    if video and "wandb" in sys.modules:
        sys.modules["wandb"].teardown()  # waits until W&B's service has written every run


if __name__ == "__main__":
    main()
