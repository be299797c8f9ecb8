"""Every command answers --help alike: usage as plain text on stdout, exit code 0, nothing else done."""

from __future__ import annotations

import importlib
import subprocess
import sys
from contextlib import nullcontext

import pytest
from launching import ROOT, cli_env


@pytest.mark.parametrize("command", ["check", "sync", "replay", "evaluate", "report"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_is_plain_usage_and_exit_0(command, flag, capsys):
    module = importlib.import_module("rlexp.report.main" if command == "report" else f"rlexp.{command}")
    try:
        code = module.main([flag])
    except SystemExit as stop:  # argparse's help exits
        code = stop.code
    out, err = capsys.readouterr()
    assert code in (0, None) and err == ""
    assert f"python -m rlexp.{command}" in out.splitlines()[0]  # what to type comes first
    assert "``" not in out  # no markup


def test_the_rlexp_command_runs_each_command_alike(tmp_path, capsys):
    """``rlexp <command> …`` (the console script; ``python -m rlexp``) is ``python -m rlexp.<command> …``:
    the same usage, the same exit codes; no or an unknown command is one line, exit 2."""
    from rlexp.__main__ import COMMANDS, main

    for command in ("check", "sync", "replay", "evaluate", "report"):
        with pytest.raises(SystemExit) if command in ("check", "sync", "report") else nullcontext():
            main([command, "--help"])
        assert f"python -m rlexp.{command}" in capsys.readouterr().out.splitlines()[0]
    assert main(["check", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"check: {tmp_path} holds no job dir; pass a sweep dir or a job's run dir\n"
    for argv in ([], ["trian"]):
        assert main(argv) == 2
        assert capsys.readouterr().err == (
            f"rlexp: unknown command {(argv or [''])[0]!r}; name one of: {', '.join(COMMANDS)}\n"
        )
    run_dir = tmp_path / "run"
    tiny = ["total_steps=600", "algo.learning_starts=200", "logger.mode=disabled", "logger.progress=off"]
    proc = subprocess.run([sys.executable, "-m", "rlexp", "train", *tiny, f"hydra.run.dir={run_dir}"],
                          cwd=ROOT, capture_output=True, text=True, env=cli_env(tmp_path))  # fmt: skip
    assert proc.returncode == 0 and (run_dir / "summary.json").exists(), proc.stderr
