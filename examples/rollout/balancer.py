"""The Service in front of the replicas: HAProxy driven through its runtime API, or an asyncio L4 forwarder.

Both model kube-proxy: a new TCP connection goes to one of the listed endpoints, and
removing an endpoint only affects connections opened afterwards. Connections already
open stay up until one side closes them, which is exactly why a pod must keep serving
(or answer 503 with ``Connection: close``) after its endpoint is gone.

Neither retries a failed backend connect (kube-proxy does not either), so a client of
a dead endpoint sees its connection closed after it was accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Protocol

__all__ = ["Balancer", "Forwarder", "HAProxy", "open_balancer"]

HAPROXY_ENV = "GRACEFUL_ROLLOUT_HAPROXY"


class Balancer(Protocol):
    """The operations a rollout needs from a load balancer."""

    name: str
    port: int

    async def add(self, endpoint: str, port: int) -> None: ...

    async def remove(self, endpoint: str) -> None: ...

    def endpoints(self) -> list[str]: ...

    async def backend_connect_errors(self) -> int: ...


class HAProxy:
    """An HAProxy process in ``mode tcp`` with ``slots`` pre-declared servers, all in maintenance at first.

    ``add`` points a free slot at a port and sets it ready; ``remove`` sets it to maint.
    Maint stops new connections only: HAProxy ends established sessions on a state
    change only with ``on-marked-down shutdown-sessions``, which is never set here.
    """

    def __init__(self, binary: str, directory: str, *, slots: int) -> None:
        self.binary = binary
        self.directory = directory
        self.slots = slots
        self.port = 0
        self.name = "haproxy"
        self.stats_socket = os.path.join(directory, "admin.sock")
        self._slot_of: dict[str, str] = {}
        self._free = [f"s{i}" for i in range(1, slots + 1)]
        self._process: asyncio.subprocess.Process | None = None
        self._listener: socket.socket | None = None

    def config(self) -> str:
        servers = "\n".join(f"    server {slot} 127.0.0.1:9 disabled" for slot in self._free)
        # No health checks and retries 0: kube-proxy neither probes nor redispatches.
        return f"""global
    stats socket {self.stats_socket} mode 600 level admin
    maxconn 2000
    nbthread 2

defaults
    mode tcp
    timeout connect 2s
    timeout client 10m
    timeout server 10m
    retries 0

frontend service
    bind fd@{self._listener.fileno() if self._listener else -1}
    default_backend pods

backend pods
    balance roundrobin
{servers}
"""

    async def start(self) -> None:
        # HAProxy inherits a socket bound here (bind fd@N): no other process can take the port meanwhile.
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        path = os.path.join(self.directory, "haproxy.cfg")
        with open(path, "w", encoding="utf-8") as out:
            out.write(self.config())
        self._process = await asyncio.create_subprocess_exec(
            self.binary,
            "-db",
            "-f",
            path,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            pass_fds=(self._listener.fileno(),),
        )
        self._listener.close()  # HAProxy holds its own copy
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._process.returncode is not None:
                err = (await self._process.stderr.read()).decode(errors="replace") if self._process.stderr else ""
                raise RuntimeError(f"haproxy exited with {self._process.returncode}: {err.strip()[-500:]}")
            try:
                info = await self.command("show info")
            except OSError:
                info = ""
            if "Pid:" in info and await _accepts(self.port):
                self.name = "haproxy " + _field(info, "Version")
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
        process = self._process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), 5)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


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


async def _accepts(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def _field(info: str, name: str) -> str:
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return "?"


def find_haproxy() -> str | None:
    """The haproxy binary, unless ``GRACEFUL_ROLLOUT_HAPROXY=off`` asks for the forwarder."""
    configured = os.environ.get(HAPROXY_ENV, "").strip()
    if configured.lower() in ("off", "0", "no", "false"):
        return None
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("haproxy") or next(
        (path for path in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(path, os.X_OK)), None
    )


@contextlib.asynccontextmanager
async def open_balancer(kind: str = "auto", *, slots: int = 16) -> AsyncIterator[HAProxy | Forwarder]:
    """Start HAProxy (``auto`` when installed, or ``haproxy``) or the forwarder; stop it on exit."""
    binary = find_haproxy() if kind in ("auto", "haproxy") else None
    if kind == "haproxy" and binary is None:
        raise RuntimeError("--balancer haproxy: haproxy is not installed; install it (apt-get install haproxy)")
    balancer: HAProxy | Forwarder
    with tempfile.TemporaryDirectory(prefix="g-lb-", dir="/tmp") as directory:
        balancer = HAProxy(binary, directory, slots=slots) if binary is not None else Forwarder()
        try:
            await balancer.start()
            yield balancer
        finally:
            await balancer.close()
