"""Prometheus metrics, read from the Drain at scrape time.

The hot path only bumps plain ints on the Drain; this collector turns them into
``graceful_*`` families when someone scrapes, so a request pays no lock and no
label lookup for metrics.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Iterator

import prometheus_client
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .._drain._state import Drain, core
from .._drain._status import State

__all__ = ["GracefulCollector", "MultiprocessMirror", "register", "render"]

# Every graceful_* metric, written once: read by the collector and the multi-process mirror.
STATE = ("graceful_state", "1 for the current drain state, 0 for the others; multi-process: workers in each state.")
IN_FLIGHT = ("graceful_in_flight", "Requests and jobs admitted and not finished.")
# Keyed by the groups of Drain.counters(): (name, help, label).
COUNTERS = {
    "requests": ("graceful_requests", "Finished requests by outcome.", "outcome"),
    "rejected": ("graceful_rejected", "Requests refused before the app saw them.", "reason"),
    "drains": ("graceful_drains", "Drains by result.", "result"),
    "truncated": (
        "graceful_truncated_streams",
        "Responses ended early: at the drain deadline, on a forced exit, or aborted by the engine.",
        "reason",
    ),
    "failures": (
        "graceful_failures",
        "Entries into FAILED by reason: engine_dead when the engine behind the server died.",
        "reason",
    ),
}
# Keyed by the groups of Drain.tally.samples(): (name, help, buckets).
HISTOGRAMS = {
    "drain_seconds": (
        "graceful_drain_duration_seconds",
        "How long drains took.",
        (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0),
    ),
    "propagation_seconds": (
        "graceful_propagation_seconds",
        "How long traffic took to stop after readiness failed: seconds from drain start to the last new "
        "request (admitted or refused; probes and exempt paths not counted) that arrived before the "
        "propagation phase ended, 0 when none did. One sample per drain whose propagation phase ended.",
        (0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0),
    ),
}
DURATIONS = (
    "graceful_request_duration_seconds",
    "How long finished requests took, from admission to the last frame the server took (or the "
    "disconnect, error or deadline that ended them), by kind: stream (body frames before the last, "
    "or a WebSocket session) or plain (every other request, and tracked jobs).",
)

# One graceful collector per registry: a newer Drain replaces an older one instead of
# failing with "Duplicated timeseries" (tests, reloads).
_installed: weakref.WeakKeyDictionary[CollectorRegistry, GracefulCollector] = weakref.WeakKeyDictionary()

logger = logging.getLogger("graceful")


class GracefulCollector(Collector):
    def __init__(self, drain: Drain) -> None:
        self.drain = drain

    def collect(self) -> Iterator[Metric]:
        drain = self.drain
        state = GaugeMetricFamily(*STATE, labels=["state"])
        for member in State:
            state.add_metric([member.value], 1.0 if drain.state is member else 0.0)
        yield state
        yield GaugeMetricFamily(*IN_FLIGHT, value=drain.in_flight)
        for group, values in drain.counters().items():
            name, doc, label = COUNTERS[group]
            yield _counter(name, doc, label, values)
        for group, samples in core(drain).tally.samples().items():
            name, doc, bounds = HISTOGRAMS[group]
            yield _histogram(name, doc, bounds, samples)
        yield _durations(drain)


def _durations(drain: Drain) -> HistogramMetricFamily:
    family = HistogramMetricFamily(*DURATIONS, labels=["kind"])
    for kind, histogram in core(drain).tally.histograms.snapshot().items():
        buckets = [("+Inf" if le == math.inf else repr(le), float(n)) for le, n in histogram.cumulative()]
        family.add_metric([kind], buckets, histogram.total)
    return family


def _counter(name: str, doc: str, label: str, values: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], float(value))
    return family


def _histogram(name: str, doc: str, bounds: tuple[float, ...], samples: list[float]) -> HistogramMetricFamily:
    buckets: list[tuple[str, float]] = []
    for bound in bounds:
        buckets.append((repr(bound), float(sum(1 for s in samples if s <= bound))))
    buckets.append(("+Inf", float(len(samples))))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=sum(samples))


def register(drain: Drain, registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """Expose ``drain`` on ``registry`` (the default registry if None); never raises.

    The registry belongs to the process, not to graceful: others may have emptied it,
    unregistered graceful's collector or registered ``graceful_*`` names of their own
    since a middleware was last built. So nothing remembered about it is trusted: the
    collector this module last put there is taken out if it is still there, and the new
    one goes in. A name clash with another party's collector leaves the app running
    without graceful's metrics on that registry, and says so.
    """
    # Looked up now: a test or plugin may have put another default registry in its place.
    registry = prometheus_client.REGISTRY if registry is None else registry
    old = _installed.pop(registry, None)
    if old is not None:
        try:
            registry.unregister(old)
        except KeyError:  # someone else took it out already
            pass
    collector = GracefulCollector(drain)
    try:
        registry.register(collector)
    except ValueError as exc:  # prometheus-client's DuplicateTimeseries
        logger.warning(
            "graceful_* metrics are not exposed: %s; unregister the other collector of these names, or pass "
            "GracefulMiddleware(registry=...) a registry of its own",
            exc,
        )
        return registry
    _installed[registry] = collector
    return registry


def render(registry: CollectorRegistry, multiprocess_dir: str | None) -> tuple[bytes, str]:
    """The exposition page: across all workers in multi-process mode (prometheus-client's, on when
    ``PROMETHEUS_MULTIPROC_DIR`` names a directory, read by the middleware), else from ``registry``."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    if multiprocess_dir:
        from prometheus_client import multiprocess

        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
        registry = merged
    return generate_latest(registry), CONTENT_TYPE_LATEST


