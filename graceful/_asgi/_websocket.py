"""WebSockets: counted from admission until closed, closed with 1012 at the deadline (refusals: ``_refusal``)."""

from __future__ import annotations

import anyio

from .._drain._ledger import CANCELLED, CLIENT_DISCONNECTED, COMPLETED, ERROR, Tracked
from ._refusal import TRY_AGAIN_LATER
from ._shared import Shared
from ._types import Message, Receive, Scope, Send

SERVICE_RESTART = 1012  # RFC 6455 registry: "Service Restart"


async def websocket_call(shared: Shared, scope: Scope, receive: Receive, send: Send) -> None:
    """Run an admitted WebSocket session (the middleware's admission has let it in)."""
    await _Socket(shared, scope, receive, send).run()


async def _drop(message: Message) -> None:
    pass


class _Socket(Tracked):
    __slots__ = ("shared", "scope", "_receive", "_send", "cancel_scope", "accepted")
    last = b""  # a session counts as a stream in the durations, whatever it sent

    def __init__(self, shared: Shared, scope: Scope, receive: Receive, send: Send) -> None:
        super().__init__(shared.ledger)
        self.shared = shared
        self.scope = scope
        self._receive = receive
        self._send = send
        self.cancel_scope: anyio.CancelScope | None = None
        self.accepted = False

    async def run(self) -> None:
        self.shared.ledger.admit_item(self)
        outcome = ERROR
        try:
            with anyio.CancelScope() as self.cancel_scope:
                await self.shared.app(self.scope, self.receive, self.send)
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
                await send({"type": "websocket.close", "code": TRY_AGAIN_LATER})
        except Exception:
            pass
        self.finish(CANCELLED)
        if self.cancel_scope is not None:
            self.cancel_scope.cancel()
