"""Run an ASGI server as a subprocess on 127.0.0.1 and drive a drain through it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

from .utils import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    socket_dir: str
    log: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return "".join(self.log)


def server_command(name: str, target: str, port: int) -> list[str]:
    bind = f"127.0.0.1:{port}"
    py = sys.executable
    commands = {
        "uvicorn-h11": [py, "-m", "uvicorn", target, "--port", str(port), "--http", "h11"],
        "uvicorn-httptools": [py, "-m", "uvicorn", target, "--port", str(port), "--http", "httptools"],
        "hypercorn-asyncio": [py, "-m", "hypercorn", target, "--bind", bind, "--worker-class", "asyncio"],
        "hypercorn-trio": [py, "-m", "hypercorn", target, "--bind", bind, "--worker-class", "trio"],
        "granian": [
            py, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port), target,
        ],
        "gunicorn": [
            py, "-m", "gunicorn", "-k", "uvicorn_worker.UvicornWorker", "--workers", "2", "-b", bind, target,
        ],
        "graceful-run": [py, "-m", "graceful", "run", target, "--port", str(port), "--grace-period", "20"],
    }  # fmt: skip
    return commands[name]


@contextlib.contextmanager
def start(name: str, socket_dir: str, *, target: str = "tests.apps_compat:app", **env: str) -> Iterator[Server]:
    port = free_port()
    environment = {**os.environ, "GRACEFUL_SOCKET_DIR": socket_dir, "PYTHONPATH": ROOT, **env}
    process = subprocess.Popen(
        server_command(name, target, port),
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = Server(process, port, socket_dir)
    try:
        wait_ready(server)
        yield server
    finally:
        if process.poll() is None:
            # SIGTERM first, so workers exit normally (and write their coverage data).
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate(timeout=10)
        server.log.append(out.decode(errors="replace"))


def wait_ready(server: Server, timeout: float = 15.0) -> None:
    """Poll /ready of a subprocess: its readiness is only observable from outside."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            out = server.process.stdout.read().decode(errors="replace") if server.process.stdout else ""
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{out}")
        try:
            if httpx.get(server.base + "/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"server on {server.base} never became ready")


def sockets(socket_dir: str) -> list[str]:
    return sorted(name for name in os.listdir(socket_dir) if name.endswith(".sock"))


def graceful_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graceful", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
