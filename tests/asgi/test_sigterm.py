"""SIGTERM drains under every server users run (end to end, real subprocesses on 127.0.0.1).

The app (tests/apps/compat.py) wraps itself in GracefulMiddleware; nothing else is
configured: the middleware takes SIGTERM over from the server in lifespan startup.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from graceful import ConfigError, Drain
from graceful._asgi._signals import REPEAT_WINDOW
from tests.utils import ROOT


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    socket_dir: str

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def wait_ready(server: Server, timeout: float = 60.0) -> None:
    """Poll /ready of a subprocess: its readiness is only observable from outside. The timeout only
    catches a hang: a loaded machine starts gunicorn's two workers in seconds, not milliseconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}")
        try:
            if httpx.get(server.base + "/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"server on {server.base} never became ready")


PROPAGATION_WAIT = 3.0  # long enough that a loaded machine still sends step 4 inside it
SERVERS = ["uvicorn-h11", "uvicorn-httptools", "gunicorn", "hypercorn-asyncio", "hypercorn-trio", "granian"]
UVICORN_PORT = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


@dataclass
class Log:
    """The server's output, read as it comes so that a test can wait for a line."""

    lines: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def follow(self, process: subprocess.Popen[bytes]) -> threading.Thread:
        def read() -> None:
            assert process.stdout is not None
            for raw in process.stdout:
                with self.changed:
                    self.lines.append(raw.decode(errors="replace"))
                    self.changed.notify_all()

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        return thread

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 15) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for line in self.lines:
                    match = pattern.search(line)
                    if match:
                        return match
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no line matching {pattern.pattern!r}:\n{self.text()}")
                self.changed.wait(left)

    def text(self) -> str:
        return "".join(self.lines)


