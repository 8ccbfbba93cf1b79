"""The admin listener over a real Unix socket, next to a real uvicorn serving inference traffic."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

import graceful._admin._client
import graceful._admin._server
from graceful import ConfigError, Drain, GracefulMiddleware, State
from graceful._admin._client import NoServer
from graceful._admin._client import drain_all as drain_all_sync
from graceful._admin._paths import prepare_socket_dir, socket_path
from graceful._admin._server import AdminServer, remove_stale
from tests.apps.streaming import app as streaming_app
from tests.apps.workers import FakeWorker, chunk, ndjson, ndjson_head, status_line
from tests.utils import ROOT, run_uvicorn

pytestmark = pytest.mark.anyio


async def drain_all(paths: list[str], **options: Any) -> Any:
    """The admin client blocks; it gets a thread so that servers on this loop keep running."""
    return await anyio.to_thread.run_sync(functools.partial(drain_all_sync, paths, **options))


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
        self.answer = anyio.Event()  # set at each answer, then replaced (see answered)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", timeout=5) as client:
            task_status.started()
            while True:
                response = await client.get("/hello")
                if response.status_code == 200 and response.text == "hello":
                    self.ok += 1
                else:
                    self.failures.append(response.status_code)
                answer, self.answer = self.answer, anyio.Event()
                answer.set()
                await anyio.sleep(0.01)  # the traffic's pace, not a wait for anything

    async def answered(self, count: int) -> None:
        """Until ``count`` more requests have been answered 200."""
        target = self.ok + count
        while self.ok < target:
            await self.answer.wait()


async def with_traffic(rig: Rig, check: object) -> Traffic:
    traffic = Traffic(rig.port)
    async with anyio.create_task_group() as tg:
        await tg.start(traffic.run)
        await check()  # type: ignore[operator]
        with anyio.fail_after(5):
            await traffic.answered(3)  # the server still answers after the bad input
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
        # request_timeout is 0.5 s: closed by it (not before), within a 10x safety bound.
        assert 0.5 <= time.monotonic() - started < 5.0

    await with_traffic(rig, check)


async def test_connections_over_the_cap_are_closed(rig: Rig) -> None:
    async def check() -> None:
        rig.admin.request_timeout = 60  # a close "by the timeout" would take a minute
        idle = [await anyio.connect_unix(rig.admin.path) for _ in range(4)]  # the cap
        try:
            with anyio.fail_after(10):
                # Once the listener has taken all four, a fifth connection is closed unanswered; until
                # then it may still be answered.
                while True:
                    started = time.monotonic()
                    answer = await raw(rig.admin.path, b"GET /status HTTP/1.1\r\nhost: g\r\n\r\n", read_timeout=10)
                    if answer == b"":
                        break
                    assert answer.startswith(b"HTTP/1.1 200"), answer
            assert time.monotonic() - started < 6.0  # closed at once, not after the 60 s timeout
        finally:
            for stream in idle:
                await stream.aclose()
            rig.admin.request_timeout = 0.5
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
    first = anyio.Event()

    async def stream() -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{rig.port}", timeout=10) as client:
            params = {"frames": 16, "interval": 0.1}
            async with client.stream("GET", "/stream", params=params) as response:
                text = ""
                async for part in response.aiter_text():
                    first.set()
                    text += part
            stream_done.append(time.monotonic())
            assert text.endswith("frame 15\ndone\n")

    async with anyio.create_task_group() as tg:
        tg.start_soon(stream)
        with anyio.fail_after(3):
            await first.wait()  # the stream is in flight
        started = time.monotonic()
        lines, times = await read_drain(rig, "propagation_wait=0.2s&timeout=5s&reason=test")
    assert lines[0]["event"] == "status"
    assert lines[0]["state"] == "DRAINING"
    assert times[0] < stream_done[0]  # the status line comes at once, while the stream still runs
    assert times[0] - started < 5.0  # a 10x safety bound
    assert [line["event"] for line in lines[1:-1]] == ["progress"] * (len(lines) - 2)
    assert len(lines) - 2 >= 1
    assert lines[1]["in_flight"] == 1
    final = lines[-1]
    assert final["event"] == "result" and final["result"] == "drained" and final["reason"] == "test"
    assert times[-1] - stream_done[0] < 3.0  # a 10x safety bound; tests/drain/test_state.py checks the order
    assert rig.drain.state is State.DRAINING


async def test_deadline_result_names_leftover(rig: Rig) -> None:
    first = anyio.Event()

    async def stream() -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{rig.port}", timeout=10) as client:
            with pytest.raises(httpx.TransportError):  # cut at the deadline
                async with client.stream("GET", "/stream", params={"frames": 100, "interval": 0.1}) as response:
                    async for _ in response.aiter_bytes():
                        first.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stream)
        with anyio.fail_after(3):
            await first.wait()  # the stream is in flight
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
    must refuse to start, with our message, instead of serving half-configured. (A socket
    directory known to be wrong is refused sooner, when the middleware is built: here another
    process listens at our socket's path, which only startup can find.)"""
    mw = GracefulMiddleware(streaming_app, socket_dir=socket_dir, registry=CollectorRegistry())
    failures: list[str] = []

    async def recorded(scope: Any, receive: Any, send: Any) -> None:
        async def send_recorded(message: Any) -> None:
            if message["type"] == "lifespan.startup.failed":
                failures.append(message["message"])
            await send(message)

        await mw(scope, receive, send_recorded)

    config = uvicorn.Config(recorded, host="127.0.0.1", port=0, lifespan="on", log_config=None)
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    path = os.path.join(socket_dir, f"{os.getpid()}.sock")
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(path)
        other.listen()
        # uvicorn logs the failure on its own logger, which an earlier in-process server's log config (uvicorn's
        # LOGGING_CONFIG) leaves not propagating to the root, where caplog listens: listen on it directly.
        uvicorn_log = logging.getLogger("uvicorn.error")
        uvicorn_log.addHandler(caplog.handler)
        try:
            with caplog.at_level(logging.ERROR), anyio.fail_after(10), pytest.raises(SystemExit) as exited:
                await server.serve()
        finally:
            uvicorn_log.removeHandler(caplog.handler)
    assert exited.value.code == 3  # uvicorn's "startup failed" exit
    assert not server.started
    assert any("another process listens on" in r.getMessage() for r in caplog.records)
    # The server is told the cause in one line, not the task group's count of its errors, naming the directory
    # as the code gave it (no --socket-dir: uvicorn has none, issue 51).
    assert failures == [
        f"graceful: socket_dir: {socket_dir!r}: another process listens on {path!r}, this process's admin socket; "
        "give each server a directory of its own"
    ]
    assert mw.drain.state is State.STOPPED


