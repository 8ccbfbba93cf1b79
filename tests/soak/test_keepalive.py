"""``graceful soak`` ends no connection on its own: only the server does (issue 54's short-grace demo)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import anyio.abc
import httpcore._async.http11 as http11
import pytest

from graceful._soak._report import RequestRecord
from graceful._soak._runner import SoakConfig, run_soak
from tests.apps.openai_app import completion, raw_http_server, read_request

pytestmark = pytest.mark.anyio


async def test_a_stall_of_the_client_leaves_its_idle_connection_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """1. a request is answered on a keep-alive connection 2. the client's clock jumps an hour before the next,
    as when its process stalls (a host that stops it, a starved CPU) 3. the next request goes out on the same
    connection, and both end ok.

    httpx's pool closes a connection idle for 5 s (its default keep-alive expiry). After a stall of the
    client's loop it could close one it had just handed to a request, once the request had gone out
    (encode/httpcore#1110): the server ran the request, the client read ``ReadError`` and judged the
    attempt ``ambiguous``, and an SDK-style retry ran it twice. The short-grace demo saw this on a host
    that stalled for seconds, on replicas that were not draining.
    """
    connections = 0

    async def answer_each(stream: anyio.abc.SocketStream, request: bytes) -> None:
        nonlocal connections
        connections += 1
        body = completion(4, "length")
        while request:
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
            await stream.send(head + body)
            request = await read_request(stream)

    # The clock httpx's pool (httpcore) reads keep-alive expiry by; the event loop keeps its own.
    offset = 0.0
    monkeypatch.setattr(http11, "time", SimpleNamespace(monotonic=lambda: time.monotonic() + offset))

    def stall(record: RequestRecord) -> None:
        nonlocal offset
        offset += 3600.0

    async with raw_http_server(answer_each) as port:
        config = SoakConfig(
            url=f"http://127.0.0.1:{port}",
            concurrency=1,
            max_requests=2,
            mix={"short": 1},
            lengths={"short": 4},
            timeout=5.0,
        )
        report = await run_soak(config, on_record=stall)
    assert [record.reason for record in report.records] == ["ok", "ok"]
    assert connections == 1
