"""graceful imports only what it declares: a fresh install must not depend on what tests pull in.

(A real case: anyio stopped depending on sniffio, and an import of it worked only where the
test extra happened to install it.)
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

from tests.utils import ROOT

REPO = Path(ROOT)
# Distribution name -> the module it installs, where they differ.
MODULE_OF = {"prometheus-client": "prometheus_client"}
# Imported only inside the feature that needs its extra, with a clear message when missing.
OPTIONAL = {"matplotlib": "plot"}


def declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[\s<>=!~\[;]", spec, maxsplit=1)[0].lower() for spec in project["dependencies"]}
    return {MODULE_OF.get(name, name.replace("-", "_")) for name in names}


def imported() -> set[str]:
    found = set()
    for path in (REPO / "graceful").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"__future__", "graceful"}


def test_every_third_party_import_is_a_declared_dependency() -> None:
    undeclared = imported() - declared() - set(OPTIONAL)
    assert not undeclared, f"graceful imports {sorted(undeclared)} without declaring them in pyproject.toml"


def test_optional_imports_belong_to_a_declared_extra() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for module, extra in OPTIONAL.items():
        assert any(spec.startswith(module) for spec in extras[extra])
