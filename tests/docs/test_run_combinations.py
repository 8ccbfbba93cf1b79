"""The combinations README.md invites, run as written (issue 51): the app of "Use it in your server" under the
line of "Run it", FastAPI's ``add_middleware`` under ``graceful run``, docs/middleware.md's ``drain=`` form
under ``graceful run``, and a flag that contradicts the app's code. Each runs the console script in a shell,
on 127.0.0.1, with a private socket directory, and reads the budget in force back with
``graceful status --json``."""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.docs.commands import Typed, command_with, section, terminal_env
from tests.servers import Launched
from tests.test_manifests import drain_params, pod_specs, prestop
from tests.utils import ROOT

pytestmark = pytest.mark.timeout(90)

USE_IN_SERVER = "docs_src/readme/use_in_server.py"
FASTAPI_APP = "docs_src/readme/fastapi_app.py"
RUN_LINE = "docs_src/readme/run.sh"
DRAIN_FORM = "docs_src/middleware/fastapi_drain.py"
PRESTOP = "docs_src/cli/prestop.yaml"  # the hook README's "Run it" shows beside the line


def graceful(*args: str, socket_dir: str) -> subprocess.CompletedProcess[str]:
    """The console script, as a terminal runs it (this test run's virtualenv first on PATH)."""
    return subprocess.run(
        ["graceful", *args],
        env=terminal_env(GRACEFUL_SOCKET_DIR=socket_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )


def budgets(socket_dir: str) -> list[dict[str, Any]]:
    """The budget in force in every worker, as ``graceful status --json`` reads it."""
    status = graceful("status", "--json", socket_dir=socket_dir)
    assert status.returncode == 0, status.stderr
    return [worker["budget"] for worker in json.loads(status.stdout)]


def on_this_machine(argv: list[str]) -> str:
    """A ``graceful run`` line from a page, bound to 127.0.0.1 and a port the kernel picks (its
    "running on" line names it): the page's ``--host 0.0.0.0 --port 8000`` would clash on a shared machine."""
    argv = list(argv)
    for flag, value in (("--host", "127.0.0.1"), ("--port", "0")):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return shlex.join(argv)


def run_line(app: str, *flags: str, folder: str, socket_dir: str) -> str:
    return on_this_machine(["graceful", "run", app, "--app-dir", folder, "--socket-dir", socket_dir, *flags])


class Stream(threading.Thread):
    """One ``POST /generate?tokens=N`` token stream, read to its end."""

    def __init__(self, server: Launched, tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.tokens = server.url("/generate"), tokens
        self.body = ""
        self.started = threading.Event()
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url, params={"tokens": self.tokens}, timeout=30) as response:
                for chunk in response.iter_text():
                    self.body += chunk
                    self.started.set()
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self.started.set()

    @property
    def whole(self) -> bool:
        expected = "".join(f"data: token {i}\n\n" for i in range(1, self.tokens + 1)) + "data: [DONE]\n\n"
        return self.body == expected


def streams(server: Launched, count: int, tokens: int) -> list[Stream]:
    started = [Stream(server, tokens) for _ in range(count)]
    for stream in started:
        stream.start()
    for stream in started:
        assert stream.started.wait(10) and stream.body, (stream.error, server.log)
    return started


def test_the_readme_app_under_the_run_line(socket_dir: str, tmp_path: Path) -> None:
    """1. "Use it in your server"'s app, saved as myapp.py 2. "Run it"'s line, run by bash in its folder
    (127.0.0.1 and a free port) 3. ``graceful status --json``: the budget in force is 90 s and 10 s, the
    line's, the code's and the preStop hook's 4. a stream in flight 5. the preStop ``graceful drain`` (its
    wait shortened to 0 s here) exits 0 and the stream ends whole 6. SIGTERM exits 0."""
    shutil.copy(Path(ROOT) / USE_IN_SERVER, tmp_path / "myapp.py")
    line = command_with(RUN_LINE, "graceful", "run")
    assert line[2] == "myapp:app"
    server = Typed(on_this_machine(line), socket_dir, tmp_path / "server.log", cwd=str(tmp_path))
    try:
        server.wait_ready()
        (budget,) = budgets(socket_dir)
        assert (budget["grace_period"], budget["propagation_wait"]) == (90.0, 10.0)
        (document,) = yaml.safe_load_all((Path(ROOT) / PRESTOP).read_text())
        ((spec, container),) = [(spec, c) for spec in pod_specs(document) for c in spec["containers"]]
        hook = drain_params(prestop(container))
        assert spec["terminationGracePeriodSeconds"] == budget["grace_period"]
        assert (hook["grace_period"], hook["propagation_wait"]) == (90.0, 10.0)

        (stream,) = streams(server, 1, tokens=20)
        drained = graceful("drain", "--propagation-wait", "0s", socket_dir=socket_dir)
        assert drained.returncode == 0, drained.stderr
        stream.join(10)
        assert stream.whole, (stream.body, stream.error)
        server.process.send_signal(signal.SIGTERM)
        assert server.wait_exit(20) == 0, server.log
    finally:
        server.stop()


@pytest.mark.parametrize("workers", [1, 2])
def test_the_fastapi_recipe_under_graceful_run(workers: int, socket_dir: str, tmp_path: Path) -> None:
    """1. the FastAPI app (``app.add_middleware(GracefulMiddleware, grace_period=90)``) under ``graceful run``
    with ``--grace-period 90`` (the code's own value) and flags for what its code leaves unset 2. one admin
    socket per worker: the app is not wrapped a second time 3. ``graceful status --json``: grace period 90 s
    from the code, propagation wait and reserve from the flags 4. streams in flight 5. SIGTERM drains them
    whole and the process exits 0."""
    assert section(FASTAPI_APP, "add_middleware").endswith("app.add_middleware(GracefulMiddleware, grace_period=90)\n")
    flags = ["--grace-period", "90", "--propagation-wait", "1s", "--reserve", "20", "--workers", str(workers)]
    line = run_line("fastapi_app:app", *flags, folder=str(Path(ROOT) / "docs_src/readme"), socket_dir=socket_dir)
    server = Typed(line, socket_dir, tmp_path / "server.log")
    try:
        server.wait_ready(sockets=workers)
        assert len(server.sockets()) == workers, server.log
        found = budgets(socket_dir)
        assert [(b["grace_period"], b["propagation_wait"], b["reserve"]) for b in found] == [
            (90.0, 1.0, 20.0)
        ] * workers
        running = streams(server, 2, tokens=20)
        server.process.send_signal(signal.SIGTERM)
        assert server.wait_exit(30) == 0, server.log
        for stream in running:
            stream.join(10)
            assert stream.whole, (stream.body, stream.error)
        assert "SIGTERM received: draining" in server.log
        assert "in use by another process" not in server.log
    finally:
        server.stop()


def test_the_drain_form_under_graceful_run(socket_dir: str, tmp_path: Path) -> None:
    """1. docs/middleware.md's FastAPI app, its ``Drain`` made at import and passed with ``drain=``, under
    ``graceful run`` with ``--reserve 20`` (left unset by its code) and ``--propagation-wait 10s`` (its code's
    own value) 2. one admin socket 3. ``graceful status --json``: 120 s and 10 s from the code, the reserve from
    the flag 4. the preStop drain (its wait shortened to 0 s) exits 0 and a new request gets the not-started
    503 5. SIGTERM exits 0."""
    flags = ["--reserve", "20", "--propagation-wait", "10s"]
    line = run_line("fastapi_drain:app", *flags, folder=str(Path(ROOT) / "docs_src/middleware"), socket_dir=socket_dir)
    server = Typed(line, socket_dir, tmp_path / "server.log")
    try:
        server.wait_ready()
        assert len(server.sockets()) == 1, server.log
        (budget,) = budgets(socket_dir)
        assert (budget["grace_period"], budget["propagation_wait"], budget["reserve"]) == (120.0, 10.0, 20.0)
        assert httpx.post(server.url("/generate"), timeout=10).status_code == 200
        drained = graceful("drain", "--propagation-wait", "0s", socket_dir=socket_dir)
        assert drained.returncode == 0, drained.stderr
        refused = httpx.post(server.url("/generate"), timeout=10)
        assert (refused.status_code, refused.headers.get("x-graceful-not-started")) == (503, "1")
        sent = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.wait_exit(20) == 0, server.log
        assert time.monotonic() - sent < 10  # drained already: SIGTERM does not wait the 10 s again
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("app", "flags", "said"),
    [
        (
            "fastapi_app:app",
            ["--grace-period", "120"],
            "--grace-period 120 contradicts grace_period=90 set in code for fastapi_app:app; "
            "drop the flag or the code's value",
        ),
        (
            "use_in_server:app",
            ["--grace-period", "90", "--propagation-wait", "5s", "--no-admit-during-propagation"],
            "--propagation-wait 5s contradicts propagation_wait=10 set in code for use_in_server:app; "
            "drop the flag or the code's value",
        ),
    ],
)
def test_a_flag_that_contradicts_the_code_is_refused(app: str, flags: list[str], said: str, socket_dir: str) -> None:
    """A flag whose value differs from the one the app's code set: exit 2 at start, one line in graceful run's
    voice naming both, no server started. Flags equal to the code's values, or setting what the code left
    unset, are not named."""
    line = run_line(app, *flags, folder=str(Path(ROOT) / "docs_src/readme"), socket_dir=socket_dir)
    done = subprocess.run(
        ["bash", "-c", line],
        env=terminal_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"graceful run: {said}"], done.stderr
    assert list(Path(socket_dir).iterdir()) == []
