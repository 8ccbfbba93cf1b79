"""The outlook (``Core.outlook``): the work in flight judged against the time left to the deadline,
which is the running drain's, else the limit given, else the budget's."""

from __future__ import annotations

from graceful._drain._ledger import COMPLETED
from graceful._drain._state import core
from tests.drain.conftest import FakeTime
from tests.drain.test_drain_run import Item, serving


def test_outside_a_drain_it_judges_the_budgets_limit_or_the_one_given() -> None:
    drain = serving()
    c = core(drain)
    assert c.outlook().left == 25.0  # no drain has begun: the budget's limit
    assert c.outlook(limit=7).left == 7
    drain.begin_drain(timeout=10)
    drain.resume()  # SERVING again, with a run from the last drain: the budget's limit again
    assert c.outlook().left == 25.0
    assert c.outlook(limit=7).left == 7


def test_during_a_drain_it_judges_the_time_left_to_its_deadline() -> None:
    drain = serving()
    drain.begin_drain(timeout=10)  # the drain's own deadline, shorter than the budget's 25 s
    left = core(drain).outlook(limit=7).left  # a drain under way: its deadline, whatever limit says
    assert 9.0 < left <= 10.0


def test_past_the_deadline_it_leaves_nothing(clock: FakeTime) -> None:
    drain = serving()
    drain.begin_drain(timeout=1)
    clock.now += 1.5
    assert core(drain).outlook().left == 0.0


def test_it_counts_the_work_in_flight() -> None:
    drain = serving()
    ledger = core(drain).ledger
    items = [Item(ledger) for _ in range(3)]
    for item in items:
        ledger.admit_item(item)
    assert core(drain).outlook().in_flight == 3
    for item in items:
        item.finish(COMPLETED)
