"""``graceful drain --engine``: the command-line face of engine mode.

The waiting lives in ``_engine``; this module reads the hook's environment, prints
progress to stderr, and turns the result into an exit code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import partial
from typing import Any

import anyio
import click

from .._drain._environ import parse_duration, variable
from .._drain._errors import ConfigError
from .._engine._config import GRACE_SHARE, EngineConfig, EngineDrainResult, EngineProgress
from .._engine._wait import REFUSED_READS, poll

__all__ = ["run_engine_drain"]


def _say(message: str) -> None:
    click.echo(f"graceful drain: {message}", err=True)


def _warn(text: str) -> None:
    _say(f"warning: {text}")


def _show(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def _counts(config: EngineConfig, values: Mapping[str, float | None]) -> str:
    preset = config.rules
    if preset is not None:
        parts = []
        for role, names in (("running", preset.running), ("waiting", preset.waiting)):
            if names:
                known = [values.get(name) for name in names]
                total = None if None in known else sum(v for v in known if v is not None)
                parts.append(f"{role}={_show(total)}")
        return " ".join(parts)
    return " ".join(f"{name}={_show(values.get(name))}" for name in config.metrics)


class _Progress:
    """Prints at most one progress line a second; reads may come faster."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.last: float | None = None

    def __call__(self, progress: EngineProgress) -> None:
        if self.last is not None and progress.elapsed - self.last < 1.0:
            return
        self.last = progress.elapsed
        state = f"{progress.error} (busy or sick)" if progress.error else _counts(self.config, progress.values)
        remaining = max(0.0, progress.limit - progress.elapsed)
        _say(
            f"{state}; read {progress.reads}, idle {progress.idle_streak}/{self.config.idle_reads}, "
            f"elapsed {progress.elapsed:.1f}s, deadline in {remaining:.1f}s"
        )


def _env_fallbacks(
    timeout: float | None, grace_period: float | None
) -> tuple[float | None, float | None, float | None]:
    """(timeout, grace_period, grace_share) with the environment's fallbacks.

    DRAIN_TIMEOUT and GRACE_SECONDS are the names of the hook proposed for kthena (its lossless-upgrade
    pull request), read so this drops into pods that set them; where either is set, that hook's rule
    applies too (70% of the grace period, ``GRACE_SHARE``). kthena's released hooks read neither.
    """
    kthena = any(os.environ.get(var, "").strip() for var in ("DRAIN_TIMEOUT", "GRACE_SECONDS"))
    if timeout is None:
        timeout = _env_duration("DRAIN_TIMEOUT")
    for var in (variable("grace_period"), "GRACE_SECONDS"):
        if grace_period is None:
            grace_period = _env_duration(var)
    return timeout, grace_period, GRACE_SHARE if kthena else None


def _env_duration(var: str) -> float | None:
    raw = os.environ.get(var, "").strip()
    return parse_duration(raw, name=f"environment variable {var}") if raw else None


def run_engine_drain(*, quiet: bool, json_output: bool, **settings: Any) -> int:
    """Exit 0 when idle or gone, 1 when the budget ran out or the engine is dead, 2 on bad usage,
    3 when no engine answers at the URL (the first read cannot connect at all).

    ``settings`` are ``EngineConfig``'s, as the command line gives them: ``timeout`` and
    ``grace_period`` fall back to the hook's environment (``_env_fallbacks``).
    """
    try:
        timeout, grace_period, grace_share = _env_fallbacks(settings.pop("timeout"), settings.pop("grace_period"))
        config = EngineConfig(**settings, timeout=timeout, grace_period=grace_period, grace_share=grace_share)
    except ConfigError as exc:
        _say(str(exc))
        return 2
    if not quiet:
        _say(
            f"waiting for {', '.join(config.metrics)} to read 0 on {config.idle_reads} consecutive reads of "
            f"{config.metrics_url} (every {config.interval:g}s, budget {config.limit:g}s, "
            f"propagation wait {config.propagation_wait:g}s)"
        )
    result = anyio.run(partial(poll, config, None if quiet else _Progress(config), _warn))
    return _print_result(config, result, quiet, json_output, url_given=settings.get("metrics_url") is not None)


def _print_result(
    config: EngineConfig, result: EngineDrainResult, quiet: bool, json_output: bool, *, url_given: bool = True
) -> int:
    counts = _counts(config, result.values)
    if result.result == "unreachable":
        # A preStop hook pointed at the wrong address must not pass as a drained engine.
        preset = config.preset.name if config.preset is not None else "?"
        source = "" if url_given else f", the address --engine {preset} reads by default"
        fix = (
            "check --metrics-url (the engine's host, port and path) and that the engine is running"
            if url_given
            else "pass --metrics-url with the engine's address, or check that the engine is running"
        )
        _say(f"no engine at {config.metrics_url}{source} ({result.last_error}); {fix}")
    elif result.result == "dead":
        _say(f"the engine is dead ({result.last_error}) with {counts}: its work in flight is lost, nothing to drain")
    elif result.result == "gone":
        _say(
            f"connection refused on {REFUSED_READS} reads in a row at {config.metrics_url}: "
            "the engine is gone, nothing to drain"
        )
    elif result.result == "timeout":
        detail = f"; last read: {result.last_error}" if result.last_error else ""
        _say(f"budget of {config.limit:g}s ran out with {counts}{detail}; the engine gets SIGTERM with work in flight")
    elif not quiet:
        held = f", then held the KV buffer {result.kv_buffer_held:g}s" if result.kv_buffer_held else ""
        _say(f"engine idle ({counts}) after {result.reads} reads in {result.duration:.1f}s{held}")
    if json_output:
        click.echo(json.dumps(result.as_dict()))
    return result.exit_code
