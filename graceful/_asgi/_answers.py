"""The small JSON answers graceful writes without the app: the probes', the refusals' and the deadline's 503.

Each is whole in one body, sized, and never cached (a balancer must not serve a stale probe).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._types import Send

if TYPE_CHECKING:
    from .._drain._state import Drain

__all__ = ["json_response", "probe_body"]


async def json_response(send: Send, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
                (b"cache-control", b"no-store"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def probe_body(drain: Drain, ok: bool) -> bytes:
    """A probe's answer: whether it passes, the state and the work in flight."""
    return json.dumps({"ok": ok, "state": drain.state.value, "in_flight": drain.in_flight}).encode()
