"""What the click commands share: the duration parameter type, the flags generated from the option fields,
the options read from the environment, and the one way a usage error ends."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import click
from click.core import ParameterSource
from click.decorators import FC

from .._admin._paths import LONGEST_PID, socket_dir_problem
from .._drain._durations import check_option
from .._drain._environ import Env, help_text
from .._drain._errors import ConfigError
from .._drain._names import variable
from ._drain_client import EXIT_USAGE
from ._prestop import UsageProblem, socket_dir_to_search

__all__ = [
    "DURATION",
    "ENGINES",
    "DurationParam",
    "FromEnv",
    "fail",
    "judge_flag",
    "option_flag",
    "run_socket_dir",
    "search_dir",
    "socket_dir_option",
    "socket_option",
]


# The engines whose presets `graceful drain --engine` and `graceful advise --engine` know.
ENGINES = ("vllm", "sglang", "tgi", "triton")


class DurationParam(click.ParamType[float]):
    """The click type of a duration flag: ``10s``, ``1.5s``, ``500ms``, ``2m``, ``1m30s`` or a bare number of
    seconds, held to the rule of the option it sets (``check_option``: a flag's parameter is named after its
    option: ``--grace-period``, ``grace_period``)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return check_option(param.name if param and param.name else "", value)
        except ConfigError as exc:
            # click names the flag as typed ("Invalid value for '--timeout'"): the error says the value and the fix.
            self.fail(str(exc), param, ctx)


DURATION = DurationParam()


class _Read(click.ParamType[Any]):
    """The click type of a flag whose option is neither a duration nor a boolean: its variable's reader."""

    name = "value"

    def __init__(self, env: Env) -> None:
        self.read = env.kind.read

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.read(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


def option_flag(option: str, field: tuple[Any, Env], *, flag: str = "", **kwargs: Any) -> Callable[[FC], FC]:
    """The flag of an option, generated from the field that declares it (``field``: its default and its ``Env``):
    spelled ``--option-name`` (or ``flag``, its parameter named after it: the drain's own ``--timeout``), a
    duration's type or a boolean's ``--x/--no-x`` pair, no default of its own (where the value is used, the
    field's applies), and the field's help, the documentation's meaning (``help_text``)."""
    default, env = field
    spelled = flag or "--" + option.replace("_", "-")
    name = spelled.removeprefix("--").replace("-", "_")
    if isinstance(default, bool):
        declared = f"{spelled}/--no-{spelled.removeprefix('--')}"
    else:
        declared = spelled
        kind = env.kind
        kwargs.setdefault(
            "type", DURATION if kind.seconds else click.Choice(kind.choices) if kind.choices else _Read(env)
        )
    return click.option(declared, name, default=None, help=help_text(env), **kwargs)


def judge_flag(
    option: str, field: tuple[Any, Env], *, flag: str = "", instead: str = "the server's"
) -> Callable[[FC], FC]:
    """``graceful advise``'s what-if flag of an option, from its field: "Judge this <option> instead of
    ``instead``: <its help>". A duration is taken as typed (``run_advise`` reads it, naming the flag)."""
    default, env = field
    spelled = flag or "--" + option.replace("_", "-")
    name = spelled.removeprefix("--").replace("-", "_")
    noun = env.noun or option.replace("_", " ")
    text = help_text(env)
    judge = f"Judge this {noun} instead of {instead}: {text[:1].lower()}{text[1:]}"
    if isinstance(default, bool):
        return click.option(f"{spelled}/--no-{spelled.removeprefix('--')}", name, default=None, help=judge)
    return click.option(spelled, name, default=None, metavar="DURATION", help=judge)


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


def run_socket_dir(ctx: click.Context, value: str | None) -> str | None:
    """``--socket-dir`` (or ``GRACEFUL_SOCKET_DIR``) as ``graceful run`` takes it: its server makes the
    directory, so the server's rules (``socket_dir_problem``) apply at once, before the app is loaded, with
    the flag or the variable named as the user gave it; a typed relative path is taken from the current
    directory. The commands that search the directory check it where they know ``--socket`` too
    (``socket_dir_to_search``). Called from the command, not as the option's callback: click before 8.5
    records where a value came from only after its callback has run."""
    if value is None:
        return value
    typed = ctx.get_parameter_source("socket_dir") is ParameterSource.COMMANDLINE
    path = os.path.abspath(value) if typed else value
    problem = socket_dir_problem(path, pid=LONGEST_PID)  # a worker's pid may be any
    if problem is None:
        return path
    if typed:
        param = next(param for param in ctx.command.params if param.name == "socket_dir")
        raise click.BadParameter(f"{value!r} {problem}", ctx, param)
    fail(ctx, f"environment variable {variable('socket_dir')}: {value!r} {problem}")


# Where the worker sockets are: every command that talks to graceful servers, and graceful run's own.
socket_dir_option = click.option(
    "--socket-dir",
    cls=FromEnv,
    envvar=variable("socket_dir"),
    variables=(variable("socket_dir"),),
    default_text="<tmp>/graceful-<uid>",
    type=click.Path(),
    metavar="DIRECTORY",
    help="Directory of the worker sockets.",
)


# One socket instead of the directory: every command that talks to graceful servers.
socket_option = click.option("--socket", type=click.Path(dir_okay=False), help="Talk to this one socket only.")


def search_dir(ctx: click.Context, socket_dir: str | None, socket: str | None) -> str | None:
    """The socket directory to search, or None with ``--socket``: both flags typed conflict (exit 2), while
    ``--socket`` wins over a directory that only the environment gave."""
    typed = ctx.get_parameter_source("socket_dir") is ParameterSource.COMMANDLINE
    try:
        return socket_dir_to_search(socket_dir, socket, typed=typed)
    except UsageProblem as exc:
        fail(ctx, str(exc))
