"""``rlexp <command> [arguments]`` (or ``python -m rlexp <command> …``): the same as ``python -m rlexp.<command> …``.

Commands: train, report, check, sync, replay, evaluate. ``rlexp <command> --help`` prints the command's usage.
"""

from __future__ import annotations

import importlib
import runpy
import sys

# command -> the module that runs it: its main(argv) (train: the module itself, as python -m runs it)
COMMANDS = {
    "train": "rlexp.train",
    "report": "rlexp.report.main",
    "check": "rlexp.check",
    "sync": "rlexp.sync",
    "replay": "rlexp.replay",
    "evaluate": "rlexp.evaluate",
}


def main(argv: list[str] | None = None) -> int:
    """Run ``argv``'s command with the rest of ``argv``; its exit code (2 and one line for no or an unknown
    command, 0 and the usage for --help)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__.replace("``", "").strip())
        return 0
    command, rest = (args[0], args[1:]) if args else ("", [])
    if command not in COMMANDS:
        print(f"rlexp: unknown command {command!r}; name one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if command == "train":  # as python -m rlexp.train: Hydra finds conf/ from the script's file and reads sys.argv
        sys.argv = [f"rlexp {command}", *rest]
        runpy.run_module(COMMANDS[command], run_name="__main__", alter_sys=True)
        return 0
    return importlib.import_module(COMMANDS[command]).main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
