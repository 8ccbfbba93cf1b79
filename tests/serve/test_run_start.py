"""``graceful run``'s start, through the console script (issue 51): the flags reach an app wrapped in code
(they fill what its code left unset), and what stops a start is one line in graceful run's voice with the
documented exit code, never a traceback: an app module that raises on import, a module not in
``--app-dir``, an ``--app-dir`` that does not exist, a port in use."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.commands import Typed

pytestmark = pytest.mark.timeout(90)

GRACEFUL = str(Path(sys.executable).parent / "graceful")  # the console script of this test run's virtualenv

# An app wrapped in code that sets none of the drain options, as an app built from the README often is.
WRAPPED_WITH_NOTHING = """
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from graceful import GracefulMiddleware


async def hello(request):
    return PlainTextResponse("hello")


app = GracefulMiddleware(Starlette(routes=[Route("/hello", hello)]))
"""

RAISES_ON_IMPORT = """
import os

SETTING = os.environ["NO_SUCH_SETTING_HERE"]

async def app(scope, receive, send):
    pass
"""


def run(*args: str, cwd: Path, socket_dir: str) -> subprocess.CompletedProcess[str]:
    """``graceful run ...`` that must refuse to start: bounded, so that a server that starts fails the test."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GRACEFUL_")}
    return subprocess.run(
        [GRACEFUL, "run", *args, "--socket-dir", socket_dir],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_flags_fill_an_app_wrapped_in_code(socket_dir: str, tmp_path: Path) -> None:
    """1. an app wrapped in code with no drain option set 2. ``graceful run`` with the README's flags
    3. ``graceful status --json``: the budget in force is the flags' 90 s and 10 s, not the defaults
    (30 s and 0 s) 4. SIGTERM exits 0."""
    (tmp_path / "myapp.py").write_text(WRAPPED_WITH_NOTHING)
    line = "graceful run myapp:app --port 0 --grace-period 90 --propagation-wait 10s --no-admit-during-propagation"
    server = Typed(line, socket_dir, tmp_path / "server.log", cwd=str(tmp_path))
    try:
        server.wait_ready()
        status = subprocess.run(
            [GRACEFUL, "status", "--json", "--socket-dir", socket_dir], capture_output=True, text=True, timeout=60
        )
        (row,) = json.loads(status.stdout)
        budget = row["budget"]
        assert (budget["grace_period"], budget["propagation_wait"]) == (90.0, 10.0), budget
        assert budget["admit_during_propagation"] is False
        server.process.send_signal(signal.SIGTERM)
        assert server.wait_exit(30) == 0, server.log  # refusing at once, nothing in flight: the 10 s wait only
    finally:
        server.stop()


def test_an_app_module_that_raises_on_import_is_one_line_exit_2(socket_dir: str, tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(RAISES_ON_IMPORT)
    done = run("broken:app", "--app-dir", str(tmp_path), cwd=tmp_path, socket_dir=socket_dir)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("graceful run: cannot load app 'broken:app': importing module 'broken' raised KeyError")
    assert "'NO_SUCH_SETTING_HERE'" in line and f"{tmp_path / 'broken.py'}, line 4" in line
    assert "Traceback" not in done.stderr + done.stdout


def test_a_module_not_in_the_app_dir_names_the_folder(socket_dir: str, tmp_path: Path) -> None:
    done = run("nosuchapp:app", "--app-dir", str(tmp_path), cwd=tmp_path, socket_dir=socket_dir)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"graceful run: cannot load app 'nosuchapp:app': no module named 'nosuchapp' in {str(tmp_path)!r} "
        "(--app-dir) or on the import path; check APP's module"
    ]


def test_an_app_dir_that_does_not_exist_is_named(socket_dir: str, tmp_path: Path) -> None:
    nowhere = str(tmp_path / "nowhere")
    done = run("myapp:app", "--app-dir", nowhere, cwd=tmp_path, socket_dir=socket_dir)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("graceful run: ") and "'--app-dir'" in line and f"'{nowhere}' does not exist" in line


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_is_one_line_exit_3(workers: str, socket_dir: str, tmp_path: Path) -> None:
    """Another process listens on the port: exit 3 (the server cannot start) with one line that names the
    address, before the app is imported or its lifespan started (so no "ASGI 'lifespan' protocol appears
    unsupported." from a startup cut short)."""
    (tmp_path / "myapp.py").write_text(WRAPPED_WITH_NOTHING)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run("myapp:app", "--port", str(port), "--workers", workers, cwd=tmp_path, socket_dir=socket_dir)
    assert done.returncode == 3, done.stderr
    assert done.stderr.splitlines() == [
        f"graceful run: cannot listen on 127.0.0.1:{port}: Address already in use; "
        "stop what holds it or choose another --port"
    ]
    assert "lifespan" not in done.stderr + done.stdout
