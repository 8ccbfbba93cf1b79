"""An engine's request-duration histogram, read off its Prometheus page for ``graceful advise``.

Every series of the histogram is summed bucket by bucket (data-parallel engines, several
models); the page is read once by engine drain's own read (``read_page``), with its bounds.
"""

from __future__ import annotations

import math

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .._drain._observed import Histogram, ObservationError
from ._page import prefilter
from ._wait import read_page

__all__ = ["EvidenceError", "fetch_histogram", "read_histogram"]


class EvidenceError(Exception):
    """The page gives no histogram to advise from; the message names the fix. ``unreachable``:
    nothing answered at the URL."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def read_histogram(page: str, name: str) -> Histogram:
    """The histogram ``name`` on a Prometheus text page, its series summed; raises EvidenceError."""
    related = {name, f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    try:
        families = list(text_string_to_metric_families(prefilter(page, related)))
    except (ValueError, IndexError, KeyError) as exc:
        raise EvidenceError(f"{name}: malformed metric line ({exc})") from None
    buckets: dict[float, float] = {}
    series: dict[tuple[tuple[str, str], ...], set[float]] = {}  # each series' bucket bounds
    total = 0.0
    kinds = set()
    for family in families:
        kinds.add(family.type)
        for sample in family.samples:
            if sample.name == f"{name}_bucket" and "le" in sample.labels:
                try:
                    le = float(sample.labels["le"])
                except ValueError:
                    raise EvidenceError(f"{name}: bucket le={sample.labels['le']!r} is not a number") from None
                bound = math.inf if math.isinf(le) else le
                buckets[bound] = buckets.get(bound, 0.0) + float(sample.value)
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
                series.setdefault(labels, set()).add(bound)
            elif sample.name == f"{name}_sum":
                total += float(sample.value)
    if len({frozenset(bounds) for bounds in series.values()}) > 1:
        raise EvidenceError(
            f"{name}: its series have different buckets and cannot be summed; "
            "give every engine the same buckets (vLLM: the same --custom-histogram-buckets)"
        )
    if not buckets:
        if "summary" in kinds:
            raise EvidenceError(
                f"{name} is a summary on this page, not a histogram: its quantiles cover a sliding window "
                "and cannot be merged; export it as a histogram (bucket boundaries) or name another with --histogram"
            )
        raise EvidenceError(
            f"the page has no histogram {name}; start the engine with its metrics on "
            "(vLLM without --disable-log-stats, SGLang with --enable-metrics), or name one with --histogram"
        )
    try:
        return Histogram.from_cumulative(buckets, total)
    except ObservationError as exc:
        raise EvidenceError(f"{name}: {exc}") from None


async def fetch_histogram(url: str, name: str, limit: float = 5.0) -> Histogram:
    """GET ``url`` (the whole read within ``limit`` seconds) and read the histogram ``name`` off it."""
    try:
        async with httpx.AsyncClient(timeout=limit) as client:
            read = await read_page(client, url, limit)
    except httpx.InvalidURL as exc:
        raise EvidenceError(f"--metrics-url {url!r} is not a URL ({exc}); give http://HOST:PORT/metrics") from None
    if read.page is None:
        raise EvidenceError(
            f"cannot read {url}: {read.error}; is the engine running there? fix --metrics-url",
            unreachable=read.refused,
        )
    return read_histogram(read.page, name)
