"""End to end: `graceful run` and `graceful drain` as real processes, real signals, 127.0.0.1 only."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

from graceful import GracefulMiddleware, State
from graceful._admin._server import is_listening
from graceful._asgi._stop import REPEAT_WINDOW
from graceful._serve._launcher import GracefulServer
from tests.apps.streaming import app as streaming_app
from tests.servers import Launched
from tests.utils import ROOT, listening_socket, run_uvicorn


class Stream(threading.Thread):
    """One streamed request; records its body and when its last byte arrived."""

    def __init__(self, url: str, frames: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.url, self.frames, self.interval = url, frames, interval
        self.body = ""
        self.finished = 0.0
        self.error: Exception | None = None
        self.status = 0

    def run(self) -> None:
        try:
            with httpx.stream(
                "GET", self.url, params={"frames": self.frames, "interval": self.interval}, timeout=30
            ) as response:
                self.status = response.status_code
                for chunk in response.iter_text():
                    self.body += chunk
            self.finished = time.monotonic()
        except httpx.TransportError as exc:
            self.error = exc

    @property
    def whole(self) -> bool:
        expected = "".join(f"frame {i}\n" for i in range(self.frames)) + "done\n"
        return self.status == 200 and self.body == expected


def graceful(*args: str, socket_dir: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "graceful", *args, "--socket-dir", socket_dir]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_streams(server: Launched, count: int, frames: int) -> list[Stream]:
    streams = [Stream(server.url("/stream"), frames) for _ in range(count)]
    for stream in streams:
        stream.start()
    deadline = time.monotonic() + 5
    while sum(1 for s in streams if s.body) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(s.body for s in streams), "streams did not start"
    return streams


def wait_status(server: Launched, code: int, limit: float = 5.0) -> float:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if httpx.get(server.url("/ready"), timeout=1).status_code == code:
                return time.monotonic()
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"/ready never answered {code}:\n{server.log}")


def test_prestop_drain_then_sigterm(launch: Callable[..., Launched]) -> None:
    """1. three 5 s streams in flight 2. `graceful drain` from another process 3. /ready and new
    requests get 503 at once 4. every stream arrives whole 5. drain exits 0 just after the last
    frame 6. SIGTERM exits 0 quickly."""
    server = launch("--propagation-wait", "0.3s", "--no-admit-during-propagation")
    server.wait_ready()
    streams = start_streams(server, 3, frames=40)
    drain = graceful("drain", socket_dir=server.socket_dir)
    wait_status(server, 503)
    refused = httpx.get(server.url("/hello"), timeout=2)
    assert refused.status_code == 503 and "retry-after" in refused.headers
    assert all(s.is_alive() for s in streams), "the drain must start while streams are in flight"
    out, err = drain.communicate(timeout=15)
    drain_ended = time.monotonic()
    assert drain.returncode == 0, err
    for stream in streams:
        stream.join(5)
        assert stream.whole, (stream.body, stream.error)
    # The hook returned promptly after the last frame. (Not "after the client's last read": a
    # loaded machine can run a reading thread later than the hook's exit, milliseconds apart.)
    assert drain_ended - max(s.finished for s in streams) < 1.0
    assert "draining 1 worker" in err and "drained 1 of 1 worker" in err
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(5) == 0
    assert time.monotonic() - sent < 5.0  # nothing left to drain: well inside the 6 s grace period
    assert glob.glob(os.path.join(server.socket_dir, "*.sock")) == []


def test_sigterm_only(launch: Callable[..., Launched]) -> None:
    """1. two 4 s streams 2. SIGTERM 3. the listener stays open answering 503 through the 3 s
    propagation wait (refuse mode): new connections are still accepted before the phase ends
    4. streams arrive whole 5. the process exits 0 right after the last frame."""
    server = launch("--propagation-wait", "3s", "--no-admit-during-propagation")
    server.wait_ready()
    streams = start_streams(server, 2, frames=40)
    server.process.send_signal(signal.SIGTERM)
    wait_status(server, 503)
    assert httpx.get(server.url("/hello"), timeout=2).status_code == 503
    assert httpx.get(server.url("/hello"), timeout=2).status_code == 503
    assert "propagation phase over" not in server.log  # both answered inside the wait
    server.wait_log("propagation phase over")
    assert server.wait_exit(10) == 0
    exited = time.monotonic()
    for stream in streams:
        stream.join(5)
        assert stream.whole, (stream.body, stream.error)
    assert exited - max(s.finished for s in streams) < 2.0  # interpreter exit included, on a busy CI box
    assert "SIGTERM received: draining" in server.log


def test_sigterm_admits_until_the_propagation_wait_ends_by_default(launch: Callable[..., Launched]) -> None:
    """1. a 4 s stream keeps the drain open 2. SIGTERM 3. /ready turns 503 at once 4. a new request is
    still served, with Connection: close 5. once the 1 s wait has passed, new requests get the
    not-started 503 6. the stream arrives whole and the process exits 0."""
    server = launch("--propagation-wait", "1s")
    server.wait_ready()
    (stream,) = start_streams(server, 1, frames=40)
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    wait_status(server, 503)
    served = httpx.get(server.url("/hello"), timeout=2)
    assert served.status_code == 200 and served.headers["connection"] == "close"
    refused = served
    deadline = time.monotonic() + 5
    while refused.status_code == 200 and time.monotonic() < deadline:
        refused = httpx.get(server.url("/hello"), timeout=2)
    refused_at = time.monotonic()
    assert refused.status_code == 503, server.log
    assert refused.headers["x-graceful-not-started"] == "1"
    assert refused_at - sent >= 1.0  # never before the wait has passed
    assert server.wait_exit(10) == 0
    stream.join(5)
    assert stream.whole, (stream.body, stream.error)


def test_deadline_exit_1_with_leftover(launch: Callable[..., Launched]) -> None:
    """1. a 10 s stream 2. `graceful drain --timeout 1s` 3. exit 1 naming what was left 4. SIGTERM exits 0."""
    server = launch()
    server.wait_ready()
    start_streams(server, 1, frames=100)
    drain = graceful("drain", "--timeout", "1s", socket_dir=server.socket_dir)
    out, err = drain.communicate(timeout=15)
    assert drain.returncode == 1, err
    pid = server.process.pid
    assert f"worker {pid}: timeout with 1 in flight; 1 ended at the deadline" in err
    assert "left: " in err and "/stream" in err
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(5) == 0


def test_workers_drained_by_one_command(launch: Callable[..., Launched]) -> None:
    """1. `--workers 2` 2. both sockets appear 3. one `graceful drain` drains both 4. SIGTERM exits 0."""
    server = launch("--workers", "2", "--propagation-wait", "0.2s")
    server.wait_ready(sockets=2)
    streams = start_streams(server, 4, frames=40)
    drain = graceful("drain", "--json", socket_dir=server.socket_dir)
    out, err = drain.communicate(timeout=20)
    assert drain.returncode == 0, err
    outcome = json.loads(out)
    assert outcome["result"] == "drained"
    assert len(outcome["workers"]) == 2
    assert {w["result"]["result"] for w in outcome["workers"]} == {"drained"}
    for stream in streams:
        stream.join(5)
        assert stream.whole, (stream.body, stream.error)
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(10) == 0
    assert glob.glob(os.path.join(server.socket_dir, "*.sock")) == []


def test_workers_sigterm_drains_every_worker(launch: Callable[..., Launched]) -> None:
    """1. `--workers 2` with streams 2. SIGTERM to the supervisor 3. streams whole 4. exit 0."""
    server = launch("--workers", "2")
    server.wait_ready(sockets=2)
    streams = start_streams(server, 4, frames=20)
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(15) == 0
    for stream in streams:
        stream.join(5)
        assert stream.whole, (stream.body, stream.error)
    assert "draining 2 worker(s)" in server.log


def test_second_signal_forces_exit(launch: Callable[..., Launched]) -> None:
    """1. a 10 s stream 2. SIGTERM starts the drain 3. SIGINT forces exit at once, logged, exit 1."""
    server = launch()
    server.wait_ready()
    (stream,) = start_streams(server, 1, frames=100)
    first = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    wait_status(server, 503)
    # A repeat within REPEAT_WINDOW is the same stop arriving twice; a later one forces.
    time.sleep(max(0.0, first + REPEAT_WINDOW + 0.1 - time.monotonic()))
    server.process.send_signal(signal.SIGINT)
    # Forced, not the drain's end: exit 1 and the line (the drain would end at its deadline with 0); how soon
    # after the signal is the machine's (4 s in a loaded CI run), bounded by wait_exit.
    assert server.wait_exit(5) == 1
    assert "forcing exit with 1 request(s) in flight" in server.log
    stream.join(5)
    assert not stream.whole


@pytest.mark.parametrize("workers", [1, 2])
def test_a_repeat_within_the_window_is_the_same_stop(workers: int, launch: Callable[..., Launched]) -> None:
    """As under the middleware's own SIGTERM drain (one policy, graceful/_asgi/_stop.py):
    1. streams in flight  2. SIGTERM  3. SIGTERM again 0.1 s later (systemd and a parent
    forwarding it both send one)  4. the streams end whole and the exit is 0."""
    server = launch("--workers", str(workers))
    server.wait_ready(sockets=workers)
    streams = start_streams(server, 2, frames=20)
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.1)  # the scenario: the same stop arriving again 0.1 s later
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(20) == 0, server.log
    for stream in streams:
        stream.join(5)
        assert stream.whole, (stream.body, stream.error)
    assert "SIGTERM again 0." in server.log and "the same stop" in server.log
    assert "second signal" not in server.log


def test_a_flag_that_contradicts_the_wrapped_app_is_refused() -> None:
    """The app set propagation_wait=0 in code; --propagation-wait 3s would be ignored: exit 2 at start, one
    line naming both (issue 51: never a warning followed by the code's value)."""
    result = graceful_cli("run", "tests.apps.streaming:wrapped", "--port", "0", "--propagation-wait", "3s")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "graceful run: --propagation-wait 3s contradicts propagation_wait=0 set in code for "
        "tests.apps.streaming:wrapped; drop the flag or the code's value"
    ]