class MultiprocessMirror:
    """Copies a Drain's plain counters into prometheus-client's shared files.

    In multi-process mode (``PROMETHEUS_MULTIPROC_DIR``) each worker's collector is
    invisible to a scrape served by another worker, so the values must go through the
    shared files. The hot path still bumps plain ints; this mirror pushes them once a
    second and at every state change. Gauges use ``livesum``: ``graceful_in_flight`` is
    the sum over live workers and ``graceful_state{state=...}`` counts the workers in
    each state. Counters and the histogram add up across workers, dead ones included. The
    request durations are not mirrored: they are counts per bucket, and the shared files take
    single observations (``graceful advise`` reads every worker over the admin socket).
    """

    def __init__(self, drain: Drain) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.drain = drain
        self.state = Gauge(*STATE, ["state"], registry=None, multiprocess_mode="livesum")
        self.in_flight = Gauge(*IN_FLIGHT, registry=None, multiprocess_mode="livesum")
        self.counters = {
            group: Counter(name, doc, [label], registry=None) for group, (name, doc, label) in COUNTERS.items()
        }
        self.histograms = {
            group: Histogram(name, doc, registry=None, buckets=bounds)
            for group, (name, doc, bounds) in HISTOGRAMS.items()
        }
        self._pushed: dict[tuple[str, str], int] = {}
        self._observed = dict.fromkeys(HISTOGRAMS, 0)
        drain.add_listener(self.sync)
        self.sync()

    def sync(self) -> None:
        drain = self.drain
        for member in State:
            self.state.labels(member.value).set(1.0 if drain.state is member else 0.0)
        self.in_flight.set(drain.in_flight)
        for group, values in drain.counters().items():
            counter = self.counters[group]
            for label, value in values.items():
                delta = value - self._pushed.get((group, label), 0)
                if delta:
                    counter.labels(label).inc(delta)
                    self._pushed[(group, label)] = value
        for group, samples in core(drain).tally.samples().items():
            for sample in samples[self._observed[group] :]:
                self.histograms[group].observe(sample)
            self._observed[group] = len(samples)