async def test_live_socket_at_our_path_is_refused(socket_dir: str) -> None:
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(os.path.join(socket_dir, f"{os.getpid()}.sock"))
        other.listen()
        admin = AdminServer(Drain(grace_period=6, reserve=1), socket_dir=socket_dir)
        with pytest.raises(ConfigError, match="another process listens on"):
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
    with pytest.raises(ConfigError, match=r"^socket_dir: '.*/file' is a file, not a directory; choose a directory"):
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


# The admin listener and its client: hostile socket dirs, races, fd exhaustion,


def bound(path: str, *, listen: bool = False) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    if listen:
        sock.listen()
    return sock


@pytest.fixture
async def admin(socket_dir: str) -> AsyncIterator[AdminServer]:
    drain = Drain(grace_period=6, reserve=1)
    drain.mark_serving()
    server = AdminServer(drain, socket_dir=socket_dir, request_timeout=0.5, max_connections=4)
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        yield server
        tg.cancel_scope.cancel()


async def status_of(path: str) -> dict[str, object]:
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=path), base_url="http://g") as client:
        response = await client.get("/status", timeout=5)
    assert response.status_code == 200
    body: dict[str, object] = response.json()
    return body


# --- the socket directory ----------------------------------------------------------------


def test_symlinked_socket_dir_is_refused(socket_dir: str) -> None:
    """A symlink planted where the socket dir should be could point the sockets anywhere."""
    target = os.path.join(socket_dir, "elsewhere")
    os.mkdir(target, 0o700)
    link = os.path.join(socket_dir, "link")
    os.symlink(target, link)
    with pytest.raises(
        ConfigError, match=r"^socket_dir: '.*/link' is a symbolic link, not a directory; choose a directory"
    ):
        prepare_socket_dir(link)


