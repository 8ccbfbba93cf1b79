"""The ``graceful`` command line: drain, status, resume, run and advise.

Exit codes: 0 done, 1 the deadline passed with work left (or a worker failed),
2 usage or configuration error, 3 no server found.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from .._admin._client import NoServer, discover, request_all
from .._admin._wire import Field, Route, Value
from .._drain._budget import BUDGET_DECLARED
from .._drain._environ import shown_default
from .._drain._names import variable
from ._drain_client import EXIT_NO_SERVER
from ._params import (
    DURATION,
    ENGINES,
    FromEnv,
    fail,
    option_flag,
    search_dir,
    socket_dir_option,
    socket_option,
)
from ._prestop import UsageProblem, run_drain

__all__ = ["cli", "drain_command", "main"]


class _Commands(click.Group):
    """Loads ``run``, ``advise`` and ``soak`` only when they are asked for: the preStop hook must not pay for
    their imports."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), "advise", "run", "soak"])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "advise":
            from ._advise import advise_command

            return advise_command
        if cmd_name == "soak":
            from ._soak import soak_command

            return soak_command
        if cmd_name == "run":
            from ._run import run_command

            return run_command
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="graceful-drain", prog_name="graceful", message="%(prog)s %(version)s")
def cli() -> None:
    """Take an inference server out of service without losing a request."""


# The drain command's options that only engine mode reads.
ENGINE_ONLY = ("engine", "metrics_url", "metrics", "interval", "idle_reads", "kv_buffer")


@cli.command("drain")
@socket_dir_option
@socket_option
# The budget's flags, from its fields (their help is the documentation's meaning). The drain's own --timeout
# is an upper bound on this drain, as drain_timeout is on every drain. Against servers the servers' own
# budget applies; engine mode reads the hook's environment for --timeout and --grace-period.
@option_flag("propagation_wait", BUDGET_DECLARED["propagation_wait"])
@option_flag("propagation_quiet", BUDGET_DECLARED["propagation_quiet"])
@option_flag(
    "drain_timeout",
    BUDGET_DECLARED["drain_timeout"],
    flag="--timeout",
    cls=FromEnv,
    variables=("DRAIN_TIMEOUT",),
    default_text="none",
    scope="engine mode",
)
@option_flag(
    "grace_period",
    BUDGET_DECLARED["grace_period"],
    cls=FromEnv,
    variables=(variable("grace_period"), "GRACE_SECONDS"),
    default_text=shown_default(*BUDGET_DECLARED["grace_period"]),
    scope="engine mode",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr.")
@click.option("--json", "json_output", is_flag=True, help="Print the outcome as JSON on stdout.")
@click.option("--engine", type=click.Choice(ENGINES), default=None, help="Drain an inference engine by its metrics.")
@click.option("--metrics-url", default=None, metavar="URL", help="Engine metrics endpoint (Prometheus text).")
@click.option(
    "--metric", "metrics", multiple=True, metavar="NAME", help='In-flight metric: NAME or NAME{label="v"}; repeatable.'
)
@click.option("--interval", type=DURATION, default="1s", show_default=True, help="Engine metrics poll interval.")
@click.option("--idle-reads", type=click.IntRange(min=1), default=2, show_default=True, help="Zero reads in a row.")
@click.option("--kv-buffer", type=DURATION, default="0", show_default=True, help="Extra wait after the engine idles.")
@click.pass_context
def drain_command(ctx: click.Context, /, **options: Any) -> None:
    """Drain every worker and wait until nothing is in flight (for a preStop hook)."""
    engine = {name: options.pop(name) for name in ENGINE_ONLY}
    options["socket_dir"] = search_dir(ctx, options["socket_dir"], options["socket"])
    if engine["engine"] is not None or engine["metrics_url"] is not None or engine["metrics"]:
        if options["propagation_quiet"] is not None:
            fail(ctx, "--propagation-quiet needs a graceful server to see the requests; drop it with --engine")
        # Engine mode reads the hook's environment itself (kthena's names bring their 70% rule): raw options.
        from ._engine_drain import run_engine_drain

        budget = {name: options[name] for name in ("timeout", "grace_period", "quiet", "json_output")}
        ctx.exit(run_engine_drain(**engine, **budget, propagation_wait=options["propagation_wait"]))
    try:
        code = run_drain(**options)
    except UsageProblem as exc:
        fail(ctx, str(exc))
    ctx.exit(code)


@cli.command("status")
@socket_dir_option
@socket_option
@click.option("--json", "json_output", is_flag=True, help="Print JSON on stdout.")
@click.pass_context
def status_command(ctx: click.Context, socket_dir: str | None, socket: str | None, json_output: bool) -> None:
    """Print one row per worker: state, in flight, since (and why a FAILED worker failed)."""
    answers = _ask(ctx, socket_dir, socket, "GET", Route.STATUS)
    if json_output:
        click.echo(json.dumps([{"socket": path, **body} for path, body in answers.items()]))
        return
    click.echo(f"{'PID':>8}  {'STATE':<9} {'IN FLIGHT':>9}  SINCE")
    for body in answers.values():
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(float(body[Field.SINCE])))
        failure = body.get(Field.FAILURE)
        cause = f"  {failure[Field.REASON]}: {failure[Field.DETAIL]}" if isinstance(failure, dict) else ""
        # admission="fits" (issue 54): the requests refused because they would not have finished in time.
        from .._drain._admission import WOULD_NOT_FINISH  # here: the preStop hook's click path does not load it

        late = body.get(Field.COUNTERS, {}).get("rejected", {}).get(WOULD_NOT_FINISH, 0)
        cause += f"  refused {late} that would not finish (admission fits)" if late else ""
        click.echo(f"{body[Field.PID]:>8}  {body[Field.STATE]:<9} {body[Field.IN_FLIGHT]:>9}  {since}{cause}")


