"""scripts/bench.py's cases: what each case runs is bound when the case is made, so a section measures the
same commands whichever other sections run beside it (SB3's SAC once took MinAtar's learning_starts)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench.py"


def test_a_sections_runs_do_not_depend_on_the_other_sections(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("bench", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench", bench)  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    for runner in ("rlexp_run", "sb3_run", "grid_run", "floor_run"):  # each run records what it would start
        monkeypatch.setattr(bench, runner, lambda *args, runner=runner, **kwargs: (runner, args, kwargs))
    sizes = dict(steps=3000, ppo_steps=2048, minatar_steps=5000, populations=[1, 16], threads=1, workdir=tmp_path)
    sizes |= dict(pack_steps=2000, pack_populations=(1, 12), mujoco_steps=2000)  # MinAtar and SAC: other starts

    def runs(sections: list[str]) -> dict[str, tuple]:
        cases, commands = bench.build_cases(sections, **sizes)
        return {name: (run(3), commands[name]) for name, _, run in cases}

    every = runs(list(bench.SECTIONS + bench.OPTIONAL_SECTIONS))
    for section in bench.SECTIONS + bench.OPTIONAL_SECTIONS:
        alone = runs([section])
        assert alone and all(every[name] == ran for name, ran in alone.items()), section
    assert every["sac_mujoco_sb3"][0][1][-1] == 400 != every["minatar_sb3"][0][1][-1] == 1000  # each its own starts
