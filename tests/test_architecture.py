"""The package's architecture, read from its source: imports run one way (no cycles), algorithms see
only the run context, and process-wide state is set by the entry point alone."""

from __future__ import annotations

import ast
import inspect
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlexp"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node`` (inside functions too) except those of ``if TYPE_CHECKING:`` blocks."""
    for child in ast.iter_child_nodes(node):
        if is_type_checking(child):
            yield from (n for other in child.orelse for n in [other, *runtime_nodes(other)])
            continue
        yield child
        yield from runtime_nodes(child)


def imported_modules(module: str) -> set[str]:
    """The rlexp modules that importing ``module`` imports: each named module and the packages it
    lies in (Python runs a package's ``__init__`` first), apart from ``module``'s own packages."""
    tree = ast.parse(MODULES[module].read_text())
    is_package = MODULES[module].name == "__init__.py"
    names: list[str] = []
    for node in runtime_nodes(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package upwards
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
    found: set[str] = set()
    for name in names:
        parts = name.split(".")
        found |= {m for i in range(1, len(parts) + 1) if (m := ".".join(parts[:i])) in MODULES}
    return found - own


@pytest.fixture(scope="module")
def imports() -> dict[str, set[str]]:
    """Each rlexp module's imported rlexp modules."""
    return {m: imported_modules(m) for m in MODULES}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a list of modules, the first repeated at the end) per strongly connected group of
    two or more modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [cycle_through(sorted(group)[0], set(group), graph) for group in groups]


