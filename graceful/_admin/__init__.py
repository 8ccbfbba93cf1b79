"""The admin protocol over a private Unix socket: its two ends and where the sockets live.

``_server`` (the listener each worker runs in its lifespan), ``_answers`` (what it answers, from
the drain's snapshots, and how it reads a drain's query), ``_client`` (what ``graceful drain``,
``status``, ``resume`` and ``advise`` use, one thread per worker), ``_wire`` (the protocol's one
home: its routes, parameters, event and field names, and the client's exchange: one request and
its answer on one socket) and ``_paths`` (socket paths and the search for them, shared by both ends).

May import ``_drain``. ``_wire`` and ``_paths`` are on the preStop hook's fast path: they import
the standard library only.
"""
