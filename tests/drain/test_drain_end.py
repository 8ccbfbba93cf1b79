"""How a drain ends when it does not simply drain: a stop while expired work unwinds, a drain joined
after it left DRAINING, and a drain begun while FAILED."""

from __future__ import annotations

import logging
from functools import partial

import anyio
import pytest

from graceful import Drain, DrainResult
from graceful._drain._ledger import CANCELLED, Ledger
from graceful._drain._state import core
from tests.drain.test_drain_run import Item, serving

pytestmark = pytest.mark.anyio


class Unwinding(Item):
    """Work that the deadline cuts (``cut_called``) and that ends when the test releases it."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(ledger)
        self.cut_called = anyio.Event()

    async def cut(self) -> None:
        self.cut_called.set()


async def drained(drain: Drain, into: list[DrainResult], **options: object) -> None:
    into.append(await drain.drain(**options))  # type: ignore[arg-type]


async def test_a_stop_while_expired_work_unwinds_leaves_the_unwind_its_time() -> None:
    """1. A request is in flight at the deadline (0.1 s); it is cut and unwinds.
    2. The lifespan stops the server meanwhile.
    3. The run goes on waiting for the unwind, and returns once the request has ended: a timeout
    with one request truncated."""
    drain = serving(unwind_timeout=5)
    work = Unwinding(core(drain).ledger)
    assert core(drain).ledger.admit_item(work)
    results: list[DrainResult] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(drained, drain, results, timeout=0.1))
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


def test_a_drain_begun_while_failed_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    drain = serving()
    assert core(drain).ledger.admit_item(Item(core(drain).ledger))
    drain.mark_failed("engine_dead")
    caplog.clear()  # the transition's own line
    with caplog.at_level(logging.INFO, logger="graceful"):
        assert drain.begin_drain("preStop") is True
    assert [r.getMessage() for r in caplog.records] == ["drain begins while FAILED (reason=preStop, in_flight=1)"]
