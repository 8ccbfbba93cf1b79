"""graceful: lossless rolling updates for LLM inference servers.

Wrap the ASGI app, and put ``graceful drain`` in the pod's preStop hook::

    from graceful import GracefulMiddleware

    app = GracefulMiddleware(
        inference_app,  # any ASGI app: Starlette, FastAPI, a vLLM-style server
        grace_period=120,  # the pod's terminationGracePeriodSeconds
    )

The docs are in the repository's ``docs/`` folder: ``docs/middleware.md`` has every option and
the Python API (``Drain`` for work that is not ASGI), ``docs/cli.md`` the command line and
``docs/resume.md`` the resuming transports.

The names below are imported on first use: ``graceful drain`` (a preStop hook, whose time
counts against the grace period) imports this package but not the middleware.
"""

from ._cli._prestop import TYPE_CHECKING, lazy_exports

__version__ = "0.1.0"

# Each public name is written once, here: type checkers read these imports, and ``lazy_exports`` reads
# the names off them (``_cli/_prestop.py``, where the preStop hook's tricks live, says how).
if TYPE_CHECKING or not lazy_exports(globals()):
    from ._asgi._frames import default_final_frame as default_final_frame
    from ._asgi._middleware import GracefulMiddleware as GracefulMiddleware
    from ._drain._budget import Budget as Budget
    from ._drain._budget import parse_duration as parse_duration
    from ._drain._errors import ConfigError as ConfigError
    from ._drain._ledger import NotAccepting as NotAccepting
    from ._drain._state import Drain as Drain
    from ._drain._status import DrainResult as DrainResult
    from ._drain._status import DrainStatus as DrainStatus
    from ._drain._status import State as State
    from ._resume._transport import AsyncResumingTransport as AsyncResumingTransport
    from ._resume._transport import ResumingTransport as ResumingTransport
