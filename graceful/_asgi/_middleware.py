"""GracefulMiddleware: admission, probes and exact in-flight accounting for any ASGI app."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, Never

from prometheus_client import CollectorRegistry

from .._drain._admission import Admission
from .._drain._core import Duration
from .._drain._environ import UNSET, Unset
from .._drain._errors import ConfigError, reported
from .._drain._ledger import ERROR, NO_LIMIT
from .._drain._options import Hook
from .._drain._state import Drain, core
from .._drain._status import DRAINING, SERVING, State
from ._admission import judge
from ._answers import json_response, probe_body
from ._frames import FinalFrame
from ._http import Call, peer_of, resumable
from ._lifecycle import Lifecycle
from ._options import MiddlewareConfig
from ._refusal import REFUSAL, reject, reject_websocket
from ._shared import Shared
from ._types import ASGIApp, Receive, Scope, Send

__all__ = ["GracefulMiddleware"]

# Loaded as a module global: one lookup, no attribute access, per request.
_monotonic = time.monotonic

logger = logging.getLogger("graceful")


class GracefulMiddleware:
    """Pure-ASGI middleware that takes a server out of service without losing a request.

    It answers the probes itself, fails readiness at once when a drain begins, serves
    new work until the propagation wait ends and refuses it with a retryable 503 after
    that (from the first instant with ``admit_during_propagation=False``), and counts
    every admitted request until its last frame has been handed to the server.
    ``.drain`` is the process-wide :class:`Drain` (made here if not given); the drain
    options (``grace_period`` to ``drain_on_sigterm``) go to that ``Drain``. Every option
    not passed comes from its ``GRACEFUL_*`` variable, else its default
    (docs/middleware.md, "Options").

    Place it *inside* authentication middleware so that only accepted work is counted.
    """

    def __init__(
        self,
        app: ASGIApp,
        drain: Drain | None = None,
        *,
        registry: CollectorRegistry | None = None,
        ready_path: str | Unset = UNSET,
        live_path: str | Unset = UNSET,
        startup_path: str | Unset = UNSET,
        exempt_paths: Iterable[str] | Unset = UNSET,
        metrics_path: str | None | Unset = UNSET,
        retry_after: int | Unset = UNSET,
        max_in_flight: int | None | Unset = UNSET,
        reject_over: int | None | Unset = UNSET,
        live_check: Callable[[], bool] | None | Unset = UNSET,
        fail_liveness: bool | Unset = UNSET,
        ready_on_startup: bool | Unset = UNSET,
        request_id_header: str | None | Unset = UNSET,
        admin: bool | Unset = UNSET,
        socket_dir: str | None | Unset = UNSET,
        socket_mode: int | Unset = UNSET,
        final_frame: FinalFrame | Unset = UNSET,
        announce_drain: bool | Unset = UNSET,
        grace_period: Duration | Unset = UNSET,
        reserve: Duration | Unset = UNSET,
        drain_timeout: Duration | Unset = UNSET,
        propagation_wait: Duration | Unset = UNSET,
        propagation_quiet: Duration | Unset = UNSET,
        admit_during_propagation: bool | Unset = UNSET,
        handoff_streams: bool | Unset = UNSET,
        admission: Admission | Unset = UNSET,
        on_drain_start: Hook | None | Unset = UNSET,
        on_drained: Hook | None | Unset = UNSET,
        hook_timeout: Duration | Unset = UNSET,
        unwind_timeout: Duration | Unset = UNSET,
        drain_on_sigterm: bool | Unset = UNSET,
        **unknown: Never,
    ) -> None:
        if unknown:
            raise TypeError(
                f"GracefulMiddleware got unknown option(s) {sorted(unknown)}; "
                "see the option tables in docs/middleware.md"
            )
        if not callable(app):
            raise TypeError(f"GracefulMiddleware: app must be an ASGI application (a callable), got {app!r}")
        if drain is not None and not isinstance(drain, Drain):
            raise TypeError(f"GracefulMiddleware: drain must be a Drain (or None for a new one), got {drain!r}")
        # The drain options go to the Drain made here; an existing one keeps its own.
        drain_options: dict[str, Any] = {
            "grace_period": grace_period,
            "reserve": reserve,
            "drain_timeout": drain_timeout,
            "propagation_wait": propagation_wait,
            "propagation_quiet": propagation_quiet,
            "admit_during_propagation": admit_during_propagation,
            "handoff_streams": handoff_streams,
            "admission": admission,
            "on_drain_start": on_drain_start,
            "on_drained": on_drained,
            "hook_timeout": hook_timeout,
            "unwind_timeout": unwind_timeout,
            "drain_on_sigterm": drain_on_sigterm,
        }
        passed = sorted(name for name, value in drain_options.items() if value is not UNSET)
        if drain is not None and passed:
            raise TypeError(
                f"pass {passed} to Drain(...) or leave drain=None; "
                "GracefulMiddleware cannot reconfigure an existing Drain"
            )
        # An option not passed comes from its GRACEFUL_* variable, else its default, so a server that
        # loads the middleware by name (vllm serve --middleware) is configured by its environment.
        # Every value is checked here, never first at startup or at a request; a wrong one is raised
        # as the server that imports the app reports in one line (``reported``).
        given = {
            "ready_path": ready_path,
            "live_path": live_path,
            "startup_path": startup_path,
            "exempt_paths": exempt_paths,
            "metrics_path": metrics_path,
            "retry_after": retry_after,
            "max_in_flight": max_in_flight,
            "reject_over": reject_over,
            "live_check": live_check,
            "fail_liveness": fail_liveness,
            "ready_on_startup": ready_on_startup,
            "request_id_header": request_id_header,
            "admin": admin,
            "socket_dir": socket_dir,
            "socket_mode": socket_mode,
            "final_frame": final_frame,
            "announce_drain": announce_drain,
        }
        try:
            options = MiddlewareConfig.resolve(given, os.environ)
            if drain is None:
                drain = Drain(**drain_options)
        except ConfigError as exc:
            raise reported(exc).with_traceback(None) from None
        self.app = app
        self.drain = drain
        self._core = inner = core(drain)
        self._ledger = inner.ledger
        self._admissions = inner.ledger.table  # the ledger's table, admitted into inline (see __call__)
        self.options = options
        self.max_in_flight = options.max_in_flight if options.max_in_flight is not None else NO_LIMIT
        # None for no limit: the admission check is then one identity test (a comparison with a
        # large "no limit" int is not one of the interpreter's fast paths).
        self.reject_over = options.reject_over
        # How to find the task that runs a request, so the deadline can cancel it; chosen
        # on the first request, when we know which event loop runs us.
        self.current_task: Callable[[Any], asyncio.Task[Any] | None] = self._detect_loop
        self.loop: asyncio.AbstractEventLoop | None = None

        from ._metrics import MultiprocessMirror, register

        self.registry = register(drain, registry)
        # prometheus-client's multi-process mode needs the counters copied to its files.
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")
        self.shared = Shared(
            app=app,
            drain=drain,
            core=inner,
            ledger=inner.ledger,
            options=options,
            retry_after=str(options.retry_after).encode(),
            request_id_header=options.request_id_header.lower().encode() if options.request_id_header else None,
            id_prefix=f"{os.getpid():x}-{os.urandom(3).hex()}-".encode(),
            ids=itertools.count(1),
            final_frame=options.final_frame,
            mirror=MultiprocessMirror(drain) if self.multiprocess_dir else None,
            lifecycle=Lifecycle(drain, ready_on_startup=options.ready_on_startup, admin=options.admin),
        )
        self.lifecycle = self.shared.lifecycle
        # One dict lookup per request decides whether a path is special; None means "pass to the app".
        self._special: dict[str, Callable[[Scope, Receive, Send], Any] | None] = dict.fromkeys(options.exempt_paths)
        if options.metrics_path:
            self._special[options.metrics_path] = self._metrics
        self._special[options.ready_path] = self._ready
        self._special[options.live_path] = self._liveness
        self._special[options.startup_path] = self._startup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if path in self._special:
                handler = self._special[path]
                if handler is None:
                    return await self.app(scope, receive, send)
                await handler(scope, receive, send)
                return
            # The drain's state read from its internal face, a plain attribute (``Drain.state`` is a property).
            inner = self._core
            admissions = self._admissions
            limit = self.reject_over
            # Admission's fast path: while SERVING under the reject_over limit there is nothing to decide.
            if inner.state is not SERVING or (limit is not None and len(admissions) >= limit):
                reason = self._refusal(scope)
                if reason is None and inner.state is DRAINING:  # admission="fits": would it finish in time?
                    receive, reason = await judge(self.shared, scope, receive)
                if reason is not None:
                    return await self._refuse(scope, receive, send, reason)
            # The request's record, filled here rather than by a Python __init__ (one frame less
            # per request); Call's docstring lists its fields.
            call = Call()
            # self.current_task is an attribute, not a method: loaded as one and then called, it
            # skips the slower method-call path. It is asyncio's C lookup (see _task_getter).
            current_task = self.current_task
            call.task = task = current_task(self.loop)
            call.ledger = self._ledger
            call.open = True
            call.shared = self.shared
            call.scope = scope
            call.server_receive = receive
            call.server_send = send
            call.last = None
            admissions[call] = _monotonic()  # Ledger.admit_item, inline: the time of admission
            try:
                if task is not None:
                    app = self.app
                    await app(scope, call.receive, call.send)
                else:
                    await call.run_scoped()
            except BaseException as exc:
                if await call.failed(exc):
                    return
                raise
            if call.open:  # the app returned without finishing its response
                call.finish(ERROR)
            return
        if kind == "websocket":
            reason = self._refusal(scope)
            if reason is not None:
                return await self._refuse(scope, receive, send, reason)
            from ._websocket import websocket_call

            return await websocket_call(self.shared, scope, receive, send)
        if kind == "lifespan":
            from ._lifespan import lifespan

            return await lifespan(self.shared, scope, receive, send)
        await self.app(scope, receive, send)

    def _detect_loop(self, loop: Any) -> asyncio.Task[Any] | None:
        # asyncio tasks are cancelled directly at the deadline; other loops (trio) get a
        # cancel scope per request instead.
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio (trio): no asyncio loop runs in this thread
            self.current_task = _no_task
        else:
            self.current_task, bound = _task_getter()
            self.loop = running if bound else None
        return self.current_task(self.loop)

    def _refusal(self, scope: Scope) -> str | None:
        """Admission, for HTTP and WebSocket alike: why a new request is refused, or None to admit it.

        The one rule: while not SERVING, a request is refused unless the drain admits it (during
        the propagation wait, or once on a connection pinned at the drain's start), and a resumable
        request is refused once streams are handed off; in any state, ``reject_over`` requests in
        flight refuse the next one.
        """
        inner = self._core
        if inner.state is not SERVING:
            # With no lifespan running, this serves it, as the unwrapped app would.
            self.lifecycle.serve_without_lifespan()
            if inner.state is not SERVING and (
                not (inner.admit_arrival() or inner.admit_pinned(peer_of(scope)))
                # Once streams are handed off, a resumable one would be handed off as soon as it
                # started (it comes on a kept-alive connection): its client goes elsewhere at once.
                or (inner.handing_off and scope["type"] == "http" and resumable(scope))
            ):
                return REFUSAL[inner.state]
        limit = self.reject_over
        if limit is not None and inner.in_flight >= limit:
            return "server_overloaded"
        return None

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, reason: str) -> None:
        self._core.count_rejected(reason)
        if scope["type"] == "websocket":
            await reject_websocket(self.shared, scope, receive, send, reason)
        else:
            await reject(self.shared, scope, receive, send, reason)

    # -- probes: answered here, never counted, never refused ----------------------------------

    async def _ready(self, scope: Scope, receive: Receive, send: Send) -> None:
        drain = self.drain
        if drain.state is not SERVING:
            self.lifecycle.serve_without_lifespan()
        ok = drain.state is SERVING and drain.in_flight < self.max_in_flight
        await json_response(send, 200 if ok else 503, probe_body(drain, ok), self.shared.announce())

    async def _liveness(self, scope: Scope, receive: Receive, send: Send) -> None:
        ok = True
        live_check = self.options.live_check
        if self.options.fail_liveness and self.drain.state is State.FAILED:
            ok = False  # the engine has died: let the kubelet restart the container
        elif live_check is not None:
            try:
                ok = bool(live_check())
            except Exception:
                logger.exception("live_check raised; reporting not live")
                ok = False
        await json_response(send, 200 if ok else 503, probe_body(self.drain, ok), self.shared.announce())

    async def _startup(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.drain.state is not SERVING:
            self.lifecycle.serve_without_lifespan()
        ok = self.drain.state is not State.STARTING
        await json_response(send, 200 if ok else 503, probe_body(self.drain, ok), self.shared.announce())

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        from ._metrics import render

        if self.shared.mirror is not None:
            self.shared.mirror.sync()
        body, content_type = render(self.registry, self.multiprocess_dir)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", content_type.encode()),
                    (b"content-length", b"%d" % len(body)),
                    *self.shared.announce(),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _task_getter() -> tuple[Callable[[Any], asyncio.Task[Any] | None], bool]:
    """asyncio's current task as one C call per request, without a Python frame.

    Returns the function and whether it must be given the loop the middleware first ran
    on (else it is given None). From Python 3.12 it is asyncio's C ``current_task``, which
    finds the running loop itself. On 3.11 it is the lookup in asyncio's own table of
    current tasks, keyed by that first loop: a request on a later loop in the same thread
    finds no task there and runs in a cancel scope, which is slower but just as correct.
    (On 3.11 one middleware instance serving two event loops at once, in two threads,
    could be handed the other loop's running task; a server runs one loop per process.)
    """
    try:
        from _asyncio import current_task  # type: ignore[attr-defined]  # C since Python 3.12

        return current_task, False
    except ImportError:
        pass
    try:
        from _asyncio import _current_tasks  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - CPython always builds _asyncio
        return asyncio.current_task, False
    return _current_tasks.get, True


def _no_task(loop: Any) -> None:
    return None
