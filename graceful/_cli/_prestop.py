"""The preStop hook's fast path: ``graceful drain`` up to its request, and every speed trick of that process.

``graceful drain`` runs in a pod's preStop hook: its start-up counts against the grace period, and
the servers go unready only once its request reaches them. So what the hook does before it sends
that request lives here, with every trick that makes it quick, and nowhere else:

- its own reader of the common command lines (``read_args``), so that click is not imported; click
  reads anything else (``--help``, engine mode, a value that does not parse, options that make no
  drain) and says what is wrong as it always does;
- its own query encoding (``_query``): ``urllib.parse`` would import ``ipaddress`` and more;
- ``TYPE_CHECKING = False`` rather than ``typing``'s, whose import costs milliseconds; the package's
  ``__init__`` takes it from here, with its lazy exports (``lazy_exports``), so that importing the
  package imports none of its public names;
- ``os._exit`` once the answer is printed (``finish``): interpreter teardown (collecting every
  imported module) measured hundreds of ms on a busy node.

Before the request is sent, the hook imports the standard library, the console script (``_console``,
which hands every other command line to click), this module, and the homes of the rules it shares
with the servers, which import the standard library only: the durations and the budget rule
(``_drain._durations``, ``_drain._errors``), the variables' names (``_drain._names``), the admin
protocol and the search for sockets (``_admin._wire``, ``_admin._paths``). What follows the request
(reading the answers, the lines printed, the exit code) is ``_drain_client``'s, imported once the
request is on its way (or no socket was found). tests/cli/test_fast_path.py holds this.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from socket import socket as Socket
    from typing import Any, NoReturn

# ``import graceful`` imports this module (``lazy_exports``): what the drain uses from the package is
# imported in the functions that use it, not here.

__all__ = [
    "BOTH_SOCKETS",
    "OPTIONS",
    "TYPE_CHECKING",
    "UsageProblem",
    "drain_without_click",
    "finish",
    "lazy_exports",
    "read_args",
    "run_drain",
    "socket_dir_to_search",
]

BOTH_SOCKETS = "use --socket-dir or --socket, not both"


def finish(code: int) -> NoReturn:
    """End the process with ``code`` as soon as its output is out, without the interpreter's teardown."""
    # Flush the log handlers of a command that logged (``run`` loads logging with uvicorn); ``drain``
    # does not import logging at all.
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def drain_without_click(argv: list[str]) -> int | None:
    """The exit code of ``graceful drain ...``; None when click has to read the command line."""
    if argv[:1] != ["drain"]:
        return None
    args = read_args(argv[1:])
    if args is None:
        return None
    try:
        typed = any(word.partition("=")[0] == "--socket-dir" for word in argv[1:])
        args["socket_dir"] = socket_dir_to_search(args["socket_dir"], args["socket"], typed=typed)
        return run_drain(**args)
    except UsageProblem:
        return None  # nothing was sent yet: click reads it again and says what is wrong
    except KeyboardInterrupt:
        sys.stderr.write("\nAborted!\n")  # what click prints for Ctrl-C
        return 1


# -- The command line, read without click ---------------------------------------------------------

# The options read here, as the click command declares them: name -> takes a duration value (True),
# a path value (False) or no value (None, a flag). tests/cli/test_cli_drain.py holds this table to
# the click command and its durations to the drain's options, so the two readers cannot drift apart.
OPTIONS: dict[str, bool | None] = {
    "--socket-dir": False,
    "--socket": False,
    "--propagation-wait": True,
    "--propagation-quiet": True,
    "--timeout": True,
    "--grace-period": True,
    "--quiet": None,
    "-q": None,
    "--json": None,
}
_PARAMETER = {"-q": "quiet", "--json": "json_output"}


class UsageProblem(Exception):
    """The options make no drain (found before anything is sent to a server)."""


