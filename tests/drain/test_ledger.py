"""The seam between Drain and the work it tracks: admit, release exactly once, expire once."""

from __future__ import annotations

import pytest

from graceful import Drain
from graceful._drain._ledger import CANCELLED, CLIENT_DISCONNECTED, COMPLETED, ERROR, HANDED_OFF, OUTCOMES, Tracked
from graceful._drain._state import core

pytestmark = pytest.mark.anyio


class Item(Tracked):
    __slots__ = ("cuts",)

    def __init__(self, drain: Drain) -> None:
        super().__init__(core(drain).ledger)
        self.cuts = 0

    def label(self) -> str:
        return "item"

    async def cut(self) -> None:
        self.cuts += 1
        self.finish(CANCELLED)


def test_outcome_indexes_name_the_counters() -> None:
    assert [OUTCOMES[i] for i in (COMPLETED, CLIENT_DISCONNECTED, ERROR, CANCELLED, HANDED_OFF)] == [
        "completed",
        "client_disconnected",
        "error",
        "cancelled",
        "handed_off",
    ]


def test_in_flight_is_the_ledger_and_an_item_finishes_once() -> None:
    drain = Drain()
    first, second = Item(drain), Item(drain)
    assert core(drain).ledger.admit_item(first) and core(drain).ledger.admit_item(second)
    assert drain.in_flight == 2 and core(drain).items() == (first, second)
    first.finish(COMPLETED)
    first.finish(ERROR)  # a second finish changes nothing
    assert drain.in_flight == 1 and core(drain).items() == (second,)
    assert drain.counters()["requests"] == {
        "completed": 1,
        "client_disconnected": 0,
        "error": 0,
        "cancelled": 0,
        "handed_off": 0,
    }
    (line,) = core(drain).leftover()
    assert line.startswith("item (") and line.endswith("s)"), line


def test_admission_stops_at_the_limit() -> None:
    drain = Drain()
    assert core(drain).ledger.admit_item(Item(drain), 1)
    assert not core(drain).ledger.admit_item(Item(drain), 1)
    assert drain.in_flight == 1


async def test_expire_cuts_open_work_once() -> None:
    drain = Drain()
    item = Item(drain)
    core(drain).ledger.admit_item(item)
    await item.expire()
    await item.expire()  # finished by the first cut: nothing more to do
    assert item.cuts == 1
    assert drain.counters()["truncated"] == {"deadline": 1}
    assert drain.counters()["requests"]["cancelled"] == 1 and drain.in_flight == 0
