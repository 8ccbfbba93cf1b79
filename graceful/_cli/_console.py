"""The console script ``graceful`` (and ``python -m graceful``).

``graceful drain`` in its common forms takes the preStop hook's fast path (``_prestop``), without
click; every other command line goes to the click CLI (``_main``). The process then ends at once
(``_prestop.finish``).
"""

from __future__ import annotations

import sys

from ._prestop import drain_without_click, finish

__all__ = ["console_main"]


def console_main() -> None:
    code = drain_without_click(sys.argv[1:])
    if code is None:
        from ._main import main

        code = main()
    finish(code)
