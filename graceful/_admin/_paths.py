"""Where admin sockets live: shared by the server end and the client end of the admin protocol.

Kept tiny on purpose: ``graceful drain`` imports it on the preStop path.
"""

from __future__ import annotations

import os

from .._drain._errors import ConfigError

__all__ = ["MAX_PATH", "SOCKET_MODE", "default_socket_dir", "socket_path"]

MAX_PATH = 107  # sun_path is 108 bytes on Linux, including the terminating NUL
SOCKET_MODE = 0o600  # owner only: the default of the middleware's socket_mode (0o660 lets the group in)


def default_socket_dir() -> str:
    """``<tempdir>/graceful-<uid>`` (``/tmp/graceful-0`` for root): where sockets live when no directory
    is configured (``socket_dir``, ``--socket-dir``, ``GRACEFUL_SOCKET_DIR``, read by the callers)."""
    import tempfile  # only here: it costs the preStop hook a few ms when the directory is given

    return os.path.join(tempfile.gettempdir(), f"graceful-{os.getuid()}")


def socket_path(socket_dir: str, pid: int) -> str:
    path = os.path.join(socket_dir, f"{pid}.sock")
    size = len(os.fsencode(path))
    if size > MAX_PATH:
        raise ConfigError(
            f"admin socket path {path!r} is {size} bytes, over the {MAX_PATH}-byte Unix socket limit; "
            "set --socket-dir / GRACEFUL_SOCKET_DIR to a shorter directory such as /tmp/graceful"
        )
    return path
