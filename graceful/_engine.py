"""Engine drain: a preStop hook for inference engines whose ASGI app cannot be wrapped.

vLLM, SGLang, TGI and Triton each publish how many requests they are running and
queueing on a Prometheus ``/metrics`` page. Polling that page until it reads zero is
what the shell hooks in the field do (kthena's ModelServing preStop, for one); this
module does it without their known faults:

- metric names are matched exactly, so ``vllm:num_requests_waiting_by_reason`` never
  counts as ``vllm:num_requests_waiting``, and any labels in any order are fine;
- every series is summed (data-parallel engines, tensor-parallel ranks);
- values go through a real number parser, so ``0``, ``0.0``, ``0e+00`` and ``-0`` all
  read zero, and a NaN or absent metric is "unknown", never "idle";
- zero must hold for several consecutive reads, because engine gauges lag;
- the wait has its own bound, derived from the pod's grace period.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

from ._budget import DEFAULT_GRACE_PERIOD, ConfigError, env_duration, parse_duration

__all__ = [
    "MAX_KV_BUFFER",
    "PRESETS",
    "EngineDrainResult",
    "EnginePreset",
    "EngineProgress",
    "effective_wait",
    "read_metrics",
    "run_engine_drain",
    "wait_idle",
]

logger = logging.getLogger("graceful.engine")

EngineOutcome = Literal["idle", "timeout", "gone"]

MAX_KV_BUFFER = 30.0
GRACE_SHARE = 0.7  # the kthena hook's rule: leave 30% of the grace period for SIGTERM and exit
REFUSED_READS = 3
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@dataclass(frozen=True)
class EnginePreset:
    """The metrics that count an engine's in-flight requests, and where it serves them."""

    name: str
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    url: str

    @property
    def metrics(self) -> tuple[str, ...]:
        return self.running + self.waiting


PRESETS: Mapping[str, EnginePreset] = {
    preset.name: preset
    for preset in (
        EnginePreset(
            "vllm", ("vllm:num_requests_running",), ("vllm:num_requests_waiting",), "http://127.0.0.1:8000/metrics"
        ),
        EnginePreset(
            "sglang", ("sglang:num_running_reqs",), ("sglang:num_queue_reqs",), "http://127.0.0.1:30000/metrics"
        ),
        # TGI serves /metrics on its main port: 80 in the official container (PORT=80), 3000 outside it.
        EnginePreset("tgi", ("tgi_batch_current_size",), ("tgi_queue_size",), "http://127.0.0.1:80/metrics"),
        # Triton reports queued and executing requests as one gauge per model and version.
        EnginePreset("triton", ("nv_inference_pending_request_count",), (), "http://127.0.0.1:8002/metrics"),
    )
}


# --------------------------------------------------------------------------- parsing


class PageError(ValueError):
    """The page is not Prometheus text exposition where it matters."""


def _prefilter(page: str, names: Collection[str]) -> str:
    """Keep only the lines about ``names`` (and their HELP/TYPE lines), in page order.

    Real vLLM pages run to hundreds of KB of histogram buckets; the text parser costs
    microseconds per line, ``str.find`` costs nanoseconds per byte.
    """
    # A counter is one metric under two names: prometheus-client writes ``foo_total``,
    # other exporters (TGI, Triton) write ``foo``, and the parser reports ``foo_total``.
    related = set(names) | {name + "_total" for name in names}
    related |= {name[: -len("_total")] for name in names if name.endswith("_total")}
    probes = [("\n" + name, "{ \t") for name in related]
    probes += [(f"\n# {kind} {name}", " \t\r\n") for name in related for kind in ("HELP", "TYPE")]
    text = "\n" + page
    spans: list[tuple[int, int]] = []
    for probe, delimiters in probes:
        pos = text.find(probe)
        while pos != -1:
            after = pos + len(probe)
            if after == len(text) or text[after] in delimiters:
                end = text.find("\n", after)
                spans.append((pos + 1, len(text) if end == -1 else end))
            pos = text.find(probe, after)
    spans.sort()
    return "".join(text[start:end] + "\n" for start, end in spans)


