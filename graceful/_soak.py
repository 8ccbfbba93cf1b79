"""``graceful soak``: short, long and streaming traffic against an OpenAI-compatible endpoint, every request judged.

Each request ends with exactly one reason (see ``REASONS`` and the README's end
reasons table). The distinction that matters most is *when* a connection died:
before it was established (``refused``: safe to retry), after the request was sent
but before any response header (``ambiguous``: it may have run), or after the body
started (``truncated``: it ran, at least partly).
"""

from __future__ import annotations

import json
import math
import random
import secrets
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NoReturn
from urllib.parse import urlsplit

import anyio
import anyio.abc
import click
import httpx

from ._budget import ConfigError, parse_duration
from ._soak_report import CLASSES, Attempt, RequestRecord, SoakReport, check_plotting, write_plot

__all__ = ["SoakConfig", "parse_weights", "run_soak", "soak_command"]

RetryPolicy = Literal["none", "sdk"]
DEFAULT_MIX = {"short": 50, "long": 20, "stream": 30}
DEFAULT_LENGTHS = {"short": 8, "long": 256, "stream": 128}
# The OpenAI SDK retries these statuses (openai-python `_should_retry`).
_RETRY_STATUSES = frozenset({408, 409, 429})


@dataclass(frozen=True)
class SoakConfig:
    """What ``run_soak`` sends, how fast, and for how long.

    ``concurrency`` workers send back to back (closed loop); with ``rate`` set,
    requests start at that many per second (open loop, Poisson arrivals) and
    ``concurrency`` caps how many are in flight. ``timeout`` bounds each attempt.
    """

    url: str
    duration: float = 30.0
    concurrency: int = 8
    rate: float | None = None
    mix: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_MIX))
    lengths: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_LENGTHS))
    model: str = "default"
    retry: RetryPolicy = "none"
    timeout: float = 60.0
    max_requests: int | None = None
    seed: int | None = None
    executions_urls: tuple[str, ...] = ()
    max_retries: int = 2
    retry_base: float = 0.5
    retry_cap: float = 8.0

    def __post_init__(self) -> None:
        endpoint(self.url)
        for url in self.executions_urls:
            endpoint(url, name="executions url")
        if self.duration <= 0 or self.timeout <= 0:
            raise ConfigError(f"duration {self.duration!r} and timeout {self.timeout!r} must both be above 0")
        if self.concurrency < 1:
            raise ConfigError(f"concurrency: {self.concurrency!r} is below 1; use 1 or more")
        if self.rate is not None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise ConfigError(f"rate: {self.rate!r} is not a positive number of requests per second")
        if self.max_requests is not None and self.max_requests < 1:
            raise ConfigError(f"max_requests: {self.max_requests!r} is below 1; use 1 or more, or no bound")
        if self.retry not in ("none", "sdk"):
            raise ConfigError(f"retry: {self.retry!r} is not a policy; use 'none' or 'sdk'")
        unknown = set(self.mix) - set(CLASSES) or set(self.lengths) - set(CLASSES)
        if unknown:
            raise ConfigError(f"unknown request class {sorted(unknown)[0]!r}; use {', '.join(CLASSES)}")
        if sum(self.mix.values()) <= 0 or min(self.mix.values()) < 0:
            raise ConfigError(f"mix: {dict(self.mix)!r} needs weights of 0 or more with a positive total")
        if any(self.lengths.get(cls, DEFAULT_LENGTHS[cls]) < 1 for cls in CLASSES):
            raise ConfigError(f"lengths: {dict(self.lengths)!r} needs at least 1 token per class")

    def tokens(self, cls: str) -> int:
        return self.lengths.get(cls, DEFAULT_LENGTHS[cls])


