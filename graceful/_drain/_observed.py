"""Request durations as the server saw them: fixed buckets, counted off the hot path.

A clock read at each release would cost a request more instructions than the rest of its
release, so nothing on the request path counts durations. The ledger's ``count_durations``, run every
``SWEEP`` seconds, counts the work that finished since the last one into ``RequestHistograms``: work
it saw in flight by the time from its admission to now (rounded up by less than ``SWEEP``),
work that came and went between two sweeps as plain, shorter than the time between them.
Everything else reads ``Histogram`` snapshots: the Prometheus family at scrape time, the admin
status, merging the workers and an engine's page, the percentiles and the share a budget
leaves uncovered.

``BOUNDS`` holds vLLM's request-latency buckets (``REQUEST_LATENCY_BUCKETS`` in
vllm/v1/metrics/buckets.py) and more between them, so an engine page and graceful's own
counts can be read side by side: every vLLM bound is one of graceful's.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["BOUNDS", "KINDS", "PLAIN", "STREAM", "SWEEP", "Histogram", "ObservationError", "RequestHistograms"]

SWEEP = 0.1  # seconds between two sweeps of the ledger

# Upper bounds in seconds (the last bucket, above 7680 s, has none). vLLM's bounds are all here.
BOUNDS: tuple[float, ...] = (
    *(0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 3.5, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    *(90.0, 120.0, 180.0, 240.0, 360.0, 480.0, 720.0, 960.0, 1440.0, 1920.0, 3840.0, 7680.0),
)
# How a finished item counts: a stream sent body frames before its last one (an SSE token
# stream, a chunked download) or was a WebSocket session; everything else is plain.
KINDS = ("plain", "stream")
PLAIN, STREAM = 0, 1


class ObservationError(ValueError):
    """Observations that cannot be read: buckets out of order, counts that fall, a foreign bucket set."""


class RequestHistograms:
    """The live counts: ``counts[kind][bucket]`` and ``sums[kind]`` (seconds), from ``since`` (wall clock).

    Only the ledger's ``count_durations`` writes them; ``snapshot`` copies them out.
    """

    __slots__ = ("counts", "sums", "since")

    def __init__(self) -> None:
        self.counts = [[0] * (len(BOUNDS) + 1) for _ in KINDS]
        self.sums = [0.0] * len(KINDS)
        self.since = time.time()

    def snapshot(self) -> dict[str, Histogram]:
        """A snapshot per kind, by name (``KINDS``)."""
        return {name: Histogram(BOUNDS, tuple(self.counts[k]), self.sums[k]) for k, name in enumerate(KINDS)}

    def as_dict(self) -> dict[str, object]:
        """The admin status's ``durations``: since and until when (wall clock), the bucket bounds, then
        per kind its counts and sum."""
        return {
            "since": self.since,
            "until": time.time(),
            "bounds": list(BOUNDS),
            **{name: {"counts": list(self.counts[k]), "sum": round(self.sums[k], 6)} for k, name in enumerate(KINDS)},
        }


@dataclass(frozen=True)
class Histogram:
    """Counts per bucket (not cumulative): ``counts[i]`` observations in ``(bounds[i-1], bounds[i]]``,
    and the last in ``(bounds[-1], inf)``; ``total`` is their sum in seconds."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float = 0.0

    def __post_init__(self) -> None:
        if len(self.counts) != len(self.bounds) + 1:
            raise ObservationError(f"{len(self.counts)} counts for {len(self.bounds)} bounds; need one more")
        if any(b <= a for a, b in zip(self.bounds, self.bounds[1:])) or any(c < 0 for c in self.counts):
            raise ObservationError("bucket bounds must rise and counts must be 0 or more")

    @classmethod
    def empty(cls, bounds: Sequence[float] = BOUNDS) -> Histogram:
        return cls(tuple(bounds), (0,) * (len(bounds) + 1))

    @classmethod
    def from_cumulative(cls, buckets: Mapping[float, float], total: float = 0.0) -> Histogram:
        """From Prometheus' cumulative ``le`` buckets (``+Inf`` as ``math.inf``), as a page gives them."""
        if math.inf not in buckets:
            raise ObservationError("the histogram has no +Inf bucket")
        bounds = sorted(le for le in buckets if le != math.inf)
        counts, before = [], 0.0
        for le in [*bounds, math.inf]:
            value = buckets[le]
            if not math.isfinite(value) or value < before:
                raise ObservationError(f"bucket le={le:g} counts {value:g}, fewer than a lower bucket's {before:g}")
            counts.append(round(value - before))
            before = value
        return cls(tuple(bounds), tuple(counts), total)

    @classmethod
    def from_dict(cls, bounds: Sequence[float], body: Mapping[str, object]) -> Histogram:
        if not isinstance(body, Mapping):
            raise ObservationError("a kind's durations must be an object with counts and sum")
        counts = body.get("counts")
        total = body.get("sum", 0.0)
        if not isinstance(counts, list) or not all(type(c) is int for c in counts):
            raise ObservationError("counts must be a list of integers")
        if not isinstance(total, (int, float)):
            raise ObservationError("sum must be a number")
        return cls(tuple(float(b) for b in bounds), tuple(counts), float(total))

    def cumulative(self) -> list[tuple[float, int]]:
        """Prometheus' ``le`` buckets, ``math.inf`` last: ``from_cumulative`` read backwards."""
        seen, buckets = 0, []
        for bound, count in zip([*self.bounds, math.inf], self.counts):
            seen += count
            buckets.append((bound, seen))
        return buckets

    @property
    def count(self) -> int:
        return sum(self.counts)

    def merged(self, other: Histogram) -> Histogram:
        """Both sets of observations (other workers, other label sets); the bounds must be the same."""
        if other.bounds != self.bounds:
            raise ObservationError("histograms with different buckets cannot be merged")
        return Histogram(self.bounds, tuple(a + b for a, b in zip(self.counts, other.counts)), self.total + other.total)

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket that holds the ``q`` quantile (inf above the last bound; 0 if empty).

        An upper bound, never an interpolation: the true value is at most this, and above the
        bucket's lower bound."""
        n = self.count
        if n == 0:
            return 0.0
        rank = max(1, math.ceil(q * n))
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return self.bounds[index] if index < len(self.bounds) else math.inf
        return math.inf  # not reached: seen ends at n >= rank

    def longest(self) -> float:
        """The upper bound of the highest bucket with an observation (inf above the last bound; 0 if empty)."""
        return self.quantile(1.0)

    def over(self, seconds: float) -> int:
        """How many observations may have lasted longer than ``seconds``: every bucket whose upper bound is above it."""
        cut = bisect.bisect_left(self.bounds, seconds)
        if cut < len(self.bounds) and self.bounds[cut] == seconds:
            cut += 1  # the bucket that ends at ``seconds`` holds nothing longer
        return sum(self.counts[cut:])

    def still_running(self, age: float, more: float) -> float:
        """Of the observations longer than ``age``, the share that may have lasted past ``age + more``.

        For work in flight that has run ``age`` seconds: how likely it runs ``more`` seconds
        more, judged by the work already seen (1.0 when nothing seen ran as long)."""
        older = self.over(age)
        if older == 0:
            return 1.0
        return self.over(age + more) / older


def merge_all(histograms: Iterable[Histogram]) -> Histogram | None:
    merged: Histogram | None = None
    for histogram in histograms:
        merged = histogram if merged is None else merged.merged(histogram)
    return merged