def listening_port(pid: int, timeout: float = 15) -> int:
    """The TCP port a process or one of its children listens on (granian logs port 0 as 0)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [pid] + [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == pid]
        inodes = set()
        for each in pids:
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{each}/fd"):
                    with contextlib.suppress(OSError):
                        target = os.readlink(f"/proc/{each}/fd/{fd}")
                        if target.startswith("socket:["):
                            inodes.add(target[8:-1])
        with open("/proc/net/tcp") as table:
            for line in table.readlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and parts[9] in inodes:  # 0A: LISTEN
                    return int(parts[1].split(":")[1], 16)
        time.sleep(0.05)
    raise TimeoutError(f"process {pid} never listened")


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def start_server(name: str, socket_dir: str, **env: str) -> Iterator[tuple[Server, Log]]:
    """Start server `name` on 127.0.0.1 without a port race: a socket passed by fd, or port 0 read back."""
    py = sys.executable
    target = "tests.apps.compat:app"
    listener = None
    pass_fds: tuple[int, ...] = ()
    if name in ("gunicorn", "hypercorn-asyncio", "hypercorn-trio"):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        listener.set_inheritable(True)
        pass_fds = (listener.fileno(),)
        bind = f"fd://{listener.fileno()}"
    commands = {
        "uvicorn-h11": [py, "-m", "uvicorn", target, "--port", "0", "--http", "h11"],
        "uvicorn-httptools": [py, "-m", "uvicorn", target, "--port", "0", "--http", "httptools"],
        "gunicorn": [py, "-m", "gunicorn", "-k", "uvicorn_worker.UvicornWorker", "--workers", "2", "--bind", "{bind}",
                     target],
        # --workers 0: the app runs in hypercorn's main process (see the compatibility table). Its graceful
        # timeout (3 s by default) is 30 s here, as gunicorn's: an exit a server's timeout held comes long
        # after the last frame, far from one that follows the drain (sigterm_during_streams).
        "hypercorn-asyncio": [py, "-m", "hypercorn", target, "--bind", "{bind}", "--workers", "0",
                              "--worker-class", "asyncio", "--graceful-timeout", "30"],
        "hypercorn-trio": [py, "-m", "hypercorn", target, "--bind", "{bind}", "--workers", "0",
                           "--worker-class", "trio", "--graceful-timeout", "30"],
        "graceful-run": [py, "-m", "graceful", "run", target, "--host", "127.0.0.1", "--port", "0"],
        # The asyncio loop, whatever is installed: granian picks uvloop when it can (see the uvloop test).
        "granian": [py, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", "0", "--loop",
                    "asyncio", target],
        "granian-uvloop": [py, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", "0",
                           "--loop", "uvloop", target],
    }  # fmt: skip
    command = [part.replace("{bind}", bind) if listener else part for part in commands[name]]
    environment = {**os.environ, "GRACEFUL_SOCKET_DIR": socket_dir, "PYTHONPATH": ROOT, **env}
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        pass_fds=pass_fds,
        start_new_session=True,
    )
    log = Log()
    reader = log.follow(process)
    try:
        if listener is not None:
            port = listener.getsockname()[1]
            listener.close()  # the server holds its own copy
        elif name.startswith("granian"):
            port = listening_port(process.pid)
        else:
            port = int(log.wait_for(UVICORN_PORT)[1])
        server = Server(process, port, socket_dir)
        wait_ready(server)
        yield server, log
    finally:
        if listener is not None:
            listener.close()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        reader.join(10)
        if process.stdout is not None:
            process.stdout.close()
        server_log = log.text()
        if server_log:
            print(server_log)


@dataclass
class Stream:
    frames: list[str] = field(default_factory=list)
    first: threading.Event = field(default_factory=threading.Event)
    ended_at: float | None = None
    error: BaseException | None = None


def stream_in_thread(base: str) -> tuple[Stream, threading.Thread]:
    stream = Stream()

    def run() -> None:
        try:
            with httpx.Client(base_url=base, timeout=20) as client:
                with client.stream("POST", "/stream") as response:
                    assert response.status_code == 200
                    for line in response.iter_lines():
                        if line:
                            stream.frames.append(line)
                            stream.first.set()
            stream.ended_at = time.monotonic()
        except BaseException as exc:  # reported by the test
            stream.error = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return stream, thread


def assert_whole(stream: Stream, output: str) -> None:
    assert stream.error is None, (repr(stream.error), output)
    assert stream.frames[-1] == "data: [DONE]", (stream.frames[-3:], output)
    assert stream.frames[:-1] == [f"data: {i}" for i in range(len(stream.frames) - 1)]


def first_503(client: httpx.Client, since: float, limit: float = 5.0) -> float:
    """Poll /ready as fast as the server answers; the seconds from `since` to the first 503."""
    while time.monotonic() < since + limit:
        if client.get("/ready").status_code == 503:
            return time.monotonic() - since
    raise AssertionError(f"/ready never returned 503 within {limit} s")


def sigterm_during_streams(name: str, socket_dir: str, *, group: bool = False) -> None:
    """
    1. two SSE streams are in flight (first frame received)
    2. SIGTERM goes to the server's main process (gunicorn's master), or with `group` to every
       process of the server at once (systemd's default KillMode=control-group)
    3. /ready returns 503 (the drain began at SIGTERM: the next step is still inside its propagation wait)
    4. during the propagation wait, a request on a new connection is served (admit mode)
    5. every stream ends whole with [DONE]
    6. the process exits soon after the last frame (within 10 s: no server timeout, 30 s here, held it)
    """
    env = {"COMPAT_ADMIT": "default", "COMPAT_PROPAGATION_WAIT": str(PROPAGATION_WAIT)}
    with start_server(name, socket_dir, **env) as (server, log):
        probe = httpx.Client(base_url=server.base, timeout=5)
        probe.get("/ready")  # connect now: the poll below measures the answer, not the handshake
        streams = [stream_in_thread(server.base) for _ in range(2)]
        for stream, _ in streams:
            assert stream.first.wait(10), log.text()
        sent = time.monotonic()
        if group:
            os.killpg(server.process.pid, signal.SIGTERM)
        else:
            server.process.send_signal(signal.SIGTERM)
        # A few ms when the machine is quiet; 1 s is a safety bound, the order is what step 4 checks.
        assert first_503(probe, sent) <= 1.0, log.text()
        with httpx.Client(timeout=5) as fresh:
            answer = fresh.post(server.base + "/short")
        answered = time.monotonic()
        assert answer.status_code == 200, (answer.status_code, answer.text, log.text())
        assert answered - sent < PROPAGATION_WAIT, "answered after the propagation wait: the test proves nothing"
        probe.close()
        for stream, thread in streams:
            thread.join(15)
            assert_whole(stream, log.text())
        last_frame = max(stream.ended_at or 0.0 for stream, _ in streams)
        server.process.wait(15)
        exited = time.monotonic()
        # Tens of ms when quiet, seconds on a loaded host: the exit follows the drain, not a server timeout
        # (30 s for hypercorn and gunicorn here; uvicorn waits for open connections without one).
        assert exited - last_frame <= 10.0, (exited - last_frame, log.text())


@pytest.mark.parametrize("name", SERVERS)
def test_sigterm_drains(name: str, socket_dir: str) -> None:
    sigterm_during_streams(name, socket_dir)


@pytest.mark.parametrize("name", ["gunicorn", "granian"])
def test_sigterm_to_every_process_drains_once(name: str, socket_dir: str) -> None:
    """systemd's default stop (KillMode=control-group) signals the parent and its workers together,
    and the parent forwards SIGTERM to its workers: each worker sees SIGTERM twice within
    milliseconds and drains once (no forced exit)."""
    sigterm_during_streams(name, socket_dir, group=True)


def test_sigterm_without_drain_on_sigterm_is_the_servers_own(socket_dir: str) -> None:
    """GRACEFUL_DRAIN_ON_SIGTERM=0 under plain uvicorn:
    1. a stream is in flight
    2. SIGTERM
    3. uvicorn closes its listener at once: a new connection is refused, while readiness never failed
       (the stream, which runs until the app sees a drain, keeps going)
    """
    with start_server("uvicorn-h11", socket_dir, GRACEFUL_DRAIN_ON_SIGTERM="0", COMPAT_ADMIT="default") as (
        server,
        log,
    ):
        stream, _ = stream_in_thread(server.base)
        assert stream.first.wait(10), log.text()
        server.process.send_signal(signal.SIGTERM)
        assert 503 not in refused_without_draining(server), log.text()
        seen = len(stream.frames)
        deadline = time.monotonic() + 5
        while len(stream.frames) < seen + 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        # Still streaming the SERVING part of the stream: no drain began.
        assert len(stream.frames) >= seen + 5 and stream.frames[-1] != "data: [DONE]"
        assert server.process.poll() is None


def test_second_signal_forces_exit(socket_dir: str) -> None:
    """
    1. a stream is in flight; the propagation wait is 10 s
    2. SIGTERM: the drain begins (/ready 503)
    3. SIGINT, more than REPEAT_WINDOW later: the process exits at once; the stream ends early with
       its final frame, not [DONE]
    """
    env = {"COMPAT_ADMIT": "default", "COMPAT_PROPAGATION_WAIT": "10", "COMPAT_TAIL": "1000"}
    with start_server("uvicorn-h11", socket_dir, **env) as (server, log):
        stream, thread = stream_in_thread(server.base)
        assert stream.first.wait(10), log.text()
        server.process.send_signal(signal.SIGTERM)
        first = time.monotonic()
        with httpx.Client(base_url=server.base, timeout=5) as probe:
            first_503(probe, first)
        # A repeat within REPEAT_WINDOW is the same stop arriving twice; a later one forces. The window
        # opens when the server handles SIGTERM, which the 503 just seen comes after (on a busy machine,
        # well after the test sent it).
        time.sleep(REPEAT_WINDOW + 0.1)
        sent = time.monotonic()
        server.process.send_signal(signal.SIGINT)
        server.process.wait(10)
        # At once: tens of ms when quiet. A drain would hold it for the 10 s wait; half that catches it.
        assert time.monotonic() - sent < 5.0, log.text()
        thread.join(10)
        assert stream.frames and stream.frames[-1] != "data: [DONE]", stream.frames[-3:]
        assert '"type":"server_shutdown"' in stream.frames[-1], stream.frames[-3:]  # the retryable final frame


def refused_without_draining(server: Server) -> list[int]:
    """Poll /ready on new connections until the listener is gone; the statuses seen before that.

    Gone: a connect refused, or a connection reset before any answer, which is what the kernel
    does to a connection still waiting in the listener's backlog when the server closes it.
    """
    seen: list[int] = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            seen.append(httpx.get(server.base + "/ready", timeout=1).status_code)
        except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
            return seen
    raise AssertionError(f"never refused a connection; /ready answered {seen[-5:]}")


def test_granian_on_uvloop_keeps_its_own_sigterm(socket_dir: str) -> None:
    """uvloop keeps add_signal_handler callbacks where Python cannot read them:
    1. the middleware logs (a warning) that SIGTERM stays with the server, and the fix
    2. SIGTERM: granian closes its listener on its own, with no drain (/ready never turned 503)
    """
    pytest.importorskip(
        "uvloop",
        reason="uvloop is kept out of the test extra: installed, it would move uvicorn and granian onto it in every "
        "other test. pip install uvloop to run this case",
    )
    with start_server("granian-uvloop", socket_dir) as (server, log):
        log.wait_for(re.compile(r"SIGTERM stays with the server: its event loop \(uvloop\)"))
        server.process.send_signal(signal.SIGTERM)
        assert 503 not in refused_without_draining(server), log.text()
        server.process.wait(10)


def test_graceful_run_drains_once(socket_dir: str) -> None:
    """`graceful run` keeps its own SIGTERM handling; the middleware does not take it over:
    1. a stream is in flight 2. SIGTERM 3. one drain (one "draining" line, none from the middleware's
    hand-on) 4. the stream ends whole and the process exits 0
    """
    with start_server("graceful-run", socket_dir, COMPAT_ADMIT="default") as (server, log):
        stream, thread = stream_in_thread(server.base)
        assert stream.first.wait(10), log.text()
        server.process.send_signal(signal.SIGTERM)
        thread.join(15)
        assert_whole(stream, log.text())
        assert server.process.wait(10) == 0, log.text()
        assert log.text().count("SIGTERM received: draining") == 1, log.text()
        assert "handing SIGTERM on" not in log.text()


def test_drain_on_sigterm_values(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Drain().config.drain_on_sigterm is True
    assert Drain(drain_on_sigterm=False).config.drain_on_sigterm is False
    monkeypatch.setenv("GRACEFUL_DRAIN_ON_SIGTERM", "0")
    assert Drain().config.drain_on_sigterm is False
    assert Drain(drain_on_sigterm=True).config.drain_on_sigterm is True  # the argument wins over the env
    monkeypatch.setenv("GRACEFUL_DRAIN_ON_SIGTERM", "maybe")
    with pytest.raises(ConfigError, match=r"GRACEFUL_DRAIN_ON_SIGTERM: 'maybe' is not a boolean; use 1 or 0"):
        Drain()
    monkeypatch.delenv("GRACEFUL_DRAIN_ON_SIGTERM")
    with pytest.raises(ConfigError, match=r"drain_on_sigterm: expected True or False, got 'no'"):
        Drain(drain_on_sigterm="no")


def test_systemd_stop_fits_timeout_stop_sec(socket_dir: str) -> None:
    """The stop systemd performs for the unit in docs/outside-kubernetes.md, with TimeoutStopSec=6
    and GRACEFUL_GRACE_PERIOD=6 (reserve 2 s: drain limit 4 s):
    1. a stream that would run 20 more seconds is in flight under gunicorn
    2. SIGTERM to every process of the unit (KillMode=control-group)
    3. at the drain deadline (4 s) the stream ends with the retryable final frame
    4. the server exits before TimeoutStopSec, so SIGKILL is never needed
    """
    env = {"COMPAT_ADMIT": "default", "COMPAT_GRACE": "6", "COMPAT_TAIL": "1000"}
    with start_server("gunicorn", socket_dir, **env) as (server, log):
        stream, thread = stream_in_thread(server.base)
        assert stream.first.wait(10), log.text()
        sent = time.monotonic()
        os.killpg(server.process.pid, signal.SIGTERM)
        thread.join(15)
        assert stream.error is None and stream.ended_at is not None, (repr(stream.error), log.text())
        assert '"type":"server_shutdown"' in stream.frames[-1], stream.frames[-3:]
        # Not cut before the deadline (4 s after SIGTERM); how soon after it is the exit's promise below.
        assert stream.ended_at - sent >= 3.8, stream.ended_at - sent
        server.process.wait(10)
        # The promise: out before TimeoutStopSec (6 s), so systemd never needs SIGKILL.
        assert time.monotonic() - sent < 6.0, log.text()


async def _noop_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app that does nothing but complete its lifespan (graceful never answers lifespan for an app)."""
    if scope["type"] != "lifespan":
        return
    while True:
        message = await receive()
        await send({"type": message["type"] + ".complete"})
        if message["type"] == "lifespan.shutdown":
            return


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_servers_handler_hears_the_signal_after_the_drain(anyio_backend: str) -> None:
    """In process, both ways a server installs a handler: asyncio's loop.add_signal_handler
    (hypercorn, granian) and signal.signal (uvicorn; the only way under trio):
    1. SIGTERM: the drain begins and the server's handler is not called yet
    2. the drain ends (a 0.2 s propagation wait) 3. the server's handler gets SIGTERM, once
    4. after lifespan shutdown the server's handler is installed again, not ours
    """
    import anyio
    from asgi_lifespan import LifespanManager
    from prometheus_client import CollectorRegistry

    from graceful import GracefulMiddleware, State

    heard: list[tuple[int, State]] = []
    app = GracefulMiddleware(_noop_app, admin=False, registry=CollectorRegistry(), propagation_wait=0.2)  # type: ignore[arg-type]

    def server_handler(sig: int, frame: object = None) -> None:
        heard.append((sig, app.drain.state))

    loop = None
    if anyio_backend == "asyncio":
        import asyncio

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, server_handler, signal.SIGTERM)
    else:
        before = signal.signal(signal.SIGTERM, server_handler)
    try:
        async with LifespanManager(app):
            os.kill(os.getpid(), signal.SIGTERM)
            with anyio.fail_after(5):
                while app.drain.state is not State.DRAINING:
                    await anyio.sleep(0.01)
                assert heard == []
                while not heard:
                    await anyio.sleep(0.01)
            assert app.drain.last_result is not None and app.drain.last_result.result == "drained"
            assert heard == [(signal.SIGTERM, State.DRAINING)]
        if loop is None:
            assert signal.getsignal(signal.SIGTERM) is server_handler
    finally:
        if loop is not None:
            loop.remove_signal_handler(signal.SIGTERM)
        else:
            signal.signal(signal.SIGTERM, before)


