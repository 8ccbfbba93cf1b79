"""The drain's internal face (``Core``) and the transitions of ``Drain``, in the detail that mutation testing
asks of them (docs/testing.md, "Mutation testing"): the outlook's time left, the handoff count, a new
lifecycle's clean slate, the announcement, the status's budget and propagation figures, and the exact
reasons and log lines of the transitions."""

from __future__ import annotations

import logging

import anyio
import pytest

from graceful import Drain, State
from graceful._drain._ledger import COMPLETED, HANDED_OFF
from graceful._drain._state import core
from tests.drain.test_drain_run import Item, serving

pytestmark = pytest.mark.anyio


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_a_new_core_starts_clean() -> None:
    """Nothing pinned, no run, no handoff, the middleware in charge of SIGTERM, no failure."""
    c = core(Drain(grace_period=30, reserve=5))
    assert (c.pinned, c.run, c.failure, c.signals_owner) == (set(), None, None, None)
    assert c.handing_off is False and c.ended_in_drain is False and c.stopped_draining is False
    assert c.listeners == []


# -- the outlook: how long is left to the deadline ----------------------------------------------


def test_outlook_outside_a_drain_judges_the_budgets_limit_or_the_one_given() -> None:
    drain = serving()
    c = core(drain)
    assert c.outlook().left == 25.0  # no drain has begun: the budget's limit
    assert c.outlook(limit=7).left == 7
    drain.begin_drain(timeout=10)
    drain.resume()  # SERVING again, with a run from the last drain: the budget's limit again
    assert c.outlook().left == 25.0
    assert c.outlook(limit=7).left == 7


def test_outlook_during_a_drain_judges_the_time_left_to_its_deadline() -> None:
    drain = serving()
    drain.begin_drain(timeout=10)  # the drain's own deadline, shorter than the budget's 25 s
    left = core(drain).outlook(limit=7).left  # a drain under way: its deadline, whatever limit says
    assert 9.0 < left <= 10.0


def test_outlook_past_the_deadline_leaves_nothing() -> None:
    drain = serving()
    drain.begin_drain(timeout=0)
    assert core(drain).outlook().left == 0.0


def test_outlook_counts_the_work_in_flight() -> None:
    drain = serving()
    ledger = core(drain).ledger
    items = [Item(ledger) for _ in range(3)]
    for item in items:
        ledger.admit_item(item)
    assert core(drain).outlook().in_flight == 3
    for item in items:
        item.finish(COMPLETED)


# -- handoff: the streams the current drain has handed off -----------------------------------------


def test_handed_off_is_zero_before_any_drain() -> None:
    drain = serving()
    assert core(drain).handed_off() == 0


def test_handed_off_counts_this_drains_streams_only() -> None:
    drain = serving()
    c = core(drain)
    before = Item(c.ledger)
    c.ledger.admit_item(before)
    before.finish(HANDED_OFF)  # handed off before the drain: not this drain's
    during = Item(c.ledger)
    c.ledger.admit_item(during)
    drain.begin_drain(timeout=10)
    assert c.handed_off() == 0
    during.finish(HANDED_OFF)
    assert c.handed_off() == 1
    assert drain.counters()["requests"]["handed_off"] == 2


# -- a new lifecycle: STOPPED -> STARTING -----------------------------------------------------------


def test_restart_only_from_stopped() -> None:
    drain = serving()
    c = core(drain)
    assert c.restart() is False
    assert drain.state is State.SERVING
    drain.begin_drain()
    assert c.restart() is False
    assert drain.state is State.DRAINING


def test_restart_clears_the_drains_per_cycle_marks(caplog: pytest.LogCaptureFixture) -> None:
    drain = serving(propagation_wait=1)
    c = core(drain)
    busy = Item(c.ledger)
    busy.peer = lambda: ("10.0.0.1", 5000)  # type: ignore[method-assign]
    c.ledger.admit_item(busy)
    drain.begin_drain()
    assert c.pinned == {("10.0.0.1", 5000)}
    c.handing_off = True  # as a drain run with handoff_streams sets it
    drain.mark_stopped()
    assert c.stopped_draining is True
    with caplog.at_level(logging.DEBUG, logger="graceful"):
        assert c.restart() is True
    assert drain.state is State.STARTING
    assert c.pinned == set()
    assert c.handing_off is False
    assert c.ended_in_drain is False
    assert c.stopped_draining is False
    [line] = messages(caplog)
    assert line.startswith("state STOPPED -> STARTING at ")
    assert "(reason=lifespan startup, in_flight=1, " in line  # the default reason
    busy.finish(COMPLETED)


