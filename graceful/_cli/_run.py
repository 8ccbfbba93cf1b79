"""``graceful run``: an app under uvicorn, draining on SIGTERM (loaded only when asked for).

Its drain flags are the drain options (``graceful/_drain/_options.py``); their help says each one's
variable and default as the declarations state them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource
from click.decorators import FC

from .._drain._environ import shown_default, variable
from .._drain._errors import ConfigError
from .._drain._options import DRAIN_DECLARED
from ._params import DURATION, FromEnv, fail, socket_dir_option

__all__ = ["run_command"]

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
# Above the 60 s for which nginx, AWS ALB and most gateways keep an idle upstream
# connection: a server that closes first races the balancer's next request on it (a 502).
DEFAULT_KEEP_ALIVE = 75


def _drain_flag(flag: str, text: str, **kwargs: Any) -> Callable[[FC], FC]:
    """A drain option's flag: its help ends with the value in force, from its variable or its declared
    default (``FromEnv``)."""
    option = flag.split("/")[0].removeprefix("--").replace("-", "_")
    default, env = DRAIN_DECLARED[option]
    return click.option(
        flag,
        cls=FromEnv,
        default=None,
        variables=(variable(option),),
        default_text=shown_default(default, env),
        help=text,
        **kwargs,
    )


@click.command("run")
@click.argument("app")
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind to this address.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Bind to this port.")
@click.option("--uds", default=None, help="Bind to this Unix socket instead of host and port.")
@click.option(
    "--app-dir",
    default=".",
    show_default=True,
    help="Look for APP's module in this directory first (as uvicorn does): the current one by default.",
)
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, help="Worker processes.")
@socket_dir_option
@_drain_flag("--grace-period", "The pod's terminationGracePeriodSeconds.", type=DURATION)
@_drain_flag("--propagation-wait", "Keep serving this long after going unready.", type=DURATION)
@_drain_flag(
    "--propagation-quiet", "End the propagation wait once no new request has come for this long.", type=DURATION
)
@_drain_flag("--drain-timeout", "Cap on the drain, below grace period - reserve.", type=DURATION)
@_drain_flag("--reserve", "Part of the grace period kept for exit.", type=DURATION)
@_drain_flag(
    "--admit-during-propagation/--no-admit-during-propagation",
    "Serve new requests until the propagation wait ends (--no-...: refuse them from the drain's start).",
)
@_drain_flag(
    "--handoff-streams/--no-handoff-streams",
    "After the propagation wait, end resumable SSE streams for their clients to continue elsewhere.",
)
@click.option(
    "--timeout-keep-alive",
    type=click.IntRange(min=1, max=24 * 3600),
    default=DEFAULT_KEEP_ALIVE,
    show_default=True,
    help="Seconds an idle keep-alive connection stays open; keep it above the balancer's idle timeout.",
)
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default="info", show_default=True)
@click.pass_context
def run_command(
    ctx: click.Context,
    /,
    app: str,
    app_dir: str,
    workers: int,
    log_level: str,
    timeout_keep_alive: int,
    **values: Any,
) -> None:
    """Run APP (module:attr) under uvicorn, draining on SIGTERM."""
    from .._serve._server import serve  # uvicorn is only needed here: keep `graceful drain` quick to start

    sys.path.insert(0, app_dir)  # as uvicorn's --app-dir: `graceful run myapp:app` finds ./myapp.py

    # What goes to uvicorn.Config rather than to the drain.
    server: dict[str, Any] = {key: values.pop(key) for key in ("host", "port", "uds")}
    server["timeout_keep_alive"] = timeout_keep_alive
    options = {k: v for k, v in values.items() if v is not None}
    explicit = frozenset(name for name in values if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT)
    try:
        code = serve(app, options, explicit, workers=workers, log_level=log_level, **server)
    except ConfigError as exc:
        fail(ctx, str(exc))
    ctx.exit(code)
