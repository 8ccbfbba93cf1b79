"""The package's shape: which private package may import which, no cycles, and no reaching into
another module's private names.

The library is one public face (``graceful``, ``graceful.engine``, ``graceful.soak``,
``graceful.cli``) over private packages, one per part of the architecture (docs/architecture.md):

    _cli  ->  _serve  ->  _asgi  ->  _admin  ->  _drain
      |                                 ^           ^
      +------> _engine -----------------|-----------+
      +------> _soak ----> _resume      |
      +---------------------------------+

Every rule reads the source with ``ast``, so imports under ``TYPE_CHECKING`` and imports
inside functions count as much as top-level ones.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "graceful"

# Which private package may import which (besides itself). The public modules may import any.
ALLOWED: dict[str, set[str]] = {
    "_drain": set(),
    "_stream": set(),
    "_resume": {"_stream"},
    "_admin": {"_drain"},
    "_engine": {"_drain"},
    "_soak": {"_drain", "_resume", "_stream"},
    "_asgi": {"_drain", "_admin", "_stream"},
    "_serve": {"_asgi", "_admin", "_drain"},
    "_cli": {"_admin", "_drain", "_engine", "_soak", "_serve"},
}
PUBLIC = {"__init__", "__main__", "cli", "engine", "soak", "integrations"}
MAX_LINES = 400


def module_name(path: Path) -> str:
    """``_drain._state`` for graceful/_drain/_state.py, ``_drain`` for its __init__, ``engine`` for
    graceful/engine.py."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, ast.Module]:
    return {module_name(path): ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def package_of(module: str) -> str:
    head = module.split(".")[0]
    return "public" if head in PUBLIC else head


def is_package(module: str) -> bool:
    return (PACKAGE / module.replace(".", "/") / "__init__.py").exists()


def imported(name: str, tree: ast.Module) -> Iterator[tuple[str, list[str], int]]:
    """(graceful module, names imported from it, line) for every graceful import of one module."""
    here = name.split(".") if is_package(name) else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module == "graceful" or (node.module or "").startswith("graceful."):
                target = (node.module or "").removeprefix("graceful").lstrip(".")
            else:
                continue
            yield target or "__init__", [alias.name for alias in node.names], node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("graceful."):
                    yield alias.name.removeprefix("graceful."), [], node.lineno


def import_graph() -> dict[str, set[str]]:
    trees = modules()
    return {
        name: {target for target, _, _ in imported(name, tree) if target in trees and target != name}
        for name, tree in trees.items()
    }


def package_arrows(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {
        (package_of(name), package_of(other))
        for name, others in graph.items()
        for other in others
        if package_of(name) != package_of(other)
    }


def forbidden_arrows(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{name} -> {other}"
        for name, others in graph.items()
        for other in others
        if package_of(name) != "public"
        and package_of(other) != package_of(name)
        and package_of(other) not in ALLOWED[package_of(name)]
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_private_package_is_known_and_says_what_it_holds() -> None:
    trees = modules()
    packages = {name for name in trees if is_package(name) and package_of(name) != "public"}
    assert packages == set(ALLOWED)
    for package in packages:
        docstring = ast.get_docstring(trees[package])
        assert docstring is not None and ("May import" in docstring or "Imports no other" in docstring), package
        # Package __init__ files import nothing: the preStop hook loads three of them.
        body = trees[package].body
        assert [type(node) for node in body] == [ast.Expr], f"{package}/__init__.py holds more than its docstring"


def test_packages_import_only_what_they_may() -> None:
    assert forbidden_arrows(import_graph()) == []


def test_no_import_cycle_between_modules_or_packages() -> None:
    graph = import_graph()
    # The package's __init__ re-exports lazily by name; the modules must not import it back.
    assert not [name for name, deps in graph.items() if "__init__" in deps]
    assert cycles(graph) == []
    arrows = package_arrows(graph)
    assert cycles({package: {b for a, b in arrows if a == package} for package in {*ALLOWED, "public"}}) == []


def test_a_forbidden_arrow_is_detected() -> None:
    graph = {"_drain._state": {"_asgi._middleware"}, "_asgi._middleware": {"_drain._state"}}
    assert forbidden_arrows(graph) == ["_drain._state -> _asgi._middleware"]
    assert cycles(graph) == [["_asgi._middleware", "_drain._state"]]


def test_helpers_do_not_import_the_middleware() -> None:
    graph = import_graph()
    for helper in ("_asgi._http", "_asgi._refusal", "_asgi._websocket", "_asgi._lifespan", "_asgi._stop"):
        assert "_asgi._middleware" not in graph[helper], helper


def test_no_module_is_longer_than_about_400_lines() -> None:
    long = {
        module_name(path): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def private_names(tree: ast.Module) -> set[str]:
    """The _private names a module defines: functions, classes, names, ``self._x`` attributes, slots."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__slots__" for t in node.targets):
            names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant))
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def foreign_private_reads(trees: dict[str, ast.Module]) -> list[str]:
    """``x._name`` where ``_name`` is defined by another graceful module and not by this one, and
    ``from ... import _name`` of another module's private name."""
    own = {name: private_names(tree) for name, tree in trees.items()}
    everyone = set().union(*own.values())
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                attr = node.attr
                if attr.startswith("_") and not attr.startswith("__") and attr in everyone and attr not in own[name]:
                    found.append(f"{name}:{node.lineno}: .{attr}")
        for target, names, line in imported(name, tree):
            for imported_name in names:
                if imported_name.startswith("_") and not imported_name.startswith("__") and target in trees:
                    if imported_name in own.get(target, set()):
                        found.append(f"{name}:{line}: import {imported_name} from {target}")
    return found


def test_no_module_reaches_into_another_modules_private_names() -> None:
    assert foreign_private_reads(modules()) == []


def test_private_reach_is_detected() -> None:
    owner = ast.parse("class Drain:\n    def __init__(self):\n        self._work = {}\n\ndef _helper():\n    pass\n")
    reader = ast.parse(
        "from .._drain._state import _helper\n\n"
        "def count(drain):\n    drain._work[1] = None\n    return len(drain._work)\n"
    )
    found = foreign_private_reads({"_drain._state": owner, "_asgi._metrics": reader})
    assert sorted(found) == [
        "_asgi._metrics:1: import _helper from _drain._state",
        "_asgi._metrics:4: ._work",
        "_asgi._metrics:5: ._work",
    ]


# -- one place per rule ------------------------------------------------------------------------

# What must be written in one module only, and which: a second copy of any of these is a drift
# waiting to happen (signal policy, refusal, admission's options, budget share, option errors).
ONE_PLACE = {
    "HANDLED_SIGNALS": "_asgi._stop",
    "REPEAT_WINDOW": "_asgi._stop",
    "REFUSAL": "_asgi._refusal",
    "NOT_STARTED_HEADER": "_stream._rules",
    "RESUMABLE_HEADER": "_stream._rules",
    "GRACE_SHARE": "_engine._config",
    "ConfigError": "_drain._errors",
    "UNSET": "_drain._environ",
    "PREFIX": "_drain._names",
    "variable": "_drain._names",
    "judge_drain": "_drain._durations",
    "Overrides": "_drain._options",
}


def defined_names(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level: assignments, functions and classes."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
    return names


def test_each_rule_is_defined_in_one_module() -> None:
    trees = modules()
    for name, home in ONE_PLACE.items():
        assert [module for module, tree in trees.items() if name in defined_names(tree)] == [home], name


def test_each_header_name_is_written_once() -> None:
    """graceful's own headers are named in code once, where both sides read them (``_stream._rules``):
    a literal elsewhere is a copy that can drift."""
    writers = {
        (module, text)
        for module, tree in modules().items()
        for text in string_constants(tree) | {b.decode("latin-1") for b in _bytes_constants(tree)}
        if text.lower().startswith("x-graceful-")
    }
    assert writers == {("_stream._rules", "x-graceful-not-started"), ("_stream._rules", "x-graceful-resumable")}


def string_constants(tree: ast.Module) -> set[str]:
    """The module's strings that code uses (docstrings and other bare string statements left out)."""
    bare = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in bare
    }


def test_drain_names_no_http_or_middleware_option() -> None:
    """``_drain`` knows nothing of HTTP: none of its modules names a middleware option or a header."""
    from graceful._asgi._options import MIDDLEWARE_DECLARED

    words = set(MIDDLEWARE_DECLARED) | {"retry-after", "x-graceful-not-started"}
    for module, tree in modules().items():
        if package_of(module) == "_drain":
            named = {word for word in words if any(word in text for text in string_constants(tree))}
            named |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)} & words
            assert named == set(), module


def test_only_the_refusal_module_writes_a_refusal() -> None:
    """One refusal for HTTP and WebSocket: the Retry-After header is written in one module."""
    writers = [module for module, tree in modules().items() if b"retry-after" in _bytes_constants(tree)]
    assert writers == ["_asgi._refusal"]


def _bytes_constants(tree: ast.Module) -> set[bytes]:
    return {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, bytes)}


def test_the_rules_are_detected() -> None:
    copy = ast.parse("HANDLED_SIGNALS = (15, 2)\n")
    assert "HANDLED_SIGNALS" in defined_names(copy)
    assert "ready_path" in string_constants(ast.parse("x = {'ready_path': 1}\n"))
    assert string_constants(ast.parse('"""ready_path, in a docstring"""\n')) == set()
    assert b"retry-after" in _bytes_constants(ast.parse("h = [(b'retry-after', b'1')]\n"))


# Where the process's environment is read (docs/architecture.md, "The environment"): the constructors
# (``Drain``, ``GracefulMiddleware``), the command line and its launcher, and the LiteLLM integration
# (LiteLLM's own settings, read as LiteLLM reads them). Everything below them is given what it needs.
ENVIRONMENT_EDGES = {"_drain._state", "_asgi._middleware", "_serve._launcher", "integrations.litellm"}


def reads_environment(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb", "getenvb"):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in ("environ", "getenv", "environb", "getenvb") for alias in node.names):
                return True
    return False


def test_only_the_edges_read_the_environment() -> None:
    readers = {name for name, tree in modules().items() if reads_environment(tree)}
    below = {name for name in readers if name not in ENVIRONMENT_EDGES and package_of(name) != "_cli"}
    assert below == set()
    assert readers >= {"_drain._state", "_asgi._middleware"}  # the rule finds the readers it allows
