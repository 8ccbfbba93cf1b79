"""A drain's lifecycle through ``Drain``'s transitions and its internal face (``Core``): a fresh
machine, a new lifecycle after STOPPED (``restart``), the stop's mark, FAILED's log lines, the
listeners, and a drain joined after it left DRAINING. Asserted through the documented API and
``Core``'s methods and read-only properties, never its fields."""

from __future__ import annotations

import logging

import anyio
import pytest

from graceful import Drain, State
from graceful._drain._ledger import COMPLETED, Tracked
from graceful._drain._state import core
from tests.drain.test_drain_run import Item, serving

pytestmark = pytest.mark.anyio

PEER = ("10.0.0.1", 5000)


class OnPeer(Item):
    """A request on the connection ``PEER``: pinned if it is in flight when a drain begins."""

    def peer(self) -> object:
        return PEER


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def admitted(drain: Drain, item: Tracked) -> Tracked:
    assert core(drain).ledger.admit_item(item)
    return item


def test_a_new_drain_starts_clean() -> None:
    """STARTING, no drain yet, no failure, no handoff, and the middleware in charge of SIGTERM."""
    drain = Drain(grace_period=30, reserve=5)
    c = core(drain)
    assert drain.state is State.STARTING and drain.failure is None and drain.last_result is None
    assert c.run is None and c.handed_off() == 0
    assert c.handing_off is False and c.stopped_draining is False
    assert c.middleware_drains_on_sigterm is True


def test_state_and_since_are_read_only() -> None:
    drain = serving()
    with pytest.raises(AttributeError):
        drain.state = State.DRAINING  # type: ignore[misc]
    with pytest.raises(AttributeError):
        drain.since = 0.0  # type: ignore[misc]
    assert drain.state is State.SERVING


def test_a_launcher_takes_sigterm_from_the_middleware() -> None:
    """``graceful run`` handles SIGTERM itself (``Core.set_launcher``); without drain_on_sigterm nobody
    in the middleware does."""
    drain = serving()
    core(drain).set_launcher("graceful run")
    assert core(drain).middleware_drains_on_sigterm is False
    assert core(serving(drain_on_sigterm=False)).middleware_drains_on_sigterm is False


def test_a_launchers_open_connections_are_pinned_at_the_drains_start() -> None:
    """1. The launcher lists two open connections (idle: nothing of theirs is in flight).
    2. A drain begins and its propagation phase ends at once.
    3. Each connection's next request is admitted once; an unknown peer's is refused."""
    drain = serving()
    seen: list[int] = []

    def open_peers() -> set[object]:
        seen.append(1)
        return {PEER, ("10.0.0.2", 6000)}

    c = core(drain)
    c.set_launcher("a test", open_peers)
    assert seen == []  # listed only when a drain begins
    drain.begin_drain(propagation_wait=0)
    assert seen == [1]
    assert c.admit_arrival() is False
    assert c.admit_pinned(("10.0.0.3", 7000)) is False
    assert c.admit_pinned(PEER) is True
    assert c.admit_pinned(PEER) is False  # once
    assert c.admit_pinned(("10.0.0.2", 6000)) is True


def test_a_pinned_connection_is_not_served_when_refusing_from_the_start() -> None:
    drain = serving(admit_during_propagation=False)
    core(drain).set_launcher("a test", lambda: {PEER})
    drain.begin_drain(propagation_wait=0)
    assert core(drain).admit_pinned(PEER) is False


def test_a_resume_forgets_the_pinned_connections() -> None:
    """1. The launcher's one open connection is pinned at a drain's start. 2. The drain is resumed, and
    the connection goes. 3. Past the propagation phase of the next drain, a request on it is refused."""
    drain = serving()
    c = core(drain)
    open_now = [PEER]
    c.set_launcher("a test", lambda: set(open_now))
    drain.begin_drain(propagation_wait=0)
    drain.resume()
    open_now.clear()
    drain.begin_drain(propagation_wait=0)
    assert c.admit_pinned(PEER) is False


@pytest.mark.parametrize("end", ["mark_failed", "mark_stopped"])
def test_a_pinned_connection_is_refused_once_failed_or_stopped(end: str) -> None:
    """A connection pinned at the drain's start gets nothing more served once the engine has died, or
    the server has stopped."""
    drain = serving()
    core(drain).set_launcher("a test", lambda: {PEER})
    drain.begin_drain(propagation_wait=0)
    getattr(drain, end)("why")
    assert core(drain).admit_pinned(PEER) is False


def test_pinning_needs_a_drain() -> None:
    """Outside DRAINING nothing is admitted as pinned: before any drain, and once resumed."""
    drain = serving()
    c = core(drain)
    c.set_launcher("a test", lambda: {PEER})
    assert c.admit_pinned(PEER) is False  # no drain yet
    drain.begin_drain(propagation_wait=0)
    drain.resume()
    assert c.admit_pinned(PEER) is False


# -- a new lifecycle: STOPPED -> STARTING -----------------------------------------------------------


def test_restart_only_from_stopped() -> None:
    drain = serving()
    c = core(drain)
    assert c.restart() is False
    assert drain.state is State.SERVING
    drain.begin_drain()
    assert c.restart() is False
    assert drain.status().state is State.DRAINING


def test_a_new_lifecycle_forgets_the_connections_pinned_in_the_last(caplog: pytest.LogCaptureFixture) -> None:
    """1. A request on PEER is in flight when a drain begins: PEER is pinned.
    2. The server stops, and starts again (a new lifecycle); the request ends.
    3. Past the propagation phase of the new lifecycle's drain, PEER's next request is refused: its pin
    went with the old lifecycle."""
    drain = serving(propagation_wait=1)
    c = core(drain)
    busy = admitted(drain, OnPeer(c.ledger))
    drain.begin_drain()
    drain.mark_stopped()
    assert c.stopped_draining is True
    with caplog.at_level(logging.DEBUG, logger="graceful"):
        assert c.restart() is True
    assert drain.state is State.STARTING and c.stopped_draining is False
    [line] = messages(caplog)
    assert line.startswith("state STOPPED -> STARTING at ")
    assert "(reason=lifespan startup, in_flight=1, " in line  # the default reason
    busy.finish(COMPLETED)
    drain.mark_serving()
    drain.begin_drain(propagation_wait=0)
    assert c.admit_pinned(PEER) is False


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


# -- the stop's mark ----------------------------------------------------------------------------------


def test_stopped_from_serving_is_not_stopped_draining() -> None:
    drain = serving()
    drain.mark_stopped()
    assert drain.state is State.STOPPED
    assert core(drain).stopped_draining is False


def test_stopped_from_draining_or_failed_is_stopped_draining() -> None:
    for enter in ("begin_drain", "mark_failed"):
        drain = serving()
        getattr(drain, enter)("why")
        drain.mark_stopped()
        assert core(drain).stopped_draining is True, enter
        drain.mark_stopped("again")  # STOPPED already: nothing changes
        assert core(drain).stopped_draining is True, enter


# -- FAILED, the log and the listeners ------------------------------------------------------------


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


async def test_status_shows_the_budget_in_force_and_each_drains_propagation() -> None:
    drain = serving(propagation_wait=0.1)
    assert drain.status().budget == drain.config.in_force()
    assert drain.status().budget["grace_period"] == 30.0
    assert drain.status().propagation == ()
    with anyio.fail_after(5):
        result = await drain.drain(timeout=5)
    assert result.drained
    assert drain.status().propagation == (0.0,)  # the drain's figure: no new request during its phase
