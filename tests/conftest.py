"""Fixtures shared by the test files."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from prometheus_client import CollectorRegistry

from graceful import GracefulMiddleware
from tests import tiers
from tests.apps.streaming import app as streaming_app
from tests.servers import Launched, Served
from tests.utils import ROOT, listening_socket


def pytest_configure(config: pytest.Config) -> None:
    """Give SIGINT back its default for the processes the tests start.

    A run started in the background of a non-interactive shell (``cmd &``, nohup, some CI
    runners) inherits SIGINT ignored, and an ignored signal stays ignored across exec: every
    server and ``graceful`` command the tests start would then ignore the Ctrl-C that the
    tests send them, and those tests would fail on the runner's setup, not on a broken promise.
    A handler of this process's own is reset to the default at exec instead.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for line in tiers.MARKERS:
        config.addinivalue_line("markers", line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test's tier, one of ``tests/tiers.TIERS`` (docs/testing.md, "Tiers")."""
    tiers.assign(items, ROOT)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _in_its_tier(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _in_its_tier(item))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tiers.TIMES.add(report)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Each tier's count and time, so that a slow change is seen when it lands (CI prints it)."""
    for line in tiers.TIMES.lines():
        terminalreporter.write_line(line)


def _in_its_tier(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("fast") is None:
        return (yield)
    with tiers.forbid_processes(item.nodeid):
        return (yield)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def registry() -> CollectorRegistry:
    """A fresh registry per test, so metric values never leak between tests."""
    return CollectorRegistry()


@pytest.fixture
def socket_dir() -> Iterator[str]:
    """A short directory for Unix sockets: pytest's tmp_path can exceed the ~107-byte limit."""
    with tempfile.TemporaryDirectory(prefix="g-", dir="/tmp") as path:
        os.chmod(path, 0o700)
        yield path


@pytest.fixture
def launch(socket_dir: str, tmp_path: Path) -> Iterator[Callable[..., Launched]]:
    """Start servers as subprocesses (``graceful run`` unless ``server=`` names another, see
    tests/servers.py); every one is stopped at teardown.

    ``graceful run`` gets ``--grace-period 6 --reserve 1`` before the options given.
    """
    started: list[Launched] = []

    def start(
        *options: str, app: str = "tests.apps.streaming:app", server: str = "graceful-run", **env: str
    ) -> Launched:
        if server == "graceful-run":
            options = ("--grace-period", "6", "--reserve", "1", *options)
        launched = Launched(server, app, options, socket_dir, tmp_path / f"server-{len(started)}.log", **env)
        started.append(launched)
        return launched

    yield start
    for launched in started:
        launched.stop()


@pytest.fixture
def served(socket_dir: str) -> Iterator[Served]:
    """A real uvicorn in a thread (CliRunner runs its own event loop on this one), on a socket
    bound here and passed in."""
    mw = GracefulMiddleware(
        streaming_app, registry=CollectorRegistry(), socket_dir=socket_dir, grace_period=6, reserve=1
    )
    sock = listening_socket()
    server = uvicorn.Server(uvicorn.Config(mw, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:  # uvicorn offers a flag, not an event
        assert thread.is_alive(), "uvicorn failed to start"
        time.sleep(0.01)
    assert server.started
    try:
        yield Served(mw, sock.getsockname()[1], socket_dir)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
