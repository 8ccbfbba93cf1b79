"""``graceful run``: uvicorn with SIGTERM wired to the drain (a ``uvicorn.Server`` subclass).

May import ``_asgi``, ``_admin`` and ``_drain``.
"""
