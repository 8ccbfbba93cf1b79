"""What the click commands share: the duration parameter type and the one way a usage error ends."""

from __future__ import annotations

from typing import Any, NoReturn

import click

from .._drain._durations import parse_duration
from .._drain._errors import ConfigError
from ._servers import EXIT_USAGE

__all__ = ["DURATION", "Duration", "fail"]


class Duration(click.ParamType[float]):
    """``10s``, ``1.5s``, ``500ms``, ``2m``, ``1m30s`` or a bare number of seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_duration(value, name=param.name if param and param.name else "duration")
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()


def fail(ctx: click.Context, message: str) -> NoReturn:
    """A usage error: one line on stderr, exit 2."""
    click.echo(f"graceful: {message}", err=True)
    ctx.exit(EXIT_USAGE)
