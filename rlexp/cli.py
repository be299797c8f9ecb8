"""The command line around ``python -m rlexp.train``: its config checked before Hydra makes a dir, and
what a run and a sweep say at their end.

A plain single run is composed once, by Hydra; ``ConfigCheck`` (a Hydra callback) validates its config
(``rlexp.compose.validate.validate``) before Hydra makes the run dir. A multirun, or a command line that may make
one (a sweep, a preset, ``hydra.mode``), is checked whole first: ``check_command_line(argv)`` composes
the config of every job (each combination of its sweeps; more than ``PRODUCT_LIMIT``: each swept value
once, the other keys at their first value) with Hydra's compose API and validates it. A mistake Hydra's
composition refuses (an unknown option or key, a wrong type, an override it cannot parse) becomes one
``ConfigError`` line with the close matches (difflib) — ``translate``; the entry point prints it and
exits with code 2 before any dir is made. Options Hydra answers by itself (``--help``, ``--cfg``,
``--info``, a config dir of one's own: ``-cp``/``-cd``) are left to Hydra.

``SweepSummary`` is the Hydra callback a multirun ends with: one table across its jobs, read from
their ``summary.json`` whichever launcher ran them, the sweep dir and the report command.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hydra.errors import HydraException, MissingConfigException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from rlexp.compose.registry import CONF_DIR, format_default, group_options, own_key_fix, register
from rlexp.config.schema import ConfigError

PRODUCT_LIMIT = 16  # a sweep of at most this many jobs is checked job by job; a larger one value by value
TYPE_NAMES = {
    "Integer": "an integer",
    "Float": "a number",
    "Boolean": "true or false",
    "valid bool": "true or false",
    "ListConfig": "a list",
    "DictConfig": "a block of keys",
}


# ---------------------------------------------------------------- before Hydra: the config of every job
def _close(word: str, options: Sequence[str]) -> list[str]:
    return difflib.get_close_matches(word, list(options), n=3, cutoff=0.6)


# the field's other names for rlexp's options
OTHER_NAMES = {
    "kaiming": "he",
    "kaiming_normal": "he_normal",
    "kaiming_uniform": "he_uniform",
    "glorot": "xavier",
    "glorot_normal": "xavier_normal",
    "glorot_uniform": "xavier_uniform",
    "batchnorm": "batch",
    "layernorm": "layer",
    "rmsnorm": "rms",
    "weightnorm": "weight",
    "spectralnorm": "spectral",
}


def _did_you_mean(word: str, options: Sequence[str], template: str = "{}") -> str:
    """The "did you mean …? " of ``word``: the option it names in another case or by another name the
    field uses (``kaiming`` -> ``he``), else the close matches; "" when none."""
    plain = word.lower().replace("-", "_")
    alias = OTHER_NAMES.get(plain) or OTHER_NAMES.get(plain.replace("_", ""))
    same = [o for o in options if o.lower() == plain or o == alias]
    close = same or _close(word, options)
    guesses = " or ".join(template.replace("{}", c) for c in close)
    return f"did you mean {guesses}? " if close else ""


def _paths_ending(tree: Any, name: str, prefix: str = "") -> list[str]:
    """The dotted paths of ``tree``'s (nested dicts') keys named ``name``, below its top level."""
    found = []
    for key, value in tree.items() if isinstance(tree, dict) else ():
        path = f"{prefix}{key}"
        if key == name and prefix:
            found.append(path)
        found += _paths_ending(value, name, path + ".")
    return found


def _value_of(key: str, overrides: Sequence[str]) -> str:
    """The value the command line gives ``key`` (the last override naming it)."""
    value = "?"
    for line in overrides:
        name, _, rest = line.partition("=")
        if name.lstrip("+~") == key:
            value = rest
    return value


# Hydra's launcher and sweeper plugins rlexp's options build on -> the extra that installs each (pyproject.toml)
HYDRA_PLUGIN_EXTRAS = {"joblib": "joblib", "submitit_slurm": "submitit", "submitit_local": "submitit", "ray": "ray",
                       "optuna": "optuna"}  # fmt: skip


def translate(err: Exception, overrides: Sequence[str], without: Callable[[str], DictConfig]) -> ConfigError:
    """Hydra's refusal ``err`` of the command line ``overrides`` as one ConfigError line naming the key,
    the value and the fix; ``without(key)`` gives the config composed from the overrides but those of
    ``key`` (the keys and the default a fix names)."""
    if isinstance(err, MissingConfigException) and err.missing_cfg_file:
        for line in overrides:
            key, _, value = line.partition("=")
            key = key.lstrip("+~")
            if err.missing_cfg_file == f"{key}/{value}":
                options = group_options(key) if (CONF_DIR / key).is_dir() else [str(o) for o in err.options or []]
                return ConfigError(
                    key,
                    f"unknown option {value!r}",
                    f"{_did_you_mean(value, options, key + '={}')}options: {', '.join(options)}",
                )
    cause = err.__cause__
    full_key = getattr(cause, "full_key", None)
    if isinstance(cause, OmegaConfBaseException) and full_key:
        value = _value_of(full_key, overrides)
        parent, _, name = full_key.rpartition(".")
        text = str(cause).splitlines()[0]
        if "not in" in text or type(cause).__name__ in ("ConfigAttributeError", "ConfigKeyError"):
            node = OmegaConf.select(without(full_key), parent) if parent else without(full_key)
            keys = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
            if not parent:
                keys = [k for k in keys if k != "hydra"]
            where = parent or "the top level"
            prefix = f"{parent}." if parent else ""
            guess = _did_you_mean(name, keys, prefix + "{}=" + value)
            if not guess and not parent:  # a key of a group given at the top level: lr -> optimizer.lr
                nested = _paths_ending(OmegaConf.to_container(without(full_key), resolve=False), name)
                guess = f"did you mean {' or '.join(f'{p}={value}' for p in nested)}?" if nested else ""
            fix = guess.strip() or f"{where} takes: {', '.join(keys)}"
            if parent == "algo":
                fix = own_key_fix(name) or fix
            return ConfigError(full_key, f"unknown key ({full_key}={value})", fix)
        kind = next((kind for word, kind in TYPE_NAMES.items() if word in text), None)
        default = OmegaConf.select(without(full_key), full_key, default=None)
        if isinstance(default, DictConfig | ListConfig):
            default = OmegaConf.to_container(default)
        need = kind or "a value of its type"
        return ConfigError(
            full_key,
            f"{value!r} is not {kind}" if kind else f"{value!r}: {text}",
            f"set {full_key} to {need} (default {format_default(default)})",
        )
    lines = str(err).strip().splitlines() or [type(err).__name__]
    plugin = re.search(r"In 'hydra/(launcher|sweeper)/([\w-]+)': Could not load 'hydra/\1/([\w-]+)'", lines[0])
    if plugin:  # a launcher or sweeper whose Hydra plugin (an extra) is not installed
        group, option, base = plugin.groups()
        extra = HYDRA_PLUGIN_EXTRAS.get(base)
        return ConfigError(
            f"hydra/{group}",
            f"{option} needs Hydra's {base} {group} plugin, which is not installed",
            f"pip install -e '.[{extra}]'" if extra else f"install the plugin that provides hydra/{group}/{base}",
        )
    odd = next((line for line in overrides if not line.isascii()), None)
    if odd is not None and ("Lexer" in lines[0] or "parsing override" in lines[0]):  # Hydra's grammar: ASCII
        key, _, value = odd.partition("=")
        quoted = ",".join(v if v.isascii() else f"'{v}'" for v in value.split(","))
        return ConfigError(
            key.lstrip("+~"),
            f"cannot parse {odd!r}: an unquoted value holds ASCII characters only",
            f'quote it, and quote that for the shell: "{key}={quoted}"',
        )
    match = re.search(r"override '([^']+)'", lines[0])
    if match:  # Error parsing override '<line>' / <what the parser expected>
        line = match.group(1)
        reason = f" ({lines[1].strip()})" if len(lines) > 1 else ""
        return ConfigError(
            line.partition("=")[0].lstrip("+~"),
            f"cannot parse {line!r}{reason}",
            "write key=value, group=option, or key=a,b with -m for a sweep (python -m rlexp.train --help)",
        )
    return ConfigError("command line", lines[0].rstrip("."), "see python -m rlexp.train --help")


def _expand(lists: list[list[str]]) -> list[list[str]]:
    """The jobs of a sweep given each key's overrides: every combination, or when there are more than
    ``PRODUCT_LIMIT``, each key's every value once with the others at their first."""
    if math.prod(len(v) for v in lists) <= PRODUCT_LIMIT:
        return [list(combo) for combo in itertools.product(*lists)]
    jobs = [[v[0] for v in lists]]
    for i, values in enumerate(lists):
        for value in values[1:]:
            jobs.append([value if j == i else v[0] for j, v in enumerate(lists)])
    return jobs


