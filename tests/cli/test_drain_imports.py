"""The preStop hook's start-up counts against the grace period: ``graceful drain`` loads only what it uses.

Up to its request, tests/cli/test_fast_path.py holds what the hook imports; here, the whole run: the
common forms of ``graceful drain`` never import click or the middleware, and the other command lines
go through click.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys

import pytest

from tests.utils import ROOT

# What the hook may load from this package over its whole run, and what it must never load (checked in a fresh
# interpreter, counting what the hook adds to what the interpreter loaded at start-up: a development
# interpreter's .pth files may load more). Package __init__ files hold a docstring only.
HOOK = {
    "graceful",
    "graceful._cli",
    "graceful._cli._console",
    "graceful._cli._prestop",
    "graceful._cli._drain_client",
    "graceful._admin",
    "graceful._admin._client",
    "graceful._admin._wire",
    "graceful._admin._paths",
    "graceful._drain",
    "graceful._drain._durations",
    "graceful._drain._errors",
    "graceful._drain._names",
}
# Through click, the drain flags' help is their fields' (the budget's declarations, issue 53).
WITH_CLICK = HOOK | {
    "graceful._cli._main",
    "graceful._cli._params",
    "graceful._drain._budget",
    "graceful._drain._environ",
}
FORBIDDEN = (
    "asyncio",
    "anyio",
    "h11",
    "httpx",
    "logging",
    "prometheus_client",
    "uvicorn",
    "graceful._drain._state",
    "graceful._soak._runner",
)

# What the console script does (graceful._cli._console.console_main), without its os._exit.
PROBE = """
import json, sys
before = set(sys.modules)
import graceful._cli._console
from graceful._cli._prestop import drain_without_click
code = drain_without_click(sys.argv[1:])
if code is None:
    from graceful._cli._main import main
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(set(sys.modules) - before)}))
"""


def probe(args: list[str], **environment: str) -> tuple[dict[str, object], str]:
    # -S: no site module, so no .pth file of this interpreter loads anything before the probe
    # looks (a development interpreter's may import typing, tempfile and more); the checkout and
    # the site-packages directories come in as plain paths.
    path = os.pathsep.join([ROOT, *site.getsitepackages()])
    env = {**os.environ, "PYTHONPATH": path, **environment}
    command = [sys.executable, "-S", "-c", PROBE, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.parametrize(
    ("args", "allowed", "code"),
    [
        (["drain", "--socket", "/nonexistent/graceful.sock"], HOOK, 3),
        (["drain", "--socket-dir=/nonexistent", "--propagation-wait", "5s", "-q", "--json"], HOOK, 3),
        (["status", "--socket", "/nonexistent/graceful.sock"], WITH_CLICK, 3),
        (["drain", "--help"], WITH_CLICK, 0),
        (["drain", "--timeout=later"], WITH_CLICK, 2),
    ],
    ids=["drain", "drain-options", "status", "drain-help", "drain-bad-value"],
)
def test_the_hook_loads_only_its_own_modules(args: list[str], allowed: set[str], code: int) -> None:
    seen, stderr = probe(args)
    assert seen["code"] == code, stderr
    modules = seen["modules"]
    assert isinstance(modules, list)
    ours = {name for name in modules if name == "graceful" or name.startswith("graceful.")}
    assert ours == allowed, ours ^ allowed
    forbidden = FORBIDDEN if "graceful._cli._main" in allowed else (*FORBIDDEN, "click")
    loaded = [name for name in modules if name.split(".")[0] in forbidden or name in forbidden]
    assert loaded == [], loaded


def test_engine_mode_loads_the_engine_code_only_when_asked() -> None:
    args = ["drain", "--engine", "vllm", "--metrics-url", "ftp://bad", "--timeout", "1"]
    seen, stderr = probe(args)
    assert seen["code"] == 2 and "not an http(s) URL" in stderr
    modules = seen["modules"]
    assert isinstance(modules, list) and "graceful._engine._wait" in modules and "graceful._drain._state" not in modules
