"""A local rolling update through a real L4 load balancer: the proof that graceful loses nothing.

``python -m examples.rollout`` runs the same scenario twice, with plain uvicorn (the
baseline) and with ``graceful run`` plus a ``graceful drain`` preStop hook, under
``graceful soak`` traffic, and prints both sides in one table.
"""
