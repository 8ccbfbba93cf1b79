"""A refusal must arrive: a 503 for a POST whose body the app never read.

Answering before the body has been read and then closing the connection leaves
unread bytes in the server's socket; Linux answers that close with a RST, which can
destroy the 503 before the client (nginx) has read it: nginx then reports a 502 and,
counting the request as sent, never retries it. graceful reads and drops the body
up to a cap before a refusal, and past the cap answers without ``Connection: close``
so the server itself keeps reading (and dropping) the rest.

The servers are real uvicorn servers (its h11 and httptools protocols,
uvicorn/protocols/http/h11_impl.py and httptools_impl.py); the client is a raw
socket that frames with h11, as a balancer would send: the whole request, then read.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import h11
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

import graceful._asgi._refusal
from graceful import GracefulMiddleware
from graceful._asgi._refusal import REFUSAL_BODY_LIMIT
from graceful._asgi._types import Receive, Scope, Send

ATTEMPTS = 50
SIZES = (64 * 1024, 256 * 1024, 1_000_000, 4 << 20)


async def echo_length(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole body, as an LLM API reads its prompt; never reached while refusing."""
    if scope["type"] != "http":
        return  # no lifespan of its own: graceful runs the protocol
    size = 0
    more = True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"%d" % size
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def refusing_server(http: str, state: str) -> Iterator[int]:
    """uvicorn on a pre-bound 127.0.0.1 socket, refusing every request (draining or starting)."""
    mw = GracefulMiddleware(
        echo_length,
        registry=CollectorRegistry(),
        admin=False,
        grace_period=30,
        reserve=5,
        admit_during_propagation=False,
        ready_on_startup=state != "starting",
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(mw, http=http, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)  # uvicorn offers a flag, not an event
    assert server.started, "uvicorn did not start"
    if state == "draining":
        mw.drain.begin_drain("test", propagation_wait=20)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def post(port: int, size: int) -> tuple[str, h11.Response | None, bytes]:
    """Send one POST with a ``size``-byte body, then read the answer: ("ok", response, body) or the failure."""
    conn = h11.Connection(h11.CLIENT)
    request = h11.Request(
        method="POST",
        target="/v1/completions",
        headers=[("host", "graceful"), ("content-type", "application/json"), ("content-length", str(size))],
    )
    wire = conn.send(request) + conn.send(h11.Data(data=b"x" * size)) + conn.send(h11.EndOfMessage())
    response: h11.Response | None = None
    body = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        try:
            client.sendall(wire)
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(client.recv(65536))
                elif isinstance(event, h11.Response):
                    response = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    return "ok", response, body
                elif isinstance(event, h11.ConnectionClosed):
                    return "closed before the answer", response, body
        except (ConnectionResetError, BrokenPipeError) as exc:
            return f"reset ({type(exc).__name__})", response, body
        except TimeoutError:
            return "timeout", response, body
        except h11.RemoteProtocolError as exc:
            return f"protocol error {exc}", response, body


@pytest.mark.parametrize("http", ["h11", "httptools"])
@pytest.mark.parametrize(
    ("state", "limit"), [("draining", REFUSAL_BODY_LIMIT), ("starting", REFUSAL_BODY_LIMIT), ("draining", 1 << 20)]
)
def test_refusal_of_a_large_post_arrives_whole(
    http: str, state: str, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """50 POSTs per size, each must get a complete 503. With the limit lowered to 1 MiB the 4 MiB
    bodies take the other path: no Connection: close, the server drops the rest itself."""
    monkeypatch.setattr(graceful._asgi._refusal, "REFUSAL_BODY_LIMIT", limit)  # the server runs in this process
    failures: dict[int, list[str]] = {}
    with refusing_server(http, state) as port:
        for size in SIZES:
            for _ in range(ATTEMPTS):
                outcome, response, body = post(port, size)
                if outcome != "ok" or response is None or response.status_code != 503:
                    failures.setdefault(size, []).append(outcome)
                    continue
                headers = dict(response.headers)
                assert headers[b"x-graceful-not-started"] == b"1"
                assert headers[b"retry-after"] == b"1"
                assert f'"server_{state}"'.encode() in body
                # Close only once the body has been read: past the cap, the server reads the rest itself.
                assert (headers.get(b"connection") == b"close") == (size <= limit)
    assert not failures, {size: (len(outcomes), outcomes[:3]) for size, outcomes in failures.items()}


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_connection_stays_usable_after_a_refusal_past_the_cap(http: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the cap (lowered to 1 MiB here) uvicorn keeps the connection and drops the rest of the
    body: a second request on it gets its own complete 503."""
    monkeypatch.setattr(graceful._asgi._refusal, "REFUSAL_BODY_LIMIT", 1 << 20)
    with refusing_server(http, "draining") as port:
        conn = h11.Connection(h11.CLIENT)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            for _ in range(2):
                size = 2 << 20
                request = h11.Request(
                    method="POST", target="/v1/completions", headers=[("host", "g"), ("content-length", str(size))]
                )
                client.sendall(
                    conn.send(request) + conn.send(h11.Data(data=b"y" * size)) + conn.send(h11.EndOfMessage())
                )
                status = 0
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        conn.receive_data(client.recv(65536))
                    elif isinstance(event, h11.Response):
                        status = event.status_code
                    elif isinstance(event, h11.EndOfMessage):
                        break
                assert status == 503
                conn.start_next_cycle()
