"""The admin protocol over a private Unix socket: its two ends and where the sockets live.

``_server`` (the listener each worker runs in its lifespan), ``_client`` (what ``graceful
drain``, ``status``, ``resume`` and ``advise`` use, one thread per worker), ``_wire`` (the
protocol's event and field names, and the client's exchange: one request and its answer on one
socket) and ``_paths`` (socket paths, shared by both ends).

May import ``_drain``. ``_client``, ``_wire`` and ``_paths`` are on the preStop hook's path:
they import nothing heavy.
"""
