"""The handoff of resumable streams (``handoff_streams``): which are handed off, how many, the bound
on each, the one log line, the count of the current drain's, and the handoff's end with a resume or
a new lifecycle."""

from __future__ import annotations

import logging
from functools import partial
from typing import TypeVar

import anyio
import pytest

from graceful import Drain, DrainResult, State
from graceful._drain._ledger import CANCELLED, COMPLETED, HANDED_OFF, Ledger
from graceful._drain._state import core
from tests.drain.conftest import FakeTime
from tests.drain.test_drain_run import Item, serving

pytestmark = pytest.mark.anyio


class Stream(Item):
    """A resumable stream: handing it off ends it at once, counted as handed off."""

    def __init__(self, ledger: Ledger, handed: anyio.Event) -> None:
        super().__init__(ledger)
        self.handed = handed

    async def hand_off(self) -> bool:
        self.finish(HANDED_OFF)
        self.handed.set()
        return True


class Expiring(Stream):
    """A resumable stream that the deadline ends too (cancelled)."""

    async def cut(self) -> None:
        self.finish(CANCELLED)


class Stuck(Item):
    """A stream whose handoff never ends by itself: only ``unwind_timeout`` cuts it (``cut_short``)."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self.cut_short = anyio.Event()
        self.give_up = anyio.Event()  # set by the test, so that a run that never cuts it ends all the same

    async def hand_off(self) -> bool:
        try:
            await self.give_up.wait()
        except anyio.get_cancelled_exc_class():
            self.cut_short.set()
            raise
        return False


class Asked(Item):
    """A request that cannot be handed off; ``asked`` is set when the run tries."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self.asked = anyio.Event()

    async def hand_off(self) -> bool:
        self.asked.set()
        return False


T = TypeVar("T", bound=Item)


def admitted(drain: Drain, item: T) -> T:
    assert core(drain).ledger.admit_item(item)
    return item


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


async def drained(drain: Drain, into: list[DrainResult], **options: object) -> None:
    into.append(await drain.drain(**options))  # type: ignore[arg-type]


async def test_handoff_ends_the_resumable_streams_once_and_counts_them(caplog: pytest.LogCaptureFixture) -> None:
    """1. Two resumable streams, one request that cannot be handed off and one stream whose handoff
    hangs are in flight; handoff_streams is on, the propagation wait is 0.1 s.
    2. The wait ends: both streams are handed off, the hanging one is cut at unwind_timeout (0.2 s),
    the request goes on; one line says so.
    3. The request and the cut stream end: the drain has drained, with two streams handed off."""
    drain = serving(handoff_streams=True, unwind_timeout=0.2)
    c = core(drain)
    first, second = anyio.Event(), anyio.Event()
    admitted(drain, Stream(c.ledger, first))
    plain = admitted(drain, Item(c.ledger))
    stuck = admitted(drain, Stuck(c.ledger))
    admitted(drain, Stream(c.ledger, second))
    results: list[DrainResult] = []
    with caplog.at_level(logging.INFO, logger="graceful"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(drained, drain, results, propagation_wait=0.1, timeout=3))
            try:
                with anyio.fail_after(2):  # 10x the wait and the unwind bound
                    await first.wait()
                    await second.wait()
                    await stuck.cut_short.wait()
            finally:
                stuck.give_up.set()
            assert c.handing_off is True
            assert drain.in_flight == 2  # the request and the cut stream go on
            assert c.handed_off() == 2
            with anyio.fail_after(2):
                await anyio.wait_all_tasks_blocked()  # the run waits for them; it hands off nothing more
            assert drain.last_result is None
            plain.finish(COMPLETED)
            stuck.finish(CANCELLED)
    [result] = results
    assert (result.result, result.handed_off, result.in_flight, result.truncated) == ("drained", 2, 0, 0)
    assert [m for m in messages(caplog) if m.startswith("handed off")] == [
        "handed off 2 resumable stream(s) of 4 in flight for their clients to continue elsewhere"
    ]


