"""Prometheus metrics, read from the Drain at scrape time.

The hot path only bumps plain ints on the Drain; this collector turns them into
``graceful_*`` families when someone scrapes, so a request pays no lock and no
label lookup for metrics.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ._state import OUTCOMES, Drain, State

__all__ = ["GracefulCollector", "register"]

DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)

# One graceful collector per registry: a newer Drain replaces an older one instead of
# failing with "Duplicated timeseries" (tests, reloads).
_installed: weakref.WeakKeyDictionary[CollectorRegistry, GracefulCollector] = weakref.WeakKeyDictionary()


class GracefulCollector(Collector):
    def __init__(self, drain: Drain) -> None:
        self.drain = drain

    def collect(self) -> Iterator[Metric]:
        drain = self.drain
        state = GaugeMetricFamily(
            "graceful_state", "1 for the current drain state, 0 for the others.", labels=["state"]
        )
        for member in State:
            state.add_metric([member.value], 1.0 if drain.state is member else 0.0)
        yield state
        yield GaugeMetricFamily("graceful_in_flight", "Requests and jobs admitted and not finished.", drain.in_flight)
        yield _counter(
            "graceful_requests", "Finished requests by outcome.", "outcome", dict(zip(OUTCOMES, drain._outcomes))
        )
        yield _counter("graceful_rejected", "Requests refused before the app saw them.", "reason", drain._rejected)
        yield _counter("graceful_drains", "Drains by result.", "result", drain._drains)
        yield _counter(
            "graceful_truncated_streams", "Responses ended early by the drain deadline.", "reason", drain._truncated
        )
        yield _histogram(drain.drain_durations)


def _counter(name: str, doc: str, label: str, values: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], float(value))
    return family


def _histogram(samples: list[float]) -> HistogramMetricFamily:
    buckets: list[tuple[str, float]] = []
    for bound in DURATION_BUCKETS:
        buckets.append((repr(bound), float(sum(1 for s in samples if s <= bound))))
    buckets.append(("+Inf", float(len(samples))))
    return HistogramMetricFamily(
        "graceful_drain_duration_seconds", "How long drains took.", buckets=buckets, sum_value=sum(samples)
    )


def register(drain: Drain, registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """Expose ``drain`` on ``registry`` (the default registry if None)."""
    registry = REGISTRY if registry is None else registry
    old = _installed.get(registry)
    if old is not None:
        if old.drain is drain:
            return registry
        registry.unregister(old)
    collector = GracefulCollector(drain)
    registry.register(collector)
    _installed[registry] = collector
    return registry
