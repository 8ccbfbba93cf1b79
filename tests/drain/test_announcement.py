"""The drain's announcement to the balancers (``announce_drain``) and the propagation phase in the
drain's result and log: the first announcement is kept, none is recorded outside a drain, the
phase's one log line, and a resumed drain records no phase."""

from __future__ import annotations

import logging
import re
import time
from functools import partial

import anyio
import pytest

from graceful import Drain, DrainResult
from graceful._drain._state import core
from tests.drain.test_drain_run import serving

pytestmark = pytest.mark.anyio


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


async def drained(drain: Drain, into: list[DrainResult], **options: object) -> None:
    into.append(await drain.drain(**options))  # type: ignore[arg-type]


async def test_the_first_announcement_is_kept_in_the_result() -> None:
    drain = serving()
    c = core(drain)
    c.record_announcement()  # SERVING, no drain yet: nothing to announce, nothing recorded
    before = time.monotonic()  # the drain's clock starts after this
    drain.begin_drain(propagation_wait=0.2, timeout=5)
    c.record_announcement()
    first = time.monotonic()  # the first announcement came before this
    await anyio.sleep(0.05)
    c.record_announcement()  # a later response changes nothing
    with anyio.fail_after(5):
        result = await drain.drain()
    # The first one's time, bounded by the calls around it (not by the machine's speed); the second
    # one, kept instead, would read 0.05 s more.
    assert result.announced is not None and 0 <= result.announced <= first - before


async def test_no_announcement_is_recorded_once_serving_again() -> None:
    """1. A drain begins; its leader waits out the propagation wait.
    2. The drain is resumed, and a response after that records an announcement before the leader
    returns: the resumed drain's result has none."""
    drain = serving()
    results: list[DrainResult] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(drained, drain, results, propagation_wait=10, timeout=20))
        with anyio.fail_after(2):
            await anyio.wait_all_tasks_blocked()
        assert drain.resume() is True
        core(drain).record_announcement()  # a response after the drain was undone announces nothing
    [result] = results
    assert result.result == "resumed" and result.announced is None


async def test_an_announcement_before_any_drain_is_not_recorded() -> None:
    """A response while SERVING records nothing, even with a past drain's run at hand."""
    drain = serving()
    with anyio.fail_after(5):
        first = await drain.drain(propagation_wait=0, timeout=5)
    assert first.announced is None
    drain.resume()  # DRAINING after the drained drain: back to SERVING
    core(drain).record_announcement()
    with anyio.fail_after(5):
        second = await drain.drain(propagation_wait=0, timeout=5)
    assert second.announced is None


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
        tg.start_soon(partial(drained, drain, results, propagation_wait=10, timeout=20))
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
