"""Entry point: ``python -m rlexp.train [group=option ...] [-m]``.

One job trains a population of ``num_seeds`` members; ``-m`` sweeps with Hydra's launcher. Here, and
only here (``prepare``, which the job runner ``rlexp.run.runner.run_population`` calls once it has
checked the job's dir): validate the config, pick the algorithm (``ALGOS[cfg.algo.name]``) and set
the process-wide state:

- the garbage collector: off while ``python -m rlexp.train`` imports torch and Hydra (~200k objects
  that all live on), then those are frozen out of every later collection and it is back on; each job
  freezes what exists before it trains (a sweep's worker processes never run this module as main);
- torch's intra-op threads: ``threads`` (0 = torch's default, -1 = ``population_threads``);
- glibc's allocator keeps freed memory (``keep_freed_memory``);
- the warnings filter: torch's note on the gradient layout of the pipelines' flat buffers is silenced.

Importing this module does nothing else.
"""

from __future__ import annotations

import ctypes
import gc
import platform
import sys

if __name__ == "__main__":
    gc.disable()  # the imports below make ~200k objects (torch, hydra) that all live on: no collections meanwhile

import os
import signal
import traceback
import warnings
from pathlib import Path
from typing import Any, NoReturn

import hydra
import torch
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException, ConfigCompositionException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig

from rlexp.algos import ALGOS
from rlexp.cli import SweepSummary, check_command_line, end_of_run_lines, needs_whole_check
from rlexp.compose.plugins import load_plugins, plugins_on_command_line
from rlexp.compose.registry import CONF_DIR, help_text, register
from rlexp.compose.validate import resolve_device, validate
from rlexp.config.cells import cell_name, job_settings, single_cell, sweep_cell_keys, sweep_name
from rlexp.config.schema import ConfigError
from rlexp.run.context import Algorithm
from rlexp.run.jobs import DiskFull, Terminated, sweep_terminated, worker_job
from rlexp.run.loggers import resolve_wandb_mode
from rlexp.run.runner import run_population
from rlexp.run.sweep import release_sweep

register()  # here, not under __main__: launcher workers import this module to run a job

if __name__ == "__main__":
    gc.freeze()  # keep the collector off the imported objects from now on
    gc.enable()