def cycle_through(start: str, group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest import path from ``start`` back to itself within ``group`` (breadth first)."""
    paths = {w: [start, w] for w in sorted(graph[start] & group)}
    frontier = list(paths)
    while start not in paths:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return paths[start]


def test_rlexp_imports_have_no_cycle(imports):
    cycles = [" -> ".join(c) for c in import_cycles(imports)]
    assert not cycles, "import cycles among rlexp modules:\n" + "\n".join(cycles)


def test_the_cycle_finder_names_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert import_cycles(graph) == [["a", "b", "c", "a"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_walk_sees_function_level_imports_and_skips_type_checking_blocks(tmp_path, monkeypatch):
    source = (
        "from typing import TYPE_CHECKING\nimport rlexp.nn.nets\n"
        "if TYPE_CHECKING:\n    from rlexp.run.runner import run_population\n"
        "def f():\n    from rlexp.algos import dqn\n"
    )
    path = tmp_path / "probe.py"
    path.write_text(source)
    monkeypatch.setitem(MODULES, "rlexp.probe", path)
    assert imported_modules("rlexp.probe") == {"rlexp.nn", "rlexp.nn.nets", "rlexp.algos", "rlexp.algos.dqn"}


def test_no_rlexp_module_imports_under_type_checking():
    """Every module names the modules it uses at run time: no import hidden from the cycle check."""
    for module in MODULES:
        tree = ast.parse(MODULES[module].read_text())
        hidden = [node for node in ast.walk(tree) if is_type_checking(node)]
        assert not hidden, f"{module} imports under TYPE_CHECKING"


# the package's layers, lowest first (docs/architecture.md): a module imports from its own layer and
# lower ones only. The top-level modules are the commands (python -m rlexp.<command>) and their
# command-line helpers, above every layer.
LAYERS = ("config", "nn", "optim", "envs", "data", "diagnostics", "run", "algos", "compose", "report")
COMMANDS = {"rlexp.__main__", "rlexp.train", "rlexp.cli", "rlexp.check", "rlexp.sync", "rlexp.replay", "rlexp.evaluate"}


def layer(module: str) -> int:
    """The layer ``module`` lies in: its index in ``LAYERS``, or ``len(LAYERS)`` for a command
    (``rlexp`` itself, which holds nothing, lies below them all)."""
    parts = module.split(".")
    if len(parts) == 1:
        return -1
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else len(LAYERS)


def upward_imports(imports: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a higher layer, as "module -> imported"."""
    return [f"{m} -> {i}" for m in sorted(imports) for i in sorted(imports[m]) if layer(i) > layer(m)]


def test_every_module_lies_in_a_layer():
    top_level = {m for m in MODULES if m.count(".") == 1 and not MODULES[m].name == "__init__.py"}
    assert top_level == COMMANDS, "a top-level module is a command; the rest lies in a layer's package"
    packages = {m.split(".")[1] for m in MODULES if m.count(".") >= 1} - {m.split(".")[1] for m in COMMANDS}
    assert packages == set(LAYERS)


def test_no_module_imports_from_a_higher_layer(imports):
    upward = upward_imports(imports)
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_the_layer_check_names_an_upward_import():
    imports = {"rlexp.nn.nets": {"rlexp.optim.pipeline"}, "rlexp.optim.pipeline": {"rlexp.nn.component"}}
    assert upward_imports(imports) == ["rlexp.nn.nets -> rlexp.optim.pipeline"]
    assert upward_imports({"rlexp.train": {"rlexp.algos"}, "rlexp.algos.dqn": {"rlexp.run.context"}}) == []


def test_no_algorithm_imports_another(imports):
    """What algorithms share lives in ``rlexp.algos.common``; the registry (``rlexp.algos``) gathers them."""
    algorithms = {m for m in MODULES if m.startswith("rlexp.algos.")} - {"rlexp.algos.common"}
    for module in algorithms:
        assert not imports[module] & algorithms, module
    assert "rlexp.algos" in imports["rlexp.train"]  # the entry point picks the algorithm


def test_each_algorithm_trains_with_a_run_context_and_declares_its_schema():
    from rlexp.algos import ALGOS
    from rlexp.config.schema import AlgoConfig
    from rlexp.run.context import RunContext

    for name, spec in ALGOS.items():
        hints = typing.get_type_hints(spec.train)
        assert list(inspect.signature(spec.train).parameters) == ["ctx"], name
        assert hints == {"ctx": RunContext, "return": type(None)}, name
        assert issubclass(spec.schema, AlgoConfig), name


def private_reaches(source: str) -> list[str]:
    """Every read or write of a private attribute (``x._y``, dunders aside) in ``source`` on anything but
    ``self``, ``cls`` or a name the module itself defines at its top level, as "line: expression"."""
    tree = ast.parse(source)
    own = {"self", "cls"}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            own |= {t.id for t in targets if isinstance(t, ast.Name)}
    return [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not (node.attr.startswith("__") and node.attr.endswith("__"))
        and not (isinstance(node.value, ast.Name) and node.value.id in own)
    ]


def test_checkpoints_keep_the_file_format_and_reach_into_no_part(imports):
    """``rlexp/run/checkpoint.py`` treats every part through the ``Stateful`` protocol: it imports no
    module of a part (so names no part's class) and touches no other module's private attribute."""
    module = "rlexp.run.checkpoint"
    allowed = {"rlexp.config", "rlexp.config.schema", "rlexp.config.state", "rlexp.run.jobs"}
    assert imports[module] <= allowed, f"{module} imports {sorted(imports[module] - allowed)}"
    reaches = private_reaches(MODULES[module].read_text())
    assert not reaches, f"{module} reaches into privates:\n" + "\n".join(reaches)


def test_the_private_check_names_a_reach_into_another_part():
    source = "X = 1\nclass C:\n    def f(self, env):\n        env._obs = self._y + X._z + env.__dict__\n"
    assert private_reaches(source) == ["4: env._obs"]


PROCESS_WIDE = {
    ("gc", "disable"),
    ("gc", "enable"),
    ("gc", "freeze"),
    ("gc", "collect"),
    ("torch", "set_num_threads"),
    ("warnings", "filterwarnings"),
}


@pytest.mark.parametrize("module", sorted(set(MODULES) - {"rlexp.train"}))
def test_only_the_entry_point_sets_process_wide_state(module):
    tree = ast.parse(MODULES[module].read_text())
    # a filter set inside `with warnings.catch_warnings():` is restored on leaving the block
    scoped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.With) and any("catch_warnings" in ast.unparse(item.context_expr) for item in node.items)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    calls = {
        (node.func.value.id, node.func.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and id(node) not in scoped
    }
    assert not calls & PROCESS_WIDE, f"{module} calls {sorted(calls & PROCESS_WIDE)}"