def test_plain_uvicorn_gets_the_prestop_path(launch: Callable[..., Launched]) -> None:
    """Under `uvicorn app:app` the middleware's admin socket still serves `graceful drain`."""
    server = launch(app="tests.apps.streaming:wrapped", server="uvicorn")
    server.wait_ready()
    streams = start_streams(server, 2, frames=15)
    drain = graceful("drain", socket_dir=server.socket_dir)
    out, err = drain.communicate(timeout=15)
    assert drain.returncode == 0, err
    for stream in streams:
        stream.join(5)
        assert stream.whole
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(5) == -signal.SIGTERM  # plain uvicorn re-raises the signal after its shutdown
    assert glob.glob(os.path.join(server.socket_dir, "*.sock")) == []


def test_socket_dir_too_long_refused_before_start(socket_dir: str) -> None:
    long_dir = os.path.join(socket_dir, "x" * 100)
    result = subprocess.run(
        [sys.executable, "-m", "graceful", "run", "tests.apps.streaming:app", "--socket-dir", long_dir],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "over the 107-byte Unix socket limit" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.anyio
async def test_connections_open_at_drain_start_get_one_more_request(registry: CollectorRegistry) -> None:
    """1. a keep-alive connection is open 2. a drain starts (here through the Drain, as the admin
    socket would) 3. after the propagation wait a new connection gets 503 4. the pinned one is
    served once, with Connection: close."""
    mw = GracefulMiddleware(
        streaming_app,
        registry=registry,
        admin=False,
        grace_period=6,
        reserve=1,
        propagation_wait=0.2,
        admit_during_propagation=True,
    )

    def make(config: uvicorn.Config) -> GracefulServer:
        return GracefulServer(config, mw.drain)

    async with run_uvicorn(mw, server_class=make) as server:  # type: ignore[arg-type]
        base = f"http://127.0.0.1:{server.port}"
        async with httpx.AsyncClient(base_url=base) as pinned, httpx.AsyncClient(base_url=base) as fresh:
            assert (await pinned.get("/hello")).status_code == 200
            mw.drain.begin_drain("test")
            with anyio.fail_after(5):  # new connections are served until the propagation wait ends
                while (refused := await fresh.get("/hello", headers={"connection": "close"})).status_code == 200:
                    pass
            assert refused.status_code == 503
            again = await pinned.get("/hello")
            assert again.status_code == 200
            assert again.headers["connection"] == "close"
            assert (await pinned.get("/hello")).status_code == 503  # once only


@pytest.mark.anyio
async def test_exit_follows_the_drain_at_once(registry: CollectorRegistry) -> None:
    """The launcher wakes on an event, not on uvicorn's 0.1 s tick: 1. the server ticks (the date
    header) 2. a real SIGTERM with nothing in flight 3. the drain ends 4. the main loop acts on
    should_exit in the same tick, before its next timed wake-up (the tick counter has not moved)."""
    mw = GracefulMiddleware(streaming_app, registry=registry, admin=False, grace_period=6, reserve=1)
    sock = listening_socket()
    server = GracefulServer(uvicorn.Config(mw, host="127.0.0.1", port=0, log_level="warning"), mw.drain)
    ticks: list[tuple[int, bool]] = []  # (counter, should_exit) at each tick
    original = server.on_tick
    ticked = anyio.Event()

    async def recording_tick(counter: int) -> bool:
        should_exit = await original(counter)
        ticks.append((counter, should_exit))
        if counter >= 1:
            ticked.set()
        return should_exit

    server.on_tick = recording_tick  # type: ignore[method-assign]
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            await ticked.wait()  # a timed tick has happened: the loop is in its steady state
            signalled_at = ticks[-1][0]
            os.kill(os.getpid(), signal.SIGTERM)  # the handler capture_signals installed takes it
    sock.close()
    exit_tick = next(counter for counter, should_exit in ticks if should_exit)
    assert exit_tick == signalled_at, ticks
    assert [should_exit for _, should_exit in ticks].count(True) == 1
    assert mw.drain.state.value == "STOPPED" or mw.drain.state.value == "DRAINING"
    assert server.signals_received == 1 and server.forced_exits == 0


# `graceful run`: the multi-worker supervisor's signals, a signal during startup,


def graceful_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graceful", *args], cwd=ROOT, capture_output=True, text=True, timeout=30
    )


