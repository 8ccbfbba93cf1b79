"""The admin listener over a real Unix socket, next to a real uvicorn serving inference traffic."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import stat
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

from graceful import ConfigError, Drain, GracefulMiddleware, State
from graceful._admin_server import AdminServer, prepare_socket_dir
from graceful._paths import socket_path
from tests.apps_streaming import app as streaming_app
from tests.utils import free_port, run_uvicorn

pytestmark = pytest.mark.anyio


@dataclass
class Rig:
    drain: Drain
    admin: AdminServer
    port: int

    def admin_client(self) -> httpx.AsyncClient:
        transport = httpx.AsyncHTTPTransport(uds=self.admin.path)
        return httpx.AsyncClient(transport=transport, base_url="http://graceful", timeout=10)


@pytest.fixture
async def rig(socket_dir: str, registry: CollectorRegistry) -> AsyncIterator[Rig]:
    """uvicorn on 127.0.0.1 with the middleware, and an admin listener with short timeouts on its Drain."""
    mw = GracefulMiddleware(streaming_app, registry=registry, admin=False, grace_period=6, reserve=1)
    admin = AdminServer(mw.drain, socket_dir=socket_dir, request_timeout=0.5, max_connections=4)
    async with run_uvicorn(mw) as server, anyio.create_task_group() as tg:
        await tg.start(admin.serve)
        yield Rig(mw.drain, admin, server.port)
        tg.cancel_scope.cancel()


class Traffic:
    """Inference requests sent all along a test; every one must succeed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.ok = 0
        self.failures: list[object] = []

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", timeout=5) as client:
            task_status.started()
            while True:
                response = await client.get("/hello")
                if response.status_code == 200 and response.text == "hello":
                    self.ok += 1
                else:
                    self.failures.append(response.status_code)
                await anyio.sleep(0.01)


async def with_traffic(rig: Rig, check: object) -> Traffic:
    traffic = Traffic(rig.port)
    async with anyio.create_task_group() as tg:
        await tg.start(traffic.run)
        await check()  # type: ignore[operator]
        with anyio.fail_after(5):
            before = traffic.ok
            while traffic.ok < before + 3:  # the server still answers after the bad input
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert traffic.failures == []
    assert rig.drain.state is State.SERVING
    return traffic


async def raw(path: str, data: bytes, *, read_timeout: float = 3.0) -> bytes:
    """Send raw bytes, return everything the server sends until it closes."""
    async with await anyio.connect_unix(path) as stream:
        if data:
            await stream.send(data)
        chunks = []
        with anyio.fail_after(read_timeout):
            while True:
                try:
                    chunks.append(await stream.receive())
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
    return b"".join(chunks)


async def test_status_reports_state_and_counters(rig: Rig) -> None:
    async with rig.admin_client() as client:
        response = await client.get("/status")
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "SERVING"
    assert body["pid"] == os.getpid()
    assert body["in_flight"] == 0
    assert body["deadline"] is None
    assert "requests" in body["counters"]


async def test_socket_file_is_private_and_named_by_pid(rig: Rig, socket_dir: str) -> None:
    assert rig.admin.path == os.path.join(socket_dir, f"{os.getpid()}.sock")
    assert stat.S_IMODE(os.stat(rig.admin.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(socket_dir).st_mode) == 0o700


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_reads_status(rig: Rig) -> None:
    command = ["curl", "-s", "--unix-socket", rig.admin.path, "http://graceful/status"]
    result = await anyio.run_process(command)
    assert json.loads(result.stdout)["state"] == "SERVING"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/nope", 404), ("POST", "/status", 405), ("GET", "/drain", 405), ("DELETE", "/resume", 405)],
)
async def test_unknown_path_and_wrong_method(rig: Rig, method: str, path: str, status: int) -> None:
    async def check() -> None:
        async with rig.admin_client() as client:
            response = await client.request(method, path)
        assert response.status_code == status
        assert "error" in response.json()
        if status == 405:
            assert response.headers["allow"] in ("GET", "POST")

    await with_traffic(rig, check)


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("propagation_wait=soon", "'soon'"),
        ("timeout=-5s", "'-5s'"),
        ("timeout=1x", "'1x'"),
        ("speed=fast", "speed='fast'"),
        ("propagation_wait", "'propagation_wait' is malformed"),
    ],
)
async def test_bad_drain_parameters_are_400_and_change_nothing(rig: Rig, query: str, named: str) -> None:
    async def check() -> None:
        async with rig.admin_client() as client:
            response = await client.post(f"/drain?{query}")
        assert response.status_code == 400
        assert named in response.json()["error"]

    await with_traffic(rig, check)
    assert rig.drain.counters()["drains"] == {}


