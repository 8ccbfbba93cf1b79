"""The admin client: finds every worker's socket and talks to all of them at once."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from ._paths import default_socket_dir

__all__ = ["NoServer", "WorkerDrain", "discover", "drain_all", "request_all"]

# Grace on top of the server's own deadline: its final line follows the deadline by
# the time it takes to expire what is left (unwind_timeout) plus the on_drained hook.
_CLIENT_SLACK = 15.0


class NoServer(Exception):
    """No socket found, or nothing listening on any of them (CLI exit code 3)."""


def discover(socket_dir: str | None = None, socket: str | None = None) -> list[str]:
    """The socket paths to talk to: ``socket`` alone, or every ``*.sock`` in the directory."""
    if socket is not None:
        return [socket]
    directory = socket_dir or default_socket_dir()
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise NoServer(f"no graceful server found: cannot read socket dir {directory!r} ({exc.strerror})") from None
    paths = []
    for name in names:
        path = os.path.join(directory, name)
        if name.endswith(".sock") and stat.S_ISSOCK(os.lstat(path).st_mode):
            paths.append(path)
    if not paths:
        raise NoServer(
            f"no graceful server found: no sockets in {directory!r}; "
            "is the server running with the same --socket-dir / GRACEFUL_SOCKET_DIR?"
        )
    return paths


def _client(path: str, timeout: float | None = 5.0) -> httpx.AsyncClient:
    # The host name is only a label: the transport always dials the Unix socket.
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=path), base_url="http://graceful", timeout=timeout)


async def request_all(paths: list[str], method: str, url: str) -> dict[str, dict[str, Any] | None]:
    """Send one small request to every socket; ``None`` for a socket nobody answers on."""
    answers: dict[str, dict[str, Any] | None] = {}

    async def one(path: str) -> None:
        try:
            async with _client(path) as client:
                response = await client.request(method, url)
            answers[path] = response.json()
        except (httpx.TransportError, ValueError):
            answers[path] = None

    async with anyio.create_task_group() as tg:
        for path in paths:
            tg.start_soon(one, path)
    return {path: answers[path] for path in paths}


@dataclass
class WorkerDrain:
    """What one worker said during a drain."""

    path: str
    pid: int | None = None
    in_flight: int = 0
    handed_off: int = 0
    deadline: float | None = None
    since_last_request: float | None = None
    progressed: bool = False
    propagation_over: bool = False
    result: dict[str, Any] | None = None
    error: str | None = None
    reachable: bool = True
    lines: list[dict[str, Any]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None or not self.reachable

    def as_dict(self) -> dict[str, Any]:
        return {"socket": self.path, "pid": self.pid, "result": self.result, "error": self.error}


async def drain_all(
    paths: list[str],
    *,
    propagation_wait: float | None = None,
    timeout: float | None = None,
    reason: str = "cli",
    propagation_quiet: float | None = None,
    on_tick: Callable[[list[WorkerDrain]], None] | None = None,
) -> list[WorkerDrain]:
    """Drain every worker concurrently; ``on_tick`` is called about once a second while any runs."""
    params: dict[str, str] = {"reason": reason}
    if propagation_wait is not None:
        params["propagation_wait"] = f"{propagation_wait}s"
    if propagation_quiet is not None:
        params["propagation_quiet"] = f"{propagation_quiet}s"
    if timeout is not None:
        params["timeout"] = f"{timeout}s"
    workers = [WorkerDrain(path) for path in paths]
    limit = None if timeout is None else max(timeout, propagation_wait or 0.0) + _CLIENT_SLACK

    async def one(worker: WorkerDrain) -> None:
        try:
            async with _client(worker.path, timeout=None) as client:
                async with client.stream("POST", "/drain", params=params) as response:
                    if response.status_code != 200:
                        body = (await response.aread()).decode(errors="replace").strip()
                        worker.error = f"HTTP {response.status_code}: {body}"
                        return
                    async for line in response.aiter_lines():
                        if line.strip():
                            _absorb(worker, json.loads(line))
        except httpx.ConnectError:
            worker.reachable = False
            return
        except (httpx.TransportError, ValueError) as exc:
            worker.error = f"lost the connection before the drain ended ({type(exc).__name__})"
            return
        if worker.result is None:
            worker.error = "the server closed the connection before the drain ended"

    async def ticker() -> None:
        while on_tick is not None:
            await anyio.sleep(1.0)
            on_tick(workers)

    with anyio.move_on_after(limit if limit is not None else float("inf")):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            async with anyio.create_task_group() as drains:
                for worker in workers:
                    drains.start_soon(one, worker)
            tg.cancel_scope.cancel()
    for worker in workers:
        if not worker.done:
            worker.error = "no final answer in time"
    if not any(worker.reachable for worker in workers):
        raise NoServer("no graceful server found: nothing is listening on " + ", ".join(paths))
    return workers


def _absorb(worker: WorkerDrain, line: dict[str, Any]) -> None:
    event = line.get("event")
    if event == "status":
        worker.pid = line.get("pid")
        worker.deadline = line.get("deadline")
        worker.in_flight = int(line.get("in_flight") or 0)
    elif event == "progress":
        worker.in_flight = int(line.get("in_flight") or 0)
        worker.handed_off = int(line.get("handed_off") or 0)
        worker.progressed = True
        worker.propagation_over = bool(line.get("propagation_over"))
        since = line.get("since_last_request")
        worker.since_last_request = float(since) if isinstance(since, (int, float)) else None
    elif event == "result":
        worker.pid = line.get("pid", worker.pid)
        worker.in_flight = int(line.get("in_flight") or 0)
        worker.handed_off = int(line.get("handed_off") or 0)
        worker.deadline = line.get("deadline", worker.deadline)
        worker.result = line
