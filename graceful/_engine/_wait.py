"""Engine drain: a preStop hook for inference engines whose ASGI app cannot be wrapped.

vLLM, SGLang, TGI and Triton each publish how many requests they are running and
queueing on a Prometheus ``/metrics`` page. Polling that page until it reads zero is
what the shell hooks in the field do (the preStop of kthena's released ModelBooster vLLM template, for one); this
module does it without their known faults:

- metric names are matched exactly, so ``vllm:num_requests_waiting_by_reason`` never
  counts as ``vllm:num_requests_waiting``, and any labels in any order are fine;
- a label selector (``name{label="value"}``) narrows a metric to the series that match;
- every matching series is summed (data-parallel engines, tensor-parallel ranks);
- values go through a real number parser, so ``0``, ``0.0``, ``0e+00`` and ``-0`` all
  read zero, and a NaN or absent metric is "unknown", never "idle";
- zero must hold for several consecutive reads, because engine gauges lag;
- the wait has its own bound, derived from the pod's grace period, and every read
  (connect, headers and the whole body) ends inside it, however slowly the engine answers.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import anyio
import httpx

from .._drain._errors import ConfigError
from ._config import EngineConfig, EngineDrainResult, EngineOutcome, EngineProgress
from ._page import PageError, has_only, read_metrics
from ._presets import EnginePreset

__all__ = ["DEAD_READS", "MAX_PAGE_BYTES", "REFUSED_READS", "PageRead", "health_url", "poll", "read_page", "wait_idle"]

logger = logging.getLogger("graceful.engine")

REFUSED_READS = 3
# A health check that fails this many reads in a row while the metrics read busy: the engine is dead.
DEAD_READS = 2
# A metrics page larger than this is not a metrics page; stop reading and count the poll as unreadable.
MAX_PAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class PageRead:
    """One read of an engine's page: its text (``page``), or why there is none; then the values read off it."""

    page: str | None = None
    values: dict[str, float | None] | None = None
    error: str | None = None
    refused: bool = False
    unconnected: bool = False  # no connection could be made at all: refused, no such host, no route
    reached: bool = True  # a connection was made (False also when the read ran out of time first)
    unreadable: bool = False  # an answer came, but not a page we can read: warn once
    fresh: bool = False  # the page shows an engine that has never served a request


