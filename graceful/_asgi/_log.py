"""The drain in the server's log, without the user configuring logging (issue 51).

uvicorn, gunicorn, hypercorn and granian configure only their own loggers, so the ``graceful``
logger reaches no handler under them: Python's last resort prints warnings only, and the
operator sees nothing of a drain. At lifespan startup, once the app's own startup has run,
:func:`show_in_server_log` gives the ``graceful`` logger the handlers of the server's own log
(its stream or file, its format, its level); where the server has made none yet (hypercorn
makes its logger after the lifespan has started), one stderr handler at INFO in the format
hypercorn and gunicorn share. It does nothing when any handler is reachable from the
``graceful`` logger: logging configured by the user (``logging.basicConfig``, a ``dictConfig``,
a ``NullHandler`` to keep graceful out of the log) or by the launcher (``graceful run``).
"""

from __future__ import annotations

import logging

__all__ = ["show_in_server_log"]

# Where each server documented in docs/outside-kubernetes.md logs its own lines: uvicorn's error log
# (under gunicorn's uvicorn worker, gunicorn's handlers), gunicorn's, hypercorn's, granian's.
SERVER_LOGGERS = ("uvicorn.error", "gunicorn.error", "hypercorn.error", "_granian")
# hypercorn's format (hypercorn/logging.py), which gunicorn's default matches.
FORMAT, DATE_FORMAT = "%(asctime)s [%(process)d] [%(levelname)s] %(message)s", "[%Y-%m-%d %H:%M:%S %z]"


def show_in_server_log(log: logging.Logger) -> None:
    """Give ``log`` the server's log handlers (else one on stderr) if no handler is reachable from it."""
    if log.hasHandlers():
        return
    level = logging.INFO
    handlers: list[logging.Handler] = []
    for name in SERVER_LOGGERS:
        server = logging.root.manager.loggerDict.get(name)  # never creates a logger
        if isinstance(server, logging.Logger):
            handlers = _reachable(server)
            if handlers:
                level = server.getEffectiveLevel()
                break
    if not handlers:
        stderr = logging.StreamHandler()
        stderr.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
        handlers = [stderr]
    for handler in handlers:
        log.addHandler(handler)
    if log.level == logging.NOTSET:  # a level the user set stays
        log.setLevel(level)


def _reachable(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers a record logged on ``logger`` reaches first (its own, else its nearest parent's)."""
    current: logging.Logger | None = logger
    while current is not None:
        if current.handlers:
            return list(current.handlers)
        if not current.propagate:
            return []
        current = current.parent
    return []
