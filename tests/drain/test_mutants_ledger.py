"""The ledger in the detail that mutation testing asks of it (docs/testing.md, "Mutation testing"): the
durations a sweep counts, bucket by bucket and second by second, on a clock the test moves; the ages
and leftover lines of the work in flight."""

from __future__ import annotations

import pytest

from graceful._drain import _ledger
from graceful._drain._ledger import COMPLETED, Ledger, Tracked
from graceful._drain._observed import BOUNDS, PLAIN, STREAM
from graceful._drain._status import Tally


class Item(Tracked):
    def label(self) -> str:
        return "request"


class Clock:
    """The ledger's clock (``_ledger._monotonic``), moved by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock(100.0)
    monkeypatch.setattr(_ledger, "_monotonic", fake)
    return fake


def admitted(ledger: Ledger, clock: Clock, at: float, *, streamed: bool = False) -> Item:
    clock.now = at
    item = Item(ledger)
    if streamed:
        item.last = b"data: token\n\n"
    assert ledger.admit_item(item)
    return item


def bucket(seconds: float) -> int:
    return BOUNDS.index(min(b for b in BOUNDS if b >= seconds))


def test_a_sweep_counts_the_work_it_saw_and_the_work_between(clock: Clock) -> None:
    """1. A and B (plain) admitted at 100 s, S (a stream) at 99 s; a sweep at 100 s sees the three.
    2. A, B and S finish; C comes and goes between the sweeps.
    3. The sweep at 103 s counts A and B 3 s each, S 4 s, and C as plain at the 3 s between the sweeps.
    4. D comes and goes before the sweep at 104 s: plain, at the 1 s between them."""
    tally = Tally()
    ledger = Ledger(tally)  # its first sweep time: 100 s
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
    counts, sums = tally.histograms.counts, tally.histograms.sums
    three, four, one = bucket(3.0), bucket(4.0), bucket(1.0)
    assert {i: n for i, n in enumerate(counts[PLAIN]) if n} == {three: 3}
    assert {i: n for i, n in enumerate(counts[STREAM]) if n} == {four: 1}
    assert sums == [9.0, 4.0]
    d = admitted(ledger, clock, 103.5)
    d.finish(COMPLETED)
    clock.now = 104.0
    ledger.count_durations()
    assert {i: n for i, n in enumerate(counts[PLAIN]) if n} == {three: 3, one: 1}
    assert {i: n for i, n in enumerate(counts[STREAM]) if n} == {four: 1}
    assert sums == [10.0, 4.0]


def test_a_sweep_with_nothing_finished_counts_nothing(clock: Clock) -> None:
    tally = Tally()
    ledger = Ledger(tally)
    a = admitted(ledger, clock, 100.0)
    ledger.count_durations()
    clock.now = 105.0
    ledger.count_durations()
    assert tally.histograms.counts[PLAIN] == [0] * (len(BOUNDS) + 1)
    assert tally.histograms.sums == [0.0, 0.0]
    a.finish(COMPLETED)
    clock.now = 106.0
    ledger.count_durations()  # a is counted from the sweep that saw it: 6 s
    assert tally.histograms.counts[PLAIN][bucket(6.0)] == 1
    assert tally.histograms.sums == [6.0, 0.0]


def test_ages_say_how_long_each_item_has_run_and_whether_it_streamed() -> None:
    ledger = Ledger(Tally())
    plain, stream = Item(ledger), Item(ledger)
    stream.last = b"data: token\n\n"
    ledger.admit_item(plain)
    ledger.admit_item(stream)
    [(plain_age, plain_streamed), (stream_age, stream_streamed)] = ledger.ages()
    assert (plain_streamed, stream_streamed) == (False, True)
    assert 0.0 <= plain_age < 1.0 and 0.0 <= stream_age < 1.0


def test_leftover_names_each_item_and_how_long_it_has_run() -> None:
    ledger = Ledger(Tally())
    ledger.admit_item(Item(ledger))
    assert ledger.leftover() == ("request (0.0s)",)
