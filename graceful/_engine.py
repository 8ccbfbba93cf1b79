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
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

from ._budget import DEFAULT_GRACE_PERIOD, ConfigError, parse_duration

__all__ = [
    "MAX_KV_BUFFER",
    "PRESETS",
    "EngineConfig",
    "EngineDrainResult",
    "EnginePreset",
    "EngineProgress",
    "effective_wait",
    "poll",
    "read_metrics",
    "wait_idle",
]

logger = logging.getLogger("graceful.engine")

EngineOutcome = Literal["idle", "timeout", "gone"]

MAX_KV_BUFFER = 30.0
# The 70% rule of the hook proposed for kthena's ModelServing (its lossless-upgrade pull request): leave 30% of
# the grace period for SIGTERM, the engine's own shutdown and process exit.
GRACE_SHARE = 0.7
REFUSED_READS = 3
# A metrics page larger than this is not a metrics page; stop reading and count the poll as unreadable.
MAX_PAGE_BYTES = 64 * 1024 * 1024
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,|$)')
_SELECTOR_HELP = (
    """give NAME or NAME{label="value",...} with double-quoted values, """
    """e.g. --metric 'nv_trt_llm_request_metrics{request_type="active"}'"""
)


@dataclass(frozen=True)
class MetricSpec:
    """A metric name, optionally narrowed to the series whose labels equal ``labels``."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.labels)


def parse_metric(text: str) -> MetricSpec:
    """Parse ``name`` or ``name{label="value",...}``; raises :class:`ConfigError` naming the value."""
    if not isinstance(text, str):
        raise ConfigError(f"metric: {text!r} is not a string; {_SELECTOR_HELP}")
    stripped = text.strip()
    brace = stripped.find("{")
    name = stripped if brace == -1 else stripped[:brace].rstrip()
    if not _NAME.fullmatch(name):
        raise ConfigError(f"metric: {text!r} is not a Prometheus metric name; {_SELECTOR_HELP}")
    if brace == -1:
        return MetricSpec(name)
    if not stripped.endswith("}"):
        raise ConfigError(f"metric: {text!r} has an unclosed label selector; {_SELECTOR_HELP}")
    body = stripped[brace + 1 : -1]
    labels: dict[str, str] = {}
    pos = 0
    while body[pos:].strip():
        match = _LABEL.match(body, pos)
        if match is None:
            raise ConfigError(f"metric: {text!r} has a malformed label selector; {_SELECTOR_HELP}")
        key, raw = match.group(1), match.group(2)
        value = re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), raw)
        if key in labels:
            raise ConfigError(f"metric: {text!r} names label {key!r} twice; {_SELECTOR_HELP}")
        labels[key] = value
        pos = match.end()
    if not labels:
        raise ConfigError(f"metric: {text!r} has an empty label selector; drop the braces or {_SELECTOR_HELP}")
    return MetricSpec(name, tuple(sorted(labels.items())))


@dataclass(frozen=True)
class EnginePreset:
    """The metrics that count an engine's in-flight requests, and where it serves them.

    ``optional`` metrics read 0 when absent: they belong to one backend or one serving
    mode only (Triton's backends, SGLang's prefill/decode queues), so their absence means
    "not this backend", never "unknown". Every other metric is required, and an absent
    required metric is unknown. ``activity`` counters must hold still across the zero
    reads: a change means requests moved while the gauges read zero (SGLang refreshes its
    gauges only at batch log points). ``min_idle_span`` is the shortest time the zero
    reads must cover. ``fresh_page`` lists the only metrics the page of an engine that
    has never served a request may hold (TGI registers its gauges at the first request):
    when no preset metric is on the page and nothing else is either, every metric reads 0.
    ``absent_hint`` is said when a required metric is absent.
    """

    name: str
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    url: str
    optional: tuple[str, ...] = ()
    activity: tuple[str, ...] = ()
    min_idle_span: float = 0.0
    fresh_page: tuple[str, ...] | None = None
    absent_hint: str = ""

    @property
    def metrics(self) -> tuple[str, ...]:
        return self.running + self.waiting

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(name for name in self.metrics if name not in self.optional)


_SGLANG_PD = (
    "sglang:num_prefill_prealloc_queue_reqs",  # prefill worker: waiting for the decode peer's bootstrap
    "sglang:num_prefill_inflight_queue_reqs",  # prefill worker: KV cache being sent
    "sglang:num_decode_prealloc_queue_reqs",  # decode worker: waiting for KV memory
    "sglang:num_decode_transfer_queue_reqs",  # decode worker: KV cache being received
)
_TRITON_BACKENDS = (
    'nv_trt_llm_request_metrics{request_type="active"}',  # TensorRT-LLM backend: in the executor
    "vllm:num_requests_running",  # vLLM backend
    'nv_trt_llm_request_metrics{request_type="waiting"}',  # TensorRT-LLM: queued in the executor (newer)
    "vllm:num_requests_waiting",
)

PRESETS: Mapping[str, EnginePreset] = {
    preset.name: preset
    for preset in (
        EnginePreset(
            "vllm",
            ("vllm:num_requests_running",),
            ("vllm:num_requests_waiting",),
            "http://127.0.0.1:8000/metrics",
            absent_hint="is the engine started with --disable-log-stats?",
        ),
        EnginePreset(
            "sglang",
            ("sglang:num_running_reqs", _SGLANG_PD[1], _SGLANG_PD[3]),
            ("sglang:num_queue_reqs", "sglang:num_grammar_queue_reqs", _SGLANG_PD[0], _SGLANG_PD[2]),
            "http://127.0.0.1:30000/metrics",
            optional=("sglang:num_grammar_queue_reqs", *_SGLANG_PD),
            # Finished requests, first tokens and streamed tokens: any of them moving means work.
            activity=(
                "sglang:num_requests_total",
                "sglang:time_to_first_token_seconds_count",
                "sglang:inter_token_latency_seconds_count",
            ),
            # A request that reaches an idle scheduler is logged as 0 running, 0 queued by its own
            # prefill batch; the next refresh comes after --decode-log-interval (40) decode steps.
            min_idle_span=5.0,
            absent_hint="is the engine started with --enable-metrics?",
        ),
        # TGI serves /metrics on its main port: 80 in the official container (PORT=80), 3000 outside it.
        EnginePreset(
            "tgi",
            ("tgi_batch_current_size",),
            ("tgi_queue_size",),
            "http://127.0.0.1:80/metrics",
            # The router installs its recorder after the backend sets this gauge, so even it is
            # usually missing; tgi_request_count appears with the first request.
            fresh_page=("tgi_batch_max_total_tokens",),
        ),
        # Triton's pending count covers queued requests only; executing ones show in the backend's gauges.
        EnginePreset(
            "triton",
            _TRITON_BACKENDS[:2],
            ("nv_inference_pending_request_count", *_TRITON_BACKENDS[2:]),
            "http://127.0.0.1:8002/metrics",
            optional=_TRITON_BACKENDS,
        ),
    )
}


# --------------------------------------------------------------------------- parsing


class PageError(ValueError):
    """The page is not Prometheus text exposition where it matters."""


def _prefilter(page: str, names: Collection[str]) -> str:
    """Keep only the lines about ``names`` (and their HELP/TYPE lines), in page order.

    Real vLLM pages run to hundreds of KB of histogram buckets; the text parser costs
    microseconds per line, ``str.find`` costs nanoseconds per byte. A metric name occurs
    a handful of times on a page, so each occurrence may cost a look at its own line.
    """
    # A counter is one metric under two names: prometheus-client writes ``foo_total``,
    # other exporters (TGI, Triton) write ``foo``, and the parser reports ``foo_total``.
    related = set(names) | {name + "_total" for name in names}
    related |= {name[: -len("_total")] for name in names if name.endswith("_total")}
    text = "\n" + page
    spans: set[tuple[int, int]] = set()
    for name in related:
        pos = text.find(name)
        while pos != -1:
            after = pos + len(name)
            following = text[after] if after < len(text) else "\n"
            start = text.rfind("\n", 0, pos) + 1
            prefix = text[start:pos]
            # A sample line (leading spaces or tabs are valid), or this name's HELP or TYPE line.
            sample = following in "{ \t" and not prefix.strip(" \t")
            comment = following in " \t\r\n" and prefix[-1:] in (" ", "\t") and prefix.split() in _COMMENTS
            if sample or comment:
                end = text.find("\n", after)
                spans.add((start, len(text) if end == -1 else end))
            pos = text.find(name, after)
    return "".join(text[start:end].lstrip(" \t") + "\n" for start, end in sorted(spans))


_COMMENTS = (["#", "HELP"], ["#", "TYPE"])
_SUMMED = ("counter", "unknown", "untyped")


def read_metrics(page: str, names: Sequence[str]) -> dict[str, float | None]:
    """Sum the matching series of each metric in ``names`` on a Prometheus text page.

    Each name is ``name`` or ``name{label="value",...}``; a selector keeps only the series
    whose labels equal every given value. Names match exactly, never by prefix. When no
    series carries the exact name, a counter answers to its name with or without
    ``_total``. The value is ``None`` when the metric is absent and NaN when a series reads
    NaN. Raises :class:`PageError` when a line about one of ``names`` is malformed, and
    :class:`ConfigError` for a malformed name.
    """
    specs = {name: parse_metric(name) for name in names}
    exact: dict[str, float | None] = dict.fromkeys(names)
    alias: dict[str, float | None] = dict.fromkeys(names)
    try:
        families = list(text_string_to_metric_families(_prefilter(page, {s.name for s in specs.values()})))
    except (ValueError, IndexError, KeyError) as exc:
        raise PageError(f"malformed metric line ({exc})") from None
    for family in families:
        # The parser files ``foo`` of a ``counter`` family as ``foo_total``, and ``foo_total`` under a
        # ``# TYPE foo counter`` line (OpenMetrics style) as an untyped family of its own.
        summed = family.type in _SUMMED
        for sample in family.samples:
            for key, spec in specs.items():
                if not spec.matches(sample.labels):
                    continue
                if sample.name == spec.name:
                    target = exact
                elif summed and (
                    sample.name == spec.name + "_total"
                    or (spec.name.endswith("_total") and sample.name == spec.name[: -len("_total")])
                ):
                    target = alias
                else:
                    continue
                previous = target[key]
                target[key] = float(sample.value) + (0.0 if previous is None else previous)
    # Exact name first: a gauge ``foo`` and an unrelated counter ``foo_total`` on one page are two metrics.
    return {name: alias[name] if exact[name] is None else exact[name] for name in names}


def _has_only(page: str, allowed: Collection[str]) -> bool:
    """Whether every sample line on ``page`` is about one of ``allowed`` (an empty page qualifies)."""
    for line in page.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _NAME.match(line)
        name = match.group(0) if match else line
        if name not in allowed:
            return False
    return True


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class EngineProgress:
    """One read of the engine's metrics page, as reported to ``on_progress``."""

    reads: int
    values: dict[str, float | None]
    error: str | None
    idle_streak: int
    elapsed: float
    limit: float