def job_overrides(sweep: Sequence[str]) -> list[list[str]]:
    """The override lists of a multirun's jobs, as Hydra's basic sweeper makes them: ``sweep`` is the
    sweeper's params then the command line; a later override of a key replaces an earlier one. An
    interval (``interval(0, 1)``: a search's range, e.g. the Optuna sweeper's) gives its two ends."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    per_key: dict[str, list[str]] = {}
    for override in OverridesParser.create().parse_overrides(list(sweep)):
        key = override.get_key_element()
        if override.is_sweep_override():
            if override.is_discrete_sweep():
                per_key[key] = [f"{key}={v}" for v in override.sweep_string_iterator()]
            elif override.is_interval_sweep():
                interval = override.value()
                per_key[key] = [f"{key}={interval.start}", f"{key}={interval.end}"]
            else:
                per_key.pop(key, None)
        else:
            per_key[key] = [f"{key}={override.get_value_element_as_str()}"]
    return _expand(list(per_key.values()))


def check_command_line(argv: Sequence[str], conf_dir: Path) -> None:
    """Compose and validate every job ``argv`` (``python -m rlexp.train``'s arguments) names; a ConfigError
    on the first refusal. Nothing for the options Hydra answers by itself."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    args = get_args_parser().parse_args(list(argv))
    answered_by_hydra = ("help", "hydra_help", "version", "cfg", "info", "shell_completion", "experimental_rerun")
    if any(getattr(args, name, None) for name in (*answered_by_hydra, "config_path", "config_dir")):
        return
    config_name = args.config_name or "config"
    overrides = list(args.overrides)
    register()

    def composed(lines: Sequence[str], hydra: bool = False) -> DictConfig:
        def without(key: str) -> DictConfig:
            others = [line for line in lines if line.partition("=")[0].lstrip("+~") != key]
            try:
                return compose(config_name, others, return_hydra_config=True)
            except (HydraException, OmegaConfBaseException):  # another bad override: the defaults
                return compose(config_name, [], return_hydra_config=True)

        try:
            return compose(config_name, list(lines), return_hydra_config=hydra)
        except (HydraException, OmegaConfBaseException) as err:
            raise translate(err, lines, without) from None

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3", job_name="train"):
        try:
            parsed = OverridesParser.create().parse_overrides(overrides)
        except HydraException as err:
            raise translate(err, overrides, lambda key: compose(config_name, [], return_hydra_config=True)) from None
        fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
        base = composed(fixed, hydra=True)
        multirun = args.multirun or base.hydra.mode == RunMode.MULTIRUN
        swept = [o for o in parsed if o.is_sweep_override()]
        if not multirun:
            if swept:
                key = swept[0].get_key_element()
                raise ConfigError(
                    key,
                    f"{swept[0].input_line} is a sweep in a single run",
                    f"add -m to run one job per value, or write {key}=[...] for a list",
                )
            check_config(base)
            return
        check_launcher(base)
        params = base.hydra.sweeper.get("params")
        params = OmegaConf.to_container(params) if isinstance(params, DictConfig) else {}
        sweep = [f"{k}={v}" for k, v in params.items()] + overrides
        try:
            jobs = job_overrides(sweep)
        except HydraException as err:
            raise translate(err, sweep, lambda key: base) from None
        for job in jobs:
            check_config(composed(job))


def check_launcher(config: DictConfig) -> None:
    """A multirun's launcher checks its own settings before Hydra starts, when its class offers
    ``check_settings(conf, sweep_dir)`` (rlexp_packed: its backend, ``max_members``): a ConfigError."""
    from hydra.utils import get_class

    try:
        launcher = get_class(str(config.hydra.launcher._target_))
    except Exception:  # a plugin not installed: Hydra's composition names it
        return
    check = getattr(launcher, "check_settings", None)
    if check is not None:
        check(config.hydra.launcher, Path(str(config.hydra.sweep.dir)))


def needs_whole_check(argv: Sequence[str]) -> bool:
    """True unless ``argv`` is a plain single run: no -m, no sweep, no preset or Hydra mode that may make
    one (those are checked job by job before Hydra starts, ``check_command_line``). A plain single run's
    config is composed once, by Hydra, and checked by ``ConfigCheck`` before Hydra makes its dir."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = get_args_parser().parse_args(list(argv))
    if args.multirun or args.config_name:
        return True
    try:
        parsed = OverridesParser.create().parse_overrides(list(args.overrides))
    except HydraException:
        return True  # check_command_line names the mistake
    keys = [o.get_key_element().lstrip("+~") for o in parsed]
    return any(o.is_sweep_override() for o in parsed) or any(k in ("experiment", "hydra.mode") for k in keys)


def check_config(config: DictConfig) -> None:
    """Validate a composed config (Hydra's keys aside): a ConfigError on a config mistake; nothing for an
    error that is not one (an env that raises while built), which the job records as its crash."""
    from rlexp.compose.validate import validate

    if "hydra" in config:
        config = config.copy()
        with open_dict(config):
            del config["hydra"]
    try:
        validate(config)
    except ConfigError:
        raise
    except Exception:
        pass


class ConfigCheck(Callback):
    """Hydra callback: a single run's config is validated before Hydra makes its dir (a refusal is one
    line and exit code 2; ``check_command_line`` has checked a multirun's every job before Hydra started)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_config(config)
        except ConfigError as err:
            print(err, file=sys.stderr)
            raise SystemExit(2) from None


# ---------------------------------------------------------------- after: where the outputs went
def sync_lines(root: Path, members: str) -> list[str]:
    """How to upload the offline W&B runs under ``root`` (``members``: the glob of its member dirs)."""
    return [
        f"W&B runs are offline; upload them with: wandb sync {shlex.quote(str(root))}/{members}/wandb/offline-run-*",
        f"  (or: python -m rlexp.sync {shlex.quote(str(root))}, which skips unfinished and crashed jobs)",
    ]


def end_of_run_lines(out_dir: Path, wandb_mode: str) -> list[str]:
    """What a single run prints last: where its outputs are and, offline, how to upload its W&B runs."""
    lines = [f"outputs: {out_dir}"]
    return lines + (sync_lines(out_dir, "seed_*") if wandb_mode == "offline" else [])


def sweep_table(sweep_dir: Path) -> list[str]:
    """One line per job of a sweep dir (its cell, status counts, IQM of the members' final evaluation
    return, wall time), read from the job dirs' ``summary.json``; a job without one is 'no summary'. The
    jobs are those of the grid the sweep records (``rlexp.run.sweep.expected_jobs``; one never started
    is 'not started'), else the job dirs present."""
    from rlexp.report.stats import iqm_fast
    from rlexp.run.jobs import job_dirs
    from rlexp.run.sweep import expected_jobs

    rows = [("job", "cell", "ok", "div", "crash", "IQM eval", "n", "wall s")]
    present = job_dirs(sweep_dir) if sweep_dir.is_dir() else []
    expected = expected_jobs(sweep_dir)
    for job_dir in present if expected is None else [d for d, _ in expected]:
        if job_dir not in present:
            rows.append((job_dir.name, "(not started)", "", "", "", "", "", ""))
            continue
        try:
            job = json.loads((job_dir / "summary.json").read_text())
            counts = job["counts"]
        except (OSError, ValueError, KeyError, TypeError):
            rows.append((job_dir.name, "(no summary: unfinished or crashed)", "", "", "", "", "", ""))
            continue
        scores = [m.get("eval_return") for m in job.get("members", [])]
        scores = [float(s) for s in scores if isinstance(s, (int, float)) and math.isfinite(s)]
        rows.append(
            (
                job_dir.name,
                str(job.get("cell", "")),
                str(counts.get("ok", 0)),
                str(counts.get("diverged", 0)),
                str(counts.get("crashed", 0)),
                f"{iqm_fast(scores):.1f}" if scores else "-",
                str(len(scores)),
                f"{job.get('wall_s', 0):.1f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    cells = (zip(row, widths) for row in rows)
    return ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(row)).rstrip() for row in cells]


class SweepSummary(Callback):
    """Hydra callback at a multirun's end, whichever launcher ran its jobs: the table across its jobs
    (``sweep_table``), the sweep dir, and the commands to run next. Hydra skips ``on_multirun_end`` when
    a job raised; the entry point then calls ``flush`` after Hydra's error, so a sweep with a crashed
    job ends with its table too."""

    pending: DictConfig | None = None  # the config of the multirun started in this process, until it is summed up

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        SweepSummary.pending = config

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        SweepSummary.pending = config
        SweepSummary.flush()

    @staticmethod
    def flush() -> None:
        """Print the summary of the multirun started in this process, once; nothing when none is pending."""
        config, SweepSummary.pending = SweepSummary.pending, None
        if config is None:
            return
        from rlexp.run.loggers import resolve_wandb_mode

        sweep_dir = Path(config.hydra.sweep.dir).absolute()
        lines = ["", f"sweep: {sweep_dir}", *sweep_table(sweep_dir), ""]
        lines.append(f"next: python -m rlexp.report {shlex.quote(str(sweep_dir))}")
        if resolve_wandb_mode(config.logger) == "offline":
            lines += sync_lines(sweep_dir, "*/seed_*")
        print("\n".join(lines), flush=True)
