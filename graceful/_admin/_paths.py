"""Where admin sockets live: shared by the server end and the client end of the admin protocol.

Kept tiny on purpose: ``graceful drain`` imports it on the preStop path.
"""

from __future__ import annotations

import os
import stat

from .._drain._errors import ConfigError

__all__ = ["MAX_PATH", "SOCKET_MODE", "default_socket_dir", "socket_dir_problem", "socket_path"]

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


def socket_dir_problem(socket_dir: str) -> str | None:
    """What already rules ``socket_dir`` out for admin sockets, worded to follow its name and value, or
    None. Read before startup (when the middleware is built), so that the startup, which makes the
    directory (``prepare_socket_dir``), does not fail for a reason known earlier; a directory that does
    not exist yet is fine when it can be made there."""
    size = len(os.fsencode(os.path.join(socket_dir, f"{os.getpid()}.sock")))
    if size > MAX_PATH:
        return (
            f"is too long: a socket in it would be {size} bytes, over the {MAX_PATH}-byte Unix socket limit; "
            "choose a shorter directory such as /tmp/graceful"
        )
    try:
        info = os.lstat(socket_dir)  # as prepare_socket_dir reads it: a symbolic link is not a directory
    except (FileNotFoundError, NotADirectoryError):  # not there, or a parent is not a directory
        return _cannot_make(socket_dir)
    except OSError as exc:
        return f"cannot be read ({exc.strerror}); choose a directory of your own"
    if not stat.S_ISDIR(info.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "a file"
        return f"is {kind}, not a directory; choose a directory (it is made at startup if it does not exist)"
    if info.st_uid != os.getuid():
        return f"belongs to uid {info.st_uid}, not to this user ({os.getuid()}); choose a directory of your own"
    return None


def _cannot_make(socket_dir: str) -> str | None:
    """Why startup could not make the missing ``socket_dir``, from its nearest existing parent, or None."""
    parent = os.path.dirname(os.path.abspath(socket_dir))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"cannot be made: {parent} is not a directory; choose a directory whose parent is one"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be made: {parent} is not writable by this user; choose a directory of your own"
    return None
