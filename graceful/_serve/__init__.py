"""``graceful run``: uvicorn with SIGTERM wired to the drain (a ``uvicorn.Server`` subclass).

``_launcher`` (the launcher: ``GracefulServer``, the workers' supervisor, and ``serve``, which sets the
flags' variables, loads the app and runs it) and ``_load`` (the app imported, its own GracefulMiddleware
found or the app wrapped in one, and the flags that contradict its code refused).

May import ``_asgi``, ``_admin`` and ``_drain``.
"""
