"""`graceful run` keeps idle keep-alive connections longer than the balancers in front of it.

nginx keeps an idle upstream connection for 60 s (ALB and many gateways too); uvicorn's
own default closes it after 5 s, just as the balancer may send the next request on it,
which then fails (nginx shows a 502). `graceful run` defaults to 75 s.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable

import h11
import pytest
from click.testing import CliRunner

from graceful._cli._main import cli
from tests.servers import Launched


def request(client: socket.socket, conn: h11.Connection) -> int:
    """One GET on an open connection; its status, or 0 if the server had closed the connection."""
    client.sendall(conn.send(h11.Request(method="GET", target="/hello", headers=[("host", "graceful")])))
    client.sendall(conn.send(h11.EndOfMessage()))
    status = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(client.recv(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.EndOfMessage):
            conn.start_next_cycle()
            return status
        elif isinstance(event, h11.ConnectionClosed):
            return 0


def closed_within(client: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed this idle connection, or None if it stayed open that long."""
    started = time.monotonic()
    readable, _, _ = select.select([client], [], [], seconds)
    if readable and client.recv(1) == b"":
        return time.monotonic() - started
    assert not readable, "the server sent data on an idle connection"
    return None


def test_idle_connection_outlives_a_balancers_keep_alive(launch: Callable[..., Launched]) -> None:
    """1. default `graceful run` 2. one request on a keep-alive connection 3. idle for 6 s, past
    uvicorn's own 5 s default 4. the connection is still open and serves the next request."""
    server = launch()
    server.wait_ready()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
        conn = h11.Connection(h11.CLIENT)
        assert request(client, conn) == 200
        assert closed_within(client, 6.0) is None
        assert request(client, conn) == 200


def test_timeout_keep_alive_option_is_what_the_server_uses(launch: Callable[..., Launched]) -> None:
    """--timeout-keep-alive 1: the same idle connection is closed by the server after about 1 s."""
    server = launch("--timeout-keep-alive", "1")
    server.wait_ready()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
        conn = h11.Connection(h11.CLIENT)
        assert request(client, conn) == 200
        closed_after = closed_within(client, 10.0)
    assert closed_after is not None and closed_after >= 0.9


@pytest.mark.parametrize("value", ["0", "-5", "soon", "1.5"])
def test_bad_timeout_keep_alive_is_refused_naming_the_value(value: str) -> None:
    result = CliRunner().invoke(cli, ["run", "tests.apps.streaming:app", "--timeout-keep-alive", value])
    assert result.exit_code == 2
    assert "--timeout-keep-alive" in result.output and value in result.output
