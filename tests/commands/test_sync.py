"""rlexp/sync.py's pieces: the sync commands pass every run once, with the options after ``--``."""

from __future__ import annotations

import sys
from pathlib import Path

from rlexp import sync


def test_sync_commands_pass_every_run_once_with_the_options_after_the_double_dash():
    runs = [Path(f"/j/seed_{k}/wandb/offline-run-{k}") for k in range(450)]
    commands = sync.sync_commands(runs, dry_run=False, extra=["--project", "other"])
    assert [c[:6] for c in commands] == [[sys.executable, "-m", "wandb", "sync", "--project", "other"]] * 3
    assert [p for c in commands for p in c[6:]] == [str(r) for r in runs]
    assert sync.sync_commands(runs[:2], dry_run=True, extra=[])[0][4:] == ["--dry-run", *map(str, runs[:2])]