@dataclass(frozen=True)
class EngineDrainResult:
    """How an engine drain ended.

    ``result`` is ``idle`` when every metric read zero on enough consecutive reads,
    ``gone`` when the engine refused connections on 3 reads in a row (nothing left to
    protect), and ``timeout`` when the budget ran out first.
    """

    result: EngineOutcome
    reads: int
    values: dict[str, float | None]
    duration: float
    limit: float
    url: str
    last_error: str | None = None
    kv_buffer_held: float = 0.0

    @property
    def idle(self) -> bool:
        return self.result == "idle"

    @property
    def exit_code(self) -> int:
        return 1 if self.result == "timeout" else 0

    def as_dict(self) -> dict[str, object]:
        return {
            "result": self.result,
            "exit_code": self.exit_code,
            "reads": self.reads,
            "values": {name: _json_number(value) for name, value in self.values.items()},
            "duration": round(self.duration, 6),
            "limit": round(self.limit, 6),
            "kv_buffer_held": round(self.kv_buffer_held, 6),
            "url": self.url,
            "last_error": self.last_error,
        }


def _json_number(value: float | None) -> float | str | None:
    # JSON has no NaN or Infinity; keep them readable instead of emitting invalid JSON.
    if value is None or math.isfinite(value):
        return value
    return str(value)


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class EngineConfig:
    """What engine mode watches, and for how long. Validated on creation.

    ``engine`` names a preset (``vllm``, ``sglang``, ``tgi``, ``triton``) or is an
    :class:`EnginePreset`; ``metrics`` and ``metrics_url`` replace its metrics and URL.
    After creation ``metrics`` holds the names watched and ``metrics_url`` the page read,
    whichever gave them. Durations are seconds; ``kv_buffer`` and ``propagation_wait``
    also take text such as ``"5s"``. Raises :class:`ConfigError` naming the wrong value.
    """

    engine: str | EnginePreset | None = None
    metrics_url: str | None = None
    metrics: Sequence[str] = ()
    interval: float = 1.0
    idle_reads: int = 2
    kv_buffer: float | str = 0.0
    propagation_wait: float | str = 0.0
    timeout: float | None = None
    grace_period: float | None = None
    preset: EnginePreset | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        engine, preset = self.engine, None
        if isinstance(engine, EnginePreset):
            preset = engine
        elif engine is not None:
            preset = PRESETS.get(engine.strip().lower())
            if preset is None:
                raise ConfigError(f"engine: unknown engine {engine!r}; use one of {', '.join(PRESETS)}")
        names = tuple(dict.fromkeys(self.metrics)) or (preset.metrics if preset else ())
        if not names:
            raise ConfigError("no metrics to watch; pass --engine vllm|sglang|tgi|triton or at least one --metric NAME")
        for name in names:
            parse_metric(name)
        url = self.metrics_url or (preset.url if preset else None)
        if not url:
            raise ConfigError("no metrics URL; pass --metrics-url http://127.0.0.1:PORT/metrics or an --engine preset")
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL:
            parsed = httpx.URL()
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ConfigError(f"metrics-url: {url!r} is not an http(s) URL; use e.g. http://127.0.0.1:8000/metrics")
        for label, seconds in (
            ("interval", self.interval),
            ("timeout", self.timeout),
            ("grace-period", self.grace_period),
        ):
            if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
                raise ConfigError(f"{label}: {seconds!r} must be a positive number of seconds")
        reads = self.idle_reads
        if isinstance(reads, bool) or not isinstance(reads, int) or reads < 1:
            raise ConfigError(f"idle-reads: {reads!r} must be a whole number of reads, 1 or more (default 2)")
        kv = parse_duration(self.kv_buffer, name="kv-buffer")
        if kv > MAX_KV_BUFFER:
            raise ConfigError(
                f"kv-buffer: {self.kv_buffer!r} is longer than {MAX_KV_BUFFER:g}s; decode peers pull the last KV "
                "within seconds, and a long hold eats the grace period: use 30s or less"
            )
        wait = parse_duration(self.propagation_wait, name="propagation-wait")
        limit = effective_wait(self.timeout, self.grace_period)
        if wait >= limit:
            raise ConfigError(
                f"propagation-wait: {self.propagation_wait!r} does not fit in the {limit:g}s budget "
                f"(min(timeout, {GRACE_SHARE:.0%} of the grace period)); shorten it or raise the grace period"
            )
        for name, value in (
            ("preset", preset),
            ("metrics", names),
            ("metrics_url", url),
            ("kv_buffer", kv),
            ("propagation_wait", wait),
        ):
            object.__setattr__(self, name, value)

    @property
    def limit(self) -> float:
        """The whole budget: ``min(timeout, 70% of grace_period)``."""
        return effective_wait(self.timeout, self.grace_period)

    @property
    def rules(self) -> EnginePreset | None:
        """The preset whose idle rules apply: only when its own metrics are watched (``--metric`` replaces them)."""
        preset = self.preset
        return preset if preset is not None and tuple(self.metrics) == preset.metrics else None


