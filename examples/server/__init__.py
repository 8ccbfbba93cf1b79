"""An OpenAI-compatible inference server that simulates an LLM engine, wrapped in GracefulMiddleware.

``examples.server:app`` is built from ``GRACEFUL_EXAMPLE_*`` environment variables
on first access, so ``graceful run examples.server:app`` and every ``--workers``
process configure themselves from the environment. Tests build their own with
:func:`create_app`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._app import EXECUTIONS_PATH, ExampleServer, create_app
from ._config import ENV, Config
from ._openai import token_text

__all__ = ["ENV", "EXECUTIONS_PATH", "Config", "ExampleServer", "app", "create_app", "token_text"]

if TYPE_CHECKING:
    app: ExampleServer

_app: ExampleServer | None = None


def __getattr__(name: str) -> ExampleServer:
    # Built lazily: importing the package (tests, the CLI) must not read the environment.
    global _app
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _app is None:
        _app = create_app()
    return _app
