"""WebSockets: refused while not serving, counted until closed, closed with 1012 at the deadline."""

from __future__ import annotations

import json

import anyio

from .._drain._ledger import CANCELLED, CLIENT_DISCONNECTED, COMPLETED, ERROR, Tracked
from .._drain._status import State
from ._config import Config
from ._http import NOT_STARTED_HEADER, REFUSAL
from ._types import Message, Receive, Scope, Send

SERVICE_RESTART = 1012  # RFC 6455 registry: "Service Restart"


async def websocket_call(config: Config, scope: Scope, receive: Receive, send: Send) -> None:
    drain = config.drain
    if drain.state is not State.SERVING:
        config.lifecycle.arrived()  # with no lifespan running, the socket is served as unwrapped
    if drain.state is not State.SERVING and not drain.admits(scope.get("client")):
        reason = REFUSAL[drain.state]
        drain.count_rejected(reason)
        await _refuse(scope, receive, send, reason)
        return
    await _Socket(config, scope, receive, send).run()


async def _refuse(scope: Scope, receive: Receive, send: Send, reason: str) -> None:
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    if "websocket.http.response" in (scope.get("extensions") or {}):
        body = json.dumps({"error": {"type": reason, "code": 503, "message": "not accepting websockets"}}).encode()
        await send(
            {
                "type": "websocket.http.response.start",
                "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"), (NOT_STARTED_HEADER, b"1")],
            }
        )
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1013})  # "Try Again Later" -> HTTP 403 from most servers


async def _drop(message: Message) -> None:
    pass


class _Socket(Tracked):
    __slots__ = ("config", "scope", "_receive", "_send", "cancel_scope", "accepted")

    def __init__(self, config: Config, scope: Scope, receive: Receive, send: Send) -> None:
        super().__init__(config.drain)
        self.config = config
        self.scope = scope
        self._receive = receive
        self._send = send
        self.cancel_scope: anyio.CancelScope | None = None
        self.accepted = False

    async def run(self) -> None:
        self.config.drain.admit_item(self)
        outcome = ERROR
        try:
            with anyio.CancelScope() as self.cancel_scope:
                await self.config.app(self.scope, self.receive, self.send)
            outcome = CANCELLED if self.cancel_scope.cancelled_caught else COMPLETED
        except OSError:
            outcome = CLIENT_DISCONNECTED
            raise
        except anyio.get_cancelled_exc_class():
            outcome = CANCELLED
            raise
        finally:
            self.finish(outcome)

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "websocket.disconnect":
            self.finish(CLIENT_DISCONNECTED)
        return message

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "websocket.accept":
            self.accepted = True
        await self._send(message)
        if kind == "websocket.close":
            self.finish(COMPLETED)

    def label(self) -> str:
        return f"websocket {self.scope['path']}"

    async def cut(self) -> None:
        send = self._send
        self._send = _drop
        try:
            if self.accepted:
                await send({"type": "websocket.close", "code": SERVICE_RESTART, "reason": "server restart"})
            else:
                await send({"type": "websocket.close", "code": 1013})
        except Exception:
            pass
        self.finish(CANCELLED)
        if self.cancel_scope is not None:
            self.cancel_scope.cancel()
