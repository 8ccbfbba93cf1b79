"""SIGTERM drains under any server: take the signal from the server, drain, then hand it on.

Servers install their SIGTERM/SIGINT handlers before lifespan startup, on the main
thread, in one of two ways:

- ``signal.signal``: uvicorn (``capture_signals``, also under gunicorn's ``UvicornWorker``);
  hypercorn's trio worker leaves SIGTERM at the default;
- ``loop.add_signal_handler`` on the asyncio loop: hypercorn's asyncio worker and granian's
  workers;
- ``loop.add_signal_handler`` on uvloop, which keeps the callbacks where Python cannot read
  them and dispatches from the interpreter's wakeup fd: vLLM's API server
  (``vllm/entrypoints/launchers/launcher.py``, ``serve_http``), granian with ``--loop uvloop``.

:class:`SignalDrain` puts itself in front of whichever it finds. The first signal starts
the drain; once it has ended, the server's own handler gets the signal as if it had just
arrived. A second signal hands on at once and ends the work still in flight with its final
frame; one within ``REPEAT_WINDOW`` of the first is the same stop (``_stop``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import threading
import time
import types
from collections.abc import Callable
from types import FrameType
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from .._drain._state import Drain, core
from .._drain._status import State
from ._stop import FIRST, FORCE, HANDLED_SIGNALS, REPEAT_WINDOW, StopSignals

__all__ = ["HANDLED_SIGNALS", "REPEAT_WINDOW", "SignalDrain"]

logger = logging.getLogger("graceful")


class SignalDrain:
    """Drain on SIGTERM/SIGINT before the server hears of it; run as a lifespan task."""

    def __init__(self, drain: Drain) -> None:
        self.drain = drain
        self.received: list[int] = []  # signals taken from the server and not yet handed on
        self._restore: list[Callable[[], None]] = []
        self._call_soon: Callable[..., object] | None = None
        self._signalled = anyio.Event()
        self._forced = anyio.Event()
        self._stops = StopSignals()
        self._handed_on = False
        self._wakeup_held = False
        self._held_numbers: set[int] = set()  # the signals taken through signal.signal
        self._restore_last: list[Callable[[], None]] = []

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if threading.current_thread() is not threading.main_thread():
            # Signals reach only the main thread: a server running us elsewhere keeps its own.
            logger.debug("lifespan runs outside the main thread: SIGTERM stays with the server")
            task_status.started()
            return
        self._call_soon = _signal_safe_call_soon()
        stopped_by_parent = _stopped_by_parent()
        if stopped_by_parent:
            logger.warning(
                "SIGTERM cannot drain this worker: %s stops it through its parent process, which takes the "
                "signal; run %s, or drain from the preStop hook (graceful drain)",
                *stopped_by_parent,
            )
        try:
            for sig in HANDLED_SIGNALS:
                self._take(sig)
            task_status.started()
            if not self._restore:
                return
            await self._signalled.wait()
            await self._drain_then_hand_on()
        finally:
            self._give_back()

    def _take(self, sig: int) -> None:
        loop_handlers = _asyncio_signal_handlers()
        if loop_handlers is not None and sig in loop_handlers:
            loop = asyncio.get_running_loop()
            saved = loop_handlers[sig]
            loop.add_signal_handler(sig, self._on_signal, sig)
            ours = loop_handlers[sig]

            def restore_loop_handler() -> None:
                if loop_handlers.get(sig) is ours:
                    loop_handlers[sig] = saved

            self._restore.append(restore_loop_handler)
            return
        previous = signal.getsignal(sig)
        if previous is signal.SIG_IGN or previous is None:  # ignored, or installed outside Python
            return
        if _owned_by_loop(previous) and not self._hold_wakeups():
            logger.warning(
                "%s stays with the server: its event loop (%s) dispatches signals through a wakeup file "
                "descriptor that graceful could not take over; drain from a preStop hook (graceful drain)",
                signal.Signals(sig).name,
                type(getattr(previous, "__self__", None)).__module__,
            )
            return
        handler = _SeeThrough(self._on_os_signal, previous).handle
        signal.signal(sig, handler)
        self._held_numbers.add(sig)

        def restore_handler() -> None:
            if signal.getsignal(sig) == handler:
                signal.signal(sig, previous)

        self._restore.append(restore_handler)

    def _hold_wakeups(self) -> bool:
        """Put ourselves between the signals and a loop that dispatches them from its wakeup fd.

        uvloop (which vLLM runs on) keeps ``add_signal_handler`` callbacks in a table Python
        cannot read. What it reads is the wakeup fd (``signal.set_wakeup_fd``): the
        interpreter writes each caught signal's number there, and the loop calls the callback
        registered for it (``uvloop/loop.pyx``, ``_read_from_self``). So the wakeup fd becomes
        ours: the numbers of the signals we take stay with us, every other number goes on to
        the loop's fd as it came, and giving back restores the loop's fd, after which a
        signal raised again reaches the server's callback. Done once, for every signal taken.
        """
        if self._wakeup_held:
            return True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # trio runs us: no asyncio loop to read our end
            return False
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        theirs.setblocking(False)
        try:
            loop_fd = signal.set_wakeup_fd(theirs.fileno(), warn_on_full_buffer=False)
        except ValueError:  # pragma: no cover - we run on the main thread, checked in run()
            ours.close()
            theirs.close()
            return False
        if loop_fd == -1:  # nothing reads the wakeup fd: the loop is not listening for signals
            signal.set_wakeup_fd(-1)
            ours.close()
            theirs.close()
            return False

        def forward() -> None:
            try:
                numbers = ours.recv(512)
            except OSError:
                return
            passed = bytes(number for number in numbers if number not in self._held_numbers)
            if passed:
                try:
                    os.write(loop_fd, passed)
                except OSError:  # the loop's pipe is full: it has wakeups pending already
                    pass

        loop.add_reader(ours.fileno(), forward)

        def restore_wakeup_fd() -> None:
            loop.remove_reader(ours.fileno())
            current = signal.set_wakeup_fd(loop_fd, warn_on_full_buffer=False)
            if current != theirs.fileno():  # someone else took it after us: theirs stays
                signal.set_wakeup_fd(current, warn_on_full_buffer=False)
            ours.close()
            theirs.close()

        self._wakeup_held = True
        # Restored last (restores run in order): the signals' handlers go back first.
        self._restore_last.append(restore_wakeup_fd)
        return True

    def _on_os_signal(self, sig: int, frame: FrameType | None) -> None:
        # Runs between two bytecodes of whatever the main thread was doing: only hand over, with
        # the time it arrived (the repeat window is judged by it).
        assert self._call_soon is not None
        self._call_soon(self._on_signal, sig, time.monotonic())

    def _on_signal(self, sig: int, at: float | None = None) -> None:
        if self._handed_on:  # caught just before the server got its handlers back: pass it on
            signal.raise_signal(sig)
            return
        meaning = self._stops.received(sig, at)
        if meaning is FIRST:
            self.received.append(sig)
            self._signalled.set()
            return
        if meaning is not FORCE:
            return
        self.received.append(sig)
        logger.warning(
            "second signal (%s): handing it on now with %d request(s) in flight",
            signal.Signals(sig).name,
            self.drain.in_flight,
        )
        self._forced.set()

    async def _drain_then_hand_on(self) -> None:
        drain = self.drain
        name = signal.Signals(self.received[0]).name
        if drain.state in (State.STARTING, State.STOPPED):
            logger.info("%s received while %s: handing it on", name, drain.state.value)
            self._hand_on()
            return
        logger.info("%s received: draining (state %s, %d in flight)", name, drain.state.value, drain.in_flight)
        over = anyio.Event()

        async def drain_until_over() -> None:
            # Joins a drain already under way (preStop): same clock, same deadline.
            try:
                result = await drain.drain(reason=name)
                # A client whose stream has just ended may have sent its next request on the same
                # kept-alive connection already. The server has not read it yet where its loop is
                # busy, and would close the connection under it. Let it read what its buffers hold
                # first: such a request (on a connection pinned at the drain's start) is served,
                # and drained too.
                while result.drained and await _reads_settled(drain):
                    again = await drain.drain(reason=name)
                    if again is result:
                        break  # past the deadline: no more follow-ups
                    result = again
                logger.info("drain ended (%s): handing %s on to the server", result.result, name)
            finally:
                over.set()

        async def forced() -> None:
            await self._forced.wait()
            over.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain_until_over)
            tg.start_soon(forced)
            await over.wait()
            self._hand_on()
            if self._forced.is_set():
                await self._cut(drain)
            tg.cancel_scope.cancel()

    def _hand_on(self) -> None:
        """Give the server its handlers back and deliver it every signal taken from it."""
        self._give_back()
        received, self.received = self.received, []
        for sig in received:
            signal.raise_signal(sig)

    def _give_back(self) -> None:
        self._handed_on = True
        restore, self._restore = [*self._restore, *self._restore_last], []
        self._restore_last = []
        for undo in restore:
            undo()

    async def _cut(self, drain: Drain) -> None:
        ledger = core(drain).ledger
        items = ledger.items()
        logger.warning("forced exit: ending %d request(s) in flight", len(items))
        async with anyio.create_task_group() as tg:
            for item in items:
                if item.open:
                    ledger.count_truncated("forced_exit")
                    tg.start_soon(item.cut)


# Loop turns that let a server read requests already in its buffers and start their app calls:
# one to read the bytes and create the request's task and one to run it to admission, with room
# for callbacks a busy server has queued ahead of them (each turn costs microseconds).
_SETTLE_TURNS = 16


async def _reads_settled(drain: Drain) -> bool:
    """Give the server a few loop turns to read requests already sent; True if one was admitted."""
    for _ in range(_SETTLE_TURNS):
        await anyio.lowlevel.checkpoint()
    return drain.in_flight > 0


class _SeeThrough:
    """The owner of the handler graceful installs in front of the server's, transparent to readers.

    Code in the ecosystem finds the running server through the installed handler:
    sse-starlette ends its open event streams once ``signal.getsignal(SIGTERM).__self__``
    has a true ``should_exit`` (uvicorn's ``Server``), polling every half second. Any
    attribute this object lacks is read from, and written to, the previous handler's owner,
    so such code sees the server's own state while graceful holds the signal; where the
    previous handler has no owner (a function, the default), the attribute is missing, as
    it would be without graceful. Dunder names are never forwarded.
    """

    __slots__ = ("on_signal", "previous")

    def __init__(self, on_signal: Callable[[int, FrameType | None], None], previous: object) -> None:
        object.__setattr__(self, "on_signal", on_signal)
        object.__setattr__(self, "previous", previous)

    def handle(self, sig: int, frame: FrameType | None) -> None:
        self.on_signal(sig, frame)

    def _owner(self) -> object:
        """The object whose method the previous handler is; None for a function (a builtin's is its module)."""
        owner = getattr(object.__getattribute__(self, "previous"), "__self__", None)
        return None if isinstance(owner, types.ModuleType) else owner

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _SeeThrough.__slots__:  # not forwarded (nor unset slots)
            raise AttributeError(name)
        owner = self._owner()
        if owner is None:
            raise AttributeError(name)
        return getattr(owner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        owner = None if name.startswith("__") or name in _SeeThrough.__slots__ else self._owner()
        if owner is None:
            raise AttributeError(f"cannot set {name!r} on graceful's SIGTERM handler")
        setattr(owner, name, value)


def _stopped_by_parent() -> tuple[str, str] | None:
    """(server, fix) when this process is a worker whose parent takes SIGTERM and stops it otherwise.

    hypercorn with ``--workers N`` (N >= 1, its default is 1) spawns its workers with
    multiprocessing, SIGINT ignored and no handler of its own for SIGTERM; its parent takes
    SIGTERM and sets a shared event that the workers' servers wait on, so no signal ever
    reaches a worker (``hypercorn/run.py``). With ``--workers 0`` it serves in one process.
    """
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is None or multiprocessing.parent_process() is None:
        return None
    # SIGINT ignored is the mark: every server that handles signals in its workers installs a
    # handler for it there. (SIGTERM may have one of a tool's own, such as coverage's.)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return None
    if "hypercorn" in sys.modules:
        return "hypercorn --workers N", "hypercorn with --workers 0"
    return "the server", "the server in one process"


def _asyncio_signal_handlers() -> dict[int, Any] | None:
    """The running asyncio loop's ``add_signal_handler`` table, or None (no asyncio loop).

    asyncio offers no way to read a registered handler; its Unix loop keeps them in
    this dict (``asyncio/unix_events.py``), which ``add_signal_handler`` writes.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    handlers = getattr(loop, "_signal_handlers", None)
    return handlers if isinstance(handlers, dict) else None


def _owned_by_loop(handler: object) -> bool:
    """Whether ``handler`` is a method of the running event loop (``add_signal_handler``'s hook)."""
    owner = getattr(handler, "__self__", None)
    return owner is not None and isinstance(owner, asyncio.AbstractEventLoop)


def _signal_safe_call_soon() -> Callable[..., object]:
    """How to run a callback in this event loop from a signal handler."""
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:
        # anyio's other backend: trio runs us, so it is loaded (graceful does not depend on it).
        trio = sys.modules["trio"]
        call_soon: Callable[..., object] = trio.lowlevel.current_trio_token().run_sync_soon
        return call_soon
