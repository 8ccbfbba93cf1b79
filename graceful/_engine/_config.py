"""What engine mode watches and for how long (``EngineConfig``), and what it reports.

``EngineConfig`` validates every setting when it is made and raises ``ConfigError`` naming
the wrong value; ``EngineProgress`` and ``EngineDrainResult`` are frozen snapshots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import httpx

from .._drain._durations import DEFAULT_GRACE_PERIOD, check_wait, default_reserve, drain_limit
from .._drain._environ import parse_duration
from .._drain._errors import ConfigError
from ._page import parse_metric
from ._presets import PRESETS, EnginePreset

__all__ = [
    "GRACE_SHARE",
    "MAX_KV_BUFFER",
    "EngineConfig",
    "EngineDrainResult",
    "EngineOutcome",
    "EngineProgress",
    "effective_wait",
    "engine_limit",
]

EngineOutcome = Literal["idle", "timeout", "gone", "dead", "unreachable"]

MAX_KV_BUFFER = 30.0
# The 70% rule of the hook proposed for kthena's ModelServing (its lossless-upgrade pull request): leave 30% of
# the grace period for SIGTERM, the engine's own shutdown and process exit. It applies where that hook's
# environment names (DRAIN_TIMEOUT, GRACE_SECONDS) configure the hook; otherwise engine mode takes the
# drain's own rule, grace_period - reserve (the two agree from a 33.3 s grace period up).
GRACE_SHARE = 0.7


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
    ``gone`` when the engine, having answered before, refused connections on 3 reads in a row
    (nothing left to protect), ``unreachable`` when a read could not connect at all before any
    read had reached the engine (no engine at the URL: exit 3, as ``graceful drain`` finding no
    server), ``dead`` when its health check failed on 2 reads in a row while its metrics read
    busy (the work in flight is lost), and ``timeout`` when the budget ran out first.
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
        return {"timeout": 1, "dead": 1, "unreachable": 3}.get(self.result, 0)

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
    propagation_wait: float | str | None = None  # None: no wait
    timeout: float | None = None
    grace_period: float | None = None
    grace_share: float | None = None
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
        share = self.grace_share
        if share is not None and (isinstance(share, bool) or not (isinstance(share, float | int) and 0 < share <= 1)):
            raise ConfigError(f"grace_share: {share!r} must be a fraction of the grace period, above 0 and at most 1")
        wait = 0.0 if self.propagation_wait is None else parse_duration(self.propagation_wait, name="propagation-wait")
        limit = self.limit
        rule = "grace period - reserve" if share is None else f"{share:.0%} of the grace period"
        try:
            check_wait(
                wait,
                limit,
                bound=f"the {limit:g}s budget, min(timeout, {rule})",
                fix="raise the grace period or the timeout",
            )
        except ConfigError as exc:
            raise exc.named("", lambda option: option.replace("_", "-")) from None  # as engine mode's messages name it
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
        """The whole budget (``engine_limit``): the drain's rule, or ``grace_share`` of the grace period."""
        return engine_limit(self.timeout, self.grace_period, self.grace_share)

    @property
    def rules(self) -> EnginePreset | None:
        """The preset whose idle rules apply: only when its own metrics are watched (``--metric`` replaces them)."""
        preset = self.preset
        return preset if preset is not None and tuple(self.metrics) == preset.metrics else None


def engine_limit(timeout: float | None, grace_period: float | None, grace_share: float | None = None) -> float:
    """Engine mode's budget: the drain's rule, ``min(timeout, grace_period - reserve)`` with the
    default reserve, as a graceful server's drain takes it; the timeout alone when only it is
    given, and Kubernetes' default 30 s grace period when neither is. With ``grace_share``,
    kthena's hook rule (``effective_wait``) instead."""
    if grace_share is not None:
        return effective_wait(timeout, grace_period, grace_share)
    if grace_period is None and timeout is not None:
        return timeout  # as the server-mode hook: no grace period given, none is assumed against the timeout
    grace = DEFAULT_GRACE_PERIOD if grace_period is None else grace_period
    return drain_limit(grace, default_reserve(grace), timeout)


def effective_wait(timeout: float | None, grace_period: float | None, share: float = GRACE_SHARE) -> float:
    """kthena's hook rule: ``min(timeout, 70% of grace_period)``; 70% of Kubernetes' default 30 s when neither
    is known, the timeout alone when only it is."""
    if timeout is None and grace_period is None:
        grace_period = DEFAULT_GRACE_PERIOD
    limits = [] if timeout is None else [timeout]
    if grace_period is not None:
        limits.append(share * grace_period)
    return min(limits)
