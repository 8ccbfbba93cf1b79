"""Where admin sockets live: shared by the server end and the client end of the admin protocol.

Kept tiny on purpose: ``graceful drain`` imports it on the preStop path.
"""

from __future__ import annotations

import os

from .._drain._errors import ConfigError

__all__ = ["MAX_PATH", "default_socket_dir", "socket_path"]

MAX_PATH = 107  # sun_path is 108 bytes on Linux, including the terminating NUL


def default_socket_dir() -> str:
    """``$GRACEFUL_SOCKET_DIR``, else ``<tempdir>/graceful-<uid>`` (``/tmp/graceful-0`` for root)."""
    configured = os.environ.get("GRACEFUL_SOCKET_DIR", "").strip()
    if configured:
        return configured
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