def test_stale_sockets_not_named_by_pid_are_removed_but_live_ones_kept(socket_dir: str) -> None:
    dead = os.path.join(socket_dir, "worker.sock")
    live = os.path.join(socket_dir, "other.sock")
    with bound(dead), bound(live, listen=True):
        assert remove_stale(socket_dir) == [dead]
        assert not os.path.exists(dead)
        assert os.path.exists(live)


def unprivileged(check: Callable[[str], str], socket_dir: str) -> str:
    """Run ``check(directory)`` in a forked child that is not root (``nobody`` when this process
    is root: root may signal any process and unlink anywhere) and return what it returned. The
    directory is a fresh one that child owns; a failure in the child is raised here."""
    user = 65534 if os.getuid() == 0 else os.getuid()
    path = os.path.join(socket_dir, "unprivileged")
    os.mkdir(path, 0o700)
    os.chmod(socket_dir, 0o711)  # the child may pass through to its own directory
    os.chown(path, user, user if user == 65534 else -1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 1
        try:
            os.close(read)
            if os.getuid() == 0:
                os.setgroups([])
                os.setgid(user)
                os.setuid(user)
            answer = "ok " + check(path)
            code = 0
        except BaseException as exc:
            answer = f"error {exc!r}"
        finally:
            os.write(write, answer.encode())
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        answer = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and answer.startswith("ok "), answer
    return answer.removeprefix("ok ")


def test_socket_of_a_process_owned_by_someone_else_is_kept(socket_dir: str) -> None:
    """Pid 1 runs and belongs to root: a process that may not signal it must keep its socket."""

    def check(directory: str) -> str:
        assert os.getuid() != 0
        path = os.path.join(directory, "1.sock")
        with bound(path):
            return f"{remove_stale(directory)} {os.path.exists(path)}"

    assert unprivileged(check, socket_dir) == "[] True"


def test_stale_socket_removed_by_a_sibling_first_is_not_an_error(
    socket_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers starting together both see the same dead socket; only one unlink wins."""
    first = os.path.join(socket_dir, "999990.sock")
    second = os.path.join(socket_dir, "999991.sock")
    probe = graceful._admin._server.is_listening

    def sibling_wins(path: str) -> bool:
        answer = probe(path)
        if path == first:
            os.unlink(path)  # the sibling worker's cleanup lands between our probe and our unlink
        return answer

    monkeypatch.setattr(graceful._admin._server, "is_listening", sibling_wins)
    with bound(first), bound(second):
        assert remove_stale(socket_dir) == [second]
    assert os.listdir(socket_dir) == []


async def test_successor_socket_is_left_alone_at_shutdown(socket_dir: str) -> None:
    """A successor (same pid in a new container, same dir) replaced our file: keep it."""
    server = AdminServer(Drain(grace_period=6, reserve=1), socket_dir=socket_dir)
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        os.unlink(server.path)
        successor = bound(server.path, listen=True)
        tg.cancel_scope.cancel()
    try:
        assert os.path.exists(server.path)
        assert graceful._admin._server.is_listening(server.path)
    finally:
        successor.close()


def test_socket_that_cannot_be_removed_is_logged(socket_dir: str) -> None:
    """1. the admin socket is up 2. its directory turns read-only 3. on exit the socket cannot be
    removed: one warning names it (run by a user who, unlike root, is held to the mode)."""

    def check(directory: str) -> str:
        assert os.getuid() != 0
        records: list[str] = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
        logging.getLogger("graceful").addHandler(handler)

        async def main() -> None:
            server = AdminServer(Drain(grace_period=6, reserve=1), socket_dir=directory)
            async with anyio.create_task_group() as tg:
                await tg.start(server.serve)
                os.chmod(directory, 0o500)
                tg.cancel_scope.cancel()
            os.chmod(directory, 0o700)

        anyio.run(main)
        return "\n".join(records)

    warnings = unprivileged(check, socket_dir)
    assert f"could not remove admin socket {socket_dir}/unprivileged/" in warnings, warnings


# --- the listener under pressure ---------------------------------------------------------


def test_accept_failures_back_off_and_serving_resumes(socket_dir: str, tmp_path: Path) -> None:
    """1. the listener's process may open only a couple more files 2. idle clients use them
    up: the next accept fails with EMFILE 3. a warning is logged, the listener keeps running 4. once the idle
    clients leave, the waiting connection is accepted and answered."""
    log = tmp_path / "admin.log"
    with open(log, "wb") as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.apps.workers", "2", socket_dir],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    clients: list[socket.socket] = []
    try:
        assert child.stdout is not None and child.stdin is not None
        ready = child.stdout.readline().decode()
        assert ready.startswith("ready "), log.read_text()
        path = ready.split()[1]
        deadline = time.monotonic() + 5
        while "accept failed" not in log.read_text() and time.monotonic() < deadline:
            if len(clients) < 8:  # a few past the headroom; the listen backlog holds the rest
                clients.append(bound_client(path))
            time.sleep(0.05)
        *idle, waiting = clients
        assert "admin listener accept failed: [Errno 24] Too many open files" in log.read_text()
        assert child.poll() is None
        for sock in idle:
            sock.close()
        waiting.sendall(b"GET /status HTTP/1.1\r\nhost: g\r\n\r\n")
        answer = read_all(waiting)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["state"] == "SERVING"
    finally:
        for sock in clients:
            sock.close()
        if child.stdin:
            child.stdin.close()
        child.wait(10)
        if child.stdout:
            child.stdout.close()
    assert child.returncode == 0, log.read_text()


def bound_client(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(5)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while data := sock.recv(65536):
        chunks.append(data)
    return b"".join(chunks)


async def test_chunked_body_over_the_limit_is_413(admin: AdminServer) -> None:
    """No content-length to refuse up front: the body is counted as it arrives."""
    async with await anyio.connect_unix(admin.path) as stream:
        await stream.send(b"POST /resume HTTP/1.1\r\nhost: g\r\ntransfer-encoding: chunked\r\n\r\n")
        piece = chunk(b"x" * 16384)
        answer = b""
        with anyio.fail_after(5):
            for _ in range(5):  # 80 KiB, over the 64 KiB cap
                try:
                    await stream.send(piece)
                except (anyio.BrokenResourceError, OSError):
                    break
            while True:
                try:
                    answer += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    break
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b"request body too long" in answer
    assert admin.drain.state is State.SERVING  # the resume never ran
    assert (await status_of(admin.path))["state"] == "SERVING"


async def test_connect_and_close_probe_is_silent(admin: AdminServer, caplog: pytest.LogCaptureFixture) -> None:
    """`is_listening` (and any liveness probe) connects and closes without a request."""
    with caplog.at_level(logging.WARNING, logger="graceful"):
        assert graceful._admin._server.is_listening(admin.path)
        assert (await status_of(admin.path))["state"] == "SERVING"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_client_gone_mid_drain_does_not_stop_the_drain(
    admin: AdminServer, caplog: pytest.LogCaptureFixture
) -> None:
    """1. POST /drain with a 1.3 s propagation wait 2. the client (a killed preStop hook) goes
    away after the first line 3. the progress write fails quietly 4. the drain still ends
    drained and the listener still answers."""
    with caplog.at_level(logging.WARNING, logger="graceful"):
        async with await anyio.connect_unix(admin.path) as stream:
            await stream.send(b"POST /drain?propagation_wait=1.3s HTTP/1.1\r\nhost: g\r\n\r\n")
            with anyio.fail_after(3):
                assert b'"event": "status"' in await stream.receive()
        assert admin.drain.state is State.DRAINING
        with anyio.fail_after(5):
            while admin.drain.counters()["drains"] != {"drained": 1}:
                await anyio.sleep(0.05)
        body = await status_of(admin.path)
    assert body["state"] == "DRAINING"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_drain_that_raises_is_reported_as_an_error_line(
    admin: AdminServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A state listener that raises must not take the admin listener down with it."""

    def broken_listener() -> None:
        if admin.drain.state is State.DRAINING:
            raise RuntimeError("listener exploded")

    admin.drain.add_listener(broken_listener)
    lines = []
    with caplog.at_level(logging.ERROR, logger="graceful"):
        async with (
            httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=admin.path), base_url="http://g") as client,
            client.stream("POST", "/drain", timeout=5) as response,
        ):
            assert response.status_code == 200
            lines = [json.loads(line) async for line in response.aiter_lines() if line]
    final = lines[-1]
    assert final["event"] == "result"
    assert final["result"] == "error"
    assert "listener exploded" in final["error"]
    assert final["pid"] == os.getpid()
    assert any(r.getMessage() == "drain failed" for r in caplog.records)
    assert (await status_of(admin.path))["pid"] == os.getpid()  # still serving


