"""What a stop signal means: one policy for every path that takes SIGTERM and SIGINT.

The middleware's takeover (``SignalDrain``), ``graceful run``'s server and its multi-worker
supervisor all ask :class:`StopSignals`, so a repeated signal means the same everywhere.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Literal

__all__ = ["FIRST", "FORCE", "HANDLED_SIGNALS", "REPEAT", "REPEAT_WINDOW", "StopSignals"]

logger = logging.getLogger("graceful")

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# A signal this soon after the first is the same stop arriving twice: systemd's default
# KillMode signals every process of the unit, and gunicorn's or granian's parent then
# forwards the signal to its workers; a container runtime may signal the process group.
# Only a later one forces exit.
REPEAT_WINDOW = 0.5

FIRST: Literal["first"] = "first"  # start the drain
REPEAT: Literal["repeat"] = "repeat"  # the same stop arriving twice: nothing more to do
FORCE: Literal["force"] = "force"  # a second stop: end the work in flight and exit now
Meaning = Literal["first", "repeat", "force"]


class StopSignals:
    """Tells each stop signal's meaning: the first drains, a repeat within ``REPEAT_WINDOW`` of it
    is the same stop (logged, ignored), and a later one forces exit."""

    __slots__ = ("first_at",)

    def __init__(self) -> None:
        self.first_at: float | None = None

    def received(self, sig: int, at: float | None = None) -> Meaning:
        """What ``sig`` means; ``at`` is when it arrived (``time.monotonic()``), if it is handled later."""
        now = time.monotonic() if at is None else at
        if self.first_at is None:
            self.first_at = now
            return FIRST
        if now - self.first_at < REPEAT_WINDOW:
            logger.info(
                "%s again %.3fs after the first: the same stop (sent to the process group and forwarded)",
                signal.Signals(sig).name,
                now - self.first_at,
            )
            return REPEAT
        return FORCE
