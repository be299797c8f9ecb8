from pathlib import Path

import pytest
import torch

from rlexp.compose.registry import register

torch.set_num_threads(1)
register()  # the schemas and resolvers every test that composes a config needs

TESTS = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before -m selects by the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's tier, by its directory: tests/jobs/ holds the whole jobs, the commands run as processes and
    the scripts (``job``); every other directory tests the parts (``unit``, the edit-test loop's
    ``python -m pytest -m unit``).

    pytest-xdist (``--dist loadgroup``, pyproject.toml) spreads tests over workers one by one, and each worker
    that runs a test sets up its fixtures: a module's CLI runs or grid, shared by its tests, would run once per
    worker. A test that uses a module- or session-scoped fixture of a test module goes to that module's group,
    which one worker runs."""

    def is_job(item: pytest.Item) -> bool:
        return Path(item.path).relative_to(TESTS).parts[0] == "jobs"

    for item in items:
        item.add_marker(pytest.mark.job if is_job(item) else pytest.mark.unit)
    # the whole jobs first, the parts after (each file's tests stay together, in their order): xdist hands the
    # tests out in this order, so the long ones start early and the short ones fill both workers to the end
    items.sort(key=lambda item: not is_job(item))
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        fixturedefs = getattr(item, "_fixtureinfo", None)
        for defs in fixturedefs.name2fixturedefs.values() if fixturedefs else ():
            module = defs[-1].func.__module__
            if defs[-1].scope in ("module", "session") and module.startswith("test_"):
                item.add_marker(pytest.mark.xdist_group(module))
                break