def endpoint(url: str, *, name: str = "url") -> str:
    """The chat completions URL for a base URL, a ``/v1`` URL or a full endpoint."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{name}: {url!r} is not an http(s) URL; use e.g. http://127.0.0.1:8000")
    path = parts.path.rstrip("/")
    if path.endswith("/completions") or name != "url":
        return url
    suffix = "/chat/completions" if path.endswith("/v1") else "/v1/chat/completions"
    return parts._replace(path=path + suffix).geturl()


def parse_weights(text: str, *, name: str) -> dict[str, int]:
    """Parse ``short=50,long=20,stream=30`` into ``{"short": 50, ...}``."""
    found: dict[str, int] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in CLASSES or not value.strip().isdigit():
            raise ConfigError(
                f"{name}: {item.strip()!r} in {text!r} is not CLASS=NUMBER; use e.g. short=50,long=20,stream=30 "
                f"with classes {', '.join(CLASSES)}"
            )
        found[key] = int(value)
    return found


@dataclass
class _Plan:
    """The shared issue budget: the number of requests and the clock."""

    config: SoakConfig
    stop: anyio.Event
    rng: random.Random
    deadline: float
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    issued: int = 0

    def take(self) -> RequestRecord | None:
        cfg = self.config
        if self.stop.is_set() or time.monotonic() >= self.deadline:
            return None
        if cfg.max_requests is not None and self.issued >= cfg.max_requests:
            return None
        self.issued += 1
        classes = [cls for cls in CLASSES if cfg.mix.get(cls, 0) > 0]
        cls = self.rng.choices(classes, weights=[cfg.mix[cls] for cls in classes])[0]
        # Keys must never repeat across runs against the same server, whatever the seed.
        rid = f"soak-{self.run_id}-{self.issued:06d}"
        return RequestRecord(
            request_id=rid,
            idempotency_key=f"idem-{self.run_id}-{self.issued:06d}-{secrets.token_hex(4)}",
            cls=cls,
            expected_tokens=cfg.tokens(cls),
            start=time.time(),
        )


async def run_soak(
    config: SoakConfig,
    *,
    stop: anyio.Event | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> SoakReport:
    """Send traffic until the duration, ``max_requests`` or ``stop``; return every request's record.

    In-flight requests are allowed to finish (each attempt is bounded by the timeout).
    ``on_record`` is called with each record as soon as its request ends.
    """
    plan = _Plan(config, stop or anyio.Event(), random.Random(config.seed), time.monotonic() + config.duration)
    url = endpoint(config.url)
    records: list[RequestRecord] = []
    started, t0 = time.time(), time.monotonic()
    # Keep-alive on, as in every SDK: reusing idle connections is what exposes a
    # server that closes them under a request already on its way.
    limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)
    timeout = httpx.Timeout(config.timeout, pool=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, headers={"user-agent": "graceful-soak"}) as client:

        async def send(record: RequestRecord) -> None:
            await _request(client, url, config, record, plan.rng)
            records.append(record)
            if on_record is not None:
                on_record(record)

        async with anyio.create_task_group() as tg:
            if config.rate is None:
                for _ in range(config.concurrency):
                    tg.start_soon(_closed_loop, plan, send)
            else:
                await _open_loop(plan, send, tg, config.rate, config.concurrency)
        executions, notes = await _executions(client, config.executions_urls)
    settings = {key: value for key, value in asdict(config).items() if key != "url"}
    return SoakReport(
        url=config.url,
        started=started,
        elapsed=time.monotonic() - t0,
        records=sorted(records, key=lambda r: r.request_id),
        settings={**settings, "mix": dict(config.mix), "lengths": {cls: config.tokens(cls) for cls in CLASSES}},
        executions=executions,
        notes=notes,
    )


async def _closed_loop(plan: _Plan, send: Callable[[RequestRecord], Any]) -> None:
    while (record := plan.take()) is not None:
        await send(record)


async def _open_loop(
    plan: _Plan, send: Callable[[RequestRecord], Any], tg: anyio.abc.TaskGroup, rate: float, cap: int
) -> None:
    slots = anyio.Semaphore(cap)
    due = time.monotonic()

    async def one(record: RequestRecord) -> None:
        try:
            await send(record)
        finally:
            slots.release()

    while True:
        with anyio.move_on_after(max(0.0, min(due, plan.deadline) - time.monotonic())):
            await plan.stop.wait()
        await slots.acquire()
        record = plan.take()
        if record is None:
            slots.release()
            return
        tg.start_soon(one, record)
        due += plan.rng.expovariate(rate)


async def _request(
    client: httpx.AsyncClient, url: str, cfg: SoakConfig, record: RequestRecord, rng: random.Random
) -> None:
    stream = record.cls == "stream"
    body = {
        "model": cfg.model,
        "messages": [{"role": "user", "content": f"soak {record.request_id}: count to {record.expected_tokens}"}],
        "max_tokens": record.expected_tokens,
        "stream": stream,
    }
    headers = {"x-request-id": record.request_id, "idempotency-key": record.idempotency_key}
    tries = cfg.max_retries + 1 if cfg.retry == "sdk" else 1
    for n in range(tries):
        attempt = Attempt(reason="timeout", start=time.time())
        record.history.append(attempt)
        outcome = _Outcome(expected=record.expected_tokens)
        with anyio.move_on_after(cfg.timeout) as deadline:
            await _exchange(client, url, body, {**headers, "x-soak-attempt": str(n)}, stream, attempt, outcome)
        if deadline.cancelled_caught and attempt.reason != "ended_by_server":
            attempt.reason, attempt.error = "timeout", f"no complete answer within {cfg.timeout:g}s"
        attempt.end = time.time()
        record.tokens, record.bytes = outcome.tokens, attempt.bytes
        if n + 1 < tries and outcome.retryable(attempt):
            await anyio.sleep(outcome.delay(n, cfg, rng))
            continue
        break
    last = record.history[-1]
    record.end, record.reason, record.status = last.end, last.reason, last.status
    record.served_by, record.replay, record.error = last.served_by, last.replay, last.error


@dataclass
class _Outcome:
    """What one attempt's answer says beyond its reason: tokens and retry hints."""

    expected: int = 0
    tokens: int = 0
    done: bool = False  # the stream's [DONE] arrived
    retry_after: float | None = None
    should_retry: bool | None = None

    def retryable(self, attempt: Attempt) -> bool:
        """The OpenAI SDK's rule, except that nothing is retried once a successful body has begun."""
        if attempt.reason in ("refused", "ambiguous"):
            return True
        if attempt.reason == "timeout":
            return not attempt.headers
        if attempt.reason not in ("rejected_retryable", "http_error") or attempt.status is None:
            return False
        if attempt.status < 300:  # a 2xx with an error inside: its body has begun
            return False
        if self.should_retry is not None:
            return self.should_retry
        return attempt.status in _RETRY_STATUSES or attempt.status >= 500

    def delay(self, n: int, cfg: SoakConfig, rng: random.Random) -> float:
        if self.retry_after is not None and 0 < self.retry_after <= 60:
            return self.retry_after
        return min(cfg.retry_base * 2.0**n, cfg.retry_cap) * (1 - 0.25 * rng.random())


