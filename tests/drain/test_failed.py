"""FAILED: the engine behind the server has died. Refuses everything, is never resumed, and drains as ever."""

from __future__ import annotations

import time

import anyio
import pytest

from graceful import Drain, NotAccepting, State
from graceful._drain._state import core
from tests.drain.test_state import serving

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("start", ["STARTING", "SERVING", "DRAINING"])
def test_failed_is_entered_from_every_live_state_once(start: str) -> None:
    drain = Drain(grace_period=30, reserve=5)
    if start != "STARTING":
        drain.mark_serving()
    if start == "DRAINING":
        drain.begin_drain()
    before = time.time()
    assert drain.mark_failed("engine_dead", "what was seen") is True
    assert drain.state is State.FAILED and not drain.accepting
    failure = drain.failure
    assert failure is not None and (failure.reason, failure.detail) == ("engine_dead", "what was seen")
    assert before <= failure.at <= time.time()
    assert drain.mark_failed("other") is False  # the first cause stays
    assert drain.failure is failure
    assert drain.counters()["failures"] == {"engine_dead": 1}
    assert core(drain).admit_arrival() is False
    assert drain.resume() is False
    drain.mark_serving()
    assert drain.state is State.FAILED


def test_stopped_is_not_failed_again_and_a_new_lifecycle_clears_the_failure() -> None:
    drain = serving()
    drain.mark_failed("engine_dead")
    drain.mark_stopped()
    assert drain.state is State.STOPPED and core(drain).stopped_draining  # final for its lifecycle
    assert drain.mark_failed("engine_dead") is False
    assert drain.failure is not None
    assert core(drain).restart() is True
    assert drain.state is State.STARTING and drain.failure is None and not core(drain).stopped_draining
    drain.mark_serving()
    assert drain.state is State.SERVING


async def test_track_refuses_while_failed() -> None:
    drain = serving()
    drain.mark_failed("engine_dead")
    with pytest.raises(NotAccepting, match="FAILED"):
        async with drain.track("job"):
            pass


async def test_a_drain_while_failed_waits_for_the_work_in_flight_and_stays_failed() -> None:
    """1. a job is in flight  2. the engine dies: FAILED  3. a drain begins (the preStop hook, SIGTERM):
    the state stays FAILED and the drain waits for the job  4. a second drain joins it
    5. the job ends: the drain ends drained, still FAILED; status shows the drain and the failure"""
    drain = serving()
    release = anyio.Event()
    inside = anyio.Event()

    async def job() -> None:
        async with drain.track("job"):
            inside.set()
            await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(job)
        await inside.wait()
        drain.mark_failed("engine_dead")
        assert drain.begin_drain("preStop", propagation_wait=0) is True
        assert drain.state is State.FAILED
        run = core(drain).run
        assert drain.begin_drain("SIGTERM") is False
        results = []

        async def wait() -> None:
            results.append(await drain.drain(reason="SIGTERM"))

        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        assert results == [] and core(drain).run is run
        release.set()
    [result] = results
    assert result.drained and result.reason == "preStop"
    assert drain.state is State.FAILED
    status = drain.status()
    assert status.drain_started is not None and status.failure is drain.failure


async def test_a_drain_resumed_before_the_failure_is_not_joined() -> None:
    """A drain that was resumed belongs to the past: a drain after the failure starts its own run."""
    drain = serving()
    drain.begin_drain("maintenance", propagation_wait=10)
    old = core(drain).run
    assert drain.resume()
    drain.mark_failed("engine_dead")
    result = await drain.drain(propagation_wait=0)
    assert core(drain).run is not old
    assert result.drained and result.reason == "drain" and drain.state is State.FAILED
