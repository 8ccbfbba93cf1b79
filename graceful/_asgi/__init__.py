"""The ASGI middleware: admission, probes, per-request accounting, lifespan and SIGTERM.

``_middleware`` (``GracefulMiddleware``), ``_http`` (one admitted request), ``_websocket``,
``_lifespan`` and ``_lifecycle`` (lifespan, and the rule without one), ``_signals`` (SIGTERM
taken from the server, then handed on), ``_config`` (the small frozen config the helpers read),
``_frames`` (the deadline's final frame), ``_metrics`` (one table of metrics, read at scrape
time) and ``_types`` (the ASGI aliases).

May import ``_drain`` and ``_admin`` (the admin listener runs in the lifespan).
"""