async def _exchange(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    stream: bool,
    attempt: Attempt,
    outcome: _Outcome,
) -> None:
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            attempt.headers, attempt.status = True, response.status_code
            attempt.served_by = response.headers.get("x-served-by")
            attempt.replay = response.headers.get("x-idempotent-replay", "").lower() == "true"
            attempt.not_started = "x-graceful-not-started" in response.headers
            outcome.retry_after = _seconds(response.headers.get("retry-after"))
            hint = response.headers.get("x-should-retry", "").lower()
            outcome.should_retry = {"true": True, "false": False}.get(hint)
            if stream and response.status_code < 300 and _is_sse(response):
                await _read_stream(response, attempt, outcome)
            else:
                await _read_body(response, attempt, outcome, stream)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        attempt.reason, attempt.error = "refused", _describe(exc)
    except httpx.TimeoutException as exc:
        attempt.reason, attempt.error = "timeout", _describe(exc)
    except httpx.RequestError as exc:
        if attempt.not_started:
            attempt.reason = "rejected_retryable"
        elif outcome.done and attempt.reason == "truncated" and attempt.error is None:
            # The answer is complete for the client, which stops reading at [DONE], as the SDK does.
            attempt.reason = "ok"
        elif attempt.reason != "ended_by_server":
            attempt.reason = "truncated" if attempt.headers else "ambiguous"
        attempt.error = _describe(exc)


async def _read_body(response: httpx.Response, attempt: Attempt, outcome: _Outcome, stream: bool) -> None:
    chunks = []
    attempt.reason = "truncated"  # until the body is complete
    async for chunk in response.aiter_bytes():
        attempt.bytes += len(chunk)
        chunks.append(chunk)
    status = response.status_code
    if attempt.not_started and status == 503:
        attempt.reason = "rejected_retryable"
        return
    if status >= 300:
        attempt.reason, attempt.error = "http_error", f"HTTP {status}: {b''.join(chunks)[:200]!r}"
        return
    if stream:
        attempt.reason = "http_error"
        attempt.error = f"asked for a stream, got content-type {response.headers.get('content-type')!r}"
        return
    try:
        data = json.loads(b"".join(chunks))
        finish = data["choices"][0].get("finish_reason")
        usage = data.get("usage") or {}
        outcome.tokens = int(usage.get("completion_tokens") or 0)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        # Valid JSON of the wrong shape (a list, a number, choices of strings) is as invalid as none.
        attempt.error = f"invalid completion body ({attempt.bytes} bytes)"
        return
    attempt.reason = _judge(finish, usage, attempt, outcome)


