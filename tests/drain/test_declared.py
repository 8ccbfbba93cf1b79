"""Each option is declared once (issue 45): its name, default and ``GRACEFUL_*`` variable live in one
field declaration; the constructors' signatures list every option; ``Drain``'s public face is its
documented API; and ``graceful advise`` judges the server's budget, not its own environment."""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

from click.testing import CliRunner

from graceful import Drain, GracefulMiddleware
from graceful._asgi._options import DECLARED, MIDDLEWARE_DECLARED, middleware_rows
from graceful._cli._main import cli
from graceful._drain._environ import UNSET, variable
from graceful._drain._ledger import COMPLETED, Tracked
from graceful._drain._options import DRAIN_OPTIONS
from graceful._drain._state import core
from tests.utils import ROOT

PACKAGE = Path(ROOT) / "graceful"
# Where options are declared: the dataclasses whose fields are options (``_environ.option``).
DECLARING = {"graceful/_drain/_budget.py", "graceful/_drain/_options.py", "graceful/_asgi/_options.py"}
# The documented Python API of Drain (docs/middleware.md, "Python API").
DOCUMENTED = {
    "accepting",
    "add_listener",
    "begin_drain",
    "budget",
    "config",
    "counters",
    "drain",
    "failure",
    "in_flight",
    "last_result",
    "mark_failed",
    "mark_serving",
    "mark_stopped",
    "resume",
    "since",
    "state",
    "status",
    "track",
}


def sources() -> dict[str, ast.Module]:
    return {str(path.relative_to(ROOT)): ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}


