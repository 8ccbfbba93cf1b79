"""Where admin sockets live: shared by the server end and the client end of the admin protocol.

The directory's rules, the making of a server's directory and the search for the servers' sockets
(``discover``). ``graceful drain`` searches before it sends its request, so this module imports the
standard library only.
"""

from __future__ import annotations

import os
import stat

from .._drain._errors import ConfigError

__all__ = [
    "DEFAULT_DIR",
    "LONGEST_PID",
    "MAX_PATH",
    "SOCKET_MODE",
    "NoServer",
    "default_socket_dir",
    "discover",
    "prepare_socket_dir",
    "search_dir_problem",
    "socket_dir_problem",
    "socket_path",
]

MAX_PATH = 107  # sun_path is 108 bytes on Linux, including the terminating NUL
SOCKET_MODE = 0o600  # owner only: the default of the middleware's socket_mode (0o660 lets the group in)
LONGEST_PID = 4194304  # Linux's pid_max limit: the longest <pid>.sock a worker of a launcher can have
# How a message names the directory when nothing set it, and how to choose another.
DEFAULT_DIR = "the default socket directory (set GRACEFUL_SOCKET_DIR to choose another)"


def default_socket_dir() -> str:
    """``<tempdir>/graceful-<uid>`` (``/tmp/graceful-0`` for root): where sockets live when no directory
    is configured (``socket_dir``, ``--socket-dir``, ``GRACEFUL_SOCKET_DIR``, read by the callers)."""
    import tempfile  # only here: it costs the preStop hook a few ms when the directory is given

    return os.path.join(tempfile.gettempdir(), f"graceful-{os.getuid()}")


class NoServer(Exception):
    """No socket found, or nothing listening on any of them (CLI exit code 3)."""


def discover(socket_dir: str | None = None, socket: str | None = None) -> list[str]:
    """The socket paths to talk to: ``socket`` alone, or every ``*.sock`` in the directory."""
    if socket is not None:
        return [socket]
    directory = socket_dir or default_socket_dir()
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise NoServer(f"no graceful server found: cannot read socket dir {directory!r} ({exc.strerror})") from None
    paths = []
    for name in names:
        path = os.path.join(directory, name)
        if name.endswith(".sock") and stat.S_ISSOCK(os.lstat(path).st_mode):
            paths.append(path)
    if not paths:
        raise NoServer(
            f"no graceful server found: no sockets in {directory!r}; "
            "is the server running with the same --socket-dir / GRACEFUL_SOCKET_DIR?"
        )
    return paths


def socket_path(socket_dir: str, pid: int) -> str:
    path = os.path.join(socket_dir, f"{pid}.sock")
    size = len(os.fsencode(path))
    if size > MAX_PATH:
        raise ConfigError(
            f"admin socket path {path!r} is {size} bytes, over the {MAX_PATH}-byte Unix socket limit; "
            "set --socket-dir / GRACEFUL_SOCKET_DIR to a shorter directory such as /tmp/graceful"
        )
    return path


def socket_dir_problem(socket_dir: str, *, look: bool = True, pid: int | None = None) -> str | None:
    """What already rules ``socket_dir`` out for a server's admin sockets, worded to follow its name and
    value, or None. Read before startup (when the middleware is built, by ``graceful run`` for its
    ``--socket-dir``) and again by the startup that makes the directory (``prepare_socket_dir``), so that
    it does not fail for a reason known earlier; a directory that does not exist yet is fine when it can be
    made there. ``look=False`` leaves out what needs the file system; ``pid`` is the worker's (this
    process's by default)."""
    if not os.path.isabs(socket_dir):
        # The server and the preStop hook would each read it from their own working directory.
        return "is a relative path; use an absolute one, such as /tmp/graceful"
    size = len(os.fsencode(os.path.join(socket_dir, f"{os.getpid() if pid is None else pid}.sock")))
    if size > MAX_PATH:
        return (
            f"is too long: a socket in it would be {size} bytes, over the {MAX_PATH}-byte Unix socket limit; "
            "choose a shorter directory such as /tmp/graceful"
        )
    if not look:
        return None
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


def prepare_socket_dir(socket_dir: str, *, group: bool = False, name: str = "socket_dir") -> None:
    """Create the directory private to this user (0700, or 0750 for group access), or refuse it, naming it
    as the user gave it (``name``: ``socket_dir``, ``environment variable GRACEFUL_SOCKET_DIR``)."""
    mode = 0o750 if group else 0o700
    problem = socket_dir_problem(socket_dir)
    if problem is None:
        try:
            os.makedirs(socket_dir, mode=mode, exist_ok=True)
        except OSError as exc:
            # What no look could foresee (root making a directory under /proc, a full disk).
            problem = f"cannot be made ({exc.strerror}); choose a directory this user can make, such as /tmp/graceful"
        else:
            problem = socket_dir_problem(socket_dir)  # what is there now: another process may have put a file
    if problem is not None:
        raise ConfigError(f"{name}: {socket_dir!r} {problem}")
    if stat.S_IMODE(os.lstat(socket_dir).st_mode) != mode:
        os.chmod(socket_dir, mode)


def search_dir_problem(socket_dir: str) -> str | None:
    """What rules ``socket_dir`` out for the commands that look for sockets in it (``graceful drain``,
    ``status``...), worded as ``socket_dir_problem``'s, or None: a path that is no directory and can never
    be one. A directory that does not exist (yet) is no such problem: no server is found there."""
    try:
        info = os.stat(socket_dir)  # as os.listdir reads it: a link to a directory is one
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return f"cannot be a directory: {_nearest(socket_dir)} is a file; use the directory of the worker sockets"
    except OSError:
        return None  # unreadable: the search says so, as no server found
    if not stat.S_ISDIR(info.st_mode):
        return "is a file, not a directory; use the directory of the worker sockets"
    return None


def _cannot_make(socket_dir: str) -> str | None:
    """Why startup could not make the missing ``socket_dir``, from its nearest existing parent, or None."""
    parent = _nearest(socket_dir)
    if not os.path.isdir(parent):
        return f"cannot be made: {parent} is not a directory; choose a directory whose parent is one"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be made: {parent} is not writable by this user; choose a directory of your own"
    return None


def _nearest(socket_dir: str) -> str:
    """The nearest parent of the missing ``socket_dir`` that exists."""
    parent = os.path.dirname(os.path.abspath(socket_dir))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    return parent
