# ruff: noqa: F704, E402, I001, F401 (a session as the asyncio REPL runs it: top-level await, the import where the listing starts)
"""docs/middleware.md's Python API, one call after another, as ``python -m asyncio`` runs it (top-level await).

The names the listing takes as given: any ASGI app, the middleware's options and a listener.
"""

from prometheus_client import CollectorRegistry


async def inner_app(scope, receive, send):
    pass


options = {"registry": CollectorRegistry(), "admin": False}
changes = []


def callback():
    changes.append(app.drain.state)


# fmt: off
# --8<-- [start:api]
from graceful import Drain, GracefulMiddleware, State
app = GracefulMiddleware(inner_app, drain=None, **options)   # .drain is the Drain
drain = Drain(grace_period=30, propagation_wait="5s")   # the drain options, by name; or app.drain
app.drain.state            # State.STARTING | SERVING | DRAINING | STOPPED | FAILED
app.drain.since            # wall-clock time the state was entered
app.drain.in_flight        # int
app.drain.accepting        # False once draining
app.drain.config           # DrainConfig: the options in force; .budget is its Budget
app.drain.budget           # Budget(grace_period, reserve, drain_timeout, propagation_wait, propagation_quiet)
app.drain.add_listener(callback)                  # callback() after each state change and drain result
app.drain.mark_serving()
async with app.drain.track("job"): ...            # non-HTTP work
app.drain.counters()       # requests by outcome, refusals, drains, truncated work, failures
app.drain.status()         # -> DrainStatus, the snapshot /status serves
result = await app.drain.drain(propagation_wait="1s", propagation_quiet="0.2s", timeout="20s")  # -> DrainResult
app.drain.last_result      # the last drain's DrainResult, once it has ended
app.drain.resume()
app.drain.begin_drain(reason="maintenance")       # sync, idempotent
app.drain.mark_failed("engine_dead", "what was seen")   # FAILED: refuse all, never resumed
app.drain.failure          # Failure(reason, detail, at) while FAILED, else None
app.drain.mark_stopped()   # STOPPED: the lifespan's shutdown does this
# --8<-- [end:api]
# fmt: on