# --- the client against workers that misbehave -------------------------------------------


async def test_worker_with_no_final_answer_in_time(socket_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that sends its status line and then hangs is given up on after the deadline
    plus the client's slack (shortened here from 15 s)."""
    monkeypatch.setattr(graceful._admin._client, "_CLIENT_SLACK", 0.3)
    worker = FakeWorker(
        os.path.join(socket_dir, "4001.sock"), ndjson_head() + chunk(ndjson(status_line(4001))), hold=True
    )
    try:
        started = time.monotonic()
        with anyio.fail_after(10):
            (result,) = await drain_all([worker.path], timeout=0.2)
        elapsed = time.monotonic() - started
    finally:
        worker.close()
    assert result.error == "no final answer in time"
    assert result.pid == 4001 and result.in_flight == 2 and result.result is None
    assert 0.5 <= elapsed < 5.0  # the 0.2 s deadline plus the 0.3 s slack, not before; 10x bound
    assert b"timeout=0.2s" in worker.requests[0]


async def test_drain_all_with_every_socket_dead_raises_no_server(socket_dir: str) -> None:
    paths = [os.path.join(socket_dir, f"{n}.sock") for n in (4002, 4003)]
    sockets = [bound(path) for path in paths]
    try:
        with pytest.raises(NoServer, match="nothing is listening on .*4002.sock, .*4003.sock"):
            await drain_all(paths)
    finally:
        for sock in sockets:
            sock.close()


async def test_unknown_events_and_blank_lines_are_skipped(socket_dir: str) -> None:
    """A newer server may stream events this client does not know: they are ignored."""
    result_line = {"event": "result", "pid": 4004, "result": "drained", "in_flight": 0}
    body = ndjson(status_line(4004)) + b"\n  \n" + ndjson({"event": "heartbeat", "in_flight": 99}, result_line)
    worker = FakeWorker(os.path.join(socket_dir, "4004.sock"), ndjson_head() + chunk(body) + b"0\r\n\r\n")
    try:
        with anyio.fail_after(5):
            (result,) = await drain_all([worker.path])
    finally:
        worker.close()
    assert result.error is None
    assert result.result == result_line
    assert result.in_flight == 0 and result.pid == 4004
