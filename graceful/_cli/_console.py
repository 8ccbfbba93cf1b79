"""The ``graceful`` console script (and ``python -m graceful``): exit as soon as the work is done.

A preStop hook's start-up and exit count against the grace period. ``graceful drain`` in its
common forms runs without importing click (see ``_servers``); every other command line goes
to the click CLI. Interpreter teardown (collecting every imported module) measured hundreds of
ms on a busy node, and the answer is already printed by then, so the script skips it.
"""

from __future__ import annotations

import os
import sys

# typing's import costs the preStop hook milliseconds; mypy reads the annotations anyway.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

__all__ = ["console_main"]


def console_main() -> NoReturn:
    code = _drain_without_click(sys.argv[1:])
    if code is None:
        from ._main import main

        code = main()
    # Flush the log handlers of a command that logged (``run`` loads logging with uvicorn); ``drain``
    # does not import logging at all, to keep the hook's start-up short.
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _drain_without_click(argv: list[str]) -> int | None:
    """The exit code of ``graceful drain ...``; None when click has to read the command line."""
    if argv[:1] != ["drain"]:
        return None
    from ._servers import UsageProblem, read_args, run_drain, socket_dir_to_search

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