async def test_malformed_http_is_400(rig: Rig) -> None:
    async def check() -> None:
        answer = await raw(rig.admin.path, b"THIS IS NOT HTTP\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400")

    await with_traffic(rig, check)


async def test_oversized_headers_are_refused(rig: Rig) -> None:
    async def check() -> None:
        big = b"GET /status HTTP/1.1\r\nhost: graceful\r\nx-pad: " + b"a" * (70 * 1024) + b"\r\n\r\n"
        answer = await raw(rig.admin.path, big)
        assert answer == b"" or answer.startswith(b"HTTP/1.1 413")

    await with_traffic(rig, check)


async def test_oversized_body_is_413(rig: Rig) -> None:
    async def check() -> None:
        head = b"POST /resume HTTP/1.1\r\nhost: graceful\r\ncontent-length: 100000\r\n\r\n"
        answer = await raw(rig.admin.path, head)
        assert answer.startswith(b"HTTP/1.1 413")

    await with_traffic(rig, check)


@pytest.mark.parametrize("data", [b"", b"GET /status HTTP/1.1\r\nhost: gra"])
async def test_idle_and_half_sent_connections_time_out(rig: Rig, data: bytes) -> None:
    async def check() -> None:
        started = time.monotonic()
        answer = await raw(rig.admin.path, data, read_timeout=3)
        assert answer == b""
        assert 0.4 < time.monotonic() - started < 2.5  # request_timeout is 0.5 s

    await with_traffic(rig, check)


async def test_connections_over_the_cap_are_closed(rig: Rig) -> None:
    async def check() -> None:
        idle = [await anyio.connect_unix(rig.admin.path) for _ in range(4)]  # the cap
        try:
            await anyio.sleep(0.05)
            started = time.monotonic()
            assert await raw(rig.admin.path, b"GET /status HTTP/1.1\r\nhost: g\r\n\r\n") == b""
            assert time.monotonic() - started < 0.4  # closed at once, not by the timeout
        finally:
            for stream in idle:
                await stream.aclose()
        with anyio.fail_after(3):  # slots come back once the idle ones are gone
            while True:
                async with rig.admin_client() as client:
                    try:
                        if (await client.get("/status")).status_code == 200:
                            break
                    except httpx.TransportError:
                        await anyio.sleep(0.05)

    await with_traffic(rig, check)


async def read_drain(rig: Rig, query: str) -> tuple[list[dict[str, object]], list[float]]:
    lines: list[dict[str, object]] = []
    times: list[float] = []
    async with rig.admin_client() as client, client.stream("POST", f"/drain?{query}") as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson"
        async for line in response.aiter_lines():
            if line:
                lines.append(json.loads(line))
                times.append(time.monotonic())
    return lines, times


async def test_drain_streams_status_progress_and_result_the_moment_it_ends(rig: Rig) -> None:
    """1. a 1.6 s stream starts 2. POST /drain 3. status line at once, progress each second,
    result as soon as the stream's last frame is out."""
    stream_done: list[float] = []

    async def stream() -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{rig.port}", timeout=10) as client:
            response = await client.get("/stream", params={"frames": 16, "interval": 0.1})
            stream_done.append(time.monotonic())
            assert response.text.endswith("frame 15\ndone\n")

    async with anyio.create_task_group() as tg:
        tg.start_soon(stream)
        with anyio.fail_after(3):
            while rig.drain.in_flight == 0:
                await anyio.sleep(0.01)
        started = time.monotonic()
        lines, times = await read_drain(rig, "propagation_wait=0.2s&timeout=5s&reason=test")
    assert lines[0]["event"] == "status"
    assert lines[0]["state"] == "DRAINING"
    assert times[0] - started < 0.5
    assert [line["event"] for line in lines[1:-1]] == ["progress"] * (len(lines) - 2)
    assert len(lines) - 2 >= 1
    assert lines[1]["in_flight"] == 1
    final = lines[-1]
    assert final["event"] == "result" and final["result"] == "drained" and final["reason"] == "test"
    assert times[-1] - stream_done[0] < 0.3
    assert rig.drain.state is State.DRAINING


