"""``graceful soak``: the click command over ``run_soak``, with Ctrl-C handling, records, report and plot."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from typing import Any, NoReturn

import anyio
import click

from .._drain._environ import parse_duration
from .._drain._errors import ConfigError
from .._soak._report import RequestRecord, SoakReport, check_plotting, write_plot
from .._soak._runner import SoakConfig, parse_weights, run_soak

__all__ = ["soak_command"]


def _duration_option(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        seconds = parse_duration(value, name=f"--{param.name}")
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None
    if seconds <= 0:
        raise click.BadParameter(f"--{param.name}: {value!r} is zero; use a duration above 0, e.g. 30s")
    return seconds


def _weights_option(ctx: click.Context, param: click.Parameter, value: str) -> dict[str, int]:
    try:
        return parse_weights(value, name=f"--{param.name}")
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("soak")
@click.argument("url")
@click.option(
    "--duration",
    default="30s",
    show_default=True,
    metavar="DURATION",
    callback=_duration_option,
    help="How long to send new requests.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Requests in flight (closed loop); with --rate, the cap on them.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Start this many requests per second (open loop) instead.",
)
@click.option(
    "--mix",
    default="short=50,long=20,stream=30",
    show_default=True,
    callback=_weights_option,
    help="Weights of the request classes.",
)
@click.option(
    "--lengths",
    default="short=8,long=256,stream=128",
    show_default=True,
    callback=_weights_option,
    help="max_tokens per class; classes left out keep their default.",
)
@click.option("--model", default="default", show_default=True, help="The model field of each request.")
@click.option(
    "--retry",
    type=click.Choice(["none", "sdk"]),
    default="none",
    show_default=True,
    help="none: one attempt; sdk: retry like the OpenAI SDK (2 retries, never after a body began).",
)
@click.option(
    "--timeout",
    default="60s",
    show_default=True,
    metavar="DURATION",
    callback=_duration_option,
    help="Limit for each attempt, from sending to the last body byte.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Send through graceful's resuming transport: cut streams continue on another replica.",
)
@click.option(
    "--max-resumes",
    type=click.IntRange(min=0),
    default=None,
    help="With --resume: continuations per stream at most [default 3].",
)
@click.option(
    "--exact-length",
    is_flag=True,
    help="Ask for exactly max_tokens (ignore_eos, temperature 0, usage on streams); other answers are truncated.",
)
@click.option("--max-requests", type=click.IntRange(min=1), default=None, help="Stop after this many requests.")
@click.option("--seed", type=int, default=None, help="Seed for the class mix, arrivals and jitter.")
@click.option(
    "--executions-url", multiple=True, help="GET URL returning {idempotency_key: executions}; repeat per replica."
)
@click.option("--records", type=click.Path(dir_okay=False), default=None, help="Write one JSON line per request here.")
@click.option("--report", type=click.Path(dir_okay=False), default=None, help="Write the summary as JSON here.")
@click.option(
    "--plot", type=click.Path(dir_okay=False), default=None, help="Draw a timeline PNG here (needs matplotlib)."
)
def soak_command(
    url: str,
    records: str | None,
    report: str | None,
    plot: str | None,
    executions_url: tuple[str, ...],
    max_resumes: int | None,
    **options: Any,
) -> None:
    """Send short, long and streaming requests to an OpenAI-compatible URL and judge every one.

    Exits 0 when nothing was lost (no ambiguous, truncated, token_mismatch, timeout or
    http_error request and no duplicate execution), 1 otherwise, 2 for bad options.
    """
    try:
        if max_resumes is not None and not options["resume"]:
            raise ConfigError(f"--max-resumes {max_resumes} only applies with --resume; add --resume or drop it")
        if max_resumes is not None:
            options["max_resumes"] = max_resumes
        config = SoakConfig(url=url, executions_urls=executions_url, **options)
        if plot is not None:
            check_plotting()
        sink = open(records, "w", encoding="utf-8") if records is not None else None
    except (ConfigError, OSError) as exc:
        raise click.UsageError(str(exc)) from None
    try:

        def write(record: RequestRecord) -> None:
            if sink is not None:
                sink.write(json.dumps(record.to_json()) + "\n")

        try:
            result = anyio.run(_run_cli, config, write)
        except BaseException as exc:
            # Ctrl-C outside the main thread's receiver may surface inside a task group, wrapped in a group.
            if _interrupted(exc):
                raise click.Abort() from None
            raise
    finally:
        if sink is not None:
            sink.close()
    if result is None:
        raise click.Abort()
    _finish(result, report, plot)


def _interrupted(exc: BaseException) -> bool:
    if isinstance(exc, KeyboardInterrupt):
        return True
    return any(_interrupted(inner) for inner in getattr(exc, "exceptions", ()))


def _finish(result: SoakReport, report: str | None, plot: str | None) -> NoReturn:
    # Its own function: CPython 3.11's tracer loses the rest of a frame after anyio.run()
    # (cpython#106749), which would hide this from coverage.
    click.echo(result.render())
    try:
        if report is not None:
            with open(report, "w", encoding="utf-8") as out:
                json.dump(result.to_json(), out, indent=2)
        if plot is not None:
            write_plot(result, plot)
    except OSError as exc:
        click.echo(f"graceful soak: could not write output: {exc}", err=True)
        raise SystemExit(1) from None
    raise SystemExit(result.exit_code)


async def _run_cli(config: SoakConfig, write: Callable[[RequestRecord], None]) -> SoakReport | None:
    """Run the soak; ``None`` when a second signal aborted it."""
    stop = anyio.Event()
    result: SoakReport | None = None
    async with anyio.create_task_group() as tg:
        if threading.current_thread() is threading.main_thread():
            tg.start_soon(_stop_on_signal, stop, tg.cancel_scope)
        result = await run_soak(config, stop=stop, on_record=write)
        tg.cancel_scope.cancel()
    return result


async def _stop_on_signal(stop: anyio.Event, run: anyio.CancelScope) -> None:
    # The first Ctrl-C (or SIGTERM) stops new requests and lets in-flight ones finish; the
    # second cancels the run. The receiver stays open for both: a KeyboardInterrupt raised
    # through the event loop would leave task groups to die unretrieved, and asyncio logs
    # their tracebacks as the process exits.
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        received = aiter(signals)
        signum = await anext(received)
        click.echo(
            f"graceful soak: {signal.Signals(signum).name}: no new requests; waiting for those in flight", err=True
        )
        stop.set()
        await anext(received)
        run.cancel()
