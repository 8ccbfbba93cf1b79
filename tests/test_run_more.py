"""More of `graceful run`: the multi-worker supervisor's signals, a signal during startup,
--uds, bad APPs, and GracefulServer embedded off the main thread."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

from graceful import GracefulMiddleware, State
from graceful._admin_server import is_listening
from graceful._server import GracefulServer
from tests.apps_streaming import app as streaming_app
from tests.test_run import Launched, start_streams
from tests.utils import free_port

ROOT = str(Path(__file__).resolve().parent.parent)


def graceful(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graceful", *args], cwd=ROOT, capture_output=True, text=True, timeout=30
    )


def wait_for_log(server: Launched, text: str, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while text not in server.log:
        assert time.monotonic() < deadline, f"never logged {text!r}:\n{server.log}"
        assert server.process.poll() is None, server.log
        time.sleep(0.02)


def test_workers_status_resume_then_sigint_drains_all(launch: Callable[..., Launched]) -> None:
    """1. `--workers 2` 2. `status` lists both 3. one is drained through its own socket
    4. `resume` undrains it and leaves the other alone 5. SIGINT to the supervisor drains
    both and exits 0."""
    server = launch("--workers", "2")
    server.wait_ready(sockets=2)
    rows = json.loads(graceful("status", "--json", "--socket-dir", server.socket_dir).stdout)
    assert len(rows) == 2 and {row["state"] for row in rows} == {"SERVING"}
    first, second = rows
    assert first["pid"] != second["pid"]
    drained = graceful("drain", "--socket", first["socket"], "--quiet")
    assert drained.returncode == 0, drained.stderr
    resumed = graceful("resume", "--socket-dir", server.socket_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(resumed.stdout.splitlines()) == sorted(
        [f"worker {first['pid']}: SERVING (resumed)", f"worker {second['pid']}: SERVING"]
    )
    streams = start_streams(server, 2, frames=10)
    server.process.send_signal(signal.SIGINT)
    assert server.wait_exit(15) == 0
    for stream in streams:
        stream.join(5)
        assert stream.whole, (stream.body, stream.error)
    assert "SIGINT received: draining 2 worker(s)" in server.log
    assert glob.glob(os.path.join(server.socket_dir, "*.sock")) == []


def test_workers_second_signal_kills_them_and_exits_1(launch: Callable[..., Launched]) -> None:
    """1. `--workers 2`, a 10 s stream 2. SIGTERM starts the drain 3. SIGTERM again kills the
    workers at once 4. exit 1, logged, the stream is cut."""
    server = launch("--workers", "2")
    server.wait_ready(sockets=2)
    (stream,) = start_streams(server, 1, frames=100)
    server.process.send_signal(signal.SIGTERM)
    wait_for_log(server, "SIGTERM received: draining 2 worker(s)")
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(10) == 1
    assert time.monotonic() - sent < 5
    assert "second signal (SIGTERM): killing 2 worker(s) now" in server.log
    stream.join(5)
    assert not stream.whole


def test_workers_without_admin_sockets_still_stop(launch: Callable[..., Launched]) -> None:
    """The app is wrapped with admin=False: the supervisor finds no worker to drain, says so,
    and still stops them (uvicorn's own SIGTERM to each)."""
    server = launch("--workers", "2", app="tests.apps_more_workers:no_admin")
    server.wait_ready(sockets=0)
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(15) == 0
    assert "no graceful server found: nothing is listening on" in server.log
    assert glob.glob(os.path.join(server.socket_dir, "*.sock")) == []


def test_sigterm_during_startup_exits_without_draining(launch: Callable[..., Launched]) -> None:
    """1. the app's startup takes 1.5 s 2. SIGTERM arrives while the drain is STARTING
    3. no drain runs: the process exits 0 once startup returns."""
    server = launch(app="tests.apps_more_workers:slow_start")
    wait_for_log(server, "slow startup begins")
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(10) == 0
    assert "SIGTERM received while STARTING: exiting" in server.log
    assert "draining" not in server.log


def test_uds_serves_and_drains_on_sigterm(socket_dir: str, tmp_path: Path) -> None:
    """`--uds PATH`: traffic over a Unix socket, the admin socket beside it, SIGTERM exits 0."""
    uds = os.path.join(socket_dir, "app.uds")
    admin_dir = os.path.join(socket_dir, "admin")
    log = tmp_path / "uds.log"
    command = [sys.executable, "-m", "graceful", "run", "tests.apps_streaming:app", "--uds", uds]
    command += ["--socket-dir", admin_dir, "--grace-period", "6", "--reserve", "1"]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        # Poll with a plain probe: httpcore leaks the socket of a failed Unix connect.
        while "Application startup complete" not in log.read_text() or not is_listening(uds):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        with httpx.Client(transport=httpx.HTTPTransport(uds=uds), base_url="http://app", timeout=2) as client:
            assert client.get("/ready").status_code == 200
            assert client.get("/hello").text == "hello"
        assert glob.glob(os.path.join(admin_dir, "*.sock")) == [os.path.join(admin_dir, f"{process.pid}.sock")]
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    assert "SIGTERM received: draining" in log.read_text()


@pytest.mark.parametrize(
    ("app", "named"),
    [("tests.apps_streaming", "tests.apps_streaming"), ("tests.no_such_module:app", "tests.no_such_module")],
)
def test_bad_app_exits_2_naming_it(app: str, named: str) -> None:
    result = graceful("run", app, "--port", str(free_port()))
    assert result.returncode == 2, result.stderr
    assert f"cannot load app {app!r}" in result.stderr and named in result.stderr
    assert "Traceback" not in result.stderr


def test_app_that_is_not_callable_exits_2(socket_dir: str) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "graceful", "run", "tests.apps_streaming:not_an_app", "--port", str(free_port())],
        cwd=ROOT,
        env={**os.environ, "GRACEFUL_SOCKET_DIR": socket_dir},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = process.communicate(timeout=3)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
    assert process.returncode == 2, err
    assert "tests.apps_streaming:not_an_app" in err


