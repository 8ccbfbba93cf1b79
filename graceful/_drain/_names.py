"""How an option's environment variable is named: ``GRACEFUL_`` and the option's name in capitals.

Its own module so that the preStop hook (``graceful drain``), which reads ``GRACEFUL_SOCKET_DIR``,
loads the rule without the option declarations (``_environ``).
"""

from __future__ import annotations

__all__ = ["PREFIX", "variable"]

PREFIX = "GRACEFUL_"


def variable(option: str) -> str:
    """The variable that sets ``option``: ``variable("socket_dir") == "GRACEFUL_SOCKET_DIR"``."""
    return PREFIX + option.upper()
