"""The example server: Starlette routes over the simulated engine, wrapped in GracefulMiddleware."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from graceful import ConfigError, GracefulMiddleware

from ._config import DRAIN_ENV, Config, drain_options_from_env, served_by
from ._engine import Engine, EngineCollector, QueueFull, Ticket, selftest_loop
from ._idempotency import IdempotencyStore, Stored
from ._openai import Frames, Invalid, Kind, error_body, parse
from ._responses import ResponsesFrames, parse_responses

__all__ = ["EXECUTIONS_PATH", "ExampleServer", "create_app"]

logger = logging.getLogger("graceful.example")

EXECUTIONS_PATH = "/debug/executions"
SSE = "text/event-stream"


class ExampleServer(GracefulMiddleware):
    """GracefulMiddleware that also stamps ``X-Served-By`` on every response, its own 503s and probes included.

    It stays a ``GracefulMiddleware``, so ``graceful run`` sees it is wrapped already.
    """

    engine: Engine
    store: IdempotencyStore
    config: Config
    served_by: str

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await super().__call__(scope, receive, send)
        header = (b"x-served-by", self.served_by.encode())

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        await super().__call__(scope, receive, stamped)


def create_app(
    config: Config | None = None,
    *,
    registry: CollectorRegistry | None = None,
    name: str | None = None,
    **options: Any,
) -> ExampleServer:
    """Build the example server; ``options`` go to GracefulMiddleware (``admin``, ``grace_period``, ...).

    With ``config=None`` the settings and drain options come from the environment.
    """
    from_variables: dict[str, str] = {}
    if config is None:
        config = Config.from_env()
        from_env = drain_options_from_env()
        from_variables = {name: DRAIN_ENV[name] for name in from_env if name not in options}
        options = {**from_env, **options}
        # Match the launcher's --socket-dir (it exports it) so it sees no conflicting setting.
        options.setdefault("socket_dir", os.environ.get("GRACEFUL_SOCKET_DIR") or None)
    engine = Engine(slots=config.slots, queue_size=config.queue_size, tokens_per_second=config.tokens_per_second)
    store = IdempotencyStore(config.idempotency_keys)
    registry = CollectorRegistry() if registry is None else registry
    registry.register(EngineCollector(engine, config.model))

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            tg.start_soon(load_model)
            if config.selftest_interval > 0:
                tg.start_soon(selftest_loop, app.drain, engine, config.selftest_interval)
            yield
            tg.cancel_scope.cancel()

    async def load_model() -> None:
        # In the background, so the port is open and /startup answers 503 while weights load.
        logger.info("loading model %r: %.1fs", config.model, config.load_delay)
        await anyio.sleep(config.load_delay)
        app.drain.mark_serving()

    handlers = _Handlers(config, engine, store)
    inner = Starlette(
        routes=[
            Route("/v1/completions", handlers.completions, methods=["POST"]),
            Route("/v1/chat/completions", handlers.chat, methods=["POST"]),
            Route("/v1/responses", handlers.responses, methods=["POST"]),
            Route("/v1/models", handlers.models, methods=["GET"]),
            Route(EXECUTIONS_PATH, handlers.executions, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    options.setdefault("exempt_paths", (EXECUTIONS_PATH,))
    try:
        app = ExampleServer(inner, ready_on_startup=False, metrics_path="/metrics", registry=registry, **options)
    except ConfigError as exc:
        # The user set GRACEFUL_EXAMPLE_* variables, not these options: name what they typed.
        named = [
            f"{name} is {var}={os.environ[var].strip()}" for name, var in from_variables.items() if name in str(exc)
        ]
        raise ConfigError(f"{exc} ({'; '.join(named)})" if named else str(exc)) from None
    app.engine = engine
    app.store = store
    app.config = config
    app.served_by = name or served_by()
    return app


class _Handlers:
    def __init__(self, config: Config, engine: Engine, store: IdempotencyStore) -> None:
        self.config = config
        self.engine = engine
        self.store = store

    async def models(self, request: Request) -> Response:
        model = {"id": self.config.model, "object": "model", "created": 0, "owned_by": "graceful-example"}
        return JSONResponse({"object": "list", "data": [model]})

    async def executions(self, request: Request) -> Response:
        return JSONResponse(self.store.executions())

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completion")

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def responses(self, request: Request) -> Response:
        return await self._generate(request, "responses")

    async def _generate(self, request: Request, kind: Kind) -> Response:
        config = self.config
        limits = {"default_max_tokens": config.default_max_tokens, "max_tokens": config.max_tokens}
        try:
            raw = await request.body()
            if kind == "responses":
                job = parse_responses(raw, **limits, word=config.token_word)
            else:
                job = parse(raw, kind, **limits, word=config.token_word)
        except Invalid as exc:
            return _error(400, str(exc), "invalid_request_error", exc.param)
        frames = ResponsesFrames(job, config.model) if kind == "responses" else Frames(job, config.model)
        key = request.headers.get("idempotency-key")
        if key is not None:
            stored = self.store.lookup(key)
            if stored is not None:
                return Response(
                    b"".join(stored.chunks), stored.status, {"x-idempotent-replay": "true"}, stored.media_type
                )
            if self.store.running(key):
                message = f"A request with Idempotency-Key {key!r} is still running; retry later to get its result."
                return _error(409, message, "idempotency_key_in_use", "Idempotency-Key")
        try:
            ticket = self.engine.admit()
        except QueueFull as exc:
            headers = {"retry-after": "1", "x-graceful-not-started": "1"}
            return _error(503, f"{exc}; retry the request.", "server_overloaded", None, headers)
        if key is not None:
            self.store.start(key)
        if job.stream:
            return _Stream(self, frames, ticket, key)
        done = False
        try:
            async with ticket:
                async for _ in self.engine.tokens(job.max_tokens):
                    pass
            done = True
        finally:
            ticket.release()
            if key is not None and not done:
                self.store.abandon(key)
        body = frames.body()
        if key is not None:
            self.store.finish(key, Stored(200, "application/json", [body]))
        return Response(body, media_type="application/json")


class _Stream(Response):
    """SSE: the opening events, one event per token, the closing ones (``[DONE]`` for chat and
    completions, ``response.completed`` for Responses); the slot and the key are settled however it ends.

    Starlette's StreamingResponse never runs a generator that it did not start, so a
    client that leaves early would leak the slot; this response owns the whole call.
    """

    media_type = SSE

    def __init__(self, handlers: _Handlers, frames: Frames | ResponsesFrames, ticket: Ticket, key: str | None) -> None:
        super().__init__(headers={"cache-control": "no-cache", "x-accel-buffering": "no"}, media_type=SSE)
        del self.headers["content-length"]
        self.handlers = handlers
        self.frames = frames
        self.ticket = ticket
        self.key = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handlers = self.handlers
        chunks: list[bytes] = []
        done = False
        try:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    # uvicorn's send() is silent once the client is gone; only receive() tells.
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(watch)
                await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                frames = self.frames

                async def frame(data: bytes, more: bool = True) -> None:
                    chunks.append(data)
                    await send({"type": "http.response.body", "body": data, "more_body": more})

                async with self.ticket:
                    for data in frames.opening():
                        await frame(data)
                    async for index in handlers.engine.tokens(frames.job.max_tokens):
                        await frame(frames.token(index))
                *closing, last = frames.closing()
                for data in closing:
                    await frame(data)
                await frame(last, more=False)
                done = True
                tg.cancel_scope.cancel()
        finally:
            self.ticket.release()
            if self.key is not None:
                if done:
                    handlers.store.finish(self.key, Stored(200, SSE, chunks))
                else:
                    handlers.store.abandon(self.key)


def _error(status: int, message: str, type: str, param: str | None, headers: dict[str, str] | None = None) -> Response:
    return Response(error_body(message, type=type, param=param), status, headers, "application/json")
