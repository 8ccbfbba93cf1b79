"""SIGTERM and SIGINT drain under any server (docs/outside-kubernetes.md, "The sequence"), in this process.

Each test plays the server's part the way one of the documented servers installs its handlers
(uvicorn's ``signal.signal``; hypercorn's and granian's ``loop.add_signal_handler``; uvloop's, under
vLLM, read through the wakeup fd), runs the wrapped app's lifespan on the main thread, as servers
do, and raises the signal in this process. The ``signals`` fixture puts back every handler and the
wakeup fd as they were, whatever the test did.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import sniffio
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry

from graceful import GracefulMiddleware, State, default_final_frame
from graceful._asgi import _stop
from graceful._asgi._types import Message, Receive, Scope, Send

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

STOPS = (signal.SIGTERM, signal.SIGINT)
HELD = (*STOPS, signal.SIGUSR1)
PEER = ("127.0.0.1", 50000)
SSE = b"text/event-stream"


@pytest.fixture
def signals() -> Iterator[None]:
    """The process's handlers and wakeup fd, put back after the test: they belong to the test runner."""
    saved = {sig: signal.getsignal(sig) for sig in HELD}
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    try:
        yield
    finally:
        signal.set_wakeup_fd(wakeup)
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def threadsafe(callback: Callable[[], object]) -> Callable[[], None]:
    """``callback`` run by the event loop of this test, from a signal handler."""
    if sniffio.current_async_library() == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()
        return lambda: token.run_sync_soon(callback)
    loop = asyncio.get_running_loop()
    return lambda: loop.call_soon_threadsafe(callback)


