"""``python -m examples.server serve|drain``: the example's own CLI, with graceful's drain command embedded."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from dataclasses import fields
from types import ModuleType

import click

from graceful import ConfigError, parse_duration

from ._config import DRAIN_ENV, ENV, Config, drain_options_from_env

APP = "examples.server:app"
EXIT_USAGE = 2


def _graceful_cli() -> ModuleType | None:
    """graceful's public CLI module, or None when this graceful has none."""
    try:
        return importlib.import_module("graceful.cli")
    except ModuleNotFoundError as exc:
        if exc.name not in ("graceful.cli", "graceful._cli._main"):
            raise
        return None


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            parse_duration(value, name=f"--{param.name}".replace("_", "-"))
        except ConfigError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """An OpenAI-compatible example inference server that drains without losing a request."""


_DEFAULTS = Config()


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind to this address.")
@click.option("--port", type=int, default=8000, show_default=True, help="Bind to this port.")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, help="Worker processes.")
@click.option("--model", envvar=ENV["model"], default=_DEFAULTS.model, show_default=True, help="Served model name.")
@click.option(
    "--tokens-per-second",
    envvar=ENV["tokens_per_second"],
    type=float,
    default=_DEFAULTS.tokens_per_second,
    show_default=True,
    help="Generation speed of each request.",
)
@click.option(
    "--slots", envvar=ENV["slots"], type=int, default=_DEFAULTS.slots, show_default=True, help="Concurrent batch slots."
)
@click.option(
    "--queue-size",
    envvar=ENV["queue_size"],
    type=int,
    default=_DEFAULTS.queue_size,
    show_default=True,
    help="Requests that may wait for a slot; more get a retryable 503.",
)
@click.option(
    "--load-delay",
    envvar=ENV["load_delay"],
    default=f"{_DEFAULTS.load_delay:g}s",
    show_default=True,
    callback=_duration,
    help="Simulated model load; /startup and /ready answer 503 until it is done.",
)
@click.option(
    "--max-tokens",
    envvar=ENV["max_tokens"],
    type=int,
    default=_DEFAULTS.max_tokens,
    show_default=True,
    help="Largest max_tokens a request may ask for.",
)
@click.option(
    "--default-max-tokens",
    envvar=ENV["default_max_tokens"],
    type=int,
    default=_DEFAULTS.default_max_tokens,
    show_default=True,
    help="max_tokens when a request gives none.",
)
@click.option(
    "--idempotency-keys",
    envvar=ENV["idempotency_keys"],
    type=int,
    default=_DEFAULTS.idempotency_keys,
    show_default=True,
    help="Finished Idempotency-Key results kept for replay.",
)
@click.option(
    "--selftest-interval",
    envvar=ENV["selftest_interval"],
    default="0s",
    show_default=True,
    callback=_duration,
    help="Run an internal one-token canary this often (0: never).",
)
@click.option(
    "--token-word",
    envvar=ENV["token_word"],
    default=_DEFAULTS.token_word,
    show_default=True,
    help="The generated text counts WORD0 WORD1 ...; replicas with different words continue streams differently.",
)
@click.option("--propagation-wait", envvar=DRAIN_ENV["propagation_wait"], callback=_duration, help="Drain option.")
@click.option("--drain-timeout", envvar=DRAIN_ENV["drain_timeout"], callback=_duration, help="Drain option.")
@click.option("--reserve", envvar=DRAIN_ENV["reserve"], callback=_duration, help="Drain option.")
@click.option(
    "--admit-during-propagation/--no-admit-during-propagation",
    envvar=DRAIN_ENV["admit_during_propagation"],
    default=True,
    show_default=True,
    help="Drain option: keep admitting requests during the propagation wait.",
)
@click.option(
    "--launcher",
    type=click.Choice(["graceful", "uvicorn"]),
    default="graceful",
    show_default=True,
    help="graceful run (drains on SIGTERM) or plain uvicorn.run (preStop drain only; a baseline).",
)
@click.option("--log-level", default="info", show_default=True, help="uvicorn log level.")
@click.argument("launcher_args", nargs=-1, type=click.UNPROCESSED)
def serve(
    host: str,
    port: int,
    workers: int,
    launcher: str,
    log_level: str,
    launcher_args: tuple[str, ...],
    propagation_wait: str | None,
    drain_timeout: str | None,
    reserve: str | None,
    admit_during_propagation: bool,
    **settings: object,
) -> None:
    """Serve the example. Arguments after the options go to `graceful run` (e.g. --socket-dir DIR)."""
    env = {ENV[spec.name]: str(settings[spec.name]) for spec in fields(Config) if settings.get(spec.name) is not None}
    drain = {"propagation_wait": propagation_wait, "drain_timeout": drain_timeout, "reserve": reserve}
    env.update({DRAIN_ENV[name]: value for name, value in drain.items() if value is not None})
    env[DRAIN_ENV["admit_during_propagation"]] = "true" if admit_during_propagation else "false"
    # The app is imported by the launcher (and by every worker process), so the
    # environment is how these settings reach it. Check them here, where a
    # mistake can still be one clear line.
    try:
        Config.from_env(env)
        drain_options_from_env(env)
    except ConfigError as exc:
        click.echo(f"examples.server: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    os.environ.update(env)
    graceful_cli = _graceful_cli() if launcher == "graceful" else None
    if launcher == "graceful" and graceful_cli is None:
        click.echo("examples.server: graceful.cli is not available; falling back to plain uvicorn", err=True)
    if graceful_cli is not None:
        argv = ["run", APP, "--host", host, "--port", str(port), "--workers", str(workers), "--log-level", log_level]
        sys.exit(graceful_cli.main([*argv, *launcher_args]))
    if launcher_args:
        click.echo(f"examples.server: ignoring {' '.join(launcher_args)}: only graceful run takes them", err=True)
    import uvicorn

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    uvicorn.run(APP, host=host, port=port, workers=workers, log_level=log_level, lifespan="on")


def _add_drain(group: click.Group) -> None:
    graceful_cli = _graceful_cli()
    if graceful_cli is not None:
        # graceful's own command object: same options, same exit codes, same admin sockets.
        group.add_command(graceful_cli.drain_command, "drain")
        return

    @group.command("drain", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def drain_missing() -> None:
        """Unavailable: this graceful has no graceful.cli module."""
        click.echo("examples.server: drain needs graceful.cli (graceful-drain with its CLI); install it", err=True)
        sys.exit(EXIT_USAGE)


_add_drain(cli)


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="python -m examples.server")


if __name__ == "__main__":
    main()