def test_workers_status_resume_then_sigint_drains_all(launch: Callable[..., Launched]) -> None:
    """1. `--workers 2` 2. `status` lists both 3. one is drained through its own socket
    4. `resume` undrains it and leaves the other alone 5. SIGINT to the supervisor drains
    both and exits 0."""
    server = launch("--workers", "2")
    server.wait_ready(sockets=2)
    rows = json.loads(graceful_cli("status", "--json", "--socket-dir", server.socket_dir).stdout)
    assert len(rows) == 2 and {row["state"] for row in rows} == {"SERVING"}
    first, second = rows
    assert first["pid"] != second["pid"]
    drained = graceful_cli("drain", "--socket", first["socket"], "--quiet")
    assert drained.returncode == 0, drained.stderr
    resumed = graceful_cli("resume", "--socket-dir", server.socket_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(resumed.stdout.splitlines()) == sorted(
        [f"worker {first['pid']}: SERVING (resumed)", f"worker {second['pid']}: SERVING"]
    )
    streams = start_streams(server, 2, frames=10)
    server.process.send_signal(signal.SIGINT)
    assert server.wait_exit(15) == 0
    for stream in streams:
        stream.join(5)
        assert stream.whole, (stream.body, stream.error)
    assert "SIGINT received: draining 2 worker(s)" in server.log
    assert glob.glob(os.path.join(server.socket_dir, "*.sock")) == []


def test_workers_second_signal_kills_them_and_exits_1(launch: Callable[..., Launched]) -> None:
    """1. `--workers 2`, a 10 s stream 2. SIGTERM starts the drain 3. SIGTERM again kills the
    workers at once 4. exit 1, logged, the stream is cut."""
    server = launch("--workers", "2")
    server.wait_ready(sockets=2)
    (stream,) = start_streams(server, 1, frames=100)
    first = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    server.wait_log("SIGTERM received: draining 2 worker(s)")
    time.sleep(max(0.0, first + REPEAT_WINDOW + 0.1 - time.monotonic()))
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(10) == 1
    assert time.monotonic() - sent < 5
    assert "second signal (SIGTERM): killing 2 worker(s) now" in server.log
    stream.join(5)
    assert not stream.whole


def test_workers_without_admin_sockets_still_stop(launch: Callable[..., Launched]) -> None:
    """The app is wrapped with admin=False: the supervisor finds no worker to drain, says so,
    and still stops them (uvicorn's own SIGTERM to each)."""
    server = launch("--workers", "2", app="tests.apps.workers:no_admin")
    server.wait_ready(sockets=0)
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(15) == 0
    assert "no graceful server found: nothing is listening on" in server.log
    assert glob.glob(os.path.join(server.socket_dir, "*.sock")) == []


def test_sigterm_during_startup_exits_without_draining(launch: Callable[..., Launched], tmp_path: Path) -> None:
    """1. the app's startup lasts until the test lets it end 2. SIGTERM arrives while the drain is
    STARTING 3. no drain runs: the process exits 0 once startup returns."""
    release = tmp_path / "release"
    server = launch(app="tests.apps.workers:slow_start", SLOW_START_RELEASE=str(release))
    server.wait_log("slow startup begins")
    server.process.send_signal(signal.SIGTERM)
    server.wait_log("SIGTERM received while STARTING: exiting")
    release.touch()
    assert server.wait_exit(10) == 0
    assert "SIGTERM received while STARTING: exiting" in server.log
    assert "draining" not in server.log


def test_uds_serves_and_drains_on_sigterm(socket_dir: str, tmp_path: Path) -> None:
    """`--uds PATH`: traffic over a Unix socket, the admin socket beside it, SIGTERM exits 0."""
    uds = os.path.join(socket_dir, "app.uds")
    admin_dir = os.path.join(socket_dir, "admin")
    log = tmp_path / "uds.log"
    command = [sys.executable, "-m", "graceful", "run", "tests.apps.streaming:app", "--uds", uds]
    command += ["--socket-dir", admin_dir, "--grace-period", "6", "--reserve", "1"]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        # Poll with a plain probe: httpcore leaks the socket of a failed Unix connect.
        while "Application startup complete" not in log.read_text() or not is_listening(uds):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        with httpx.Client(transport=httpx.HTTPTransport(uds=uds), base_url="http://app", timeout=2) as client:
            assert client.get("/ready").status_code == 200
            assert client.get("/hello").text == "hello"
        assert glob.glob(os.path.join(admin_dir, "*.sock")) == [os.path.join(admin_dir, f"{process.pid}.sock")]
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
    assert "SIGTERM received: draining" in log.read_text()


@pytest.mark.parametrize(
    ("app", "named"),
    [("tests.apps.streaming", "tests.apps.streaming"), ("tests.no_such_module:app", "tests.no_such_module")],
)
def test_bad_app_exits_2_naming_it(app: str, named: str) -> None:
    result = graceful_cli("run", app, "--port", "0")
    assert result.returncode == 2, result.stderr
    assert f"cannot load app {app!r}" in result.stderr and named in result.stderr
    assert "Traceback" not in result.stderr


def test_app_that_is_not_callable_exits_2(socket_dir: str) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "graceful", "run", "tests.apps.streaming:not_an_app", "--port", "0"],
        cwd=ROOT,
        env={**os.environ, "GRACEFUL_SOCKET_DIR": socket_dir},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = process.communicate(timeout=3)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
    assert process.returncode == 2, err
    assert "tests.apps.streaming:not_an_app" in err