async def test_handoff_that_empties_the_ledger_ends_the_drain() -> None:
    """The leader has slept through the propagation wait; the handoff of the one stream in flight
    releases the last item, and the drain ends drained."""
    drain = serving(handoff_streams=True)
    handed = anyio.Event()
    admitted(drain, Stream(core(drain).ledger, handed))
    with anyio.fail_after(2):
        result = await drain.drain(propagation_wait=0.05, timeout=3)
    assert handed.is_set()
    assert (result.result, result.handed_off, result.in_flight) == ("drained", 1, 0)


async def test_no_handoff_without_handoff_streams() -> None:
    drain = serving()
    handed = anyio.Event()
    stream = admitted(drain, Stream(core(drain).ledger, handed))
    results: list[DrainResult] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(drained, drain, results, propagation_wait=0, timeout=3))
        with anyio.fail_after(2):
            await anyio.wait_all_tasks_blocked()  # the leader's first turn, past the propagation phase, is over
        assert not handed.is_set() and core(drain).handing_off is False
        stream.finish(COMPLETED)
    assert results[0].handed_off == 0


async def test_the_handoff_begins_at_the_propagation_phases_end(clock: FakeTime) -> None:
    """At the instant the propagation phase ends (the clock exactly there) the phase is over: the run
    hands the streams off."""
    drain = serving(handoff_streams=True)
    handed = anyio.Event()
    admitted(drain, Stream(core(drain).ledger, handed))
    drain.begin_drain("test", propagation_wait=2, timeout=5)
    clock.now += 2.0
    results: list[DrainResult] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(drained, drain, results)
        with anyio.move_on_after(2):
            await handed.wait()
        at_the_instant = handed.is_set()
        clock.now += 1.0  # a run that let the instant pass hands off now: the test fails rather than hangs
        run = core(drain).run
        assert run is not None
        run.wake()
    assert at_the_instant
    assert (results[0].result, results[0].handed_off) == ("drained", 1)


async def test_no_handoff_at_the_deadlines_instant(clock: FakeTime) -> None:
    """At the deadline's instant (the clock exactly there, the wait ending with it) the deadline ends the
    streams in flight: cut, not handed off."""
    drain = serving(handoff_streams=True)
    handed = anyio.Event()
    admitted(drain, Expiring(core(drain).ledger, handed))
    drain.begin_drain("test", propagation_wait=5, timeout=5)
    clock.now += 5.0
    with anyio.fail_after(5):
        result = await drain.drain()
    assert not handed.is_set()
    assert (result.result, result.handed_off, result.truncated) == ("timeout", 0, 1)


def test_handed_off_is_zero_before_any_drain() -> None:
    drain = serving()
    assert core(drain).handed_off() == 0


def test_handed_off_counts_this_drains_streams_only() -> None:
    drain = serving()
    c = core(drain)
    before = admitted(drain, Item(c.ledger))
    before.finish(HANDED_OFF)  # handed off before the drain: not this drain's
    during = admitted(drain, Item(c.ledger))
    drain.begin_drain(timeout=10)
    assert c.handed_off() == 0
    during.finish(HANDED_OFF)
    assert c.handed_off() == 1
    assert drain.counters()["requests"]["handed_off"] == 2


@pytest.mark.parametrize("end", ["resume", "mark_stopped"])
async def test_the_handoff_ends_with_a_resume_or_a_new_lifecycle(end: str) -> None:
    """1. A request is in flight; a drain with handoff_streams begins and its run starts handing off.
    2. The drain is resumed (or the server stops): the run returns.
    3. After a resume nothing is handed off any more; after a stop the mark stays until a new
    lifecycle begins."""
    drain = serving(handoff_streams=True)
    c = core(drain)
    request = admitted(drain, Asked(c.ledger))
    results: list[DrainResult] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(drained, drain, results, propagation_wait=0, timeout=5))
        with anyio.fail_after(2):
            await request.asked.wait()
        assert c.handing_off is True
        getattr(drain, end)()
    assert [r.result for r in results] == ["resumed" if end == "resume" else "stopped"]
    if end == "mark_stopped":
        assert c.handing_off is True  # STOPPED refuses everything anyway
        assert c.restart() is True and drain.state is State.STARTING
    assert c.handing_off is False
    request.finish(COMPLETED)