def test_restart_logs_the_reason_given(caplog: pytest.LogCaptureFixture) -> None:
    drain = serving()
    drain.mark_stopped()
    with caplog.at_level(logging.DEBUG, logger="graceful"):
        core(drain).restart("second run")
    assert "(reason=second run, in_flight=0, " in messages(caplog)[0]


def test_restart_clears_the_failure() -> None:
    drain = serving()
    drain.mark_failed("engine_dead", "the engine exited")
    drain.mark_stopped()
    assert core(drain).stopped_draining is True  # the lifecycle ended FAILED
    core(drain).restart()
    assert drain.failure is None and drain.status().failure is None


# -- the stop's mark and resume's --------------------------------------------------------------------


def test_stopped_from_serving_is_not_stopped_draining() -> None:
    drain = serving()
    drain.mark_stopped()
    assert core(drain).ended_in_drain is False
    assert core(drain).stopped_draining is False


def test_stopped_from_draining_or_failed_is_stopped_draining() -> None:
    for enter in ("begin_drain", "mark_failed"):
        drain = serving()
        getattr(drain, enter)("why")
        drain.mark_stopped()
        assert core(drain).ended_in_drain is True, enter


def test_resume_ends_the_handoff() -> None:
    drain = serving()
    drain.begin_drain()
    core(drain).handing_off = True  # the run has begun handing off streams
    assert drain.resume() is True
    assert core(drain).handing_off is False


# -- the announcement ---------------------------------------------------------------------------------


async def test_the_first_announcement_is_kept_in_the_result() -> None:
    drain = serving()
    c = core(drain)
    c.record_announcement()  # SERVING, no drain yet: nothing to announce, nothing recorded
    drain.begin_drain(propagation_wait=0.2, timeout=5)
    c.record_announcement()
    first = c.run.announced if c.run is not None else None
    assert first is not None
    await anyio.sleep(0.05)
    c.record_announcement()  # a later response changes nothing
    assert c.run is not None and c.run.announced == first
    with anyio.fail_after(5):
        result = await drain.drain()
    assert result.announced is not None and 0 <= result.announced < 0.05


async def test_no_announcement_is_recorded_once_serving_again() -> None:
    drain = serving()
    c = core(drain)
    drain.begin_drain(propagation_wait=0.2, timeout=5)
    drain.resume()
    c.record_announcement()  # a response after the drain was undone announces nothing
    assert c.run is not None and c.run.announced is None


# -- the status -----------------------------------------------------------------------------------------


async def test_status_shows_the_budget_in_force_and_each_drains_propagation() -> None:
    drain = serving(propagation_wait=0.1)
    assert drain.status().budget == drain.config.in_force()
    assert drain.status().budget["grace_period"] == 30.0
    assert drain.status().propagation == ()
    with anyio.fail_after(5):
        result = await drain.drain(timeout=5)
    assert result.drained
    assert drain.status().propagation == (0.0,)  # the drain's figure: no new request during its phase


# -- FAILED and the listeners ------------------------------------------------------------------------


def test_mark_failed_without_detail_logs_only_the_transition(caplog: pytest.LogCaptureFixture) -> None:
    drain = serving()
    with caplog.at_level(logging.INFO, logger="graceful"):
        assert drain.mark_failed("engine_dead") is True
    assert drain.failure is not None and drain.failure.detail == ""
    [line] = messages(caplog)
    assert line.startswith("state SERVING -> FAILED at ") and "(reason=engine_dead, in_flight=0, " in line
    assert caplog.records[0].levelno == logging.WARNING  # FAILED is news at any log level


def test_mark_failed_logs_what_was_seen(caplog: pytest.LogCaptureFixture) -> None:
    drain = serving()
    with caplog.at_level(logging.INFO, logger="graceful"):
        drain.mark_failed("engine_dead", "the engine exited with 137")
    assert messages(caplog)[1:] == ["failed (engine_dead): the engine exited with 137"]
    assert caplog.records[1].levelno == logging.WARNING


def test_a_lifecycle_without_a_drain_is_quiet_at_info(caplog: pytest.LogCaptureFixture) -> None:
    """Starting up and a plain shutdown are DEBUG (docs/middleware.md, "Logging")."""
    drain = Drain(grace_period=30, reserve=5)
    with caplog.at_level(logging.INFO, logger="graceful"):
        drain.mark_serving()
        drain.mark_stopped()
        core(drain).restart()
    assert messages(caplog) == []


def test_listeners_are_called_on_every_change() -> None:
    drain = Drain(grace_period=30, reserve=5)
    seen: list[State] = []
    drain.add_listener(lambda: seen.append(drain.state))
    drain.mark_serving()
    drain.begin_drain()
    drain.resume()
    drain.mark_stopped()
    assert seen == [State.SERVING, State.DRAINING, State.SERVING, State.STOPPED]
