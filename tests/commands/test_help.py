"""Every command answers --help alike: usage as plain text on stdout, exit code 0, nothing else done."""

from __future__ import annotations

import importlib

import pytest


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
