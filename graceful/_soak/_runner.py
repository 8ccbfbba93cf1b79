"""``graceful soak``: short, long and streaming traffic against an OpenAI-compatible endpoint, every request judged.

Each request ends with exactly one reason (see ``REASONS`` and docs/soak.md's end
reasons table). The distinction that matters most is *when* a connection died:
before it was established (``refused``: safe to retry), after the request was sent
but before any response header (``ambiguous``: it may have run), or after the body
started (``truncated``: it ran, at least partly).
"""

from __future__ import annotations

import math
import random
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx

from .._drain._errors import ConfigError
from .._resume._transport import AsyncResumingTransport
from ._attempt import Outcome, describe, run_attempt
from ._report import CLASSES, Attempt, RequestRecord, SoakReport

__all__ = ["SoakConfig", "endpoint", "parse_weights", "run_soak"]

RetryPolicy = Literal["none", "sdk"]
DEFAULT_MIX = {"short": 50, "long": 20, "stream": 30}
DEFAULT_LENGTHS = {"short": 8, "long": 256, "stream": 128}


@dataclass(frozen=True)
class SoakConfig:
    """What ``run_soak`` sends, how fast, and for how long.

    ``concurrency`` workers send back to back (closed loop); with ``rate`` set,
    requests start at that many per second (open loop, Poisson arrivals) and
    ``concurrency`` caps how many are in flight. ``timeout`` bounds each attempt.
    With ``resume``, requests go through ``AsyncResumingTransport`` (at most
    ``max_resumes`` continuations per stream) and streams ask for a final usage chunk.
    With ``exact_length``, every request asks for exactly its ``max_tokens`` (``ignore_eos``,
    temperature 0, and the final usage chunk on streams), and an answer is whole only if it
    stopped for length with that many completion tokens: for engines whose text is not known
    in advance, such as vLLM. With ``check_count``, streams ask for the final usage chunk and
    their text is checked against the example server's count as with ``resume``: for streams
    that something between client and server continues out of the client's sight (a gateway
    that resumes). ``headers`` go with every request (a gateway's API key, say); the report
    keeps their names only.
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
    resume: bool = False
    max_resumes: int = 3
    exact_length: bool = False
    check_count: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)

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
        for flag in ("resume", "exact_length", "check_count"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{flag}: {getattr(self, flag)!r} is not a boolean; use True or False")
        if isinstance(self.max_resumes, bool) or not isinstance(self.max_resumes, int) or self.max_resumes < 0:
            raise ConfigError(
                f"max_resumes: {self.max_resumes!r} is not a whole number of 0 or more; use e.g. 3 (0: never resume)"
            )
        if not isinstance(self.headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.headers.items()
        ):
            raise ConfigError(f"headers: {dict(self.headers)!r} must map header names to strings")
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
    # server that closes them under a request already on its way. Only the server ends
    # a connection: with httpx's keep-alive expiry (5 s) a client whose loop stalled that
    # long could close one it had just sent a request on (encode/httpcore#1110), a loss
    # of the client's own that no server caused.
    limits = httpx.Limits(
        max_connections=config.concurrency, max_keepalive_connections=config.concurrency, keepalive_expiry=None
    )
    timeout = httpx.Timeout(config.timeout, pool=None)
    options: dict[str, Any] = {"limits": limits}
    if config.resume:
        inner = httpx.AsyncHTTPTransport(limits=limits)
        options = {"transport": AsyncResumingTransport(inner, max_resumes=config.max_resumes)}
    async with httpx.AsyncClient(timeout=timeout, headers={"user-agent": "graceful-soak"}, **options) as client:

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
    settings["headers"] = sorted(config.headers)  # their names: a value may be a secret
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
    if cfg.exact_length:
        # A known length from any model: greedy, and the end-of-sequence token ignored (vLLM's, SGLang's).
        body.update(temperature=0, ignore_eos=True)
    if stream and (cfg.resume or cfg.exact_length or cfg.check_count):
        # The usage counts the tokens; a resumed stream's spliced usage must get them right.
        body["stream_options"] = {"include_usage": True}
    headers = {**cfg.headers, "x-request-id": record.request_id, "idempotency-key": record.idempotency_key}
    tries = cfg.max_retries + 1 if cfg.retry == "sdk" else 1
    for n in range(tries):
        attempt = Attempt(reason="timeout", start=time.time())
        record.history.append(attempt)
        text: list[str] | None = [] if stream and (cfg.resume or cfg.check_count) else None
        outcome = Outcome(expected=record.expected_tokens, text=text, exact=cfg.exact_length)
        with anyio.move_on_after(cfg.timeout) as deadline:
            await run_attempt(client, url, body, {**headers, "x-soak-attempt": str(n)}, stream, attempt, outcome)
        if deadline.cancelled_caught and attempt.reason != "ended_by_server":
            attempt.reason, attempt.error = "timeout", f"no complete answer within {cfg.timeout:g}s"
        attempt.end = time.time()
        record.tokens, record.bytes = outcome.tokens, attempt.bytes
        if n + 1 < tries and outcome.retryable(attempt):
            await anyio.sleep(outcome.delay(n, base=cfg.retry_base, cap=cfg.retry_cap, rng=rng))
            continue
        break
    last = record.history[-1]
    record.end, record.reason, record.status = last.end, last.reason, last.status
    record.served_by, record.replay, record.error = last.served_by, last.replay, last.error
    record.resumes = last.resumes


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
            notes.append(f"could not read execution counts from {url}: {describe(exc)}")
    return (total if len(notes) < len(dict.fromkeys(urls)) else None), notes