async def _read_stream(response: httpx.Response, attempt: Attempt, outcome: _Outcome) -> None:
    attempt.reason = "truncated"  # until [DONE] or the server's final frame
    buffer, data_lines = b"", []
    finish = None
    usage: dict[str, Any] = {}
    async for chunk in response.aiter_bytes():
        attempt.bytes += len(chunk)
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                data_lines.append(line[5:].removeprefix(b" "))
                continue
            if line or not data_lines:
                continue  # comments, other fields, stray blank lines
            event, data_lines = b"\n".join(data_lines), []
            if event == b"[DONE]":
                outcome.done = True
                continue
            frame = _frame(event)
            if frame is None:
                attempt.error = f"malformed event {event[:80]!r}"
                continue
            if "error" in frame:
                error = frame["error"] if isinstance(frame["error"], dict) else {}
                if error.get("type") == "server_shutdown":
                    attempt.reason = "ended_by_server"
                else:
                    attempt.error = f"error event: {event[:200]!r}"
                continue
            for choice in frame.get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    outcome.tokens += 1
                finish = choice.get("finish_reason") or finish
            usage = frame.get("usage") or usage
    if attempt.reason == "ended_by_server":
        return
    if attempt.error is not None and not attempt.error.startswith("malformed"):
        attempt.reason = "http_error"
    elif not outcome.done:
        attempt.error = "stream ended without [DONE]"
    elif attempt.error is None:
        if usage.get("completion_tokens") is not None:
            outcome.tokens = int(usage["completion_tokens"])
        attempt.reason = _judge(finish, usage, attempt, outcome)


def _frame(event: bytes) -> dict[str, Any] | None:
    """The event as a chunk object whose choices, deltas and usage have the shapes read; None otherwise."""
    try:
        frame = json.loads(event)
    except ValueError:
        return None
    if not isinstance(frame, dict):
        return None
    choices, usage = frame.get("choices") or [], frame.get("usage") or {}
    if not isinstance(choices, list) or not isinstance(usage, dict):
        return None
    if not all(isinstance(c, dict) and isinstance(c.get("delta") or {}, dict) for c in choices):
        return None
    return frame if isinstance(usage.get("completion_tokens") or 0, int) else None


def _judge(finish: Any, usage: Mapping[str, Any], attempt: Attempt, outcome: _Outcome) -> str:
    # Stopping for length with fewer tokens than asked for means the server cut the answer short.
    if finish == "length" and usage.get("completion_tokens") is not None and outcome.tokens < outcome.expected:
        attempt.error = f"finish_reason length after {outcome.tokens} of {outcome.expected} tokens"
        return "truncated"
    return "ok"


def _is_sse(response: httpx.Response) -> bool:
    media: str = response.headers.get("content-type", "").split(";")[0]
    return media.strip().lower() == "text/event-stream"


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _executions(client: httpx.AsyncClient, urls: tuple[str, ...]) -> tuple[dict[str, int] | None, list[str]]:
    """Sum the execution counts per idempotency key that each replica reports."""
    if not urls:
        return None, []
    total: dict[str, int] = {}
    notes = []
    for url in dict.fromkeys(urls):
        try:
            response = await client.get(url, timeout=10.0)
            response.raise_for_status()
            counts = response.json()
            for key, count in counts.items():
                total[str(key)] = total.get(str(key), 0) + int(count)
        except (httpx.HTTPError, ValueError, AttributeError, TypeError) as exc:
            notes.append(f"could not read execution counts from {url}: {_describe(exc)}")
    return (total if len(notes) < len(dict.fromkeys(urls)) else None), notes


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
    "--duration", default="30s", show_default=True, callback=_duration_option, help="How long to send new requests."
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
    callback=_duration_option,
    help="Limit for each attempt, from sending to the last body byte.",
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
    **options: Any,
) -> None:
    """Send short, long and streaming requests to an OpenAI-compatible URL and judge every one.

    Exits 0 when nothing was lost (no ambiguous, truncated, timeout or http_error
    request and no duplicate execution), 1 otherwise, 2 for bad options.
    """
    try:
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
