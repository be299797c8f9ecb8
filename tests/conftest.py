import os
import shutil
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
COMPOSED = "RLEXP_TESTS_COMPOSED"  # tests/composing.py's SHARED


def runs_tests(config: pytest.Config) -> bool:
    """This process runs tests: an xdist worker, or a run without workers (not the controller of ``-n``)."""
    return hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)


@pytest.hookimpl(trylast=True)  # after pytest-cov starts measuring in an xdist worker (its pytest_sessionstart)
def pytest_sessionstart(session: pytest.Session) -> None:
    """In a process that runs tests, before it collects them: one torch thread, rlexp's schemas and resolvers
    (every test that composes a config needs them) and the installed plugins' options. The controller of ``-n``
    imports neither torch nor rlexp, so its workers start sooner."""
    if runs_tests(session.config):
        import torch

        from rlexp.compose.plugins import load_plugins
        from rlexp.compose.registry import register

        torch.set_num_threads(1)
        register()
        load_plugins()  # the installed plugins: the tests parametrized over a registry cover their options too


@pytest.fixture(autouse=True)
def ieee_subnormals() -> None:
    """Each test starts with IEEE's gradual underflow, torch's default, though a job that ran before it in
    this process flushed subnormal floats to zero (``flush_denormal=true``, as ``minatar_dqn`` sets it)."""
    import torch

    torch.set_flush_denormal(False)


def pytest_configure(config: pytest.Config) -> None:
    """The session's compose cache (tests/composing.py): one dir for the session and its xdist workers (which start
    after this and inherit the environment), removed at the end."""
    if not hasattr(config, "workerinput") and COMPOSED not in os.environ:
        config._composed_dir = tempfile.mkdtemp(prefix="rlexp-composed-")
        os.environ[COMPOSED] = config._composed_dir


def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "_composed_dir"):
        del os.environ[COMPOSED]
        shutil.rmtree(config._composed_dir, ignore_errors=True)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """``-m unit`` selects no test of tests/jobs/: its modules (and what they import) are not even collected."""
    if config.getoption("markexpr") == "unit" and collection_path.is_relative_to(TESTS / "jobs"):
        return True
    return None


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


@pytest.fixture
def torch_without_private_entry_points(monkeypatch: pytest.MonkeyPatch):
    """For one test, a torch whose private entry points the fast paths call are missing, as an older or a newer
    release may lack them: the capability checks (``rlexp.nn.capabilities``) answer False, and torch's fused and
    foreach functions raise when called. Their cached answers are forgotten before and after."""
    import torch

    from rlexp.nn import capabilities
    from rlexp.optim.optimizers import fast_kernels_run

    def refuse(*args, **kwargs):
        raise AssertionError("a private torch entry point ran although the capability check said it is missing")

    for name in dir(torch):
        if name.startswith(("_fused_", "_foreach_")):
            monkeypatch.setattr(torch, name, refuse)
    for check in ("has_torch", "has_aten", "has_functional"):
        monkeypatch.setattr(capabilities, check, lambda *names: False)
    fast_kernels_run.cache_clear()
    yield
    monkeypatch.undo()
    fast_kernels_run.cache_clear()
    capabilities.clear()