async def test_deadline_result_names_leftover(rig: Rig) -> None:
    async def stream() -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{rig.port}", timeout=10) as client:
            with pytest.raises(httpx.TransportError):  # cut at the deadline
                await client.get("/stream", params={"frames": 100, "interval": 0.1})

    async with anyio.create_task_group() as tg:
        tg.start_soon(stream)
        with anyio.fail_after(3):
            while rig.drain.in_flight == 0:
                await anyio.sleep(0.01)
        lines, _ = await read_drain(rig, "timeout=0.3s")
    final = lines[-1]
    assert final["result"] == "timeout"
    assert final["in_flight"] == 1
    assert len(final["leftover"]) == 1  # type: ignore[arg-type]


async def test_concurrent_drains_join_one_drain(rig: Rig) -> None:
    results: list[dict[str, object]] = []

    async def one() -> None:
        lines, _ = await read_drain(rig, "propagation_wait=0.3s")
        results.append(lines[-1])

    async with anyio.create_task_group() as tg:
        for _ in range(3):  # the fixture caps connections at 4
            tg.start_soon(one)
    assert len(results) == 3
    assert {(r["result"], r["started_at"], r["deadline"]) for r in results} == {
        ("drained", results[0]["started_at"], results[0]["deadline"])
    }
    assert rig.drain.counters()["drains"] == {"drained": 1}


async def test_resume_returns_to_serving(rig: Rig) -> None:
    async with rig.admin_client() as client:
        first = (await client.post("/resume")).json()
        assert first["resumed"] is False and first["state"] == "SERVING"
        rig.drain.begin_drain("test")
        second = (await client.post("/resume")).json()
    assert second["resumed"] is True and second["state"] == "SERVING"
    assert rig.drain.state is State.SERVING


async def test_socket_removed_on_shutdown(socket_dir: str) -> None:
    admin = AdminServer(Drain(grace_period=6, reserve=1), socket_dir=socket_dir)
    async with anyio.create_task_group() as tg:
        await tg.start(admin.serve)
        assert os.path.exists(admin.path)
        tg.cancel_scope.cancel()
    assert not os.path.exists(admin.path)


async def test_group_mode_socket(socket_dir: str) -> None:
    admin = AdminServer(Drain(grace_period=6, reserve=1), socket_dir=socket_dir, socket_mode=0o660)
    async with anyio.create_task_group() as tg:
        await tg.start(admin.serve)
        assert stat.S_IMODE(os.stat(admin.path).st_mode) == 0o660
        assert stat.S_IMODE(os.stat(socket_dir).st_mode) == 0o750
        tg.cancel_scope.cancel()


def test_other_socket_modes_are_refused() -> None:
    with pytest.raises(ConfigError, match="0o666"):
        AdminServer(Drain(grace_period=6, reserve=1), socket_mode=0o666)


async def test_stale_socket_removed_and_live_one_kept(socket_dir: str) -> None:
    stale = os.path.join(socket_dir, "999999.sock")
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(stale)  # bound, never listening: what a killed process leaves behind
    live_path = os.path.join(socket_dir, "1.sock")
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(live_path)
        live.listen()
        admin = AdminServer(Drain(grace_period=6, reserve=1), socket_dir=socket_dir)
        async with anyio.create_task_group() as tg:
            await tg.start(admin.serve)
            assert not os.path.exists(stale)
            assert os.path.exists(live_path)
            tg.cancel_scope.cancel()


