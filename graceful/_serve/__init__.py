"""``graceful run``: uvicorn with SIGTERM wired to the drain (a ``uvicorn.Server`` subclass).

``_server`` (the launcher: ``GracefulServer``, the workers' supervisor, and ``serve``, which loads
the app and runs it).

May import ``_asgi``, ``_admin`` and ``_drain``.
"""
