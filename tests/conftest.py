import pytest
import torch

from rlexp.compose.registry import register

torch.set_num_threads(1)
register()  # the schemas and resolvers every test that composes a config needs


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """pytest-xdist (``--dist loadgroup``, pyproject.toml) spreads tests over workers one by one, and each worker
    that runs a test sets up its fixtures: a module's CLI runs or grid, shared by its tests, would run once per
    worker. A test that uses a module- or session-scoped fixture of a test module goes to that module's group,
    which one worker runs."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        fixturedefs = getattr(item, "_fixtureinfo", None)
        for defs in fixturedefs.name2fixturedefs.values() if fixturedefs else ():
            module = defs[-1].func.__module__
            if defs[-1].scope in ("module", "session") and module.startswith("test_"):
                item.add_marker(pytest.mark.xdist_group(module))
                break
