"""End to end: `graceful run` and `graceful drain` as real processes, real signals, 127.0.0.1 only."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

from graceful import GracefulMiddleware
from graceful._server import GracefulServer
from tests.apps_streaming import app as streaming_app
from tests.utils import free_port, run_uvicorn

ROOT = str(Path(__file__).resolve().parent.parent)


class Launched:
    """A server process on 127.0.0.1 with its log in a file (a full pipe would block it)."""

    def __init__(self, command: list[str], socket_dir: str, port: int, log: Path) -> None:
        self.port = port
        self.socket_dir = socket_dir
        self.log_path = log
        env = {**os.environ, "GRACEFUL_SOCKET_DIR": socket_dir, "PYTHONUNBUFFERED": "1"}
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_ready(self, sockets: int = 1) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log
            if len(glob.glob(os.path.join(self.socket_dir, "*.sock"))) >= sockets:
                try:
                    if httpx.get(self.url("/ready"), timeout=1).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.05)
        raise AssertionError(f"server not ready:\n{self.log}")

    def wait_exit(self, limit: float) -> int:
        try:
            return self.process.wait(limit)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"server still running after {limit}s:\n{self.log}") from None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)


class Stream(threading.Thread):
    """One streamed request; records its body and when its last byte arrived."""

    def __init__(self, url: str, frames: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.url, self.frames, self.interval = url, frames, interval
        self.body = ""
        self.finished = 0.0
        self.error: Exception | None = None
        self.status = 0

    def run(self) -> None:
        try:
            with httpx.stream(
                "GET", self.url, params={"frames": self.frames, "interval": self.interval}, timeout=30
            ) as response:
                self.status = response.status_code
                for chunk in response.iter_text():
                    self.body += chunk
            self.finished = time.monotonic()
        except httpx.TransportError as exc:
            self.error = exc

    @property
    def whole(self) -> bool:
        expected = "".join(f"frame {i}\n" for i in range(self.frames)) + "done\n"
        return self.status == 200 and self.body == expected


@pytest.fixture
def launch(socket_dir: str, tmp_path: Path) -> Iterator[Callable[..., Launched]]:
    started: list[Launched] = []

    def start(*options: str, app: str = "tests.apps_streaming:app", uvicorn: bool = False) -> Launched:
        port = free_port()
        if uvicorn:
            command = [sys.executable, "-m", "uvicorn", app, "--port", str(port)]
        else:
            command = [sys.executable, "-m", "graceful", "run", app, "--port", str(port)]
            command += ["--grace-period", "6", "--reserve", "1", *options]
        server = Launched(command, socket_dir, port, tmp_path / f"server-{len(started)}.log")
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def graceful(*args: str, socket_dir: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "graceful", *args, "--socket-dir", socket_dir]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_streams(server: Launched, count: int, frames: int) -> list[Stream]:
    streams = [Stream(server.url("/stream"), frames) for _ in range(count)]
    for stream in streams:
        stream.start()
    deadline = time.monotonic() + 5
    while sum(1 for s in streams if s.body) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(s.body for s in streams), "streams did not start"
    return streams


def wait_status(server: Launched, code: int, limit: float = 5.0) -> float:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if httpx.get(server.url("/ready"), timeout=1).status_code == code:
                return time.monotonic()
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"/ready never answered {code}:\n{server.log}")


def test_prestop_drain_then_sigterm(launch: Callable[..., Launched]) -> None:
    """1. three 5 s streams in flight 2. `graceful drain` from another process 3. /ready and new
    requests get 503 at once 4. every stream arrives whole 5. drain exits 0 just after the last
    frame 6. SIGTERM exits 0 quickly."""
    server = launch("--propagation-wait", "0.3s", "--no-admit-during-propagation")
    server.wait_ready()
    streams = start_streams(server, 3, frames=50)
    drain = graceful("drain", socket_dir=server.socket_dir)
    wait_status(server, 503)
    refused = httpx.get(server.url("/hello"), timeout=2)
    assert refused.status_code == 503 and "retry-after" in refused.headers
    assert all(s.is_alive() for s in streams), "the drain must start while streams are in flight"
    out, err = drain.communicate(timeout=15)
    drain_ended = time.monotonic()
    assert drain.returncode == 0, err
    for stream in streams:
        stream.join(5)
        assert stream.whole, (stream.body, stream.error)
    assert 0 <= drain_ended - max(s.finished for s in streams) < 1.0
    assert "draining 1 worker" in err and "drained 1 of 1 worker" in err
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(5) == 0
    assert time.monotonic() - sent < 1.5
    assert glob.glob(os.path.join(server.socket_dir, "*.sock")) == []


def test_sigterm_only(launch: Callable[..., Launched]) -> None:
    """1. two 2 s streams 2. SIGTERM 3. the listener stays open answering 503 through the 1 s
    propagation wait (refuse mode) 4. streams arrive whole 5. the process exits 0 right after the last frame."""
    server = launch("--propagation-wait", "1s", "--no-admit-during-propagation")
    server.wait_ready()
    streams = start_streams(server, 2, frames=20)
    server.process.send_signal(signal.SIGTERM)
    wait_status(server, 503)
    assert httpx.get(server.url("/hello"), timeout=2).status_code == 503
    time.sleep(0.5)  # still inside the propagation wait: connections are still accepted
    assert httpx.get(server.url("/hello"), timeout=2).status_code == 503
    assert server.wait_exit(10) == 0
    exited = time.monotonic()
    for stream in streams:
        stream.join(5)
        assert stream.whole, (stream.body, stream.error)
    assert exited - max(s.finished for s in streams) < 2.0  # interpreter exit included, on a busy CI box
    assert "SIGTERM received: draining" in server.log


def test_sigterm_admits_until_the_propagation_wait_ends_by_default(launch: Callable[..., Launched]) -> None:
    """1. a 4 s stream keeps the drain open 2. SIGTERM 3. /ready turns 503 at once 4. a new request is
    still served, with Connection: close 5. once the 1 s wait has passed, new requests get the
    not-started 503 6. the stream arrives whole and the process exits 0."""
    server = launch("--propagation-wait", "1s")
    server.wait_ready()
    (stream,) = start_streams(server, 1, frames=40)
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    wait_status(server, 503)
    served = httpx.get(server.url("/hello"), timeout=2)
    assert served.status_code == 200 and served.headers["connection"] == "close"
    refused = served
    deadline = time.monotonic() + 5
    while refused.status_code == 200 and time.monotonic() < deadline:
        refused = httpx.get(server.url("/hello"), timeout=2)
    refused_at = time.monotonic()
    assert refused.status_code == 503, server.log
    assert refused.headers["x-graceful-not-started"] == "1"
    assert refused_at - sent >= 1.0  # never before the wait has passed
    assert server.wait_exit(10) == 0
    stream.join(5)
    assert stream.whole, (stream.body, stream.error)


def test_deadline_exit_1_with_leftover(launch: Callable[..., Launched]) -> None:
    """1. a 10 s stream 2. `graceful drain --timeout 1s` 3. exit 1 naming what was left 4. SIGTERM exits 0."""
    server = launch()
    server.wait_ready()
    start_streams(server, 1, frames=100)
    drain = graceful("drain", "--timeout", "1s", socket_dir=server.socket_dir)
    out, err = drain.communicate(timeout=15)
    assert drain.returncode == 1, err
    pid = server.process.pid
    assert f"worker {pid}: timeout with 1 in flight; 1 ended at the deadline" in err
    assert "left: " in err and "/stream" in err
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(5) == 0


def test_workers_drained_by_one_command(launch: Callable[..., Launched]) -> None:
    """1. `--workers 2` 2. both sockets appear 3. one `graceful drain` drains both 4. SIGTERM exits 0."""
    server = launch("--workers", "2", "--propagation-wait", "0.2s")
    server.wait_ready(sockets=2)
    streams = start_streams(server, 4, frames=50)
    drain = graceful("drain", "--json", socket_dir=server.socket_dir)
    out, err = drain.communicate(timeout=20)
    assert drain.returncode == 0, err
    outcome = json.loads(out)
    assert outcome["result"] == "drained"
    assert len(outcome["workers"]) == 2
    assert {w["result"]["result"] for w in outcome["workers"]} == {"drained"}
    for stream in streams:
        stream.join(5)
        assert stream.whole, (stream.body, stream.error)
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(10) == 0
    assert glob.glob(os.path.join(server.socket_dir, "*.sock")) == []


def test_workers_sigterm_drains_every_worker(launch: Callable[..., Launched]) -> None:
    """1. `--workers 2` with streams 2. SIGTERM to the supervisor 3. streams whole 4. exit 0."""
    server = launch("--workers", "2")
    server.wait_ready(sockets=2)
    streams = start_streams(server, 4, frames=20)
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(15) == 0
    for stream in streams:
        stream.join(5)
        assert stream.whole, (stream.body, stream.error)
    assert "draining 2 worker(s)" in server.log


def test_second_signal_forces_exit(launch: Callable[..., Launched]) -> None:
    """1. a 10 s stream 2. SIGTERM starts the drain 3. SIGINT forces exit at once, logged, exit 1."""
    server = launch()
    server.wait_ready()
    (stream,) = start_streams(server, 1, frames=100)
    server.process.send_signal(signal.SIGTERM)
    wait_status(server, 503)
    sent = time.monotonic()
    server.process.send_signal(signal.SIGINT)
    assert server.wait_exit(5) == 1
    assert time.monotonic() - sent < 2
    assert "forcing exit with 1 request(s) in flight" in server.log
    stream.join(5)
    assert not stream.whole


def test_already_wrapped_app_warns_on_conflicting_options(launch: Callable[..., Launched]) -> None:
    server = launch("--propagation-wait", "3s", app="tests.apps_streaming:wrapped")
    server.wait_ready()
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(5) == 0  # the app's own propagation_wait=0 applies, not 3 s
    assert "ignoring --propagation-wait 3.0" in server.log


def test_plain_uvicorn_gets_the_prestop_path(launch: Callable[..., Launched]) -> None:
    """Under `uvicorn app:app` the middleware's admin socket still serves `graceful drain`."""
    server = launch(app="tests.apps_streaming:wrapped", uvicorn=True)
    server.wait_ready()
    streams = start_streams(server, 2, frames=15)
    drain = graceful("drain", socket_dir=server.socket_dir)
    out, err = drain.communicate(timeout=15)
    assert drain.returncode == 0, err
    for stream in streams:
        stream.join(5)
        assert stream.whole
    server.process.send_signal(signal.SIGTERM)
    server.wait_exit(5)
    assert glob.glob(os.path.join(server.socket_dir, "*.sock")) == []


