"""Resumable streams on the client: httpx transports that continue a cut stream elsewhere.

``_transport`` (``ResumingTransport`` and its async twin: they move bytes) and ``_splice`` (the
protocol without I/O: which requests qualify, what the caller sees, the continuation request).

Imports no other graceful package.
"""