def effective_wait(timeout: float | None, grace_period: float | None) -> float:
    """``min(timeout, 70% of grace_period)``; 70% of Kubernetes' default 30 s when neither is known."""
    if timeout is None and grace_period is None:
        grace_period = DEFAULT_GRACE_PERIOD
    limits = [] if timeout is None else [timeout]
    if grace_period is not None:
        limits.append(GRACE_SHARE * grace_period)
    return min(limits)


# --------------------------------------------------------------------------- polling


@dataclass(frozen=True)
class _Read:
    values: dict[str, float | None] | None = None
    error: str | None = None
    refused: bool = False
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
                raise _Oversize
        return response.status_code, response.charset_encoding or "utf-8", bytes(body)


class _Oversize(Exception):
    pass


async def _read_once(
    client: httpx.AsyncClient, url: str, names: Sequence[str], limit: float, fresh_page: Collection[str] | None = None
) -> _Read:
    # httpx's timeouts apply per socket operation: an engine that trickles bytes never trips them.
    # The cancel scope bounds the whole read, connect to last byte.
    with anyio.move_on_after(limit):
        try:
            status, charset, body = await _fetch(client, url)
        except httpx.ConnectError as exc:
            if _refused(exc):
                return _Read(error="connection refused", refused=True)
            return _Read(error=f"cannot connect: {exc}")
        except httpx.TimeoutException:
            return _Read(error=f"no answer within {limit:.2g}s")
        except httpx.TransportError as exc:
            return _Read(error=f"connection error: {type(exc).__name__}")
        except httpx.DecodingError as exc:
            return _Read(error=f"unreadable page: bad Content-Encoding ({exc})", unreadable=True)
        except _Oversize:
            return _Read(error=f"unreadable page: larger than {MAX_PAGE_BYTES // 2**20} MiB", unreadable=True)
        except (httpx.HTTPError, httpx.StreamError) as exc:
            return _Read(error=f"unreadable page: {type(exc).__name__}: {exc}", unreadable=True)
        return _parse(status, charset, body, names, fresh_page)
    return _Read(error=f"no answer within {limit:.2g}s")