def test_wrapped_app_warns_naming_each_conflicting_option(launch: Callable[..., Launched]) -> None:
    """Options the wrapped app already fixed are named one per line; agreeing ones are not."""
    server = launch("--drain-timeout", "3s", "--no-admit-during-propagation", app="tests.apps_streaming:wrapped")
    server.wait_ready()
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(5) == 0
    log = server.log
    assert "GracefulMiddleware with drain_timeout=None; ignoring --drain-timeout 3.0" in log
    assert "with admit_during_propagation=True; ignoring --no-admit-during-propagation" in log
    # --grace-period 6 and --reserve 1 agree with the wrapped app's own values.
    assert "ignoring --grace-period" not in log and "ignoring --reserve" not in log


def test_graceful_server_runs_off_the_main_thread(registry: CollectorRegistry) -> None:
    """Embedded in a thread, signal handlers cannot be installed: it must run anyway and
    leave the main thread's handlers alone."""
    before = signal.getsignal(signal.SIGTERM)
    mw = GracefulMiddleware(streaming_app, registry=registry, admin=False, grace_period=6, reserve=1)
    port = free_port()
    server = GracefulServer(uvicorn.Config(mw, host="127.0.0.1", port=port, log_level="warning"), mw.drain)
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        assert httpx.get(f"http://127.0.0.1:{port}/hello", timeout=5).text == "hello"
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        server.should_exit = True
        thread.join(10)
    assert not thread.is_alive()
    assert mw.drain.state is State.STOPPED


@pytest.mark.anyio
async def test_exit_requested_before_the_loop_runs(registry: CollectorRegistry) -> None:
    """handle_exit before serve() (no loop to hand over to yet) just asks uvicorn to exit:
    the server starts, stops at once, and no drain runs."""
    mw = GracefulMiddleware(streaming_app, registry=registry, admin=False, grace_period=6, reserve=1)
    server = GracefulServer(uvicorn.Config(mw, host="127.0.0.1", port=free_port(), log_level="warning"), mw.drain)
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit
    with anyio.fail_after(5):
        await server.serve()
    assert server.signals_received == 0
    assert mw.drain.counters()["drains"] == {}