def read_args(argv: list[str], environ: Mapping[str, str] = os.environ) -> dict[str, Any] | None:
    """The keyword arguments of :func:`run_drain` for ``argv`` (after ``drain``), or None for click to read.

    None for anything but the options in ``OPTIONS`` written as ``--name value``, ``--name=value``
    or a flag, with values that parse; the caller then hands the command line to click.
    """
    from .._drain._durations import check_option
    from .._drain._errors import ConfigError
    from .._drain._names import variable

    args: dict[str, Any] = {
        "socket_dir": environ.get(variable("socket_dir")) or None,
        "socket": None,
        "propagation_wait": None,
        "propagation_quiet": None,
        "timeout": None,
        "grace_period": None,
        "quiet": False,
        "json_output": False,
    }
    position = 0
    while position < len(argv):
        word = argv[position]
        position += 1
        name, equals, value = word.partition("=")
        kind = OPTIONS.get(name, "unknown")
        if kind == "unknown":
            return None
        key = _PARAMETER.get(name) or name[2:].replace("-", "_")
        if kind is None:
            if equals:
                return None
            args[key] = True
            continue
        if not equals:
            if position == len(argv) or argv[position].startswith("-"):
                return None
            value = argv[position]
            position += 1
        if kind:
            try:
                args[key] = check_option(key, value)
            except ConfigError:
                return None
        elif value:
            args[key] = value
        else:
            return None
    return args


def socket_dir_to_search(socket_dir: str | None, socket: str | None, *, typed: bool) -> str | None:
    """The socket directory to search: None with ``--socket``, which wins over a directory that only the
    environment gave; both typed conflict (:class:`UsageProblem`). ``typed``: ``--socket-dir`` was on
    the command line."""
    from .._admin._paths import search_dir_problem
    from .._drain._names import variable

    if socket_dir and socket:
        if typed:
            raise UsageProblem(BOTH_SOCKETS)
        return None
    problem = search_dir_problem(socket_dir) if socket_dir else None
    if problem is not None:
        # A path that can never hold sockets is the user's to fix (exit 2), as with every command.
        given = "Invalid value for '--socket-dir':" if typed else f"environment variable {variable('socket_dir')}:"
        raise UsageProblem(f"{given} {socket_dir!r} {problem}")
    return socket_dir


# -- The drain, up to its request ----------------------------------------------------------------


def run_drain(
    *,
    socket_dir: str | None,
    socket: str | None,
    propagation_wait: float | None,
    propagation_quiet: float | None,
    timeout: float | None,
    grace_period: float | None,
    quiet: bool,
    json_output: bool,
) -> int:
    """Drain every worker and wait until nothing is in flight; returns the exit code.

    Raises :class:`UsageProblem` before it contacts any server when the options make no drain.
    """
    import math
    import time

    from .._admin._paths import NoServer, discover
    from .._admin._wire import DRAIN_SILENCE, METHODS, Broken, Route, Unreachable, drain_params, send
    from .._drain._durations import check_quiet, default_reserve, grace_seconds, judge_drain
    from .._drain._errors import ConfigError

    if socket_dir and socket:
        raise UsageProblem(BOTH_SOCKETS)
    given = {"propagation_wait": propagation_wait, "propagation_quiet": propagation_quiet, "timeout": timeout}
    try:
        if propagation_quiet is not None:
            # Checked here when both are given; against the server's own wait, the server answers.
            check_quiet(propagation_quiet, math.inf if propagation_wait is None else propagation_wait)
        if grace_period is not None or timeout is not None:
            # The preStop hook shares terminationGracePeriodSeconds with everything after it: the drain
            # gets grace_period - reserve at most (sent to the servers as the drain's timeout), judged by the
            # server's own rule before any server is contacted (the deadline would come before the
            # balancers have stopped sending).
            grace = None if grace_period is None else grace_seconds(grace_period)
            reserve = 0.0 if grace is None else default_reserve(grace)
            timeout = judge_drain(propagation_wait, grace=grace, reserve=reserve, drain_timeout=None, timeout=timeout)
    except ConfigError as exc:
        raise UsageProblem(str(exc.named("", _flag))) from None
    started = time.monotonic()
    # This drain's own options, as a worker already draining does not apply them (it keeps its drain's).
    given["grace_period"] = grace_period
    asked = [f"{_flag(option)} {value:g}s" for option, value in given.items() if value is not None]
    missing = None
    try:
        paths = discover(socket_dir, socket)
    except NoServer as exc:
        paths, missing = [], exc
    # The request, to every worker at once, before anything else is imported: each worker goes unready
    # as it reads it. A socket that cannot be reached, or takes no request, is the answer's reader's to tell.
    target = Route.DRAIN + "?" + _query(drain_params("cli", propagation_wait, propagation_quiet, timeout))
    opened: list[Socket] = []
    sent: dict[str, Socket | Exception] = {}
    for path in paths:
        try:
            sent[path] = send(path, METHODS[Route.DRAIN], target, DRAIN_SILENCE, opened)
        except (Unreachable, Broken) as exc:
            sent[path] = exc
    from ._drain_client import follow

    window = (propagation_wait, timeout)
    return follow(sent, opened, window, started, asked, quiet=quiet, json_output=json_output, missing=missing)


