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

# typing's import costs the preStop hook milliseconds; mypy reads the block below anyway.
TYPE_CHECKING = False

__version__ = "0.1.0"

_homes: dict[str, str] = {}  # each public name's module, read off the block below on first use


def _public() -> dict[str, str]:
    """Each public name is written once, in the block below: type checkers read its imports, and
    this reads them as text (``ast`` and ``inspect`` would cost the preStop hook milliseconds).
    Without the source (an install of bytecode only) the block has imported every name at once."""
    if _homes:
        return _homes
    if __file__.endswith(".py"):
        source = globals()["__loader__"].get_data(__file__).decode()
        block = source.partition('\nif TYPE_CHECKING or not __file__.endswith(".py"):\n')[2]
        for line in block.partition("\n\n")[0].splitlines():  # from <module> import <name> as <name>
            words = line.split()
            _homes[words[3]] = words[1]
    else:
        for name, value in list(globals().items()):
            if getattr(value, "__module__", "").startswith(__name__ + "."):
                _homes[name] = value.__module__
    return _homes


if TYPE_CHECKING or not __file__.endswith(".py"):
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


def __getattr__(name: str) -> object:
    # ``__all__`` is made here: type checkers would read one computed at the top level as empty.
    if name == "__all__":
        value: object = sorted(_public())
    elif name in _public():
        from importlib import import_module

        value = getattr(import_module(_homes[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_public(), "__all__"})