async def test_sibling_socket_not_yet_listening_is_kept(socket_dir: str) -> None:
    """A sibling worker binds before it listens: between the two it refuses connections
    like a stale socket, but its process is alive, so it must not be removed."""
    sibling = os.path.join(socket_dir, f"{os.getppid()}.sock")
    with socket.socket(socket.AF_UNIX) as starting:
        starting.bind(sibling)
        admin = AdminServer(Drain(grace_period=6, reserve=1), socket_dir=socket_dir)
        async with anyio.create_task_group() as tg:
            await tg.start(admin.serve)
            assert os.path.exists(sibling)
            tg.cancel_scope.cancel()


async def test_admin_failure_fails_the_server_startup(socket_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    """A server without its admin socket could not be drained by the preStop hook: uvicorn
    must refuse to start, with our message, instead of serving half-configured."""
    mw = GracefulMiddleware(streaming_app, socket_dir=os.path.join(socket_dir, "d" * 110), registry=CollectorRegistry())
    config = uvicorn.Config(mw, host="127.0.0.1", port=free_port(), lifespan="on", log_config=None)
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR), anyio.fail_after(10), pytest.raises(SystemExit) as exited:
        await server.serve()
    assert exited.value.code == 3  # uvicorn's "startup failed" exit
    assert not server.started
    assert any("107-byte Unix socket limit" in r.getMessage() for r in caplog.records)
    assert mw.drain.state is State.STOPPED


async def test_live_socket_at_our_path_is_refused(socket_dir: str) -> None:
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(os.path.join(socket_dir, f"{os.getpid()}.sock"))
        other.listen()
        admin = AdminServer(Drain(grace_period=6, reserve=1), socket_dir=socket_dir)
        with pytest.raises(ConfigError, match="in use by another process"):
            await admin.serve()


async def test_long_path_refused_with_clear_message(socket_dir: str) -> None:
    long_dir = os.path.join(socket_dir, "d" * 110)
    admin = AdminServer(Drain(grace_period=6, reserve=1), socket_dir=long_dir)
    with pytest.raises(ConfigError, match="over the 107-byte Unix socket limit"):
        await admin.serve()
    assert not os.path.exists(long_dir)


def test_socket_path_limit_is_exact(socket_dir: str) -> None:
    fits = "/tmp/" + "x" * (107 - len("/tmp/") - len("/1.sock"))
    assert len(socket_path(fits, 1)) == 107
    with pytest.raises(ConfigError):
        socket_path(fits + "x", 1)


def test_dir_permissions_tightened(socket_dir: str) -> None:
    os.chmod(socket_dir, 0o777)
    prepare_socket_dir(socket_dir)
    assert stat.S_IMODE(os.stat(socket_dir).st_mode) == 0o700


def test_created_dir_is_private(socket_dir: str) -> None:
    path = os.path.join(socket_dir, "new")
    prepare_socket_dir(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory away")
def test_dir_of_another_user_is_refused(socket_dir: str) -> None:
    path = os.path.join(socket_dir, "theirs")
    os.mkdir(path, 0o700)
    os.chown(path, 12345, -1)
    with pytest.raises(ConfigError, match="belongs to uid 12345"):
        prepare_socket_dir(path)


def test_a_file_is_not_a_socket_dir(socket_dir: str) -> None:
    path = os.path.join(socket_dir, "file")
    open(path, "w").close()
    with pytest.raises(ConfigError, match="socket dir"):
        prepare_socket_dir(path)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_works_under_trio(socket_dir: str) -> None:
    drain = Drain(grace_period=6, reserve=1)
    drain.mark_serving()
    admin = AdminServer(drain, socket_dir=socket_dir)
    async with anyio.create_task_group() as tg:
        await tg.start(admin.serve)
        answer = await raw(admin.path, b"POST /drain?timeout=1s HTTP/1.1\r\nhost: g\r\n\r\n")
        tg.cancel_scope.cancel()
    assert b'"result": "drained"' in answer
    assert drain.state is State.DRAINING
