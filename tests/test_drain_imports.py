"""The preStop hook's start-up counts against the grace period: ``graceful drain`` loads only what it uses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# What the hook may load from this package, and what it must never load (checked in a fresh interpreter, counting
# what the hook adds to what the interpreter loaded at start-up: a development interpreter's .pth files may load more).
ALLOWED = {"graceful", "graceful._admin_client", "graceful._budget", "graceful._cli", "graceful._paths"}
FORBIDDEN = (
    "asyncio",
    "anyio",
    "h11",
    "httpx",
    "logging",
    "prometheus_client",
    "urllib",
    "uvicorn",
    "graceful._state",
    "graceful._soak",
)

PROBE = """
import json, sys
before = set(sys.modules)
from graceful._cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(set(sys.modules) - before)}))
"""


@pytest.mark.parametrize(
    "args",
    [
        ["drain", "--socket", "/nonexistent/graceful.sock"],
        ["status", "--socket", "/nonexistent/graceful.sock"],
        ["drain", "--help"],
    ],
)
def test_the_hook_loads_only_its_own_modules(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["code"] in (0, 3), done.stderr
    ours = {name for name in seen["modules"] if name == "graceful" or name.startswith("graceful.")}
    assert ours == ALLOWED, ours ^ ALLOWED
    loaded = [name for name in seen["modules"] if name.split(".")[0] in FORBIDDEN or name in FORBIDDEN]
    assert loaded == [], loaded


def test_engine_mode_loads_the_engine_code_only_when_asked() -> None:
    args = ["drain", "--engine", "vllm", "--metrics-url", "ftp://bad", "--timeout", "1"]
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["code"] == 2 and "not an http(s) URL" in done.stderr
    assert "graceful._engine" in seen["modules"] and "graceful._state" not in seen["modules"]