def test_flags_fill_what_the_wrapped_app_left_unset(launch: Callable[..., Launched]) -> None:
    """The app set grace_period=6, reserve=1 and propagation_wait=0 in code: --grace-period 6 and --reserve 1
    (the fixture's) agree with it, and --drain-timeout and --no-admit-during-propagation, which its code
    leaves unset, are in force (graceful status), not ignored."""
    server = launch("--drain-timeout", "3s", "--no-admit-during-propagation", app="tests.apps.streaming:wrapped")
    server.wait_ready()
    (row,) = json.loads(graceful_cli("status", "--json", "--socket-dir", server.socket_dir).stdout)
    budget = row["budget"]
    assert (budget["grace_period"], budget["reserve"], budget["propagation_wait"]) == (6.0, 1.0, 0.0)
    assert (budget["drain_timeout"], budget["admit_during_propagation"]) == (3.0, False)
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(5) == 0
    assert "ignoring" not in server.log and "contradicts" not in server.log


def test_graceful_server_runs_off_the_main_thread(registry: CollectorRegistry) -> None:
    """Embedded in a thread, signal handlers cannot be installed: it must run anyway and
    leave the main thread's handlers alone."""
    before = signal.getsignal(signal.SIGTERM)
    mw = GracefulMiddleware(streaming_app, registry=registry, admin=False, grace_period=6, reserve=1)
    sock = listening_socket()
    port = sock.getsockname()[1]
    server = GracefulServer(uvicorn.Config(mw, host="127.0.0.1", port=0, log_level="warning"), mw.drain)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        assert httpx.get(f"http://127.0.0.1:{port}/hello", timeout=5).text == "hello"
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    assert not thread.is_alive()
    assert mw.drain.state is State.STOPPED


