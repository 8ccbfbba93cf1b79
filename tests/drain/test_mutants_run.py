"""A drain run in the detail that mutation testing asks of it (docs/testing.md, "Mutation testing"): the
handoff of resumable streams (which are handed off, how many, the bound on each, the one log line), a
stop while expired work unwinds, the result's record of the propagation phase and the announcement,
joining a drain that has left DRAINING, and the line logged when a drain begins while FAILED."""

from __future__ import annotations

import logging
import re

import anyio
import pytest

from graceful import Drain, DrainResult
from graceful._drain._ledger import CANCELLED, COMPLETED, HANDED_OFF, Ledger, Tracked
from graceful._drain._state import core
from tests.drain.test_drain_run import serving

pytestmark = pytest.mark.anyio


class Item(Tracked):
    """A request that cannot be handed off (``Tracked.hand_off``'s answer) and ends when the test says."""

    def label(self) -> str:
        return "request"


class Stream(Item):
    """A resumable stream: handing it off ends it at once, counted as handed off."""

    def __init__(self, ledger: Ledger, handed: anyio.Event) -> None:
        super().__init__(ledger)
        self.handed = handed

    async def hand_off(self) -> bool:
        self.finish(HANDED_OFF)
        self.handed.set()
        return True


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


class Unwinding(Item):
    """Work that the deadline cuts (``cut_called``) and that ends when the test releases it."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self.cut_called = anyio.Event()

    async def cut(self) -> None:
        self.cut_called.set()


def admitted(drain: Drain, item: Tracked) -> Tracked:
    assert core(drain).ledger.admit_item(item)
    return item


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


async def drained(drain: Drain, into: list[DrainResult], **options: object) -> None:
    into.append(await drain.drain(**options))  # type: ignore[arg-type]


# -- handoff -----------------------------------------------------------------------------------------


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
    stuck = Stuck(c.ledger)
    admitted(drain, stuck)
    admitted(drain, Stream(c.ledger, second))
    results: list[DrainResult] = []
    with caplog.at_level(logging.INFO, logger="graceful"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: drained(drain, results, propagation_wait=0.1, timeout=3))
            try:
                with anyio.fail_after(2):  # 10x the wait and the unwind bound
                    await first.wait()
                    await second.wait()
                    await stuck.cut_short.wait()
            finally:
                stuck.give_up.set()
            assert c.handing_off is True
            assert c.in_flight == 2  # the request and the cut stream go on
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
        tg.start_soon(lambda: drained(drain, results, propagation_wait=0, timeout=3))
        with anyio.fail_after(2):
            await anyio.wait_all_tasks_blocked()  # the leader's first turn, past the propagation phase, is over
        assert not handed.is_set() and core(drain).handing_off is False
        stream.finish(COMPLETED)
    assert results[0].handed_off == 0


# -- the deadline ------------------------------------------------------------------------------------


async def test_a_stop_while_expired_work_unwinds_leaves_the_unwind_its_time() -> None:
    """1. A request is in flight at the deadline (0.1 s); it is cut and unwinds.
    2. The lifespan stops the server meanwhile.
    3. The run goes on waiting for the unwind, and returns once the request has ended: a timeout
    with one request truncated."""
    drain = serving(unwind_timeout=5)
    c = core(drain)
    work = Unwinding(c.ledger)
    admitted(drain, work)
    results: list[DrainResult] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: drained(drain, results, timeout=0.1))
        with anyio.fail_after(2):
            await work.cut_called.wait()
        drain.mark_stopped()  # wakes the leader
        with anyio.fail_after(2):
            await anyio.wait_all_tasks_blocked()
        assert drain.last_result is None  # still waiting for the unwind
        work.finish(CANCELLED)
    [result] = results
    assert (result.result, result.in_flight, result.truncated) == ("timeout", 1, 1)
    assert drain.counters()["truncated"] == {"deadline": 1}


# -- the propagation phase and the announcement in the result --------------------------------------


async def test_a_plain_wait_ends_the_phase_by_propagation_wait(caplog: pytest.LogCaptureFixture) -> None:
    drain = serving()
    c = core(drain)
    with caplog.at_level(logging.INFO, logger="graceful"):
        drain.begin_drain(propagation_wait=0.1, timeout=3)
        c.record_announcement()  # the first response of the drain told the balancers
        with anyio.fail_after(2):
            result = await drain.drain()
    assert result.propagation_ended_by == "propagation_wait"
    [line] = [m for m in messages(caplog) if m.startswith("propagation phase over")]
    found = re.fullmatch(
        r"propagation phase over (\d+\.\d{3})s after drain start \(propagation_wait\); no new request; "
        r"drain announced (\d+\.\d{3})s after it",
        line,
    )
    assert found, line
    # The phase lasts the whole wait (no clock bound above it: fail_after catches a hang), and the
    # announcement, made at its start, falls inside it.
    phase, announced = float(found.group(1)), float(found.group(2))
    assert phase >= 0.1
    assert result.announced is not None and 0 <= result.announced <= phase
    assert announced == pytest.approx(result.announced, abs=0.002)


async def test_a_resumed_drain_records_no_propagation_phase() -> None:
    drain = serving()
    results: list[DrainResult] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: drained(drain, results, propagation_wait=10, timeout=20))
        with anyio.fail_after(2):
            await anyio.wait_all_tasks_blocked()
        assert drain.resume() is True
    [result] = results
    assert result.result == "resumed"
    assert (result.propagation, result.propagation_ended_by, result.last_request, result.announced) == (
        None,
        None,
        None,
        None,
    )


# -- joining a drain that has left DRAINING ---------------------------------------------------------


async def test_joining_a_drain_undone_before_it_ran_says_resumed() -> None:
    drain = serving()
    drain.begin_drain("preStop", timeout=5)
    drain.resume()
    with anyio.fail_after(2):
        result = await core(drain).join()
    assert (result.result, result.reason, result.in_flight) == ("resumed", "preStop", 0)


async def test_joining_a_drain_stopped_before_it_ran_says_stopped() -> None:
    drain = serving()
    drain.begin_drain("preStop", timeout=5)
    drain.mark_stopped()
    with anyio.fail_after(2):
        result = await drain.drain()
    assert (result.result, result.reason) == ("stopped", "preStop")


# -- FAILED -----------------------------------------------------------------------------------------


def test_a_drain_begun_while_failed_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    drain = serving()
    admitted(drain, Item(core(drain).ledger))
    drain.mark_failed("engine_dead")
    caplog.clear()  # the transition's own line
    with caplog.at_level(logging.INFO, logger="graceful"):
        assert drain.begin_drain("preStop") is True
    assert messages(caplog) == ["drain begins while FAILED (reason=preStop, in_flight=1)"]
