"""Whether the server runs the middleware's lifespan, and what holds when it does not.

Servers run lifespan before they accept a connection: uvicorn, hypercorn, granian and
gunicorn's uvicorn workers, and Starlette's ``TestClient`` or asgi-lifespan's
``LifespanManager`` used as context managers. So a request that arrives while no
lifespan runs means none will come: ``TestClient(app)`` without ``with``,
``uvicorn --lifespan off``, an app whose lifespan raised before startup under
``--lifespan auto``, or an app object used again after its server shut down. The
unwrapped app serves such a request, and so does the wrapped one: the machine moves to
SERVING (reason ``no lifespan``), and the log says once what the process then lacks.

Two things stay as they are: a lifecycle that ended in a drain keeps refusing until a new
lifespan startup, and ``ready_on_startup=False`` waits for ``mark_serving()``.
"""

from __future__ import annotations

import logging

from .._drain._state import Drain, core
from .._drain._status import STOPPED, State

__all__ = ["Lifecycle"]

logger = logging.getLogger("graceful")


class Lifecycle:
    """How many lifespans of one middleware run now, and the rule for a request without one."""

    __slots__ = ("drain", "core", "ready_on_startup", "admin", "running", "warned")

    def __init__(self, drain: Drain, *, ready_on_startup: bool, admin: bool) -> None:
        self.drain = drain
        self.core = core(drain)
        self.ready_on_startup = ready_on_startup
        self.admin = admin
        self.running = 0  # lifespan scopes in progress (more than one only when a server is run twice at once)
        self.warned = False

    def serve_without_lifespan(self) -> None:
        """A request or probe arrived while not SERVING (the slow path): with no lifespan running, move
        the machine to SERVING (restarting a lifecycle that stopped without a drain) to serve it."""
        if self.running or not self.ready_on_startup:
            return
        drain = self.drain
        if drain.state is STOPPED:
            if self.core.stopped_draining:
                return  # the drain is final for its lifecycle
            self.core.restart("no lifespan")
        if drain.state is not State.STARTING:
            return
        drain.mark_serving("no lifespan")
        if self.warned:
            return
        self.warned = True
        lacks = self._lacks()
        if not lacks:
            logger.debug("no lifespan runs for this app: serving without one")
            return
        logger.warning(
            "no lifespan runs for this app: serving without %s, which start in the lifespan; run the server "
            "with lifespan on (uvicorn --lifespan on; hypercorn and granian run it by default; in tests "
            "`with TestClient(app):` or asgi-lifespan's LifespanManager)",
            " and ".join(lacks),
        )

    def _lacks(self) -> list[str]:
        lacks = []
        if self.admin:
            lacks.append("the admin socket (graceful drain cannot reach this process)")
        if self.core.middleware_drains_on_sigterm:
            lacks.append("the SIGTERM drain")
        return lacks
