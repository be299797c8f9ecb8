"""Processes' start-up: ``python -m rlexp.train`` imports with the garbage collector off and leaves it
on, its ``--help`` lists the groups and keys, importing the optimizers never imports torch._dynamo, and
the process keeps freed memory for reuse (glibc's malloc) without page faults."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from rlexp.compose.registry import DOC, SCHEMAS, group_options
from rlexp.config.schema import Config, field_help

ROOT = Path(__file__).resolve().parents[2]


TIMEOUT = 600


def cli_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess: W&B offline and silent, its dirs under tmp, no forced TTY."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "HYDRA_FULL_ERROR", "WANDB_MODE")
    }
    wandb_home = tmp / "wandb_home"
    env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_CONFIG_DIR=str(wandb_home / "config"),
        WANDB_CACHE_DIR=str(wandb_home / "cache"),
        WANDB_DATA_DIR=str(wandb_home / "data"),
        WANDB_ARTIFACT_DIR=str(wandb_home / "artifacts"),
        COLUMNS="200",
        PYTHONFAULTHANDLER="1",  # a fatal signal (a hung run aborted) prints every thread's stack
    )
    env.update(extra)
    return env


def test_the_entry_point_imports_without_collections_and_leaves_the_collector_on(tmp_path):
    """`python -m rlexp.train` imports torch and Hydra with the garbage collector off (start-up speed),
    then freezes what the imports made and turns the collector back on, whatever the run does next."""
    probe = (
        "import gc, runpy, sys\n"
        "sys.argv = ['rlexp.train', '--help']\n"
        "try:\n    runpy.run_module('rlexp.train', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('probe', gc.isenabled(), gc.get_freeze_count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT
    )
    _, enabled, frozen = out.stdout.strip().splitlines()[-1].split()
    assert enabled == "True"
    assert int(frozen) > 100_000  # torch's and Hydra's objects, out of every later collection's way


ROOT = Path(__file__).resolve().parents[2]


def test_no_optimizer_imports_torch_dynamo():
    """torch.optim.Optimizer's first construction imports torch._dynamo (~1.2 s): none of ours is one (but the
    plain forms a torch without an option's fused CPU kernel takes, torch 2.2's adam, adamw and sgd)."""
    code = (
        "import sys, torch\n"
        "from rlexp.config.schema import AdamConfig, RMSpropConfig, RMSpropTFConfig, SGDConfig\n"
        "from rlexp.optim.optimizers import fast_kernels_run, make_optimizer\n"
        "for cfg in (AdamConfig(name='adam'), AdamConfig(name='adamw'), RMSpropConfig(name='rmsprop', centered=True,"
        " momentum=0.5), RMSpropTFConfig(name='rmsprop_tf'), SGDConfig(name='sgd', momentum=0.9)):\n"
        "    if not fast_kernels_run(cfg.name, 'cpu'):\n"
        "        continue\n"
        "    p = torch.zeros(2, 3, requires_grad=True); p.grad = torch.ones(2, 3)\n"
        "    make_optimizer([p], cfg).step()\n"
        "    assert p.detach().ne(0).all(), cfg.name\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


ROOT = Path(__file__).resolve().parents[2]


def test_help_lists_the_groups_and_keys():
    proc = subprocess.run(
        [sys.executable, "-m", "rlexp.train", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    for group in SCHEMAS:  # what the group picks, then its options
        assert f"\n{group}: {field_help(Config, group)}\n    {', '.join(group_options(group))}\n" in text, group
    assert "\n    crelu, elu, gelu, " in text
    assert "nan_hunt/tanh" in text
    for f in fields(Config):
        if f.name not in SCHEMAS:
            assert f"\n{f.name}" in text, f.name
    assert DOC in text
    assert "schema/" not in text and "hydra/" not in text


FAULTS = """
import resource, torch
from rlexp.train import keep_freed_memory
keep_freed_memory()
for _ in range(2):  # 3 MiB: the heap grows (the first block is placed apart, the second where every later one goes)
    torch.ones(96, 128, 64)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    torch.ones(96, 128, 64)  # allocated, written, freed: the same block again
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings (Linux only)"
)
def test_keep_freed_memory_reuses_an_update_sized_temporary_without_page_faults():
    """In a fresh process, as ``python -m rlexp.train`` sets it (a test worker's heap, shaped by the tests before,
    may place the block anew)."""
    proc = subprocess.run([sys.executable, "-c", FAULTS], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    # at most one placement of the 3 MiB block (768 pages); glibc's defaults trim it and fault it in again and
    # again: 3,800-5,400 faults here
    assert int(proc.stdout) <= 768
