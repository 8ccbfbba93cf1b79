"""An admin socket directory that cannot be used, under plain uvicorn (issue 51): one line from graceful, naming
the directory as the user gave it (``GRACEFUL_SOCKET_DIR``, or ``socket_dir`` in code) and the fix, no
traceback, and uvicorn's own exit for what failed. Each case runs a real ``uvicorn`` process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.commands import terminal_env
from tests.docs.shown import console, unmatched
from tests.utils import ROOT

pytestmark = pytest.mark.servers  # real uvicorn processes (tests/tiers.py)

# Starlette builds its middleware stack at the first call, the lifespan's: the directory is first made, and
# first found wrong, at startup.
STARLETTE_APP = """
from starlette.applications import Starlette
from starlette.middleware import Middleware
from graceful import GracefulMiddleware

app = Starlette(middleware=[Middleware(GracefulMiddleware{options})])
"""

# Wrapped at import: what can be known then is refused then.
WRAPPED_APP = """
from graceful import GracefulMiddleware

async def inner(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({{"type": "lifespan.startup.complete"}})
        await send({{"type": "lifespan.shutdown.complete"}})

app = GracefulMiddleware(inner{options})
"""

UVICORN_STARTUP_FAILURE = 3  # uvicorn's exit when the app's lifespan startup fails (uvicorn.server)


def uvicorn(tmp_path: Path, source: str, options: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "served.py").write_text(source.format(options=options))
    environ = {key: value for key, value in os.environ.items() if not key.startswith("GRACEFUL_")}
    environ["PYTHONPATH"] = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])  # this checkout's graceful
    done = subprocess.run(
        [sys.executable, "-m", "uvicorn", "served:app", "--app-dir", str(tmp_path), "--port", "0"],
        cwd=tmp_path, env=environ | env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert "--socket-dir" not in done.stderr, done.stderr  # a flag uvicorn does not have
    return done


def graceful_lines(done: subprocess.CompletedProcess[str], value: str) -> list[str]:
    """The lines that speak of the directory: graceful's one line, whatever the server wraps it in."""
    return [line for line in done.stderr.splitlines() if value in line]


def test_a_variable_naming_a_directory_that_cannot_be_made_fails_the_startup_in_one_line(tmp_path: Path) -> None:
    """1. GRACEFUL_SOCKET_DIR is a path under a file  2. uvicorn runs a Starlette app with the middleware
    3. the startup fails: one line names the variable, the value and the fix; exit 3, no traceback"""
    (tmp_path / "a-file").write_text("")
    wanted = f"{tmp_path}/a-file/sub"
    done = uvicorn(tmp_path, STARLETTE_APP, GRACEFUL_SOCKET_DIR=wanted)
    assert done.returncode == UVICORN_STARTUP_FAILURE, done.stderr
    [line] = graceful_lines(done, wanted)
    assert f"graceful: environment variable GRACEFUL_SOCKET_DIR: {wanted!r} cannot be made" in line
    assert "choose a directory" in line


def test_the_option_in_code_is_named_as_the_code_gave_it(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    wanted = f"{tmp_path}/a-file/sub"
    done = uvicorn(tmp_path, STARLETTE_APP, options=f", socket_dir={wanted!r}")
    assert done.returncode == UVICORN_STARTUP_FAILURE, done.stderr
    [line] = graceful_lines(done, wanted)
    assert f"graceful: socket_dir: {wanted!r} cannot be made" in line
    assert "GRACEFUL_SOCKET_DIR" not in done.stderr


@pytest.mark.skipif(os.getuid() != 0, reason="as root, only making it can tell that /proc takes no directory")
def test_a_directory_only_the_startup_can_find_wrong_as_the_page_shows(tmp_path: Path) -> None:
    """docs/cli.md, "Messages", the issue's case: ``GRACEFUL_SOCKET_DIR=/proc/x uvicorn app:app`` for an app
    wrapped at import. Root may write /proc's entries, so nothing rules it out until makedirs fails: uvicorn
    prints the page's lines (graceful's one among them) and exits 3."""
    ((command, shown),) = console((Path(ROOT) / "docs_src/cli/socket_dir_uvicorn.console").read_text())
    (tmp_path / "app.py").write_text(WRAPPED_APP.format(options=""))
    done = subprocess.run(
        ["bash", "-c", command], cwd=tmp_path, env=terminal_env(PYTHONPATH=ROOT),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == UVICORN_STARTUP_FAILURE, done.stderr
    assert unmatched(shown, done.stderr) == [], done.stderr
    assert len(done.stderr.splitlines()) == len(shown.splitlines()), done.stderr  # nothing more: no traceback


@pytest.mark.parametrize(
    ("options", "env", "named"),
    [
        (", socket_dir='relative/dir'", {}, "socket_dir: 'relative/dir' is a relative path"),
        ("", {"GRACEFUL_SOCKET_DIR": "relative/dir"}, "GRACEFUL_SOCKET_DIR: 'relative/dir' is a relative path"),
    ],
    ids=["code", "variable"],
)
def test_a_relative_directory_is_refused_when_the_app_is_built(
    tmp_path: Path, options: str, env: dict[str, str], named: str
) -> None:
    """The server and the preStop hook would each read a relative path from their own working directory."""
    done = uvicorn(tmp_path, WRAPPED_APP, options=options, **env)
    assert done.returncode != 0, done.stderr
    [line] = graceful_lines(done, "relative/dir")
    assert named in line and "use an absolute one" in line
    assert not (tmp_path / "relative").exists()
