"""The package's shape: no import cycles, and no module reaching into another's private names.

Both rules read the source with ``ast``, so imports under ``TYPE_CHECKING`` and imports
inside functions count as much as top-level ones.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "graceful"


def modules() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.glob("*.py"))}


def imported(tree: ast.Module) -> Iterator[str]:
    """The graceful modules one module imports, at any place in it."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                yield node.module.split(".")[0]
            elif node.level == 1 or node.module == "graceful":
                yield from (alias.name for alias in node.names)
            elif node.module and node.module.startswith("graceful."):
                yield node.module.split(".")[1]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("graceful."):
                    yield alias.name.split(".")[1]


def import_graph() -> dict[str, set[str]]:
    trees = modules()
    return {
        name: {other for other in imported(tree) if other in trees and other != name} for name, tree in trees.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
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


def test_no_import_cycle() -> None:
    graph = import_graph()
    # The package's __init__ re-exports lazily by name; the modules must not import it back.
    assert not [name for name, deps in graph.items() if "__init__" in deps or "graceful" in deps]
    assert cycles(graph) == []


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"_a": {"_b"}, "_b": {"_c"}, "_c": {"_a"}, "_d": {"_a"}}
    assert cycles(graph) == [["_a", "_b", "_c"]]


def test_helpers_do_not_import_the_middleware() -> None:
    graph = import_graph()
    for helper in ("_http", "_websocket", "_lifespan"):
        assert "_middleware" not in graph[helper], helper


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
    """``x._name`` where ``_name`` is defined by another graceful module and not by this one."""
    own = {name: private_names(tree) for name, tree in trees.items()}
    everyone = set().union(*own.values())
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                attr = node.attr
                if attr.startswith("_") and not attr.startswith("__") and attr in everyone and attr not in own[name]:
                    found.append(f"{name}.py:{node.lineno}: .{attr}")
    return found


def test_no_module_reaches_into_another_modules_private_names() -> None:
    assert foreign_private_reads(modules()) == []


def test_private_reach_is_detected() -> None:
    owner = ast.parse("class Drain:\n    def __init__(self):\n        self._work = {}\n")
    reader = ast.parse("def count(drain):\n    drain._work[1] = None\n    return len(drain._work)\n")
    found = foreign_private_reads({"_state": owner, "_metrics": reader})
    assert sorted(found) == ["_metrics.py:2: ._work", "_metrics.py:3: ._work"]
