"""The budget from evidence: the duration histogram, the advice's arithmetic, and the same advice
from a vLLM page as from graceful's own counts of the same traffic."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Histogram as PromHistogram

from graceful._drain._advice import Evidence, advise, outlook
from graceful._drain._budget import Budget
from graceful._drain._ledger import COMPLETED, Ledger, Tracked
from graceful._drain._observed import BOUNDS, KINDS, Histogram, ObservationError
from graceful._drain._status import Tally
from graceful._engine._histogram import EvidenceError, read_histogram

# vLLM's request-latency buckets: REQUEST_LATENCY_BUCKETS in vllm/v1/metrics/buckets.py (vLLM 0.32),
# which vllm/v1/metrics/loggers.py gives vllm:e2e_request_latency_seconds, labelled model_name and engine.
VLLM_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


def test_every_vllm_bound_is_one_of_gracefuls() -> None:
    assert set(VLLM_BUCKETS) <= set(BOUNDS)
    assert list(BOUNDS) == sorted(set(BOUNDS))


def histogram(*durations: float) -> Histogram:
    counts = [0] * (len(BOUNDS) + 1)
    for d in durations:
        counts[next((i for i, b in enumerate(BOUNDS) if d <= b), len(BOUNDS))] += 1
    return Histogram(BOUNDS, tuple(counts), sum(durations))


def test_quantiles_are_the_upper_bounds_of_their_buckets() -> None:
    seen = histogram(*[0.2] * 50, *[4.0] * 45, *[12.0] * 4, 100.0)
    assert seen.count == 100
    assert seen.quantile(0.5) == 0.3
    assert seen.quantile(0.95) == 5.0
    assert seen.quantile(0.99) == 15.0
    assert seen.longest() == 120.0
    assert histogram(9000.0).longest() == math.inf
    assert Histogram.empty().longest() == 0.0


def test_over_counts_the_buckets_that_may_hold_longer_ones() -> None:
    seen = histogram(0.2, 4.0, 4.0, 12.0)
    assert seen.over(5.0) == 1  # the bucket ending at 5 holds nothing longer than 5
    assert seen.over(4.0) == 3  # (3.5, 5] may hold something longer than 4
    assert seen.over(20.0) == 0
    assert seen.still_running(3.0, 5.0) == pytest.approx(1 / 3)  # of the three past 3 s, one may pass 8 s
    assert seen.still_running(200.0, 1.0) == 1.0  # older than anything seen: no evidence it ends


def test_bad_observations_are_refused() -> None:
    with pytest.raises(ObservationError, match="one more"):
        Histogram((1.0, 2.0), (1, 2))
    with pytest.raises(ObservationError, match="rise"):
        Histogram((2.0, 1.0), (0, 0, 0))
    with pytest.raises(ObservationError, match="fewer than a lower bucket"):
        Histogram.from_cumulative({1.0: 5.0, 2.0: 3.0, math.inf: 6.0})
    with pytest.raises(ObservationError, match="different buckets"):
        histogram(1.0).merged(Histogram((1.0,), (1, 0)))


def test_the_sweep_counts_finished_work_by_kind_rounded_up_by_less_than_its_period() -> None:
    """The ledger's own clock, a sweep every 0.25 s (the lifespan's are 0.1 s apart): work seen in
    flight by a sweep counts from its admission to the first sweep after its end; work that came
    and went between two sweeps counts as plain, at the time between them."""
    clock = [100.0]

    class Work(Tracked):
        __slots__ = ("last",)

        def __init__(self, ledger: Ledger, streamed: bool) -> None:
            super().__init__(ledger)
            self.last = b"frame" if streamed else None

    tally = Tally()
    ledger = Ledger(tally, clock=lambda: clock[0])
    running: dict[str, Work] = {}
    ends = {
        "stream-7s": (7.0, True),
        "stream-1.1s": (1.1, True),
        "plain-0.6s": (0.6, False),
        "plain-0.05s": (0.05, False),
    }
    started = clock[0]
    for name, (_, streamed) in ends.items():
        running[name] = Work(ledger, streamed)
        ledger.admit_item(running[name])
    ledger.admit_item(quick := Work(ledger, False))  # shorter than a sweep's period: never seen in flight
    quick.finish(COMPLETED)
    while running:
        clock[0] = round(clock[0] + 0.25, 6)
        for name, (length, _) in list(ends.items()):
            if name in running and clock[0] - started >= length:
                running.pop(name).finish(COMPLETED)
        ledger.count_durations()
    ledger.count_durations()
    plain, stream = (tally.histograms.snapshot()[kind] for kind in KINDS)
    assert stream.count == 2 and plain.count == 3
    assert stream.longest() == 7.5 and stream.quantile(0.5) == 1.5  # 7.0 and 1.25: rounded up, not by a bucket
    assert plain.longest() == 0.8  # 0.75
    assert plain.quantile(0.5) == 0.3  # the two that never crossed a sweep: 0.25 s
    assert tally.outcomes[COMPLETED] == 5


def budget(grace: float, wait: float, reserve: float | None = None) -> Budget:
    return Budget.resolve(grace_period=grace, reserve=reserve, propagation_wait=wait)


def test_the_share_at_risk_is_the_share_longer_than_the_budget_covers() -> None:
    """grace 30 s, reserve 10 s, wait 3 s: admitting, requests of up to (20 - 3) / 2 = 8.5 s are
    covered; refusing, 20 s. 90 short requests and 10 streams of 12 s: 10% at risk, then none."""
    evidence = Evidence({"plain": histogram(*[0.2] * 90), "stream": histogram(*[12.0] * 10)})
    admitting = advise(evidence, budget(30, 3), admit=True)
    assert admitting.covered == 8.5
    assert admitting.at_risk == {"plain": 0, "stream": 10, "all": 10}
    assert admitting.at_risk_share == pytest.approx(0.10)
    refusing = advise(evidence, budget(30, 3), admit=False)
    assert refusing.covered == 20 and refusing.at_risk_share == 0.0


@pytest.mark.parametrize("admit", [True, False])
def test_the_recommended_grace_period_is_the_shortest_that_covers_the_longest(admit: bool) -> None:
    evidence = Evidence({"plain": histogram(0.2), "stream": histogram(50.0, 110.0)})
    advice = advise(evidence, budget(30, 3), admit=admit)
    assert advice.longest == 120.0
    grace = advice.grace_period
    assert grace is not None
    assert advise(evidence, budget(grace, advice.propagation_wait), admit=admit).at_risk_share == 0.0
    assert advise(evidence, budget(grace - 1, advice.propagation_wait), admit=admit).at_risk_share > 0.0
    # Admitting: wait + 2 x 120 s + the default reserve (30%): 243 / 0.7, rounded up.
    assert grace == (math.ceil(243 / 0.7) if admit else math.ceil(120 / 0.7))
    assert advice.drain_timeout == (243 if admit else 120)


def test_a_set_reserve_is_kept() -> None:
    evidence = Evidence({"stream": histogram(50.0)})
    advice = advise(evidence, budget(100, 3, reserve=5), admit=False, reserve_given=True)
    assert advice.grace_period == 55.0  # 50 s + the 5 s reserve


def test_the_propagation_wait_grows_to_the_slowest_drain_seen_never_shrinks() -> None:
    evidence = Evidence({"plain": histogram(0.2)}, propagation=(1.2, 4.3))
    advice = advise(evidence, budget(60, 3), admit=True)
    assert advice.propagation_wait == 7.0  # 4.3 x 1.5, rounded up
    assert advice.propagation_quiet == 2.0
    assert "4.3 s" in advice.reasons["propagation_wait"]
    calm = advise(Evidence({"plain": histogram(0.2)}, propagation=(0.5,)), budget(60, 10), admit=True)
    assert calm.propagation_wait == 10.0


def test_no_grace_period_holds_streams_past_the_last_bucket_or_the_platforms_limit() -> None:
    beyond = advise(Evidence({"stream": histogram(9000.0)}), budget(30, 3), admit=True)
    assert beyond.grace_period is None and beyond.handoff is not None and "resume" in beyond.handoff
    capped = advise(Evidence({"stream": histogram(400.0)}), budget(30, 3), admit=True, max_grace=600)
    assert capped.grace_period is not None and capped.grace_period > 600
    assert capped.handoff is not None and "600 s" in capped.handoff


def test_the_outlook_judges_work_in_flight_by_what_was_seen() -> None:
    plain, stream = histogram(*[0.2] * 8), histogram(5.0, 20.0, 20.0, 50.0)
    # 12 s left. A stream 10 s old, by the streams: of the three seen past 10 s, one (50 s) ran past
    # 22 s. A request 0.1 s old that has not streamed, by everything: 3 of 12 ran past 12.1 s.
    ahead = outlook([(10.0, True), (0.1, False)], {"plain": plain, "stream": stream}, 12.0)
    assert ahead.in_flight == 2 and ahead.seen == 12
    assert ahead.at_risk == 2
    assert ahead.expected == pytest.approx(1 / 3 + 3 / 12)
    assert outlook([(10.0, True)], {"plain": plain, "stream": stream}, 60.0).at_risk == 0  # nothing seen ran past 70 s
    assert outlook([(10.0, True)], {"plain": Histogram.empty(), "stream": Histogram.empty()}, 12.0).at_risk == 0


def test_a_request_older_than_every_one_seen_is_not_forecast_to_be_cut() -> None:
    """Issue 51: a 4.5 s stream in flight with 42 s left, when the streams seen ran up to 3 s, was
    counted as at risk with a chance of 1 ("about 1.0 expected to be cut"). Nothing seen ran as long:
    it is older than every request seen, and no forecast either way."""
    seen = {"plain": histogram(*[0.2] * 8), "stream": histogram(2.0, 3.0, 3.0)}
    ahead = outlook([(4.5, True)], seen, 42.0)
    assert (ahead.in_flight, ahead.at_risk, ahead.expected, ahead.older, ahead.seen) == (1, 0, 0.0, 1, 11)
    assert ahead.as_dict()["older"] == 1
    # A stream inside the streams seen is judged as before; a plain request is judged by everything.
    mixed = outlook([(4.5, True), (2.2, True), (0.1, False)], seen, 0.5)
    assert (mixed.older, mixed.at_risk) == (1, 2)
    assert mixed.expected == pytest.approx(1.0 + 3 / 11)  # (3.0 s bucket past 2.7 s: 2 of 2), (3 of 11 past 0.6 s)


def test_a_request_within_the_durations_seen_is_judged_by_those_longer_than_its_age() -> None:
    """The chance is conditional on the age: of the seen requests longer than it, the share that also
    ran past its age plus the time left."""
    seen = {"stream": histogram(1.0, 4.0, 4.0, 30.0, 30.0, 30.0)}
    # 3.5 s old: five seen may have run longer (the 4.0 s bucket is (3.5, 5.0]); three of them past 13.5 s.
    ahead = outlook([(3.5, True)], seen, 10.0)
    assert (ahead.at_risk, ahead.older) == (1, 0) and ahead.expected == pytest.approx(3 / 5)
    # 20 s old with 42 s left: the three 30 s ones ran longer, none past 62 s.
    assert (outlook([(20.0, True)], seen, 42.0).at_risk, outlook([(20.0, True)], seen, 42.0).older) == (0, 0)
    # Past the last bucket seen: older, whatever the time left.
    assert outlook([(31.0, True)], seen, 0.1).older == 1 and outlook([(31.0, True)], seen, 0.1).at_risk == 0


def vllm_page(durations: list[tuple[float, str]]) -> str:
    """A /metrics page as vLLM writes it (vllm/v1/metrics/loggers.py: prometheus_client, one series
    per engine), holding ``durations`` (seconds, engine index)."""
    registry = CollectorRegistry()
    e2e = PromHistogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        labelnames=["model_name", "engine"],
        buckets=VLLM_BUCKETS,
        registry=registry,
    )
    for seconds, engine in durations:
        e2e.labels("tiny", engine).observe(seconds)
    return generate_latest(registry).decode()


def test_a_vllm_page_gives_the_same_advice_as_gracefuls_counts_of_the_same_traffic() -> None:
    """The same requests, as vLLM's histogram (two engines, summed) and as graceful's two kinds:
    the same share at risk and the same recommended numbers, for each budget."""
    traffic = [(0.4, "0")] * 30 + [(1.2, "1")] * 10 + [(14.0, "0")] * 6 + [(45.0, "1")] * 2
    page = read_histogram(vllm_page(traffic), "vllm:e2e_request_latency_seconds")
    assert page.count == len(traffic) and page.total == pytest.approx(sum(d for d, _ in traffic))
    engine = Evidence({"all requests": page})
    ours = Evidence(
        {"plain": histogram(*[d for d, _ in traffic if d < 5]), "stream": histogram(*[d for d, _ in traffic if d > 5])}
    )
    for grace, wait, admit in ((30, 3, True), (60, 3, False), (120, 10, True)):
        a, b = advise(engine, budget(grace, wait), admit=admit), advise(ours, budget(grace, wait), admit=admit)
        assert (a.at_risk["all"], a.grace_period, a.drain_timeout, a.longest) == (
            b.at_risk["all"],
            b.grace_period,
            b.drain_timeout,
            b.longest,
        )
    assert advise(engine, budget(30, 3), admit=True).at_risk["all"] == 8


def test_a_page_without_the_histogram_says_what_to_do() -> None:
    with pytest.raises(EvidenceError, match="no histogram vllm:e2e_request_latency_seconds; start the engine"):
        read_histogram("vllm:num_requests_running 0\n", "vllm:e2e_request_latency_seconds")
    summary = '# TYPE tgi_request_duration summary\ntgi_request_duration{quantile="0.5"} 3.1\n'
    with pytest.raises(EvidenceError, match="is a summary"):
        read_histogram(summary, "tgi_request_duration")


@pytest.mark.parametrize("admit", [True, False])
def test_the_recommended_numbers_fed_back_leave_nothing_at_risk(admit: bool) -> None:
    """Every bucket as the longest request, waits from 0 to 60 s: the grace period, drain timeout
    and propagation wait the advice names, resolved as the server resolves them, cover it all
    (including the floating point of the budget rule: 1 + 2 x 0.1 - 1 is under 0.2)."""
    for longest in BOUNDS[:-1]:
        for wait in (0.0, 1.0, 3.0, 10.0, 60.0):
            evidence = Evidence({"stream": histogram(longest)})
            named = advise(evidence, budget(max(200.0, 4 * wait), wait), admit=admit)
            assert named.grace_period is not None and named.drain_timeout is not None
            assert named.drain_timeout >= named.propagation_wait  # refusing too: the drain lasts the wait
            resolved = Budget.resolve(
                grace_period=named.grace_period,
                drain_timeout=named.drain_timeout,
                propagation_wait=named.propagation_wait,
            )
            assert advise(evidence, resolved, admit=admit).at_risk["all"] == 0, (longest, wait)


def test_no_evidence_names_no_numbers() -> None:
    advice = advise(Evidence({"plain": Histogram.empty(), "stream": Histogram.empty()}), budget(30, 3), admit=True)
    assert advice.requests == 0
    assert (advice.grace_period, advice.drain_timeout, advice.refuse_grace_period, advice.handoff) == (
        None,
        None,
        None,
        None,
    )


def test_an_engines_series_with_different_buckets_are_not_summed() -> None:
    page = (
        "# TYPE x histogram\n"
        'x_bucket{engine="0",le="1.0"} 1\nx_bucket{engine="0",le="+Inf"} 1\nx_sum{engine="0"} 0.5\n'
        'x_bucket{engine="1",le="2.0"} 1\nx_bucket{engine="1",le="+Inf"} 1\nx_sum{engine="1"} 1.5\n'
    )
    with pytest.raises(EvidenceError, match="different buckets"):
        read_histogram(page, "x")
