"""A new request during a drain's propagation phase, as the admin server waits for it
(``Core.until_arrival``): it sends a progress line at each one, so that the preStop hook's lines about
the last new request are never a second late."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from graceful._drain._core import Core
from graceful._drain._ledger import COMPLETED
from graceful._drain._state import core
from tests.drain.test_drain_run import Item, serving

pytestmark = pytest.mark.anyio


async def waited(drain_core: Core, done: anyio.Event, returned: anyio.Event) -> None:
    await drain_core.until_arrival(done)
    returned.set()


async def released_by(drain_core: Core, done: anyio.Event, release: Callable[[], object]) -> None:
    """``until_arrival(done)`` waits until ``release()`` is called, and returns then."""
    returned = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(waited, drain_core, done, returned)
        with anyio.fail_after(2):
            await anyio.wait_all_tasks_blocked()
        assert not returned.is_set()
        release()
        with anyio.fail_after(2):
            await returned.wait()


async def test_a_new_request_of_the_propagation_phase_ends_the_wait() -> None:
    """1. A drain's propagation phase runs; the wait begins. 2. Nothing arrives: it goes on.
    3. A new request arrives: it returns, with ``done`` not set."""
    drain = serving()
    drain.begin_drain(propagation_wait=10, timeout=20)
    c = core(drain)
    done = anyio.Event()
    admitted: list[bool] = []
    await released_by(c, done, lambda: admitted.append(c.admit_arrival()))
    assert admitted == [True]
    assert not done.is_set()


async def test_done_ends_the_wait() -> None:
    drain = serving()
    drain.begin_drain(propagation_wait=10, timeout=20)
    done = anyio.Event()
    await released_by(core(drain), done, done.set)


@pytest.mark.parametrize("when", ["before any drain", "after a drain"])
async def test_outside_a_drain_only_done_ends_the_wait(when: str) -> None:
    """While SERVING no request is a drain's new one: the wait lasts until ``done``, even with the last
    drain's run at hand."""
    drain = serving()
    if when == "after a drain":
        drain.begin_drain(propagation_wait=10, timeout=20)
        drain.resume()
    c = core(drain)
    done, returned = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(waited, c, done, returned)
        with anyio.fail_after(2):
            await anyio.wait_all_tasks_blocked()
        assert c.admit_arrival() is True  # served: SERVING
        if when == "after a drain":
            run = c.run
            assert run is not None
            run.next_arrival().set()  # the old run's arrival event: not what this wait listens to
        with anyio.fail_after(2):
            await anyio.wait_all_tasks_blocked()
        assert not returned.is_set()
        done.set()
        with anyio.fail_after(2):
            await returned.wait()


async def test_a_follow_up_runs_wait_lasts_until_done() -> None:
    """1. A drain drains; a pinned connection's one more request is then in flight. 2. A second
    ``begin_drain`` starts a follow-up run for it, its propagation phase long over: the wait goes on,
    with no arrival of its own to end it, until ``done``."""
    drain = serving(admit_during_propagation=True)
    c = core(drain)
    c.set_launcher("a test", lambda: {"peer"})  # an open connection, pinned at the drain's start
    with anyio.fail_after(5):
        assert (await drain.drain(timeout=10)).drained
    assert c.admit_pinned("peer") is True
    item = Item(c.ledger)
    assert c.ledger.admit_item(item)
    drain.begin_drain()  # joins the drain: a follow-up run for the request
    done = anyio.Event()
    await released_by(c, done, done.set)
    item.finish(COMPLETED)
    with anyio.fail_after(5):
        assert (await drain.drain()).drained