@pytest.mark.anyio
async def test_what_is_not_taken_over(caplog: pytest.LogCaptureFixture) -> None:
    """1. an ignored SIGINT stays ignored 2. a SIGTERM handler that is a method of an event loop
    (uvloop's way) while no wakeup fd is set (nothing would dispatch it) stays, with a warning
    naming the fix."""
    import asyncio

    from asgi_lifespan import LifespanManager
    from prometheus_client import CollectorRegistry

    from graceful import GracefulMiddleware, State

    other_loop = asyncio.new_event_loop()
    loop_owned = other_loop.call_soon  # stands in for uvloop's Loop.__sighandler: never called here
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    wakeup_before = signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, loop_owned)  # type: ignore[arg-type]
    app = GracefulMiddleware(_noop_app, admin=False, registry=CollectorRegistry())  # type: ignore[arg-type]
    try:
        with caplog.at_level("WARNING", logger="graceful"):
            async with LifespanManager(app):
                assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
                assert signal.getsignal(signal.SIGTERM) == loop_owned
                assert app.drain.state is State.SERVING
        assert "SIGTERM stays with the server: its event loop (asyncio" in caplog.text
        assert "drain from a preStop hook (graceful drain)" in caplog.text
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(wakeup_before)
        other_loop.close()