def population_threads(members: int) -> int:
    """``threads=-1``: torch threads for a population of ``members`` — one per 8 members (a smaller
    population's matmuls are too small to split), at most the cores this process may use."""
    return max(1, min(len(os.sched_getaffinity(0)), members // 8))


def keep_freed_memory() -> None:
    """Have glibc's malloc keep freed memory for the next allocation instead of returning it to the
    kernel: blocks up to 32 MiB come from the heap, not a fresh mmap each, and the heap's top is
    trimmed only beyond 1 GiB. An update's temporaries ([P, B, H] float32: 3 MiB at P = 96) are
    then reused, not faulted in page by page and zeroed again at every op; results are unchanged
    (torch aligns every tensor to 64 bytes either way). A no-op off glibc."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # <malloc.h>
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 1 << 30)
    mallopt(m_top_pad, 64 << 20)


def set_process_state(cfg: DictConfig) -> None:
    """Before a job: subnormal floats flushed to zero or not (``cfg.flush_denormal``: this thread's mode,
    which threads started later inherit), torch's threads from ``cfg.threads``, glibc's allocator
    (``keep_freed_memory``), the collector kept off every object that exists now (imports, Hydra's
    config, ...) for the rest of the process, and torch's note on the gradient layout silenced (a
    member's gradient is a strided view into its pipeline's flat buffer, which backward adds into in
    place: nothing is copied or lost)."""
    torch.set_flush_denormal(cfg.flush_denormal)  # before torch starts its threads; False where the CPU cannot
    threads = population_threads(cfg.num_seeds) if cfg.threads == -1 else cfg.threads
    if threads > 0:
        torch.set_num_threads(threads)
    keep_freed_memory()
    gc.freeze()
    warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")


def prepare(cfg: DictConfig) -> tuple[Algorithm, torch.device]:
    """Validate ``cfg`` (ConfigError on a bad value, before any work), set the process state, and pick
    the algorithm and the device."""
    validate(cfg)
    set_process_state(cfg)
    return ALGOS[cfg.algo.name].train, resolve_device(cfg.device)


def run_job(
    cfg: DictConfig, out_dir: Path, cell: str = "default", choices: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run one job in ``out_dir`` and return its summary (``rlexp.run.runner.run_population``): skipped
    when it is finished and ``resume`` is set, refused (ConfigError) when it is finished and
    ``resume`` is not, else validated (ConfigError on a bad value), then trained."""
    return run_population(cfg, out_dir, prepare, cell, choices)


def job_identity() -> tuple[Path, str, dict[str, str]]:
    """The job's output dir (absolute), its cell (``rlexp.config.cells``: in a multirun the settings its sweep
    varies, alone ``single_cell``) and its group choices."""
    hc = HydraConfig.get()
    task = list(hc.overrides.task)
    keys = sweep_cell_keys(Path(hc.sweep.dir)) if hc.mode == RunMode.MULTIRUN else None
    if keys is None:  # a single run (or a sweep without Hydra's record): what its command line sets
        cell = single_cell(hc.runtime.choices, task)
    else:
        cell = cell_name(job_settings(hc.runtime.choices, task), keys)
    choices = {k: str(v) for k, v in hc.runtime.choices.items() if not k.startswith(("hydra", "schema"))}
    return Path(hc.runtime.output_dir).absolute(), cell, choices


def name_sweep(cfg: DictConfig) -> None:
    """Give a multirun's job its sweep's default ``logger.sweep`` (``sweep_name`` of the sweep dir) unless
    the command line names one: every member run of the sweep is grouped and tagged by it in W&B."""
    hc = HydraConfig.get()
    if cfg.logger.sweep is None and hc.mode == RunMode.MULTIRUN:
        cfg.logger.sweep = sweep_name(Path(hc.sweep.dir))


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict[str, Any]:
    name_sweep(cfg)
    out_dir, cell, choices = job_identity()
    single = HydraConfig.get().mode != RunMode.MULTIRUN  # a sweep ends with rlexp.cli.SweepSummary's table
    try:
        with worker_job():  # in a launcher's worker: a SIGTERM stops the job and every later one
            return run_job(cfg, out_dir, cell, choices)
    except ConfigError as err:
        if not single:
            raise  # this job fails; the sweep runs the others and exits non-zero at the end
        single = False  # refused: no outputs to point to
        print(err, file=sys.stderr)  # a single run: the one line, no traceback
        raise SystemExit(2) from None
    except DiskFull as err:  # recorded crashed with it (error.txt: the traceback) when there was room
        print(err, file=sys.stderr, flush=True)  # each job's line: Hydra names a sweep's first failure only
        if not single:
            raise  # this job fails; the sweep attempts the others
        raise SystemExit(1) from None
    finally:
        if single:  # finished or crashed: where its files are
            print("\n".join(end_of_run_lines(out_dir, resolve_wandb_mode(cfg.logger))), flush=True)


def cli() -> None:
    """``python -m rlexp.train``. A multirun (or a command line that may make one) has every job's config
    checked first (``rlexp.cli.check_command_line``); a single run's config, composed once by Hydra, is
    checked by ``rlexp.cli.ConfigCheck`` before Hydra makes its dir, and a mistake Hydra's composition
    refuses is named by ``check_command_line`` after it: a refusal is one line and exit code 2, no dir.
    The plugins (installed, and those ``plugins=[...]`` names) are registered first: a plugin that cannot
    be is one line and exit code 2 too.
    Any other error is reported as Hydra reports it (``HYDRA_FULL_ERROR=1``: in full). ``--help`` prints
    what Hydra's help template holds (``rlexp.compose.registry.help_text``) without Hydra, which would first list
    every config group, copying its config store for each (tens of seconds)."""
    argv = sys.argv[1:]
    args = get_args_parser().parse_args(argv)
    try:  # before Hydra composes: a plugin's options are options of its groups
        load_plugins(plugins_on_command_line(args.overrides))
    except ConfigError as err:
        print(err, file=sys.stderr)
        raise SystemExit(2) from None
    if args.help:
        print(help_text())
        return
    if needs_whole_check(argv):
        refuse_or_pass(argv)
        try:
            main()
        except SystemExit as stop:
            if stop.code == 2:  # refused (one line, e.g. by a launcher): nothing ran, nothing to summarize
                SweepSummary.pending = None
            if not sweep_terminated():
                raise
        finally:  # a multirun whose job raised: Hydra skipped the callback's summary
            SweepSummary.flush()
            release_sweep()
        if sweep_terminated():  # its workers' jobs recorded it: the process ends as a SIGTERM ends one
            raise Terminated("SIGTERM")
        return
    full_error = "HYDRA_FULL_ERROR" in os.environ
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing: a composition error is named here
    try:
        main()
    except Exception as err:
        if full_error:
            raise
        del os.environ["HYDRA_FULL_ERROR"]
        if isinstance(err, (ConfigCompositionException, OverrideParseException)):
            GlobalHydra.instance().clear()
            refuse_or_pass(argv)
        hydra_report(err)
    finally:
        if not full_error:
            os.environ.pop("HYDRA_FULL_ERROR", None)


def refuse_or_pass(argv: list[str]) -> None:
    """``check_command_line(argv)``: a refusal is printed as its one line and the process exits with code 2."""
    try:
        check_command_line(argv, CONF_DIR)
    except ConfigError as err:
        print(err, file=sys.stderr)
        raise SystemExit(2) from None


def hydra_report(err: BaseException) -> NoReturn:
    """Report ``err`` as Hydra does without ``HYDRA_FULL_ERROR``: a Hydra error's message, else the
    traceback from the job's own frames (below Hydra's ``run_job``); exit code 1."""
    if isinstance(err, CompactHydraException):
        print(err, file=sys.stderr)
    else:
        tb = err.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_name != "run_job":
            tb = tb.tb_next
        traceback.print_exception(type(err), err, (tb.tb_next if tb is not None else None) or err.__traceback__)
    print("\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.", file=sys.stderr)
    raise SystemExit(1)


def main_process() -> None:
    """``python -m rlexp.train``: ``cli()``; a job a SIGTERM stopped (its summaries written, ``Terminated``
    in its crash record) exits as a process that signal ends would, 143, with one line instead of a
    traceback (``error.txt`` holds it)."""
    try:
        cli()
    except Terminated:
        print("terminated (SIGTERM): the job is recorded crashed; resume=true goes on with it", file=sys.stderr)
        raise SystemExit(128 + signal.SIGTERM) from None


if __name__ == "__main__":
    main_process()