def read_metrics(page: str, names: Sequence[str]) -> dict[str, float | None]:
    """Sum every series of each metric in ``names`` on a Prometheus text page.

    Names match exactly, never by prefix; a counter answers to its name with and
    without ``_total``. The value is ``None`` when the metric is absent and NaN when a series
    reads NaN. Raises :class:`PageError` when a line about one of ``names`` is malformed.
    """
    sums: dict[str, float | None] = dict.fromkeys(names)
    try:
        families = list(text_string_to_metric_families(_prefilter(page, sums)))
    except (ValueError, IndexError, KeyError) as exc:
        raise PageError(f"malformed metric line ({exc})") from None
    for family in families:
        counter = family.type == "counter"
        for sample in family.samples:
            keys = {sample.name}
            if counter and sample.name == family.name + "_total":
                keys.add(family.name)
            for key in keys & sums.keys():
                previous = sums[key]
                sums[key] = float(sample.value) + (0.0 if previous is None else previous)
    return sums


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
class _Plan:
    url: str
    metrics: tuple[str, ...]
    interval: float
    idle_reads: int
    kv_buffer: float
    propagation_wait: float
    limit: float
    preset: EnginePreset | None = None


def effective_wait(timeout: float | None, grace_period: float | None) -> float:
    """``min(timeout, 70% of grace_period)``; 70% of Kubernetes' default 30 s when neither is known."""
    if timeout is None and grace_period is None:
        grace_period = DEFAULT_GRACE_PERIOD
    limits = [] if timeout is None else [timeout]
    if grace_period is not None:
        limits.append(GRACE_SHARE * grace_period)
    return min(limits)


def _plan(
    *,
    engine: str | None,
    metrics_url: str | None,
    metrics: Sequence[str],
    interval: float,
    idle_reads: int,
    kv_buffer: float,
    propagation_wait: float,
    timeout: float | None,
    grace_period: float | None,
) -> _Plan:
    preset = None
    if engine is not None:
        preset = PRESETS.get(engine.strip().lower())
        if preset is None:
            raise ConfigError(f"engine: unknown engine {engine!r}; use one of {', '.join(PRESETS)}")
    names = tuple(dict.fromkeys(metrics)) or (preset.metrics if preset else ())
    if not names:
        raise ConfigError("no metrics to watch; pass --engine vllm|sglang|tgi|triton or at least one --metric NAME")
    for name in names:
        if not _NAME.fullmatch(name):
            raise ConfigError(f"metric: {name!r} is not a Prometheus metric name; give the bare name, without labels")
    url = metrics_url or (preset.url if preset else None)
    if not url:
        raise ConfigError("no metrics URL; pass --metrics-url http://127.0.0.1:PORT/metrics or an --engine preset")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        parsed = httpx.URL()
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(f"metrics-url: {url!r} is not an http(s) URL; use e.g. http://127.0.0.1:8000/metrics")
    for label, seconds in (("interval", interval), ("timeout", timeout), ("grace-period", grace_period)):
        if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
            raise ConfigError(f"{label}: {seconds!r} must be a positive number of seconds")
    if isinstance(idle_reads, bool) or not isinstance(idle_reads, int) or idle_reads < 1:
        raise ConfigError(f"idle-reads: {idle_reads!r} must be a whole number of reads, 1 or more (default 2)")
    kv = parse_duration(kv_buffer, name="kv-buffer")
    if kv > MAX_KV_BUFFER:
        raise ConfigError(
            f"kv-buffer: {kv_buffer!r} is longer than {MAX_KV_BUFFER:g}s; decode peers pull the last KV within "
            "seconds, and a long hold eats the grace period: use 30s or less"
        )
    wait = parse_duration(propagation_wait, name="propagation-wait")
    limit = effective_wait(timeout, grace_period)
    if wait >= limit:
        raise ConfigError(
            f"propagation-wait: {propagation_wait!r} does not fit in the {limit:g}s budget "
            f"(min(timeout, {GRACE_SHARE:.0%} of the grace period)); shorten it or raise the grace period"
        )
    return _Plan(url, names, interval, idle_reads, kv, wait, limit, preset)


# --------------------------------------------------------------------------- polling


@dataclass(frozen=True)
class _Read:
    values: dict[str, float | None] | None = None
    error: str | None = None
    refused: bool = False


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


