"""Start a real server as a subprocess on 127.0.0.1 and wait for it, without a port race.

Each server gets its listening address in a way that leaves no window for another process
to take it: hypercorn and gunicorn inherit a socket bound and listening here (``fd://N``);
uvicorn and ``graceful run`` bind port 0 and name the port in their start-up log line;
granian (which takes neither) binds port 0 and the port is read back from the process's own
listening socket in ``/proc``.

``Served`` is the in-process counterpart the ``served`` fixture yields: a middleware under
uvicorn in a thread of this process.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from graceful import GracefulMiddleware
from tests.utils import ROOT

SERVERS = ["uvicorn-h11", "uvicorn-httptools", "hypercorn-asyncio", "hypercorn-trio", "granian", "gunicorn"]
_RUNNING = re.compile(r"running on http://127\.0\.0\.1:(\d+)")


def server_command(name: str, app: str, fd: int) -> list[str]:
    py = sys.executable
    commands = {
        "graceful-run": [py, "-m", "graceful", "run", app, "--port", "0"],
        "uvicorn": [py, "-m", "uvicorn", app, "--port", "0"],
        "uvicorn-h11": [py, "-m", "uvicorn", app, "--port", "0", "--http", "h11"],
        "uvicorn-httptools": [py, "-m", "uvicorn", app, "--port", "0", "--http", "httptools"],
        "hypercorn-asyncio": [py, "-m", "hypercorn", app, "--bind", f"fd://{fd}", "--worker-class", "asyncio"],
        "hypercorn-trio": [py, "-m", "hypercorn", app, "--bind", f"fd://{fd}", "--worker-class", "trio"],
        "granian": [py, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", "0", app],
        "gunicorn": [
            py, "-m", "gunicorn", "-k", "uvicorn_worker.UvicornWorker", "--workers", "2", "--bind", f"fd://{fd}", app,
        ],
    }  # fmt: skip
    return commands[name]


def listening_port(pid: int) -> int | None:
    """The TCP port a process (or one of its children) listens on, read from /proc."""
    pids, inodes = [pid], set()
    while pids:
        current = pids.pop()
        try:
            for child in glob.glob(f"/proc/{current}/task/*/children"):
                pids += [int(p) for p in Path(child).read_text().split()]
            for fd in os.listdir(f"/proc/{current}/fd"):
                target = os.readlink(f"/proc/{current}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # the process ended meanwhile
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and inode in inodes and local.startswith("0100007F:"):  # LISTEN on 127.0.0.1
            return int(local.split(":")[1], 16)
    return None


class Launched:
    """A server process on 127.0.0.1 with its log in a file (a full pipe would block it)."""

    def __init__(self, name: str, app: str, options: tuple[str, ...], socket_dir: str, log: Path, **env: str) -> None:
        self.name = name
        self.socket_dir = socket_dir
        self.log_path = log
        self.port = 0
        listener = socket.socket()
        try:
            fd = -1
            if name.startswith(("hypercorn", "gunicorn")):
                listener.bind(("127.0.0.1", 0))
                listener.listen(128)  # connections queue here until the server accepts them
                self.port = listener.getsockname()[1]
                fd = listener.fileno()
            environment = {
                **os.environ,
                "GRACEFUL_SOCKET_DIR": socket_dir,
                "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
                **env,
            }
            command = server_command(name, app, fd) + list(options)
            with open(log, "wb") as out:
                self.process = subprocess.Popen(
                    command,
                    cwd=ROOT,
                    env=environment,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    pass_fds=(fd,) if fd >= 0 else (),
                    start_new_session=True,
                )
        finally:
            listener.close()

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    def sockets(self) -> list[str]:
        return sorted(glob.glob(os.path.join(self.socket_dir, "*.sock")))

    def wait_port(self, limit: float = 20) -> int:
        """The bound port: known at once for an inherited socket, else from the log line or /proc."""
        deadline = time.monotonic() + limit
        while not self.port:
            assert self.process.poll() is None, f"{self.name} exited with {self.process.returncode}:\n{self.log}"
            assert time.monotonic() < deadline, f"{self.name} never bound a port:\n{self.log}"
            found = _RUNNING.search(self.log)
            if found:
                self.port = int(found.group(1))
            elif self.name == "granian":
                self.port = listening_port(self.process.pid) or 0
            if not self.port:
                time.sleep(0.02)
        return self.port

    def wait_ready(self, sockets: int = 1, limit: float = 60) -> None:
        """Until the port is known, `sockets` admin sockets exist, and /ready answers 200: a start-up bound, not a
        measure (two workers beside the vllm tier took over 20 s to start in a fresh-clone CI run)."""
        deadline = time.monotonic() + limit
        self.wait_port(limit)
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log
            if len(self.sockets()) >= sockets:
                try:
                    if httpx.get(self.url("/ready"), timeout=1).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.05)
        raise AssertionError(f"server not ready:\n{self.log}")

    def wait_log(self, text: str, limit: float = 10.0) -> None:
        deadline = time.monotonic() + limit
        while text not in self.log:
            assert time.monotonic() < deadline, f"never logged {text!r}:\n{self.log}"
            assert self.process.poll() is None, self.log
            time.sleep(0.02)

    def wait_exit(self, limit: float) -> int:
        try:
            return self.process.wait(limit)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"server still running after {limit}s:\n{self.log}") from None

    def stop(self) -> None:
        """SIGTERM first, so workers exit normally (and write their coverage data); SIGKILL after 10 s."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)


@dataclass
class Served:
    """A ``GracefulMiddleware`` under uvicorn in a thread of this process, on ``port``."""

    mw: GracefulMiddleware
    port: int
    socket_dir: str

    def stream_in_background(self, frames: int, interval: float = 0.1) -> tuple[threading.Thread, list[object]]:
        outcome: list[object] = []

        def get() -> None:
            try:
                with httpx.Client(timeout=30) as client:
                    outcome.append(
                        client.get(
                            f"http://127.0.0.1:{self.port}/stream", params={"frames": frames, "interval": interval}
                        ).text
                    )
            except httpx.TransportError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=get)
        thread.start()
        deadline = time.monotonic() + 5
        while self.mw.drain.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.mw.drain.in_flight == 1
        return thread, outcome