def _parse(status: int, charset: str, body: bytes, names: Sequence[str], fresh_page: Collection[str] | None) -> _Read:
    if status != 200:
        return _Read(error=f"HTTP {status}")
    try:
        page = body.decode(charset)
    except LookupError:
        return _Read(error=f"unreadable page: unknown charset {charset!r}", unreadable=True)
    except UnicodeDecodeError as exc:
        return _Read(error=f"unreadable page: not {charset} text ({exc.reason} at byte {exc.start})", unreadable=True)
    try:
        values = read_metrics(page, names)
    except PageError as exc:
        return _Read(error=f"garbage page: {exc}")
    if all(value is None for value in values.values()):
        if page.lstrip().startswith("<"):
            return _Read(error="garbage page: not Prometheus text (HTML?)")
        if fresh_page is not None and _has_only(page, fresh_page):
            return _Read(values=values, fresh=True)
    return _Read(values=values)


async def wait_idle(
    engine: str | EnginePreset | None = None,
    *,
    metrics_url: str | None = None,
    metrics: Sequence[str] = (),
    interval: float = 1.0,
    idle_reads: int = 2,
    kv_buffer: float | str = 0.0,
    propagation_wait: float | str = 0.0,
    timeout: float | None = None,
    grace_period: float | None = None,
    config: EngineConfig | None = None,
    on_progress: Callable[[EngineProgress], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> EngineDrainResult:
    """Wait until an engine's in-flight metrics read zero, within ``min(timeout, 70% of grace_period)``.

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
    plan: EngineConfig, on_progress: Callable[[EngineProgress], None] | None, warn: Callable[[str], None]
) -> EngineDrainResult:
    url = cast(str, plan.metrics_url)
    kv_buffer = cast(float, plan.kv_buffer)
    propagation_wait = cast(float, plan.propagation_wait)
    start = anyio.current_time()
    deadline = start + plan.limit
    rules = plan.rules
    activity = rules.activity if rules is not None else ()
    values: dict[str, float | None] = dict.fromkeys(plan.metrics)
    warned: set[str] = set()
    reads = streak = refused = 0
    streak_start = 0.0
    error: str | None = None
    moved: dict[str, float | None] | None = None

    def finish(outcome: EngineOutcome, held: float = 0.0) -> EngineDrainResult:
        duration = anyio.current_time() - start
        return EngineDrainResult(outcome, reads, values, duration, plan.limit, url, error, held)

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
            limit = min(0.9 * plan.interval, deadline - now)
            fresh_page = rules.fresh_page if rules is not None else None
            read = await _read_once(client, url, tuple(plan.metrics) + activity, limit, fresh_page)
            read_at = anyio.current_time()
            reads += 1
            error = read.error
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
                on_progress(EngineProgress(reads, values, error, streak, read_at - start, plan.limit))
            if refused >= REFUSED_READS:
                return finish("gone")
            span = rules.min_idle_span if rules is not None else 0.0
            if streak >= plan.idle_reads and read_at - streak_start >= span:
                break
            tick = max(tick + plan.interval, anyio.current_time())
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