class Server:
    """Stands in for a server's signal handling: it records each signal it hears."""

    def __init__(self) -> None:
        self.heard: list[int] = []
        self.should_exit = False  # uvicorn's flag, which sse-starlette reads through the handler
        self.changed = anyio.Event()
        self._notify = threadsafe(self._changed)

    def _changed(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    def handle_exit(self, sig: int, frame: Any) -> None:  # uvicorn's signal.signal handler
        self.heard.append(sig)
        self.should_exit = True
        self._notify()

    def on_signal(self, sig: int) -> None:  # a loop.add_signal_handler callback
        self.heard.append(sig)
        self._notify()

    async def hears(self, *expected: int) -> None:
        with anyio.fail_after(10):
            while len(self.heard) < len(expected):
                await self.changed.wait()
        assert self.heard == list(expected)


class HiddenSignalsLoop(asyncio.SelectorEventLoop):
    """An event loop that takes signals as uvloop does (vLLM's API server runs on uvloop): the callbacks
    kept where Python cannot read them, a method of the loop installed as the signal's handler, and the
    signal's number read from the interpreter's wakeup fd, which the loop owns."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden: dict[int, Callable[[int], None]] = {}
        self.pair: tuple[socket.socket, socket.socket] | None = None

    def add_signal_handler(self, sig: int, callback: Callable[..., object], *args: Any) -> None:
        if self.pair is None:
            ours, theirs = self.pair = socket.socketpair()
            ours.setblocking(False)
            theirs.setblocking(False)
            self.add_reader(ours.fileno(), self._read)
            signal.set_wakeup_fd(theirs.fileno(), warn_on_full_buffer=False)
        self.hidden[sig] = callback
        signal.signal(sig, self._wake)

    def _wake(self, sig: int, frame: Any) -> None:
        """The handler: nothing to do, the number reaches the wakeup fd."""

    def _read(self) -> None:
        assert self.pair is not None
        for number in self.pair[0].recv(512):
            if number in self.hidden:
                self.hidden[number](number)

    def close(self) -> None:
        if self.pair is not None:
            self.remove_reader(self.pair[0].fileno())
            for end in self.pair:
                end.close()
        super().close()


class DeafLoop(HiddenSignalsLoop):
    """As HiddenSignalsLoop, but with no wakeup fd: the loop is not listening for the signals."""

    def add_signal_handler(self, sig: int, callback: Callable[..., object], *args: Any) -> None:
        self.hidden[sig] = callback
        signal.signal(sig, self._wake)


class Stream:
    """An app that streams server-sent events until released: one frame, then the rest once released."""

    def __init__(self) -> None:
        self.release = anyio.Event()
        self.streaming = anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", SSE)]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        self.streaming.set()
        await self.release.wait()
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def scope_of(path: str, client: tuple[str, int] = PEER) -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [],
        "client": client,
        "server": ("127.0.0.1", 8000),
    }


async def request(app: Any, path: str, sent: list[Message], client: tuple[str, int] = PEER) -> None:
    """One request from a client that stays connected; what the server was sent goes to ``sent``."""
    asked = False
    gone = anyio.Event()

    async def receive() -> Message:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope_of(path, client), receive, send)


async def status_of(app: Any, path: str) -> int:
    sent: list[Message] = []
    await request(app, path, sent)
    return int(sent[0]["status"])


def body_of(sent: list[Message]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def wrap(app: Any, **options: Any) -> GracefulMiddleware:
    options = {"grace_period": 30, "reserve": 5, "propagation_wait": 0, **options}
    return GracefulMiddleware(app, registry=CollectorRegistry(), admin=False, **options)


async def draining(mw: GracefulMiddleware) -> None:
    """Wait (bounded) until the drain has begun: readiness fails from that instant."""
    began = anyio.Event()
    mw.drain.add_listener(lambda: began.set() if mw.drain.state is not State.SERVING else None)
    with anyio.fail_after(10):
        while mw.drain.state is State.SERVING:
            await began.wait()


@asynccontextmanager
async def streaming(mw: GracefulMiddleware, app: Stream, sent: list[Message]) -> AsyncIterator[anyio.abc.TaskGroup]:
    """The lifespan running (on the main thread, as a server runs it) with one stream in flight."""
    async with LifespanManager(mw), anyio.create_task_group() as tg:
        tg.start_soon(request, mw, "/v1/stream", sent)
        with anyio.fail_after(10):
            await app.streaming.wait()
        yield tg


def with_uvicorns_handlers(server: Server) -> None:
    for sig in STOPS:
        signal.signal(sig, server.handle_exit)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("sig", STOPS, ids=lambda sig: signal.Signals(sig).name)
async def test_the_first_signal_drains_then_reaches_the_servers_handler(
    sig: int, signals: None, caplog: pytest.LogCaptureFixture
) -> None:
    """1. the server installs its handlers with signal.signal (uvicorn) 2. lifespan startup 3. a stream in
    flight 4. the signal: readiness fails at once and the server hears nothing yet 5. the stream ends
    whole 6. the server's own handler, back in place, gets the signal once."""
    caplog.set_level(logging.INFO, logger="graceful")
    server = Server()
    with_uvicorns_handlers(server)
    app = Stream()
    mw = wrap(app)
    sent: list[Message] = []
    async with streaming(mw, app, sent):
        installed = signal.getsignal(sig)
        assert installed != server.handle_exit  # taken over for the lifespan
        # Code that finds the server through the installed handler still reads (and writes) the server's.
        owner: Any = getattr(installed, "__self__", None)
        assert owner.should_exit is False
        owner.should_exit = False
        signal.raise_signal(sig)
        await draining(mw)
        assert await status_of(mw, "/ready") == 503
        assert server.heard == []
        app.release.set()
        await server.hears(sig)
        assert owner.should_exit is True  # the server's own flag, seen through graceful's handler
    assert signal.getsignal(sig) == server.handle_exit
    assert body_of(sent) == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    result = mw.drain.last_result
    assert result is not None and result.result == "drained" and result.reason == signal.Signals(sig).name
    name = signal.Signals(sig).name
    assert f"{name} received: draining" in caplog.text
    assert f"handing {name} on to the server" in caplog.text


async def test_the_same_stop_twice_is_one_stop(signals: None, caplog: pytest.LogCaptureFixture) -> None:
    """1. SIGTERM 2. SIGTERM again at once (the process group signalled, and the signal forwarded)
    3. the stream ends whole 4. the server hears SIGTERM once."""
    caplog.set_level(logging.INFO, logger="graceful")
    server = Server()
    with_uvicorns_handlers(server)
    app = Stream()
    mw = wrap(app)
    sent: list[Message] = []
    async with streaming(mw, app, sent):
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        await draining(mw)
        app.release.set()
        await server.hears(signal.SIGTERM)
    assert body_of(sent).endswith(b"data: [DONE]\n\n")
    assert "SIGTERM again" in caplog.text and "the same stop" in caplog.text


async def test_a_second_signal_hands_on_at_once_and_ends_the_work_with_the_final_frame(
    signals: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """1. SIGTERM: the drain begins 2. a second SIGTERM, past the repeat window (made 0 here, so that
    no test waits it out) 3. the server hears both at once, with the stream still in flight 4. the
    stream ends with the retryable final frame, counted as a forced exit."""
    monkeypatch.setattr(_stop, "REPEAT_WINDOW", 0.0)
    server = Server()
    with_uvicorns_handlers(server)
    app = Stream()
    mw = wrap(app)
    sent: list[Message] = []
    async with streaming(mw, app, sent):
        signal.raise_signal(signal.SIGTERM)
        await draining(mw)
        signal.raise_signal(signal.SIGTERM)
        await server.hears(signal.SIGTERM, signal.SIGTERM)
    assert not app.release.is_set()
    assert body_of(sent) == b"data: 1\n\n" + default_final_frame(SSE)  # type: ignore[operator]
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert mw.drain.counters()["truncated"] == {"forced_exit": 1}
    assert "second signal (SIGTERM): handing it on now with 1 request(s) in flight" in caplog.text
    assert "forced exit: ending 1 request(s) in flight" in caplog.text


async def test_a_signal_before_the_server_is_ready_is_handed_on_at_once(
    signals: None, caplog: pytest.LogCaptureFixture
) -> None:
    """1. ready_on_startup=False: after startup the server is still STARTING (weights loading) 2. SIGTERM
    3. nothing to drain: the server hears it at once, and no drain ran."""
    caplog.set_level(logging.INFO, logger="graceful")
    server = Server()
    with_uvicorns_handlers(server)
    mw = wrap(Stream(), ready_on_startup=False)
    async with LifespanManager(mw):
        signal.raise_signal(signal.SIGTERM)
        await server.hears(signal.SIGTERM)
        assert mw.drain.state is State.STARTING
    assert mw.drain.last_result is None
    assert "SIGTERM received while STARTING: handing it on" in caplog.text


async def test_the_loops_signal_handler_is_taken_and_given_back(signals: None) -> None:
    """hypercorn's and granian's asyncio workers: 1. the server registers loop.add_signal_handler callbacks
    2. lifespan startup 3. SIGTERM with a stream in flight: the drain begins, the server hears nothing
    4. the stream ends 5. the server's callback gets SIGTERM once."""
    server = Server()
    loop = asyncio.get_running_loop()
    for sig in STOPS:
        loop.add_signal_handler(sig, server.on_signal, sig)
    try:
        app = Stream()
        mw = wrap(app)
        sent: list[Message] = []
        async with streaming(mw, app, sent):
            signal.raise_signal(signal.SIGTERM)
            await draining(mw)
            assert server.heard == []
            app.release.set()
            await server.hears(signal.SIGTERM)
        assert body_of(sent).endswith(b"data: [DONE]\n\n")
    finally:
        for sig in STOPS:
            loop.remove_signal_handler(sig)


@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {"loop_factory": HiddenSignalsLoop}), id="hidden")])
async def test_a_loop_that_reads_the_wakeup_fd_is_served_through_it(signals: None) -> None:
    """vLLM's API server (uvloop): 1. the loop keeps its callbacks hidden and reads the wakeup fd 2.
    lifespan startup 3. SIGUSR1, not a stop, still reaches the loop's callback 4. SIGTERM: the drain
    begins 5. the stream ends 6. the server's callback gets SIGTERM once, through the loop's own fd."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, HiddenSignalsLoop)
    server = Server()
    for sig in HELD:
        loop.add_signal_handler(sig, server.on_signal)
    theirs = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(theirs)
    app = Stream()
    mw = wrap(app)
    sent: list[Message] = []
    async with streaming(mw, app, sent):
        signal.raise_signal(signal.SIGUSR1)
        await server.hears(signal.SIGUSR1)
        signal.raise_signal(signal.SIGTERM)
        await draining(mw)
        assert server.heard == [signal.SIGUSR1]
        app.release.set()
        await server.hears(signal.SIGUSR1, signal.SIGTERM)
    assert body_of(sent).endswith(b"data: [DONE]\n\n")
    assert signal.set_wakeup_fd(theirs) == theirs  # the loop's fd is back


@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {"loop_factory": DeafLoop}), id="deaf")])
async def test_a_signal_that_cannot_be_taken_over_stays_with_the_server_and_says_so(
    signals: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop that installs its handler but reads no wakeup fd: graceful cannot see the signals it would
    dispatch. Each stays with the server, and one warning per signal names the fix (the preStop hook)."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, DeafLoop)
    server = Server()
    for sig in STOPS:
        loop.add_signal_handler(sig, server.on_signal)
    before = {sig: signal.getsignal(sig) for sig in STOPS}
    async with LifespanManager(wrap(Stream())):
        assert {sig: signal.getsignal(sig) for sig in STOPS} == before
    for sig in STOPS:
        assert f"{signal.Signals(sig).name} stays with the server" in caplog.text
    assert "drain from a preStop hook (graceful drain)" in caplog.text


async def test_ignored_signals_stay_ignored(signals: None) -> None:
    """A process that ignores SIGTERM and SIGINT keeps ignoring them: there is nothing to hand on to."""
    for sig in STOPS:
        signal.signal(sig, signal.SIG_IGN)
    mw = wrap(Stream())
    async with LifespanManager(mw):
        assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in STOPS)
        assert await status_of(mw, "/ready") == 200
    assert all(signal.getsignal(sig) is signal.SIG_IGN for sig in STOPS)


async def test_a_handler_installed_by_someone_else_meanwhile_is_kept(signals: None) -> None:
    """Handlers are given back only if they are still graceful's (docs/middleware.md, "Process-wide state"):
    1. the server's handlers 2. lifespan startup 3. other code installs its own SIGTERM handler 4. shutdown
    5. that handler stays, and SIGINT's goes back to the server's."""
    server = Server()
    with_uvicorns_handlers(server)
    other = Server()
    async with LifespanManager(wrap(Stream())):
        signal.signal(signal.SIGTERM, other.handle_exit)
    assert signal.getsignal(signal.SIGTERM) == other.handle_exit
    assert signal.getsignal(signal.SIGINT) == server.handle_exit


async def test_a_loop_callback_registered_by_someone_else_meanwhile_is_kept(signals: None) -> None:
    """As above, for a loop's add_signal_handler callback: the one registered during the lifespan stays."""
    server, other = Server(), Server()
    loop = asyncio.get_running_loop()
    for sig in STOPS:
        loop.add_signal_handler(sig, server.on_signal, sig)
    try:
        async with LifespanManager(wrap(Stream())):
            loop.add_signal_handler(signal.SIGTERM, other.on_signal, signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        await other.hears(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
        await server.hears(signal.SIGINT)
    finally:
        for sig in STOPS:
            loop.remove_signal_handler(sig)


@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {"loop_factory": HiddenSignalsLoop}), id="hidden")])
async def test_a_wakeup_fd_taken_by_someone_else_meanwhile_is_kept(signals: None) -> None:
    """As above, for the wakeup fd: one set by other code during the lifespan stays set."""
    loop = asyncio.get_running_loop()
    server = Server()
    for sig in STOPS:
        loop.add_signal_handler(sig, server.on_signal)
    reader, writer = socket.socketpair()
    with reader, writer:
        writer.setblocking(False)
        async with LifespanManager(wrap(Stream())):
            signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        assert signal.set_wakeup_fd(-1) == writer.fileno()