@cli.command("resume")
@socket_dir_option
@socket_option
@click.pass_context
def resume_command(ctx: click.Context, socket_dir: str | None, socket: str | None) -> None:
    """Undrain every worker (DRAINING -> SERVING). A FAILED worker is never resumed: exit 1."""
    answers = _ask(ctx, socket_dir, socket, "POST", Route.RESUME)
    failed = 0
    for body in answers.values():
        worker, state = body.get(Field.PID, "?"), body[Field.STATE]
        click.echo(f"worker {worker}: {state}" + (" (resumed)" if body[Field.RESUMED] else ""))
        failure = body.get(Field.FAILURE)
        if state == Value.FAILED and isinstance(failure, dict):
            failed += 1
            click.echo(
                f"graceful resume: worker {worker} has failed ({failure[Field.REASON]}: "
                f"{failure[Field.DETAIL]}) and is not resumed; restart it",
                err=True,
            )
    if failed:
        ctx.exit(1)


def _ask(ctx: click.Context, socket_dir: str | None, socket: str | None, method: str, url: str) -> dict[str, Any]:
    socket_dir = search_dir(ctx, socket_dir, socket)
    try:
        paths = discover(socket_dir, socket)
        answers = request_all(paths, method, url)
    except NoServer as exc:
        click.echo(f"graceful {ctx.info_name}: {exc}", err=True)
        ctx.exit(EXIT_NO_SERVER)
    live = {path: body for path, body in answers.items() if body is not None}
    if not live:
        click.echo(
            f"graceful {ctx.info_name}: no graceful server found: nothing is listening on {', '.join(paths)}", err=True
        )
        ctx.exit(EXIT_NO_SERVER)
    return live


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code instead of exiting (for embedding and tests)."""
    try:
        result = cli.main(args=argv, prog_name="graceful", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.UsageError as exc:
        # One line in the command's voice, as every other message (docs/cli.md, "Messages"), not
        # click's three (usage, hint, error).
        command = _voice(exc.ctx, argv)
        click.echo(f"{command}: {exc.format_message().rstrip('.')} (see {command} --help)", err=True)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.Abort:
        click.echo("Aborted!", err=True)
        return 1
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return result if isinstance(result, int) else 0


def _voice(ctx: click.Context | None, argv: list[str] | None) -> str:
    """Who says a usage error: ``graceful <command>``, else ``graceful``. click's parser raises some errors
    without their context (``Option '--propagation-wait' requires an argument``): the command is then the
    first word of the command line that names one."""
    if ctx is not None:
        return f"graceful {ctx.info_name}" if ctx.parent is not None else "graceful"
    words = sys.argv[1:] if argv is None else argv
    known = set(cli.list_commands(click.Context(cli)))
    command = next((word for word in words if not word.startswith("-")), None)
    return f"graceful {command}" if command in known else "graceful"