def docstrings(tree: ast.Module) -> set[int]:
    """The ids of the string constants that are docstrings (they may mention a variable in prose)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.add(id(value))
    return found


def is_unset(node: ast.expr | None, option: str = "") -> bool:
    """A default that declares nothing: None, ``UNSET`` (the option comes from its declaration), or the
    declaration itself (``DrainConfig.admit_during_propagation``)."""
    return (
        node is None
        or (isinstance(node, ast.Constant) and node.value is None)
        or (isinstance(node, ast.Name) and node.id == "UNSET")
        or (isinstance(node, ast.Attribute) and node.attr == option)
    )


def test_each_option_is_declared_in_exactly_one_field() -> None:
    declared: dict[str, list[str]] = {}
    for path, tree in sources().items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "option"
            ):
                declared.setdefault(node.target.id, []).append(path)
    assert {name: paths for name, paths in declared.items() if len(paths) != 1} == {}
    assert set(declared) == set(DECLARED)
    assert {path for paths in declared.values() for path in paths} <= DECLARING


def test_no_second_declaration_of_a_default_or_a_variable() -> None:
    """Nowhere else may a variable's name be spelled out, or an option be given a default of its own:
    a parameter, a ``.get(name, default)`` or a click option named for an option defaults to None or
    ``UNSET`` only (the declaration fills it)."""
    variables = {variable(name): name for name in DECLARED}
    found: list[str] = []
    for path, tree in sources().items():
        prose = docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
                if node.value in variables:
                    found.append(f"{path}:{node.lineno}: the variable {node.value} spelled out")
            if isinstance(node, ast.arguments):
                positional = [*node.posonlyargs, *node.args]
                defaults: list[ast.expr | None] = [None] * (len(positional) - len(node.defaults)) + list(node.defaults)
                pairs = [*zip(positional, defaults), *zip(node.kwonlyargs, node.kw_defaults)]
                for arg, default in pairs:
                    if arg.arg in DECLARED and not is_unset(default):
                        found.append(f"{path}:{arg.lineno}: parameter {arg.arg} with a default of its own")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                args = node.args
                if node.func.attr == "get" and len(args) == 2 and isinstance(args[0], ast.Constant):
                    # Text is read as words here, not a default: tables keyed by option names hold reasons.
                    words = isinstance(args[1], ast.Constant) and isinstance(args[1].value, str)
                    if args[0].value in DECLARED and not is_unset(args[1], args[0].value) and not words:
                        found.append(f"{path}:{node.lineno}: .get({args[0].value!r}, a default of its own)")
                if node.func.attr == "option" and args and isinstance(args[0], ast.Constant):
                    flag = str(args[0].value).split("/")[0].removeprefix("--").replace("-", "_")
                    default = next((k.value for k in node.keywords if k.arg == "default"), None)
                    if flag in DECLARED and not is_unset(default):
                        found.append(f"{path}:{node.lineno}: --{flag} with a default of its own")
    assert found == []


def test_the_signatures_list_every_option_by_name() -> None:
    drain = inspect.signature(Drain).parameters
    assert set(drain) - {"unknown"} == DRAIN_OPTIONS
    assert all(drain[name].default is UNSET for name in DRAIN_OPTIONS)
    middleware = inspect.signature(GracefulMiddleware).parameters
    assert set(middleware) - {"app", "drain", "registry", "unknown"} == set(DECLARED)
    assert all(middleware[name].default is UNSET for name in DECLARED)
    assert all(middleware[name].kind is inspect.Parameter.KEYWORD_ONLY for name in DECLARED)


def mutmut_copy(name: str) -> bool:
    """A copy of one of Drain's methods that mutmut 3 adds to the class it mutates (``xǁDrainǁresume__mutmut_orig``,
    ``xǁDrainǁresume__mutmut_6``): present only under ``scripts/mutation`` (docs/testing.md, "Mutation testing")."""
    return name.startswith("xǁDrainǁ") and "__mutmut_" in name


def test_drains_public_face_is_its_documented_api() -> None:
    drain = Drain(grace_period=30)
    public = {name for name in dir(drain) if not name.startswith("_") and not mutmut_copy(name)}
    assert public == DOCUMENTED
    page = (Path(ROOT) / "docs" / "middleware.md").read_text()
    section = page.split("## Python API", 1)[1].split("\n## ", 1)[0]
    # The listing is a file the page includes (docs_src/middleware/python_api.py, issue 51).
    section += "".join(
        (Path(ROOT) / path.split(":")[0]).read_text() for path in re.findall(r'--8<-- "([^"]+)"', section)
    )
    assert {name for name in DOCUMENTED if re.search(rf"\.{name}\b", section)} == DOCUMENTED


def test_the_middleware_option_table_is_the_declarations() -> None:
    page = (Path(ROOT) / "docs" / "middleware.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `") and line.split("`")[1] in MIDDLEWARE_DECLARED]
    assert rows == middleware_rows()


def saved_status(tmp_path: Path) -> Path:
    """A worker's ``/status`` as ``graceful status --json`` saves it: grace 30 s, a wait of 4 s, no quiet
    rule, and a few requests counted."""
    drain = Drain(grace_period=30, propagation_wait=4, propagation_quiet=None)
    drain.mark_serving()
    ledger = core(drain).ledger
    for _ in range(5):
        work = Tracked(ledger)
        ledger.admit_item(work)
        ledger.count_durations()
        work.finish(COMPLETED)
    ledger.count_durations()
    saved = tmp_path / "status.json"
    saved.write_text(json.dumps([drain.status().as_dict()]))
    return saved


def test_advise_judges_the_servers_budget_whatever_its_own_environment(tmp_path: Path) -> None:
    saved = saved_status(tmp_path)
    command = ["advise", "--from", str(saved), "--json"]
    clean = CliRunner().invoke(cli, command, env={variable(name): None for name in DECLARED})
    assert clean.exit_code in (0, 1), clean.output
    advice = json.loads(clean.stdout)
    # The advising process's own variables (a quiet rule, another grace period and reserve) change nothing.
    noisy = CliRunner().invoke(
        cli,
        command,
        env={"GRACEFUL_PROPAGATION_QUIET": "1s", "GRACEFUL_GRACE_PERIOD": "300", "GRACEFUL_RESERVE": "5"},
    )
    assert (noisy.exit_code, json.loads(noisy.stdout)) == (clean.exit_code, advice)