@pytest.mark.anyio
async def test_exit_requested_before_the_loop_runs(registry: CollectorRegistry) -> None:
    """handle_exit before serve() (no loop to hand over to yet) just asks uvicorn to exit:
    the server starts, stops at once, and no drain runs."""
    mw = GracefulMiddleware(streaming_app, registry=registry, admin=False, grace_period=6, reserve=1)
    server = GracefulServer(uvicorn.Config(mw, host="127.0.0.1", port=0, log_level="warning"), mw.drain)
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit
    with anyio.fail_after(5):
        await server.serve()
    assert server.signals_received == 0
    assert mw.drain.counters()["drains"] == {}


def test_the_repeat_window_counts_from_each_signals_arrival(socket_dir: str) -> None:
    """uvicorn's supervisor handles its queued signals every 0.5 s, the repeat window's length: a
    duplicate that arrives 0.1 s after the first but straddles a check is still the same stop."""
    from graceful._asgi._stop import FIRST, FORCE, REPEAT, StopSignals
    from graceful._serve._launcher import _Supervisor

    stops = StopSignals()
    assert stops.received(signal.SIGTERM, at=100.0) is FIRST
    assert stops.received(signal.SIGTERM, at=100.1) is REPEAT  # however late it is handled
    assert stops.received(signal.SIGTERM, at=100.6) is FORCE

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        supervisor = _Supervisor(uvicorn.Config("tests.apps.streaming:app"), [], socket_dir)
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        handler(signal.SIGTERM, None)  # the first arrives, and is handled at a check
        supervisor.handle_signals()
        handler(signal.SIGTERM, None)  # the duplicate arrives just after that check
        assert supervisor.signal_queue == [signal.SIGTERM]
        time.sleep(REPEAT_WINDOW + 0.1)  # the scenario: it is handled a check later
        supervisor.handle_signals()
        assert supervisor.forced_exits == 0  # the same stop: no worker killed
        assert supervisor.should_exit.wait(5)  # the first one's drain (no workers here) ended
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)
