"""What the balancer processes share: a listening socket they inherit, finding binaries, stopping them.

A balancer binds the port it serves on. Picking a free port and letting HAProxy or nginx
bind it later is a race with every other process on the machine, so the demo binds the
socket itself (port 0), reads the port back and hands the bound, listening socket to
the balancer: HAProxy takes it as ``bind fd@N``, nginx through its ``NGINX`` inherited
sockets variable (the mechanism of its binary upgrade). Connections that arrive before
the balancer is up wait in the kernel's backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket

__all__ = ["documented_lines", "find_binary", "listening_socket", "stop_group"]

# The balancer configurations docs/gateways.md shows, which the demo runs as written.
GATEWAYS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gateways")


def documented_lines(name: str) -> list[str]:
    """The lines of ``examples/gateways/<name>`` as written, without comments and blank lines."""
    with open(os.path.join(GATEWAYS, name), encoding="utf-8") as config:
        lines = (line.rstrip() for line in config)
        return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def listening_socket() -> socket.socket:
    """A TCP socket bound to 127.0.0.1 on a port the kernel chose, listening, inheritable."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def find_binary(name: str, env: str) -> str | None:
    """The ``name`` binary: ``$env`` if set (``off`` disables it), else PATH, else /usr/sbin and /usr/local/sbin."""
    configured = os.environ.get(env, "").strip()
    if configured.lower() in ("off", "0", "no", "false"):
        return None
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which(name) or next(
        (path for path in (f"/usr/sbin/{name}", f"/usr/local/sbin/{name}") if os.access(path, os.X_OK)), None
    )


async def stop_group(process: asyncio.subprocess.Process | None, *, timeout: float = 5.0) -> None:
    """SIGTERM the process group (the balancer started it with ``start_new_session``), SIGKILL if it lingers."""
    if process is None or process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