def _refused(exc: BaseException) -> bool:
    """Whether every connection attempt behind ``exc`` was refused (trio reports them as a group)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        group = getattr(seen, "exceptions", None)
        if isinstance(group, tuple) and group:
            return all(isinstance(member, BaseException) and _refused(member) for member in group)
        seen = seen.__cause__ or seen.__context__
    return False


async def _fetch(client: httpx.AsyncClient, url: str) -> tuple[int, str, bytes]:
    """One GET, streamed so that the body is capped; httpx decodes any Content-Encoding on the way."""
    async with client.stream("GET", url) as response:
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_PAGE_BYTES:
                raise _PageTooLarge
        return response.status_code, response.charset_encoding or "utf-8", bytes(body)


class _PageTooLarge(Exception):
    """The answer ran past ``MAX_PAGE_BYTES``: not a metrics page."""


async def read_page(client: httpx.AsyncClient, url: str, limit: float) -> PageRead:
    """GET the page as text, connect to last byte within ``limit`` seconds, or say why not (``error``).

    httpx's timeouts apply per socket operation: an engine that trickles bytes never trips
    them. The cancel scope bounds the whole read.
    """
    with anyio.move_on_after(limit):
        try:
            status, charset, body = await _fetch(client, url)
        except httpx.ConnectError as exc:
            if _refused(exc):
                return PageRead(error="connection refused", refused=True, unconnected=True, reached=False)
            return PageRead(error=f"cannot connect: {exc}", unconnected=True, reached=False)
        except httpx.TimeoutException as exc:
            connected = not isinstance(exc, httpx.ConnectTimeout)
            return PageRead(error=f"no answer within {limit:.2g}s", reached=connected)
        except httpx.TransportError as exc:
            return PageRead(error=f"connection error: {type(exc).__name__}")
        except httpx.DecodingError as exc:
            return PageRead(error=f"unreadable page: bad Content-Encoding ({exc})", unreadable=True)
        except _PageTooLarge:
            return PageRead(error=f"unreadable page: larger than {MAX_PAGE_BYTES // 2**20} MiB", unreadable=True)
        except (httpx.HTTPError, httpx.StreamError) as exc:
            return PageRead(error=f"unreadable page: {type(exc).__name__}: {exc}", unreadable=True)
        if status != 200:
            return PageRead(error=f"HTTP {status}")
        try:
            return PageRead(page=body.decode(charset))
        except LookupError:
            return PageRead(error=f"unreadable page: unknown charset {charset!r}", unreadable=True)
        except UnicodeDecodeError as exc:
            reason = f"not {charset} text ({exc.reason} at byte {exc.start})"
            return PageRead(error=f"unreadable page: {reason}", unreadable=True)
    return PageRead(error=f"no answer within {limit:.2g}s", reached=False)  # connected or not: unknown


def health_url(metrics_url: str, rules: EnginePreset | None) -> str | None:
    """The engine's health check beside its page (the preset's path on the same host and port), or None."""
    if rules is None or not rules.health:
        return None
    return str(httpx.URL(metrics_url).copy_with(path=rules.health, query=None, fragment=None))


async def _sick(client: httpx.AsyncClient, url: str, limit: float) -> str | None:
    """What the health check answered when it says the engine has failed (a 5xx), else None.

    No answer (refused, timed out) proves nothing here: the refusal rule covers an engine that is gone.
    """
    with anyio.move_on_after(max(limit, 0.01)):
        try:
            response = await client.get(url)
        except httpx.HTTPError:
            return None
        if 500 <= response.status_code <= 599:
            return f"HTTP {response.status_code}"
    return None


async def _read_once(
    client: httpx.AsyncClient, url: str, names: Sequence[str], limit: float, fresh_page: Collection[str] | None = None
) -> PageRead:
    read = await read_page(client, url, limit)
    return read if read.page is None else _parse(read.page, names, fresh_page)


def _parse(page: str, names: Sequence[str], fresh_page: Collection[str] | None) -> PageRead:
    try:
        values = read_metrics(page, names)
    except PageError as exc:
        return PageRead(error=f"garbage page: {exc}")
    if all(value is None for value in values.values()):
        if page.lstrip().startswith("<"):
            return PageRead(error="garbage page: not Prometheus text (HTML?)")
        if fresh_page is not None and has_only(page, fresh_page):
            return PageRead(values=values, fresh=True)
    return PageRead(values=values)


async def wait_idle(
    engine: str | EnginePreset | None = None,
    *,
    metrics_url: str | None = None,
    metrics: Sequence[str] = (),
    interval: float = 1.0,
    idle_reads: int = 2,
    kv_buffer: float | str = 0.0,
    propagation_wait: float | str | None = None,
    timeout: float | None = None,
    grace_period: float | None = None,
    grace_share: float | None = None,
    config: EngineConfig | None = None,
    on_progress: Callable[[EngineProgress], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> EngineDrainResult:
    """Wait until an engine's in-flight metrics read zero, within the budget (``EngineConfig.limit``).

    Pass the settings as keywords or as one :class:`EngineConfig` (``config=``), not both.
    Raises :class:`ConfigError` for bad settings. Unlike the ``graceful drain`` command,
    this reads no environment variables.
    """
    if config is None:
        config = EngineConfig(
            engine=engine,
            metrics_url=metrics_url,
            metrics=metrics,
            interval=interval,
            idle_reads=idle_reads,
            kv_buffer=kv_buffer,
            propagation_wait=propagation_wait,
            timeout=timeout,
            grace_period=grace_period,
            grace_share=grace_share,
        )
    elif engine is not None or metrics_url is not None or metrics:
        raise ConfigError("wait_idle: pass either config= or the engine settings, not both")
    return await poll(config, on_progress, on_warning or logger.warning)


def _apply_rules(
    rules: EnginePreset | None, values: dict[str, float | None], page_fresh: bool
) -> dict[str, float | None]:
    """The values the idle rule judges: optional metrics absent read 0, and so does a fresh engine."""
    if rules is None:
        return values
    values = dict(values)
    if page_fresh:
        return dict.fromkeys(values, 0.0)
    for name in rules.optional:
        if name in values and values[name] is None:
            values[name] = 0.0
    return values


async def poll(
    config: EngineConfig, on_progress: Callable[[EngineProgress], None] | None, warn: Callable[[str], None]
) -> EngineDrainResult:
    """Read ``config``'s metrics page until the engine is idle, gone or dead, or the budget runs out.

    Until a read has reached the engine, a read that cannot connect at all ends the wait at once
    (``unreachable``): nothing was ever there to drain, and a preStop hook pointed at the wrong
    address must not pass as a drained engine. Refusals after the engine answered mean it is gone.
    """
    url = cast(str, config.metrics_url)
    kv_buffer = cast(float, config.kv_buffer)
    propagation_wait = cast(float, config.propagation_wait)
    start = anyio.current_time()
    deadline = start + config.limit
    rules = config.rules
    activity = rules.activity if rules is not None else ()
    values: dict[str, float | None] = dict.fromkeys(config.metrics)
    warned: set[str] = set()
    reads = streak = refused = sick_reads = 0
    reached = False  # whether any read has reached the engine yet
    streak_start = 0.0
    error: str | None = None
    moved: dict[str, float | None] | None = None
    health = health_url(url, rules)
    sick: str | None = None  # what the health check last said of a failed engine

    def finish(outcome: EngineOutcome, held: float = 0.0) -> EngineDrainResult:
        duration = anyio.current_time() - start
        return EngineDrainResult(outcome, reads, values, duration, config.limit, url, error, held)

    # trust_env=False: a pod's HTTP(S)_PROXY must not route a loopback scrape elsewhere.
    # verify=False for plain http skips loading the CA bundle, which costs up to a second on a busy node.
    https = url.lower().startswith("https:")
    async with httpx.AsyncClient(trust_env=False, verify=https, headers={"Accept": "text/plain"}) as client:
        # Endpoints need time to drop this pod; requests still arrive until they do.
        await anyio.sleep(propagation_wait)
        tick = anyio.current_time()
        while True:
            now = anyio.current_time()
            if now >= deadline:
                return finish("timeout")
            # Keep each read shorter than the interval so a hung engine cannot stretch the schedule.
            limit = min(0.9 * config.interval, deadline - now)
            fresh_page = rules.fresh_page if rules is not None else None
            read = await _read_once(client, url, tuple(config.metrics) + activity, limit, fresh_page)
            read_at = anyio.current_time()
            reads += 1
            error = read.error
            if read.unconnected and not reached:
                return finish("unreachable")
            reached = reached or read.reached
            refused = refused + 1 if read.refused else 0
            judged: dict[str, float | None] | None = None
            still = True
            if read.values is not None:
                watched = dict(read.values)
                counters = {name: watched.pop(name) for name in activity}
                # A counter that appears (prometheus-client creates a labelled series on first use) moved too.
                still = moved is None or moved == counters
                moved = counters
                fresh = read.fresh and all(value is None for value in watched.values())
                judged = _apply_rules(rules, watched, fresh)
                values = judged
                if fresh and "fresh" not in warned:
                    warned.add("fresh")
                    warn(
                        f"{url} shows no request counter and no in-flight gauges: the engine has not served "
                        "a request since it started, so it counts as idle"
                    )
                _warn_unknown(values, url, rules, warned, warn)
            if read.error and read.error.startswith("HTTP 4") and read.error not in warned:
                warned.add(read.error)
                warn(f"{url} answered {read.error}; check --metrics-url. Polling continues")
            if read.unreadable and "unreadable" not in warned:
                warned.add("unreadable")
                warn(f"{url} sent a page that cannot be read ({read.error}); it counts as busy. Polling continues")
            zero = judged is not None and still and all(value == 0 for value in judged.values())
            if zero and streak == 0:
                streak_start = read_at
            streak = streak + 1 if zero else 0
            if on_progress is not None:
                on_progress(EngineProgress(reads, values, error, streak, read_at - start, config.limit))
            if health is not None and not zero and not read.refused:
                # A dead engine's gauges freeze busy: is it alive to finish that work?
                said = await _sick(client, health, min(0.9 * config.interval, deadline - anyio.current_time()))
                sick_reads = sick_reads + 1 if said else 0
                sick = said or sick
                if sick_reads >= DEAD_READS:
                    error = f"{health} answered {said}"
                    return finish("dead")
            if refused >= REFUSED_READS:
                if sick is not None:  # it failed its health check, then went away: its work is lost
                    error = f"{health} answered {sick}, then connections were refused"
                    return finish("dead")
                return finish("gone")
            span = rules.min_idle_span if rules is not None else 0.0
            if streak >= config.idle_reads and read_at - streak_start >= span:
                break
            tick = max(tick + config.interval, anyio.current_time())
            await anyio.sleep_until(min(tick, deadline))
    # Disaggregated decode peers may still be pulling the last KV from this (prefill) engine.
    held = max(0.0, min(kv_buffer, deadline - anyio.current_time()))
    await anyio.sleep(held)
    return finish("idle", held)


def _warn_unknown(
    values: Mapping[str, float | None],
    url: str,
    rules: EnginePreset | None,
    warned: set[str],
    warn: Callable[[str], None],
) -> None:
    hint = f": {rules.absent_hint}" if rules is not None and rules.absent_hint else ""
    for state, unknown in (
        ("absent", [name for name, value in values.items() if value is None]),
        ("nan", [name for name, value in values.items() if value is not None and math.isnan(value)]),
    ):
        new = [name for name in unknown if f"{name}:{state}" not in warned]
        if not new:
            continue
        warned.update(f"{name}:{state}" for name in new)
        listed = ", ".join(repr(name) for name in new)
        verb = "is" if len(new) == 1 else "are"
        where = f"absent from the page{hint} ({url})" if state == "absent" else f"NaN on {url}"
        warn(f"metric {listed} {verb} {where}; it counts as unknown, so the engine is never reported idle")
