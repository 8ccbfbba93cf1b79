"""The ASGI middleware: admission, probes, per-request accounting, lifespan and SIGTERM.

``_middleware`` (``GracefulMiddleware`` and its admission), ``_options`` (its own options, declared
once), ``_http`` (one admitted request), ``_admission`` (a request judged by its body during a drain with
``admission="fits"``, and the streams' pace sampled), ``_refusal`` (the answer to work it refuses), ``_answers``
(the small JSON answers of the probes, the refusals and the deadline), ``_websocket``, ``_lifespan``
and ``_lifecycle`` (lifespan, and the rule without one), ``_signals`` (SIGTERM taken from the
server, then handed on) and ``_stop`` (what a stop signal means), ``_shared`` (what the middleware
shares with the work it runs), ``_frames`` (the deadline's final frame), ``_metrics`` (one table of
metrics, read at scrape time) and ``_types`` (the ASGI aliases).

May import ``_drain`` and ``_admin`` (the admin listener runs in the lifespan).
"""
