"""The Service in front of the replicas: HAProxy (L4 or L7), nginx (L7), Envoy (L7), or an asyncio L4 forwarder.

The L4 ones model kube-proxy: a new TCP connection goes to one of the listed endpoints,
and removing an endpoint only affects connections opened afterwards. Connections
already open stay up until one side closes them, which is exactly why a pod must keep
serving (or answer 503 with ``Connection: close``) after its endpoint is gone. Neither
retries a failed backend connect (kube-proxy does not either), so a client of a dead
endpoint sees its connection closed after it was accepted.

The L7 ones (``nginx``, ``haproxy-http``, ``envoy``) balance each request on its own over their
own keep-alive connections to the replicas, and retry what they retry by default;
``gateway_retry`` turns on the documented retry of a not-started 503. Envoy has retry profiles
of its own (``envoy.RETRIES``) and active health checking (``active_hc``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import tempfile
from collections.abc import AsyncIterator
from typing import Protocol

from .envoy import Envoy, find_envoy, missing_envoy
from .haproxy import HAProxy, Mode, find_haproxy
from .nginx import Nginx, find_nginx

__all__ = [
    "BALANCERS",
    "L7_BALANCERS",
    "Balancer",
    "Envoy",
    "Forwarder",
    "HAProxy",
    "Nginx",
    "find_envoy",
    "find_haproxy",
    "find_nginx",
    "open_balancer",
]

BALANCERS = ("auto", "haproxy", "haproxy-http", "nginx", "envoy", "forwarder")
L7_BALANCERS = ("haproxy-http", "nginx", "envoy")


class Balancer(Protocol):
    """The operations a rollout needs from a load balancer."""

    name: str
    port: int

    async def add(self, endpoint: str, port: int) -> None: ...

    async def remove(self, endpoint: str) -> None: ...

    def endpoints(self) -> list[str]: ...

    async def backend_connect_errors(self) -> int: ...


class Forwarder:
    """An embedded asyncio L4 forwarder: kube-proxy's behaviour without HAProxy.

    Each accepted connection is paired with a new connection to the next endpoint in
    round-robin order; the pair lives until either side closes. Changing the endpoint
    list never touches connections already paired.
    """

    name = "asyncio forwarder"

    def __init__(self) -> None:
        self.port = 0
        self._endpoints: dict[str, int] = {}
        self._turn = itertools.count()
        self._server: asyncio.Server | None = None
        self._pairs: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.connect_errors = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def add(self, endpoint: str, port: int) -> None:
        self._endpoints[endpoint] = port

    async def remove(self, endpoint: str) -> None:
        self._endpoints.pop(endpoint, None)

    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    async def backend_connect_errors(self) -> int:
        return self.connect_errors

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pairs.add(task)
        self._writers.add(client_writer)
        try:
            ports = list(self._endpoints.values())
            if not ports:
                return
            port = ports[next(self._turn) % len(ports)]
            try:
                server_reader, server_writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                self.connect_errors += 1
                return
            self._writers.add(server_writer)
            try:
                await asyncio.gather(_pipe(client_reader, server_writer), _pipe(server_reader, client_writer))
            finally:
                server_writer.close()
                self._writers.discard(server_writer)
        finally:
            client_writer.close()
            self._writers.discard(client_writer)
            self._pairs.discard(task)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        # Closing the transports ends every pipe with EOF; no task needs cancelling.
        for writer in list(self._writers):
            writer.close()
        if self._pairs:
            await asyncio.wait(list(self._pairs), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        # Half-close, as TCP does: the other direction may still be sending.
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


@contextlib.asynccontextmanager
async def open_balancer(
    kind: str = "auto",
    *,
    slots: int = 16,
    gateway_retry: bool = False,
    envoy_retry: str | None = None,
    active_hc: bool = False,
) -> AsyncIterator[HAProxy | Nginx | Envoy | Forwarder]:
    """Start the balancer ``kind`` names (``auto``: HAProxy in mode tcp when installed, else the forwarder).

    With ``envoy``: ``envoy_retry`` is its retry profile (default ``not-started`` with
    ``gateway_retry``, else ``none``), ``active_hc`` its health checking of ``/ready``.
    """
    if kind not in BALANCERS:
        raise RuntimeError(f"balancer {kind!r} is unknown; use one of {', '.join(BALANCERS)}")
    if gateway_retry and kind not in L7_BALANCERS:
        raise RuntimeError(f"gateway retry needs an L7 balancer ({' or '.join(L7_BALANCERS)}), not {kind!r}")
    balancer: HAProxy | Nginx | Envoy | Forwarder
    with tempfile.TemporaryDirectory(prefix="g-lb-", dir="/tmp") as directory:
        if kind == "envoy":
            envoy = find_envoy()
            if envoy is None:
                raise RuntimeError(f"--balancer envoy: {missing_envoy()}")
            retry = envoy_retry or ("not-started" if gateway_retry else "none")
            balancer = Envoy(envoy, directory, retry=retry, active_hc=active_hc)
        elif kind == "nginx":
            nginx = find_nginx()
            if nginx is None:
                raise RuntimeError("--balancer nginx: nginx is not installed; install it (apt-get install nginx)")
            balancer = Nginx(nginx, directory, gateway_retry=gateway_retry)
        else:
            haproxy = find_haproxy() if kind != "forwarder" else None
            if haproxy is None and kind in ("haproxy", "haproxy-http"):
                raise RuntimeError(f"--balancer {kind}: haproxy is not installed; install it (apt-get install haproxy)")
            if haproxy is None:
                balancer = Forwarder()
            else:
                mode: Mode = "http" if kind == "haproxy-http" else "tcp"
                balancer = HAProxy(haproxy, directory, slots=slots, mode=mode, gateway_retry=gateway_retry)
        try:
            await balancer.start()
            yield balancer
        finally:
            await balancer.close()