async def _read_once(client: httpx.AsyncClient, url: str, names: Sequence[str], limit: float) -> _Read:
    try:
        response = await client.get(url, timeout=limit)
    except httpx.TimeoutException:
        return _Read(error=f"no answer within {limit:.2g}s")
    except httpx.ConnectError as exc:
        return (
            _Read(error="connection refused", refused=True) if _refused(exc) else _Read(error=f"cannot connect: {exc}")
        )
    except httpx.TransportError as exc:
        return _Read(error=f"connection error: {type(exc).__name__}")
    if response.status_code != 200:
        return _Read(error=f"HTTP {response.status_code}")
    page = response.text
    try:
        values = read_metrics(page, names)
    except PageError as exc:
        return _Read(error=f"garbage page: {exc}")
    if all(value is None for value in values.values()) and page.lstrip().startswith("<"):
        return _Read(error="garbage page: not Prometheus text (HTML?)")
    return _Read(values=values)


async def wait_idle(
    engine: str | None = None,
    *,
    metrics_url: str | None = None,
    metrics: Sequence[str] = (),
    interval: float = 1.0,
    idle_reads: int = 2,
    kv_buffer: float = 0.0,
    propagation_wait: float = 0.0,
    timeout: float | None = None,
    grace_period: float | None = None,
    on_progress: Callable[[EngineProgress], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> EngineDrainResult:
    """Wait until an engine's in-flight metrics read zero, within ``min(timeout, 70% of grace_period)``.

    ``engine`` names a preset (``vllm``, ``sglang``, ``tgi``, ``triton``); ``metrics`` and
    ``metrics_url`` override its metrics and URL. Raises :class:`ConfigError` for bad
    settings. Unlike the ``graceful drain`` command, this reads no environment variables.
    """
    plan = _plan(
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
    return await _poll(plan, on_progress, on_warning or logger.warning)


async def _poll(
    plan: _Plan, on_progress: Callable[[EngineProgress], None] | None, warn: Callable[[str], None]
) -> EngineDrainResult:
    start = anyio.current_time()
    deadline = start + plan.limit
    values: dict[str, float | None] = dict.fromkeys(plan.metrics)
    warned: set[str] = set()
    reads = streak = refused = 0
    error: str | None = None

    def finish(outcome: EngineOutcome, held: float = 0.0) -> EngineDrainResult:
        duration = anyio.current_time() - start
        return EngineDrainResult(outcome, reads, values, duration, plan.limit, plan.url, error, held)

    # trust_env=False: a pod's HTTP(S)_PROXY must not route a loopback scrape elsewhere.
    # verify=False for plain http skips loading the CA bundle, which costs up to a second on a busy node.
    https = plan.url.lower().startswith("https:")
    async with httpx.AsyncClient(trust_env=False, verify=https, headers={"Accept": "text/plain"}) as client:
        # Endpoints need time to drop this pod; requests still arrive until they do.
        await anyio.sleep(plan.propagation_wait)
        tick = anyio.current_time()
        while True:
            now = anyio.current_time()
            if now >= deadline:
                return finish("timeout")
            # Keep each read shorter than the interval so a hung engine cannot stretch the schedule.
            read = await _read_once(client, plan.url, plan.metrics, min(0.9 * plan.interval, deadline - now))
            reads += 1
            error = read.error
            refused = refused + 1 if read.refused else 0
            if read.values is not None:
                values = read.values
                _warn_unknown(values, plan.url, warned, warn)
            if read.error and read.error.startswith("HTTP 4") and read.error not in warned:
                warned.add(read.error)
                warn(f"{plan.url} answered {read.error}; check --metrics-url. Polling continues")
            zero = read.values is not None and all(value == 0 for value in read.values.values())
            streak = streak + 1 if zero else 0
            if on_progress is not None:
                elapsed = anyio.current_time() - start
                on_progress(EngineProgress(reads, values, error, streak, elapsed, plan.limit))
            if refused >= REFUSED_READS:
                return finish("gone")
            if streak >= plan.idle_reads:
                break
            tick = max(tick + plan.interval, anyio.current_time())
            await anyio.sleep_until(min(tick, deadline))
    # Disaggregated decode peers may still be pulling the last KV from this (prefill) engine.
    held = max(0.0, min(plan.kv_buffer, deadline - anyio.current_time()))
    await anyio.sleep(held)
    return finish("idle", held)


def _warn_unknown(values: Mapping[str, float | None], url: str, warned: set[str], warn: Callable[[str], None]) -> None:
    for name, value in values.items():
        if value is None or math.isnan(value):
            key = f"{name}:{'absent' if value is None else 'nan'}"
            if key not in warned:
                warned.add(key)
                state = "absent from" if value is None else "NaN on"
                warn(f"metric {name!r} is {state} {url}; it counts as unknown, so the engine is never reported idle")


# --------------------------------------------------------------------------- command line


def _say(message: str) -> None:
    print(f"graceful drain: {message}", file=sys.stderr, flush=True)


def _show(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def _counts(plan: _Plan, values: Mapping[str, float | None]) -> str:
    preset = plan.preset
    if preset is not None and plan.metrics == preset.metrics:
        parts = []
        for role, names in (("running", preset.running), ("waiting", preset.waiting)):
            if names:
                known = [values.get(name) for name in names]
                total = None if None in known else sum(v for v in known if v is not None)
                parts.append(f"{role}={_show(total)}")
        return " ".join(parts)
    return " ".join(f"{name}={_show(values.get(name))}" for name in plan.metrics)


class _Progress:
    """Prints at most one progress line a second; reads may come faster."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.last: float | None = None

    def __call__(self, progress: EngineProgress) -> None:
        if self.last is not None and progress.elapsed - self.last < 1.0:
            return
        self.last = progress.elapsed
        state = f"{progress.error} (busy or sick)" if progress.error else _counts(self.plan, progress.values)
        remaining = max(0.0, progress.limit - progress.elapsed)
        _say(
            f"{state}; read {progress.reads}, idle {progress.idle_streak}/{self.plan.idle_reads}, "
            f"elapsed {progress.elapsed:.1f}s, deadline in {remaining:.1f}s"
        )


def _env_fallbacks(timeout: float | None, grace_period: float | None) -> tuple[float | None, float | None]:
    # DRAIN_TIMEOUT and GRACE_SECONDS are the kthena hook's names, read so this is a drop-in replacement.
    if timeout is None:
        timeout = env_duration("DRAIN_TIMEOUT")
    for var in ("GRACEFUL_GRACE_PERIOD", "GRACE_SECONDS"):
        if grace_period is None:
            grace_period = env_duration(var)
    return timeout, grace_period


def run_engine_drain(
    *,
    engine: str | None,
    metrics_url: str | None,
    metrics: tuple[str, ...],
    interval: float,
    idle_reads: int,
    kv_buffer: float,
    propagation_wait: float,
    timeout: float | None,
    grace_period: float | None,
    quiet: bool,
    json_output: bool,
) -> int:
    """``graceful drain --engine``: exit 0 when idle or gone, 1 when the budget ran out, 2 on bad usage."""
    try:
        timeout, grace_period = _env_fallbacks(timeout, grace_period)
        plan = _plan(
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
    except ConfigError as exc:
        _say(f"error: {exc}")
        return 2
    if not quiet:
        _say(
            f"waiting for {', '.join(plan.metrics)} to read 0 on {plan.idle_reads} consecutive reads of {plan.url} "
            f"(every {plan.interval:g}s, budget {plan.limit:g}s, propagation wait {plan.propagation_wait:g}s)"
        )
    result = anyio.run(partial(_poll, plan, None if quiet else _Progress(plan), _warn))
    return _report(plan, result, quiet, json_output)


def _warn(text: str) -> None:
    _say(f"warning: {text}")


def _report(plan: _Plan, result: EngineDrainResult, quiet: bool, json_output: bool) -> int:
    counts = _counts(plan, result.values)
    if result.result == "gone":
        _say(
            f"connection refused on {REFUSED_READS} reads in a row at {plan.url}: the engine is gone, nothing to drain"
        )
    elif result.result == "timeout":
        detail = f"; last read: {result.last_error}" if result.last_error else ""
        _say(f"budget of {plan.limit:g}s ran out with {counts}{detail}; the engine gets SIGTERM with work in flight")
    elif not quiet:
        held = f", then held the KV buffer {result.kv_buffer_held:g}s" if result.kv_buffer_held else ""
        _say(f"engine idle ({counts}) after {result.reads} reads in {result.duration:.1f}s{held}")
    if json_output:
        print(json.dumps(result.as_dict()), flush=True)
    return result.exit_code