def _flag(option: str) -> str:
    """How the command line writes ``option``: ``--propagation-wait`` (``OPTIONS``'s flags say the same)."""
    return "--" + option.replace("_", "-")


# Left as they are in a query string (urllib.parse's always-safe set); every other byte is %XX.
_QUERY_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def _query(params: dict[str, str]) -> str:
    """``urllib.parse.urlencode(params)``, without importing urllib.parse (and ipaddress)."""

    def quote(text: str) -> str:
        return "".join(
            chr(byte) if byte in _QUERY_SAFE else "+" if byte == 0x20 else f"%{byte:02X}" for byte in text.encode()
        )

    return "&".join(f"{quote(key)}={quote(value)}" for key, value in params.items())


# -- The package's lazy exports -------------------------------------------------------------------


def lazy_exports(namespace: dict[str, Any]) -> bool:
    """Make the package whose globals are ``namespace`` import each public name on first use; returns
    whether it does.

    The package writes its public names once, as the imports of its block
    ``if TYPE_CHECKING or not lazy_exports(globals()):``. Type checkers read that block; at run time
    the names are read off it with ``ast`` when one is first asked for (``graceful drain`` imports the
    package and never asks). Without the package's source (an install of byte-code only) there is
    nothing to read: this returns False and the block imports every name at once. ``__all__`` and
    ``dir()`` list the names either way.
    """
    package = namespace["__name__"]
    loader = namespace["__loader__"]
    lazy: bool = str(namespace.get("__file__", "")).endswith(".py")
    homes: dict[str, tuple[str, str]] = {}  # public name -> (module, name in it)
    # Imported for the block only: neither is a public name.
    namespace.pop("TYPE_CHECKING", None)
    namespace.pop("lazy_exports", None)

    def public() -> dict[str, tuple[str, str]]:
        if homes:
            return homes
        if lazy:
            import ast

            for node in ast.parse(loader.get_source(package)).body:
                if isinstance(node, ast.If) and _the_block(node.test):
                    for stmt in node.body:
                        if isinstance(stmt, ast.ImportFrom):
                            module = "." * stmt.level + (stmt.module or "")
                            homes.update({alias.asname or alias.name: (module, alias.name) for alias in stmt.names})
        else:  # the block has run: its names are the ones imported from the package's own modules
            for name, value in list(namespace.items()):
                home = getattr(value, "__module__", None)
                if isinstance(home, str) and home.startswith(package + ".") and not name.startswith("_"):
                    homes[name] = (home, name)
        return homes

    def __getattr__(name: str) -> object:
        if name == "__all__":
            value: object = sorted(public())
        elif name in public():
            from importlib import import_module

            module, attribute = homes[name]
            value = getattr(import_module(module, package), attribute)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *public(), "__all__"})

    namespace["__getattr__"] = __getattr__
    namespace["__dir__"] = __dir__
    return lazy


def _the_block(test: object) -> bool:
    """Whether an ``if`` statement's test is ``TYPE_CHECKING or ...``: the block of public names."""
    import ast

    return (
        isinstance(test, ast.BoolOp)
        and isinstance(test.op, ast.Or)
        and isinstance(test.values[0], ast.Name)
        and test.values[0].id == "TYPE_CHECKING"
    )
