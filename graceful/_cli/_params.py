"""What the click commands share: the duration parameter type, the options read from the environment,
and the one way a usage error ends."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from .._drain._durations import parse_duration
from .._drain._errors import ConfigError
from .._drain._names import variable
from ._servers import EXIT_USAGE

__all__ = ["DURATION", "Duration", "FromEnv", "fail", "socket_dir_option"]


class Duration(click.ParamType[float]):
    """``10s``, ``1.5s``, ``500ms``, ``2m``, ``1m30s`` or a bare number of seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        name = param.name if param and param.name else "duration"
        try:
            return parse_duration(value, name=name)
        except ConfigError as exc:
            # click names the flag as typed ("Invalid value for '--timeout'"): the rest is the reason.
            self.fail(str(exc).removeprefix(f"{name}: "), param, ctx)


DURATION = Duration()


class FromEnv(click.Option):
    """An option whose value may come from the environment: its help ends with the value in force and
    where it comes from, read when the help is shown (``[in force: 5s, from GRACEFUL_PROPAGATION_WAIT]``,
    else ``[default: 0; env GRACEFUL_PROPAGATION_WAIT]``). ``variables`` are read in order; ``default_text``
    says the default in words; ``scope`` names when the variables apply (``engine mode``)."""

    def __init__(
        self, *args: Any, variables: Sequence[str] = (), default_text: str = "", scope: str = "", **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.variables = tuple(variables)
        self.shown = default_text
        self.scope = f"{scope}: " if scope else ""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        if record is None:  # pragma: no cover - hidden options are not used here
            return None
        names, text = record
        return names, f"{text} {self.in_force()}".strip()

    def in_force(self) -> str:
        """The value in force now and its source, or the default and the variables that would set it."""
        for var in self.variables:
            raw = os.environ.get(var, "").strip()
            if raw:
                return f"[{self.scope}in force: {raw}, from {var}]"
        return f"[{self.scope}default: {self.shown}; env {' or '.join(self.variables)}]"


def fail(ctx: click.Context, message: str) -> NoReturn:
    """A usage error: one line on stderr in the command's voice (``graceful run: ...``, whatever the
    CLI that embeds the command is called), exit 2."""
    click.echo(f"graceful {ctx.info_name}: {message}", err=True)
    ctx.exit(EXIT_USAGE)


# Where the worker sockets are: every command that talks to graceful servers, and graceful run's own.
socket_dir_option = click.option(
    "--socket-dir",
    cls=FromEnv,
    envvar=variable("socket_dir"),
    variables=(variable("socket_dir"),),
    default_text="<tmp>/graceful-<uid>",
    type=click.Path(file_okay=False),
    help="Directory of the worker sockets.",
)