def test_socket_dir_too_long_refused_before_start(socket_dir: str) -> None:
    long_dir = os.path.join(socket_dir, "x" * 100)
    result = subprocess.run(
        [sys.executable, "-m", "graceful", "run", "tests.apps_streaming:app", "--socket-dir", long_dir],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "over the 107-byte Unix socket limit" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.anyio
async def test_connections_open_at_drain_start_get_one_more_request(registry: CollectorRegistry) -> None:
    """1. a keep-alive connection is open 2. a drain starts (here through the Drain, as the admin
    socket would) 3. after the propagation wait a new connection gets 503 4. the pinned one is
    served once, with Connection: close."""
    mw = GracefulMiddleware(
        streaming_app,
        registry=registry,
        admin=False,
        grace_period=6,
        reserve=1,
        propagation_wait=0.2,
        admit_during_propagation=True,
    )

    def make(config: uvicorn.Config) -> GracefulServer:
        return GracefulServer(config, mw.drain)

    async with run_uvicorn(mw, server_class=make) as server:  # type: ignore[arg-type]
        base = f"http://127.0.0.1:{server.port}"
        async with httpx.AsyncClient(base_url=base) as pinned, httpx.AsyncClient(base_url=base) as fresh:
            assert (await pinned.get("/hello")).status_code == 200
            mw.drain.begin_drain("test")
            assert len(mw.drain.pinned) == 1
            await anyio.sleep(0.3)  # past the propagation wait
            assert (await fresh.get("/hello")).status_code == 503
            again = await pinned.get("/hello")
            assert again.status_code == 200
            assert again.headers["connection"] == "close"
            assert (await pinned.get("/hello")).status_code == 503  # once only


@pytest.mark.anyio
async def test_exit_follows_the_drain_at_once(registry: CollectorRegistry) -> None:
    """The launcher wakes on an event: should_exit is acted on well before uvicorn's 0.1 s tick."""
    mw = GracefulMiddleware(streaming_app, registry=registry, admin=False, grace_period=6, reserve=1)
    server = GracefulServer(uvicorn.Config(mw, host="127.0.0.1", port=free_port(), log_level="warning"), mw.drain)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(10):
            while not server.started:
                await anyio.sleep(0.01)
        ticks: list[int] = []
        original = server.on_tick

        async def counting_tick(counter: int) -> bool:
            ticks.append(counter)
            return await original(counter)

        server.on_tick = counting_tick  # type: ignore[method-assign]
        await anyio.sleep(0.35)
        assert len(ticks) >= 2  # still ticks regularly for the date header
        server._on_signal(signal.SIGTERM)  # what handle_exit schedules on the loop
        with anyio.fail_after(3):
            while not server.should_exit:
                await anyio.sleep(0.001)
        assert mw.drain.state.value in ("DRAINING", "STOPPED")
        assert server.signals_received == 1 and server.forced_exits == 0