@pytest.mark.anyio
async def test_a_loop_that_dispatches_from_its_wakeup_fd() -> None:
    """uvloop's way (vLLM's API server runs on it): Python's handler is a method of the loop,
    the callbacks sit in a table Python cannot read, and the loop dispatches from the numbers
    the interpreter writes to its wakeup fd (uvloop/loop.pyx, _read_from_self). Emulated:
    1. during the lifespan the wakeup fd is graceful's, and another signal's number (SIGUSR1)
       still reaches the loop's fd
    2. SIGTERM: the drain runs and the loop's fd hears nothing of it
    3. once the drain has ended, the loop's handler and fd are back and the loop's fd gets
       SIGTERM's number, once."""
    import asyncio
    import socket

    import anyio
    from asgi_lifespan import LifespanManager
    from prometheus_client import CollectorRegistry

    from graceful import GracefulMiddleware, State

    other_loop = asyncio.new_event_loop()
    loop_owned = other_loop.call_soon  # stands in for uvloop's Loop.__sighandler
    loop_reads, loop_fd = socket.socketpair()  # the loop's self-pipe
    loop_reads.setblocking(False)
    loop_fd.setblocking(False)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    wakeup_before = signal.set_wakeup_fd(loop_fd.fileno(), warn_on_full_buffer=False)
    for sig in before:
        signal.signal(sig, loop_owned)  # type: ignore[arg-type]

    def numbers() -> bytes:
        try:
            return loop_reads.recv(512)
        except BlockingIOError:
            return b""

    async def heard(expected: bytes) -> None:
        got = b""
        with anyio.fail_after(5):
            while got != expected:
                got += numbers()
                await anyio.sleep(0.01)

    app = GracefulMiddleware(_noop_app, admin=False, registry=CollectorRegistry(), propagation_wait=0.2)  # type: ignore[arg-type]
    try:
        async with LifespanManager(app):
            assert signal.getsignal(signal.SIGTERM) != loop_owned
            assert signal.getsignal(signal.SIGUSR1) == loop_owned  # not one of ours
            os.kill(os.getpid(), signal.SIGUSR1)
            await heard(bytes([signal.SIGUSR1]))
            os.kill(os.getpid(), signal.SIGTERM)
            with anyio.fail_after(5):
                while app.drain.state is not State.DRAINING:
                    await anyio.sleep(0.01)
            assert numbers() == b""
            await heard(bytes([signal.SIGTERM]))
            assert app.drain.last_result is not None and app.drain.last_result.result == "drained"
            assert signal.getsignal(signal.SIGTERM) == loop_owned
            assert signal.set_wakeup_fd(loop_fd.fileno(), warn_on_full_buffer=False) == loop_fd.fileno()
        await anyio.sleep(0.05)
        assert numbers() == b""  # once
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(wakeup_before)
        loop_reads.close()
        loop_fd.close()
        other_loop.close()


