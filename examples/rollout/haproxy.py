"""HAProxy in front of the replicas, driven through its runtime API: ``mode tcp`` (kube-proxy) or ``mode http``.

``mode tcp`` models kube-proxy: a new TCP connection goes to one of the listed
endpoints, removing an endpoint only affects connections opened afterwards, and a
failed backend connect is not retried (``retries 0``).

``mode http`` is an L7 balancer with HAProxy's own defaults: client and server
keep-alive, idle server connections shared between requests (``http-reuse safe``),
each request balanced on its own, a refused connect retried 3 times on the same server
(``retries`` defaults to 3, ``retry-on`` to ``conn-failure``, no redispatch).
``gateway_retry`` adds the documented retry of a not-started 503 on another server, the lines of
examples/gateways/haproxy-retry.cfg as written: ``retry-on conn-failure 503`` with
``option redispatch 1`` and ``option http-buffer-request``. Directives: HAProxy's
configuration.txt (``retries``, ``retry-on``, ``option redispatch``, ``http-reuse``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Literal

from .processes import documented_lines, find_binary, listening_socket, stop_group

__all__ = ["GATEWAY_RETRY", "HAPROXY_ENV", "HAProxy", "find_haproxy"]

HAPROXY_ENV = "GRACEFUL_ROLLOUT_HAPROXY"
Mode = Literal["tcp", "http"]
# The documented HAProxy configuration that retries a not-started 503 on another server.
GATEWAY_RETRY = tuple(line.strip() for line in documented_lines("haproxy-retry.cfg"))
HTTP_DEFAULTS = ("mode http", "option http-keep-alive", "http-reuse safe", "timeout http-keep-alive 75s")


def find_haproxy() -> str | None:
    """The haproxy binary, unless ``GRACEFUL_ROLLOUT_HAPROXY=off`` asks for the forwarder."""
    return find_binary("haproxy", HAPROXY_ENV)


class HAProxy:
    """An HAProxy process with ``slots`` pre-declared servers, all in maintenance at first.

    ``add`` points a free slot at a port and sets it ready; ``remove`` sets it to maint.
    Maint stops new connections (``mode tcp``) or new requests (``mode http``) only:
    HAProxy ends established sessions on a state change only with
    ``on-marked-down shutdown-sessions``, which is never set here.
    """

    def __init__(
        self, binary: str, directory: str, *, slots: int, mode: Mode = "tcp", gateway_retry: bool = False
    ) -> None:
        if gateway_retry and mode != "http":
            raise ValueError("gateway_retry needs mode http: retry-on is an L7 setting")
        self.binary = binary
        self.directory = directory
        self.slots = slots
        self.mode = mode
        self.gateway_retry = gateway_retry
        self.port = 0
        self.name = "haproxy"
        self.stats_socket = os.path.join(directory, "admin.sock")
        self._slot_of: dict[str, str] = {}
        self._free = [f"s{i}" for i in range(1, slots + 1)]
        self._process: asyncio.subprocess.Process | None = None

    def config(self, listen: str = "127.0.0.1:0") -> str:
        servers = "\n".join(f"    server {slot} 127.0.0.1:9 disabled" for slot in self._free)
        if self.mode == "tcp":
            # No health checks and retries 0: kube-proxy neither probes nor redispatches.
            defaults = "    mode tcp\n    retries 0"
        else:
            lines = list(HTTP_DEFAULTS)
            if self.gateway_retry:
                # A request is retried only if HAProxy holds all of it; http-buffer-request makes
                # it wait for the body before connecting (a client that writes the headers and
                # the body apart would otherwise never be retried). Bodies past tune.bufsize
                # (16 kB by default) are never retried.
                lines += [line for line in GATEWAY_RETRY if line not in lines]
            defaults = "\n".join(f"    {line}" for line in lines)
        return f"""global
    stats socket {self.stats_socket} mode 600 level admin
    maxconn 2000
    nbthread 2

defaults
{defaults}
    timeout connect 2s
    timeout client 10m
    timeout server 10m

frontend service
    bind {listen}
    default_backend pods

backend pods
    balance roundrobin
{servers}
"""

    async def start(self) -> None:
        sock = listening_socket()
        try:
            self.port = int(sock.getsockname()[1])
            path = os.path.join(self.directory, "haproxy.cfg")
            with open(path, "w", encoding="utf-8") as out:
                out.write(self.config(listen=f"fd@{sock.fileno()}"))
            self._process = await asyncio.create_subprocess_exec(
                self.binary,
                "-db",
                "-f",
                path,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(sock.fileno(),),
                start_new_session=True,
            )
        finally:
            sock.close()  # HAProxy holds its own copy
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._process.returncode is not None:
                err = (await self._process.stderr.read()).decode(errors="replace") if self._process.stderr else ""
                raise RuntimeError(f"haproxy exited with {self._process.returncode}: {err.strip()[-500:]}")
            try:
                info = await self.command("show info")
            except OSError:
                info = ""
            if "Pid:" in info:
                retry = ", gateway retry" if self.gateway_retry else ""
                self.name = f"haproxy {_field(info, 'Version')} (mode {self.mode}{retry})"
                return
            await asyncio.sleep(0.02)
        raise RuntimeError(f"haproxy did not start within 10 s (config {path})")

    async def command(self, line: str) -> str:
        """One runtime API command over the stats socket (non-interactive: the socket closes after it)."""
        reader, writer = await asyncio.open_unix_connection(self.stats_socket)
        try:
            writer.write(line.encode() + b"\n")
            await writer.drain()
            return (await reader.read()).decode()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _checked(self, line: str) -> None:
        answer = (await self.command(line)).strip()
        # Successful set/enable/disable commands answer with nothing (or a "no need to change" note).
        if answer and "no need to change" not in answer.lower():
            raise RuntimeError(f"haproxy refused {line!r}: {answer}")

    async def add(self, endpoint: str, port: int) -> None:
        if not self._free:
            raise RuntimeError(f"haproxy: no free server slot for {endpoint!r}; raise slots above {self.slots}")
        slot = self._free.pop(0)
        await self._checked(f"set server pods/{slot} addr 127.0.0.1 port {port}")
        await self._checked(f"set server pods/{slot} state ready")
        self._slot_of[endpoint] = slot

    async def remove(self, endpoint: str) -> None:
        slot = self._slot_of.pop(endpoint, None)
        if slot is None:
            return
        await self._checked(f"set server pods/{slot} state maint")
        # The slot is reused only after every other one: its old sessions may still be draining.
        self._free.append(slot)

    def endpoints(self) -> list[str]:
        return list(self._slot_of)

    async def stats(self) -> list[dict[str, str]]:
        """``show stat`` rows of the backend's servers."""
        lines = (await self.command("show stat")).splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","))) for line in lines[1:] if line]
        return [row for row in rows if row.get("pxname") == "pods" and row.get("svname", "").startswith("s")]

    async def backend_connect_errors(self) -> int:
        return sum(int(row.get("econ") or 0) for row in await self.stats())

    async def close(self) -> None:
        await stop_group(self._process)


def _field(info: str, name: str) -> str:
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return "?"
