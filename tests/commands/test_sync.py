"""rlexp/sync.py's pieces: the sync commands pass every run once, with the options after ``--``."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from rlexp import sync
from rlexp.cli import sync_lines


def test_sync_commands_pass_every_run_once_with_the_options_after_the_double_dash():
    runs = [Path(f"/j/seed_{k}/wandb/offline-run-{k}") for k in range(450)]
    commands = sync.sync_commands(runs, dry_run=False, extra=["--project", "other"])
    assert [c[:6] for c in commands] == [[sys.executable, "-m", "wandb", "sync", "--project", "other"]] * 3
    assert [p for c in commands for p in c[6:]] == [str(r) for r in runs]
    assert sync.sync_commands(runs[:2], dry_run=True, extra=[])[0][4:] == ["--dry-run", *map(str, runs[:2])]


def test_the_printed_sync_commands_work_in_a_shell_for_a_dir_with_a_space_and_a_quote(tmp_path):
    root = tmp_path / "my grid's runs"
    run = root / "0" / "seed_1" / "wandb" / "offline-run-1"
    run.mkdir(parents=True)
    upload, alternative = sync_lines(root, "*/seed_*")
    command = upload.split("upload them with: wandb sync ", 1)[1]
    listed = subprocess.run(["sh", "-c", f"ls -d {command}"], capture_output=True, text=True)
    assert listed.stdout.splitlines() == [str(run)], listed.stderr
    argv = shlex.split(alternative.split("(or: ", 1)[1].split(",", 1)[0])
    assert argv == ["python", "-m", "rlexp.sync", str(root)]
