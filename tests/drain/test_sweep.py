"""The ledger's sweep (``Ledger.count_durations``): the durations it counts, bucket by bucket and
second by second, on a clock the test moves (the ledger's ``clock``), read from the histograms'
snapshots; the ages and leftover lines of the work in flight."""

from __future__ import annotations

import pytest

from graceful._drain._ledger import COMPLETED, Ledger, Tracked
from graceful._drain._observed import BOUNDS, KINDS, Histogram
from graceful._drain._status import Tally


class Item(Tracked):
    def label(self) -> str:
        return "request"


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(100.0)


def admitted(ledger: Ledger, clock: Clock, at: float, *, streamed: bool = False) -> Item:
    clock.now = at
    item = Item(ledger)
    if streamed:
        item.last = b"data: token\n\n"
    assert ledger.admit_item(item)
    return item


def bucket(seconds: float) -> int:
    return BOUNDS.index(min(b for b in BOUNDS if b >= seconds))


def counted(tally: Tally) -> dict[str, Histogram]:
    return tally.histograms.snapshot()


def filled(histogram: Histogram) -> dict[int, int]:
    """The buckets with an observation, by index, and how many each holds."""
    return {i: n for i, n in enumerate(histogram.counts) if n}


def test_a_sweep_counts_the_work_it_saw_and_the_work_between(clock: Clock) -> None:
    """1. A and B (plain) admitted at 100 s, S (a stream) at 99 s; a sweep at 100 s sees the three.
    2. A, B and S finish; C comes and goes between the sweeps.
    3. The sweep at 103 s counts A and B 3 s each, S 4 s, and C as plain at the 3 s between the sweeps.
    4. D comes and goes before the sweep at 104 s: plain, at the 1 s between them."""
    tally = Tally()
    ledger = Ledger(tally, clock=clock)  # its first sweep time: 100 s
    s = admitted(ledger, clock, 99.0, streamed=True)
    a = admitted(ledger, clock, 100.0)
    b = admitted(ledger, clock, 100.0)
    ledger.count_durations()
    clock.now = 100.5
    a.finish(COMPLETED)
    b.finish(COMPLETED)
    c = admitted(ledger, clock, 101.0)
    clock.now = 101.5
    c.finish(COMPLETED)
    s.finish(COMPLETED)
    clock.now = 103.0
    ledger.count_durations()
    three, four, one = bucket(3.0), bucket(4.0), bucket(1.0)
    plain, stream = (counted(tally)[kind] for kind in KINDS)
    assert filled(plain) == {three: 3} and filled(stream) == {four: 1}
    assert (plain.total, stream.total) == (9.0, 4.0)
    d = admitted(ledger, clock, 103.5)
    d.finish(COMPLETED)
    clock.now = 104.0
    ledger.count_durations()
    plain, stream = (counted(tally)[kind] for kind in KINDS)
    assert filled(plain) == {three: 3, one: 1} and filled(stream) == {four: 1}
    assert (plain.total, stream.total) == (10.0, 4.0)


def test_a_sweep_with_nothing_finished_counts_nothing(clock: Clock) -> None:
    tally = Tally()
    ledger = Ledger(tally, clock=clock)
    a = admitted(ledger, clock, 100.0)
    ledger.count_durations()
    clock.now = 105.0
    ledger.count_durations()
    assert all(h == Histogram.empty() for h in counted(tally).values())
    a.finish(COMPLETED)
    clock.now = 106.0
    ledger.count_durations()  # a is counted from the sweep that saw it: 6 s
    plain, stream = (counted(tally)[kind] for kind in KINDS)
    assert filled(plain) == {bucket(6.0): 1} and plain.total == 6.0
    assert stream == Histogram.empty()


def test_ages_say_how_long_each_item_has_run_and_whether_it_streamed(clock: Clock) -> None:
    ledger = Ledger(Tally(), clock=clock)
    admitted(ledger, clock, 100.0)
    admitted(ledger, clock, 101.0, streamed=True)
    clock.now = 103.5
    assert ledger.ages() == [(3.5, False), (2.5, True)]


def test_leftover_names_each_item_and_how_long_it_has_run(clock: Clock) -> None:
    ledger = Ledger(Tally(), clock=clock)
    admitted(ledger, clock, 100.0)
    clock.now = 102.5
    assert ledger.leftover() == ("request (2.5s)",)


def test_a_ledger_reads_the_monotonic_clock_by_default() -> None:
    ledger = Ledger(Tally())
    ledger.admit_item(Item(ledger))
    [(age, streamed)] = ledger.ages()
    assert 0.0 <= age < 1.0 and streamed is False
    assert ledger.leftover() == ("request (0.0s)",)