async def test_the_installed_handler_reads_through_to_a_functions_nothing(signals: None) -> None:
    """The handler graceful installs reads through to the server's own handler's owner (docs/middleware.md,
    "Process-wide state"); where that handler is a plain function, an attribute is missing, as it would
    be without graceful, and none can be set on it. Dunder names are never read through."""

    def plain(sig: int, frame: Any) -> None:
        raise AssertionError("no signal is sent in this test")

    server = Server()
    server.__marker__ = 1  # type: ignore[attr-defined]
    signal.signal(signal.SIGTERM, plain)
    signal.signal(signal.SIGINT, server.handle_exit)
    async with LifespanManager(wrap(Stream())):
        of_function: Any = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
        of_method: Any = getattr(signal.getsignal(signal.SIGINT), "__self__", None)
        assert not hasattr(of_function, "should_exit")
        with pytest.raises(AttributeError, match="cannot set 'should_exit'"):
            of_function.should_exit = True
        assert of_method.should_exit is False
        assert not hasattr(of_method, "__marker__")
    assert signal.getsignal(signal.SIGTERM) is plain


@pytest.mark.parametrize("server_module", ["hypercorn", None])
async def test_a_worker_stopped_through_its_parent_says_that_sigterm_cannot_drain_it(
    server_module: str | None, signals: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """hypercorn --workers N (docs/outside-kubernetes.md, "Per server"): the worker is a multiprocessing
    child with SIGINT ignored, and its parent takes SIGTERM; each worker's lifespan says once that SIGTERM
    cannot drain it, and names the fix. (This process plays the child: multiprocessing says it has a parent.)"""
    import hypercorn  # noqa: F401  (loaded, as in hypercorn's workers)

    if server_module is None:
        monkeypatch.delitem(sys.modules, "hypercorn")
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    async with LifespanManager(wrap(Stream())):
        pass
    fix = "hypercorn with --workers 0" if server_module else "the server in one process"
    assert "SIGTERM cannot drain this worker" in caplog.text
    assert f"run {fix}, or drain from the preStop hook (graceful drain)" in caplog.text


async def test_a_child_process_with_its_own_sigint_handler_drains_on_sigterm(
    signals: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker process whose server handles signals itself (gunicorn's uvicorn workers install SIGINT's
    handler too) is not taken for one stopped through its parent: no warning."""
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    with_uvicorns_handlers(Server())
    async with LifespanManager(wrap(Stream())):
        pass
    assert "cannot drain this worker" not in caplog.text


async def test_a_request_on_a_pinned_connection_sent_as_sigterm_comes_is_served_before_the_server_hears_it(
    signals: None,
) -> None:
    """docs/middleware.md, "Pinned connections": 1. a stream in flight on a connection 2. the preStop
    hook's drain 3. the stream ends: drained 4. SIGTERM, and at once the client's next request on that
    connection 5. it is served, and the server hears SIGTERM only once it has ended."""
    server = Server()
    with_uvicorns_handlers(server)
    first = Stream()
    mw = wrap(first)
    sent: list[Message] = []
    async with streaming(mw, first, sent) as tg:
        tg.start_soon(mw.drain.drain)
        await draining(mw)
        first.release.set()
        with anyio.fail_after(10):
            while mw.drain.last_result is None:
                await draining_ended(mw)
        assert mw.drain.last_result.drained
        first.release, first.streaming = anyio.Event(), anyio.Event()
        again: list[Message] = []
        signal.raise_signal(signal.SIGTERM)
        tg.start_soon(request, mw, "/v1/stream", again)
        with anyio.fail_after(10):
            await first.streaming.wait()
        assert server.heard == []
        first.release.set()
        await server.hears(signal.SIGTERM)
        assert again[0]["status"] == 200
        assert body_of(again).endswith(b"data: [DONE]\n\n")


async def draining_ended(mw: GracefulMiddleware) -> None:
    ended = anyio.Event()
    mw.drain.add_listener(ended.set)
    if mw.drain.last_result is None:
        await ended.wait()
