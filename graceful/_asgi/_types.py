"""ASGI type aliases.

Copied in spirit from asgi-lifespan's ``_types.py`` and the ASGI spec
(https://asgi.readthedocs.io/en/latest/specs/main.html) so that graceful does
not depend on Starlette for five aliases.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