@pytest.mark.anyio
async def test_a_signal_before_serving_goes_to_the_server_at_once() -> None:
    """ready_on_startup=False, weights still loading (STARTING): SIGTERM reaches the server's
    handler at once, with no drain."""
    import anyio
    from asgi_lifespan import LifespanManager
    from prometheus_client import CollectorRegistry

    from graceful import GracefulMiddleware, State

    heard: list[State] = []
    app = GracefulMiddleware(_noop_app, admin=False, registry=CollectorRegistry(), ready_on_startup=False)  # type: ignore[arg-type]
    before = signal.signal(signal.SIGTERM, lambda sig, frame: heard.append(app.drain.state))
    try:
        async with LifespanManager(app):
            os.kill(os.getpid(), signal.SIGTERM)
            with anyio.fail_after(5):
                while not heard:
                    await anyio.sleep(0.01)
            assert heard == [State.STARTING]
            assert app.drain.last_result is None
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_lifespan_off_the_main_thread_leaves_the_signals_alone() -> None:
    """A server running the app in another thread (signals reach only the main thread): startup
    succeeds and SIGTERM's handler is unchanged."""
    import anyio
    from asgi_lifespan import LifespanManager
    from prometheus_client import CollectorRegistry

    from graceful import GracefulMiddleware, State

    app = GracefulMiddleware(_noop_app, admin=False, registry=CollectorRegistry())  # type: ignore[arg-type]
    seen: list[object] = []

    async def serve() -> None:
        async with LifespanManager(app):
            seen.extend([app.drain.state, signal.getsignal(signal.SIGTERM)])

    thread = threading.Thread(target=anyio.run, args=(serve,))
    thread.start()
    thread.join(10)
    assert seen == [State.SERVING, signal.getsignal(signal.SIGTERM)]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_request_the_server_has_not_read_at_sigterm_is_served_before_it_hears_it(anyio_backend: str) -> None:
    """The race of a strict keep-alive client inside vLLM (docs/middleware.md, "Pinned connections"):
    1. a stream is in flight on peer P when the preStop drain begins: P is pinned
    2. the stream ends and the drain reports drained
    3. P's next request is already in the server's buffer, unread, when SIGTERM arrives (the
       server reads it with a reader callback and starts the app's task a few loop turns later)
    4. graceful lets the server read it, serves it, and only then hands SIGTERM on: the server's
       handler finds nothing in flight and the request answered 200 with Connection: close"""
    import asyncio

    import anyio
    from asgi_lifespan import LifespanManager
    from prometheus_client import CollectorRegistry

    from graceful import GracefulMiddleware, State
    from tests.asgi.test_middleware_raw import Recorder, http_scope, no_body

    gate = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _noop_app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        if scope["path"] == "/stream":
            await gate.wait()
        await send({"type": "http.response.body", "body": b"ok"})

    mw = GracefulMiddleware(app, admin=False, registry=CollectorRegistry())
    peer = ("10.1.2.3", 41000)
    heard: list[tuple[int, list[int]]] = []
    answers: list[Recorder] = []

    def server_handler() -> None:
        heard.append((mw.drain.in_flight, [answer.status for answer in answers]))

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, server_handler)
    server_end, client_end = socket.socketpair()
    server_end.setblocking(False)
    tasks: list[asyncio.Task[None]] = []

    def start() -> None:
        answer = Recorder(mw.drain)
        answers.append(answer)
        tasks.append(loop.create_task(mw({**http_scope("/next"), "client": peer}, no_body, answer)))

    def later(turns: int, callback: Callable[[], None]) -> None:
        if turns:
            loop.call_soon(later, turns - 1, callback)
        else:
            callback()

    def on_readable() -> None:
        # The server reads the request and starts the app's task six loop turns later, as a busy
        # server does (callbacks queued ahead of it): after graceful's drain call has returned.
        if server_end.recv(64):
            later(6, start)

    try:
        async with LifespanManager(mw):
            stream = Recorder(mw.drain)
            streaming = loop.create_task(mw({**http_scope("/stream"), "client": peer}, no_body, stream))
            await asyncio.sleep(0)
            assert mw.drain.in_flight == 1
            mw.drain.begin_drain("preStop", propagation_wait=0)
            gate.set()
            await streaming
            result = await mw.drain.drain()
            assert result.drained and mw.drain.in_flight == 0
            loop.add_reader(server_end.fileno(), on_readable)
            client_end.send(b"POST /next")  # in the buffer, unread, ...
            os.kill(os.getpid(), signal.SIGTERM)  # ... when SIGTERM comes
            with anyio.fail_after(5):
                while not heard:
                    await asyncio.sleep(0.01)
            assert heard == [(0, [200])]
            assert answers[0].headers[b"connection"] == b"close"
            assert mw.drain.state is State.DRAINING
    finally:
        loop.remove_reader(server_end.fileno())
        loop.remove_signal_handler(signal.SIGTERM)
        server_end.close()
        client_end.close()
        for task in tasks:
            task.cancel()
