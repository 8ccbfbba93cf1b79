"""Resumable streams on the client: httpx transports that continue a cut stream elsewhere.

``_transport`` (``ResumingTransport`` and its async twin: they move bytes), ``_splice`` (the
protocol without I/O for Chat Completions and Completions: which requests qualify, what the caller
sees, the continuation request), ``_responses`` (the same for the Responses API) and ``_attempts``
(what both keep across attempts: the final event held back, the bounds on continuations).

May import ``_stream`` (the stream rules it shares with the middleware).
"""
