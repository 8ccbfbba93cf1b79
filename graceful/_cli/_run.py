"""``graceful run``: an app under uvicorn, draining on SIGTERM (loaded only when asked for).

Its drain flags are the drain options (``graceful/_drain/_options.py``); their help says each one's
variable and default as the declarations state them. A flag given sets its option's variable for the
app (``graceful/_serve/_launcher.py``, ``serve``): it fills what the app's code left unset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource
from click.decorators import FC

from .._drain._environ import shown_default, variable
from .._drain._errors import ConfigError
from .._drain._options import DRAIN_DECLARED
from ._params import FromEnv, fail, option_flag, run_socket_dir, socket_dir_option

if TYPE_CHECKING:
    from .._serve._load import Flag

__all__ = ["run_command"]

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
# Above the 60 s for which nginx, AWS ALB and most gateways keep an idle upstream
# connection: a server that closes first races the balancer's next request on it (a 502).
DEFAULT_KEEP_ALIVE = 75
EXIT_CANNOT_START = 3  # as uvicorn's own exit when its startup fails


# Where each drain flag's text, as typed, is kept in the click context's meta (by option).
_TYPED = "graceful.run.typed"


class _DrainFlag(FromEnv):
    """A drain option's flag, which keeps the text typed: messages quote it, and its variable is set to it."""

    def process_value(self, ctx: click.Context, value: Any) -> Any:
        if isinstance(value, str):
            ctx.meta.setdefault(_TYPED, {})[self.name] = value
        return super().process_value(ctx, value)


# The drain options that graceful run takes as flags, in the order of its --help.
FLAGS = (
    "grace_period",
    "propagation_wait",
    "propagation_quiet",
    "drain_timeout",
    "reserve",
    "admit_during_propagation",
    "handoff_streams",
    "admission",
)


def _drain_flags(command: FC) -> FC:
    """The drain options' flags, from their fields (``option_flag``): the help is the documentation's meaning
    and ends with the value in force, from the option's variable or its declared default (``FromEnv``)."""
    for option in reversed(FLAGS):
        field = DRAIN_DECLARED[option]
        flag = option_flag(
            option, field, cls=_DrainFlag, variables=(variable(option),), default_text=shown_default(*field)
        )
        command = flag(command)
    return command


@click.command("run")
@click.argument("app")
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind to this address.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Bind to this port.")
@click.option("--uds", default=None, help="Bind to this Unix socket instead of host and port.")
@click.option(
    "--app-dir",
    type=click.Path(exists=True, file_okay=False),
    default=".",
    show_default=True,
    help="Look for APP's module in this directory first (as uvicorn does): the current one by default.",
)
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, help="Worker processes.")
@socket_dir_option
@_drain_flags
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
    from .._serve._launcher import CannotListen, serve  # uvicorn is only needed here: keep `graceful drain` quick

    # What goes to uvicorn.Config rather than to the drain.
    server: dict[str, Any] = {key: values.pop(key) for key in ("host", "port", "uds")}
    server["timeout_keep_alive"] = timeout_keep_alive
    values["socket_dir"] = run_socket_dir(ctx, values["socket_dir"])
    try:
        code = serve(app, _flags(ctx, values), app_dir=app_dir, workers=workers, log_level=log_level, **server)
    except ConfigError as exc:
        fail(ctx, str(exc))
    except CannotListen as exc:
        click.echo(f"graceful {ctx.info_name}: {exc}", err=True)
        ctx.exit(EXIT_CANNOT_START)
    ctx.exit(code)


def _flags(ctx: click.Context, values: dict[str, Any]) -> list[Flag]:
    """The drain flags given on the command line (``--socket-dir`` included; not from its variable), each
    with its text as typed."""
    from .._serve._load import Flag

    typed: dict[str, str] = ctx.meta.get(_TYPED, {})
    flags = []
    for name, value in values.items():
        if value is None or ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(Flag(name, value, flag if value else flag.replace("--", "--no-", 1), "1" if value else "0"))
        else:
            text = typed.get(name, str(value))
            flags.append(Flag(name, value, f"{flag} {text}", value if name == "socket_dir" else text))
    return flags
