"""More of the admin listener and its client: hostile socket dirs, races, fd exhaustion,
clients that vanish, and workers that answer the client badly."""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

import graceful._admin_client
import graceful._admin_server
from graceful import ConfigError, Drain, State
from graceful._admin_client import NoServer
from graceful._admin_client import drain_all as drain_all_sync
from graceful._admin_server import AdminServer, prepare_socket_dir, remove_stale
from tests.apps_more_workers import FakeWorker, chunk, ndjson, ndjson_head, status_line

pytestmark = pytest.mark.anyio

ROOT = str(Path(__file__).resolve().parent.parent)


async def drain_all(paths: list[str], **options: Any) -> Any:
    """The admin client blocks; it gets a thread so that servers on this loop keep running."""
    return await anyio.to_thread.run_sync(functools.partial(drain_all_sync, paths, **options))


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
    with pytest.raises(ConfigError, match=r"'.*/link' is not a directory; choose another --socket-dir"):
        prepare_socket_dir(link)


def test_stale_sockets_not_named_by_pid_are_removed_but_live_ones_kept(socket_dir: str) -> None:
    dead = os.path.join(socket_dir, "worker.sock")
    live = os.path.join(socket_dir, "other.sock")
    with bound(dead), bound(live, listen=True):
        assert remove_stale(socket_dir) == [dead]
        assert not os.path.exists(dead)
        assert os.path.exists(live)


@pytest.mark.skipif(os.getuid() == 0, reason="root may signal any process: no PermissionError to see")
def test_socket_of_a_process_owned_by_someone_else_is_kept(socket_dir: str) -> None:
    path = os.path.join(socket_dir, "1.sock")  # pid 1 runs, and belongs to root
    with bound(path):
        assert remove_stale(socket_dir) == []
        assert os.path.exists(path)


def test_stale_socket_removed_by_a_sibling_first_is_not_an_error(
    socket_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers starting together both see the same dead socket; only one unlink wins."""
    first = os.path.join(socket_dir, "999990.sock")
    second = os.path.join(socket_dir, "999991.sock")
    probe = graceful._admin_server.is_listening

    def sibling_wins(path: str) -> bool:
        answer = probe(path)
        if path == first:
            os.unlink(path)  # the sibling worker's cleanup lands between our probe and our unlink
        return answer

    monkeypatch.setattr(graceful._admin_server, "is_listening", sibling_wins)
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
        assert graceful._admin_server.is_listening(server.path)
    finally:
        successor.close()


@pytest.mark.skipif(os.getuid() == 0, reason="root may unlink in a read-only directory")
async def test_socket_that_cannot_be_removed_is_logged(socket_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    server = AdminServer(Drain(grace_period=6, reserve=1), socket_dir=socket_dir)
    with caplog.at_level(logging.WARNING, logger="graceful"):
        async with anyio.create_task_group() as tg:
            await tg.start(server.serve)
            os.chmod(socket_dir, 0o500)
            tg.cancel_scope.cancel()
    os.chmod(socket_dir, 0o700)
    assert any("could not remove admin socket" in r.getMessage() for r in caplog.records)


# --- the listener under pressure ---------------------------------------------------------


def test_accept_failures_back_off_and_serving_resumes(socket_dir: str, tmp_path: Path) -> None:
    """1. the listener's process may open only a couple more files 2. idle clients use them
    up: the next accept fails with EMFILE 3. a warning is logged, the listener keeps running 4. once the idle
    clients leave, the waiting connection is accepted and answered."""
    log = tmp_path / "admin.log"
    with open(log, "wb") as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.apps_more_workers", "2", socket_dir],
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
        assert graceful._admin_server.is_listening(admin.path)
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
    monkeypatch.setattr(graceful._admin_client, "_CLIENT_SLACK", 0.3)
    worker = FakeWorker(
        os.path.join(socket_dir, "4001.sock"), ndjson_head() + chunk(ndjson(status_line(4001))), hold=True
    )
    try:
        started = time.monotonic()
        with anyio.fail_after(5):
            (result,) = await drain_all([worker.path], timeout=0.2)
        elapsed = time.monotonic() - started
    finally:
        worker.close()
    assert result.error == "no final answer in time"
    assert result.pid == 4001 and result.in_flight == 2 and result.result is None
    assert 0.4 < elapsed < 2.0
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
