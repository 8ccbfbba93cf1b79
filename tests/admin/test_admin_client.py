"""The admin client's own HTTP/1.1 reading, against answers a broken or foreign server might send.

The happy path runs against the real admin server in test_admin.py; here each case scripts the
bytes on the socket, so every way an answer can go wrong is seen exactly once.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import pytest

from graceful._admin._client import NoServer
from graceful._admin._client import drain_all as drain_all_sync
from graceful._admin._client import request_all as request_all_sync

pytestmark = pytest.mark.anyio

Script = Callable[[anyio.abc.ByteStream], Any]


@pytest.fixture
async def scripted() -> AsyncIterator[Callable[[Script], Any]]:
    """Serve a scripted answer on a fresh Unix socket; yields a starter that returns the socket path."""
    directory = tempfile.mkdtemp(prefix="graceful-client-")
    requests: list[bytes] = []
    async with anyio.create_task_group() as tg:

        async def start(script: Script) -> str:
            path = os.path.join(directory, f"{len(os.listdir(directory))}.sock")
            listener = await anyio.create_unix_listener(path)

            async def handle(stream: anyio.abc.ByteStream) -> None:
                async with stream:
                    requests.append(await stream.receive())
                    await script(stream)

            async def serve() -> None:
                async with listener:
                    await listener.serve(handle)

            tg.start_soon(serve)
            return path

        start.requests = requests  # type: ignore[attr-defined]
        with anyio.fail_after(30):
            yield start
        tg.cancel_scope.cancel()


async def drain_all(paths: list[str], **options: Any) -> Any:
    """The client blocks; the scripted servers run on this loop, so the client gets a thread."""
    return await anyio.to_thread.run_sync(partial(drain_all_sync, paths, **options))


async def request_all(paths: list[str], method: str, url: str) -> Any:
    return await anyio.to_thread.run_sync(request_all_sync, paths, method, url)


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n"
STATUS = json.dumps({"event": "status", "pid": 7, "in_flight": 2, "deadline": 100.0}).encode() + b"\n"
RESULT = json.dumps({"event": "result", "pid": 7, "result": "drained", "in_flight": 0}).encode() + b"\n"


async def test_a_drain_stream_split_anywhere_is_read_line_by_line(scripted: Any) -> None:
    body = chunked(STATUS[:5], STATUS[5:] + RESULT[:9], RESULT[9:])

    async def script(stream: anyio.abc.ByteStream) -> None:
        for index in range(0, len(HEAD + body), 7):  # seven bytes at a time: every boundary is crossed
            await stream.send((HEAD + body)[index : index + 7])

    path = await scripted(script)
    [worker] = await drain_all([path], propagation_wait=1.5, timeout=20, reason="test")
    assert worker.error is None and worker.result is not None
    assert (worker.pid, worker.result["result"], worker.deadline) == (7, "drained", 100.0)
    request = scripted.requests[0].decode()
    assert request.startswith("POST /drain?reason=test&propagation_wait=1.5s&timeout=20s HTTP/1.1\r\n")


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (HEAD + chunked(STATUS), "the server closed the connection before the drain ended"),
        (HEAD + b'5\r\n{"ev', "lost the connection before the drain ended (the connection closed mid-answer)"),
        (HEAD + b"zz\r\n", "lost the connection before the drain ended (a bad chunk size)"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP answer: 'SSH-2.0-OpenSSH'"),
        (b"HTTP/1.1 200 OK\r\n" + b"x: y\r\n" * 4000, "an answer line is too long"),
        (HEAD + chunked(b"not json\n"), "lost the connection before the drain ended"),
        (
            b'HTTP/1.1 409 Conflict\r\ncontent-length: 24\r\n\r\n{"error": "not serving"}',
            'HTTP 409: {"error": "not serving"}',
        ),
    ],
    ids=["no-result", "cut-mid-chunk", "bad-chunk-size", "not-http", "endless-head", "not-json", "http-error"],
)
async def test_every_broken_answer_is_one_error_never_a_traceback(scripted: Any, answer: bytes, error: str) -> None:
    async def script(stream: anyio.abc.ByteStream) -> None:
        await stream.send(answer)

    [worker] = await drain_all([await scripted(script)], timeout=5)
    assert worker.result is None and worker.error is not None and error in worker.error, worker.error


async def test_request_all_reads_a_sized_body_and_maps_garbage_to_none(scripted: Any) -> None:
    good_body = json.dumps({"state": "serving", "in_flight": 0}).encode()

    async def good(stream: anyio.abc.ByteStream) -> None:
        await stream.send(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(good_body), good_body))
        await stream.send(b"trailing bytes past content-length are not read")

    async def cut(stream: anyio.abc.ByteStream) -> None:
        await stream.send(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"state"')

    async def unsized(stream: anyio.abc.ByteStream) -> None:
        await stream.send(b"HTTP/1.1 200 OK\r\n\r\n" + good_body)

    paths = [await scripted(good), await scripted(cut), await scripted(unsized)]
    answers = await request_all(paths, "GET", "/status")
    assert [answers[path] for path in paths] == [json.loads(good_body), None, json.loads(good_body)]


async def test_nothing_listening_is_no_server() -> None:
    directory = tempfile.mkdtemp(prefix="graceful-client-")
    path = os.path.join(directory, "gone.sock")
    listener = await anyio.create_unix_listener(path)
    await listener.aclose()  # the path stays, nothing accepts on it
    with pytest.raises(NoServer, match="nothing is listening on"):
        await drain_all([path], timeout=5)
    assert await request_all([path], "GET", "/status") == {path: None}


async def test_a_server_gone_silent_ends_a_drain_without_a_timeout(scripted: Any) -> None:
    """1. the server answers the drain with its head and status line 2. then sends nothing more,
    holding the connection open 3. a drain run without --timeout has no limit of its own, yet
    the client gives up after the silence bound: one error naming it, no result."""
    hold = anyio.Event()

    async def script(stream: anyio.abc.ByteStream) -> None:
        await stream.send(HEAD + b"%x\r\n%s\r\n" % (len(STATUS), STATUS))
        await hold.wait()  # silent, connection open, until the test ends

    path = await scripted(script)
    try:
        [worker] = await drain_all([path], silence=0.3)
    finally:
        hold.set()
    assert worker.result is None and worker.pid == 7
    assert worker.error == "lost the connection before the drain ended (the server sent nothing for 0.3 s)"
