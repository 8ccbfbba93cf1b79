"""One drain run in process: its result and status fields, the quiet rule, the hooks' time
bounds, expiry and the exact log lines (messages are part of the promise)."""

from __future__ import annotations

import logging
import os
import re
import time

import anyio
import pytest

from graceful import Budget, ConfigError, Drain, DrainResult, State
from graceful._drain._admission import WOULD_NOT_FINISH
from graceful._drain._durations import quiet_seconds
from graceful._drain._ledger import COMPLETED, Tracked
from graceful._drain._state import core
from tests.drain.conftest import FakeTime

pytestmark = pytest.mark.anyio


class Item(Tracked):
    """One admitted request, as the middleware's helpers admit them."""

    def label(self) -> str:
        return "request"


def serving(**options: object) -> Drain:
    options.setdefault("grace_period", 30)
    options.setdefault("reserve", 5)
    drain = Drain(**options)  # type: ignore[arg-type]
    drain.mark_serving()
    return drain


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


async def hold(drain: Drain, release: anyio.Event, name: str = "job") -> None:
    async with drain.track(name):
        await release.wait()


def test_drain_reads_its_budget_and_tally() -> None:
    drain = Drain(grace_period=12, reserve=2, drain_timeout=8, propagation_wait=1)
    assert drain.budget == Budget(grace_period=12, reserve=2, drain_timeout=8, propagation_wait=1)
    assert core(drain).tally.drain_seconds is core(drain).tally.drain_seconds
    assert core(drain).tally.propagation_seconds is core(drain).tally.propagation_seconds


def test_transitions_are_logged_exactly(caplog: pytest.LogCaptureFixture) -> None:
    drain = Drain(grace_period=30, reserve=5)
    # DEBUG: outside a drain the transitions are DEBUG (docs/middleware.md, "Logging").
    with caplog.at_level(logging.DEBUG, logger="graceful"):
        drain.mark_serving()
        drain.mark_serving()  # already SERVING: nothing to say
        drain.begin_drain()
        drain.resume()
        drain.mark_stopped()
        drain.mark_serving()
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00"
    lines = messages(caplog)
    assert len(lines) == 5, lines
    expected = [
        ("STARTING", "SERVING", "ready"),
        ("SERVING", "DRAINING", "drain"),
        ("DRAINING", "SERVING", "resume"),
        ("SERVING", "STOPPED", "shutdown"),
    ]
    for line, (old, new, reason) in zip(lines, expected):
        pattern = rf"state {old} -> {new} at {stamp} \(reason={reason}, in_flight=0, elapsed=(\d+\.\d{{3}})s\)"
        found = re.fullmatch(pattern, line)
        assert found, line
        assert float(found.group(1)) < 60  # the time in the old state, not a timestamp sum
    assert lines[4] == "mark_serving() ignored: state is STOPPED"


def test_mark_stopped_logs_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    drain = serving()
    with caplog.at_level(logging.DEBUG, logger="graceful"):  # a shutdown without a drain is DEBUG
        drain.mark_stopped("lifespan")
    assert "(reason=lifespan, in_flight=0," in messages(caplog)[0]


def test_status_fields_before_during_and_after_a_drain() -> None:
    drain = serving()
    before = drain.status()
    assert (before.state, before.in_flight, before.pid) == (State.SERVING, 0, os.getpid())
    assert before.since == drain.since and before.counters == drain.counters()
    assert (before.drain_started, before.deadline, before.propagation_until, before.last_request) == (None,) * 4
    drain.begin_drain("preStop", propagation_wait=1, timeout=4)
    during = drain.status()
    assert during.state is State.DRAINING and during.drain_started is not None
    assert during.deadline == pytest.approx(during.drain_started + 4)
    assert during.propagation_until == pytest.approx(during.drain_started + 1)
    assert during.last_request is None
    core(drain).admit_arrival()  # a new request during the propagation phase is recorded
    arrived = drain.status().last_request
    assert arrived is not None and during.drain_started - 1e-6 <= arrived < during.drain_started + 1
    drain.resume()
    assert drain.status().drain_started is None  # resumed: no drain to show
    drain.mark_stopped()


async def test_status_keeps_the_last_drain_once_it_has_its_result() -> None:
    drain = serving()
    result = await drain.drain(reason="preStop", timeout=3)
    drain.resume()
    assert drain.status().drain_started == result.started_at  # the last drain, with its result
    drain.begin_drain("again", timeout=2)
    again = await drain.drain()
    shown = drain.status()
    assert shown.drain_started == again.started_at and shown.deadline == again.deadline
    assert result.reason == "preStop" and again.reason == "again"


async def test_result_fields_of_a_drained_run() -> None:
    drain = serving()
    started = time.time()
    result = await drain.drain(propagation_wait=0.1, timeout=3)
    assert result.result == "drained" and result.in_flight == 0
    assert result.reason == "drain"  # the default reason
    assert started <= result.started_at <= time.time()
    assert result.deadline == pytest.approx(result.started_at + 3)
    assert result.truncated == 0 and result.leftover == ()
    assert result.propagation == pytest.approx(0.1, abs=0.05)
    assert result.last_request is None
    assert 0.1 - 1e-3 <= result.duration < 1.0 + 1.0  # 10x safety bound
    assert core(drain).tally.drain_seconds == [result.duration]
    assert core(drain).tally.propagation_seconds == [0.0]  # no new request came during the phase
    assert drain.counters()["drains"] == {"drained": 1}


async def test_a_request_in_the_propagation_phase_is_dated_in_the_result() -> None:
    drain = serving()
    drain.begin_drain("preStop", propagation_wait=0.3, timeout=5)
    assert core(drain).admit_arrival() is True  # admitted during the wait (the default)
    result = await drain.drain()
    assert result.last_request is not None and 0 <= result.last_request < 0.3
    assert core(drain).tally.propagation_seconds == [pytest.approx(result.last_request)]


async def test_propagation_wait_is_waited_without_sleeping_to_the_deadline() -> None:
    """Nothing in flight: the run wakes at the end of the wait, not at its 20 s deadline."""
    drain = serving()
    with anyio.fail_after(2):  # 10x the wait
        result = await drain.drain(propagation_wait=0.2, timeout=20)
    assert result.drained


async def test_the_waiting_leader_sleeps_after_the_propagation_phase() -> None:
    """Past the propagation end with work in flight, the run sleeps until the deadline or a
    release: every task blocks (a leader that spun would never block)."""
    drain = serving()
    release = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(hold, drain, release)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(lambda: drain.drain(propagation_wait=0.05, timeout=10))
        await anyio.sleep(0.1)  # the propagation phase is over
        with anyio.fail_after(5):
            await anyio.wait_all_tasks_blocked()
        assert drain.last_result is None  # still waiting for the job
        release.set()
    result = drain.last_result
    assert result is not None and result.drained


async def test_quiet_rule_ends_the_phase_after_the_last_arrival(caplog: pytest.LogCaptureFixture) -> None:
    """propagation_quiet 0.3 s within a 10 s wait: the phase ends 0.3 s after the last new
    request, logged with the rule that ended it."""
    drain = serving(propagation_wait=10)
    with caplog.at_level(logging.INFO, logger="graceful"):
        drain.begin_drain("preStop", propagation_quiet=0.3, timeout=20)
        await anyio.sleep(0.1)
        core(drain).admit_arrival()  # a request 0.1 s in moves the end to 0.4 s
        with anyio.fail_after(5):
            result = await drain.drain()
    assert result.drained
    assert result.last_request is not None and result.propagation is not None
    assert result.propagation == pytest.approx(result.last_request + 0.3)
    assert 0.4 - 1e-3 <= result.propagation < 1.0
    [line] = [m for m in messages(caplog) if m.startswith("propagation phase over")]
    pattern = (
        r"propagation phase over (\d+\.\d{3})s after drain start \(no new request for 0\.3s\); "
        r"last new request (\d+\.\d{3})s after drain start"
    )
    found = re.fullmatch(pattern, line)
    assert found, line
    assert float(found.group(1)) == pytest.approx(result.propagation, abs=0.002)
    assert float(found.group(2)) == pytest.approx(result.last_request, abs=0.002)


async def test_quiet_rule_without_arrivals_counts_from_the_drain_start() -> None:
    drain = serving(propagation_wait=10)
    with anyio.fail_after(5):
        result = await drain.drain(propagation_quiet=0.2, timeout=20)
    assert result.propagation == pytest.approx(0.2)  # the quiet period counted from the drain start
    assert result.last_request is None


async def test_a_quiet_period_as_long_as_the_wait_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    drain = serving()
    with caplog.at_level(logging.INFO, logger="graceful"):
        result = await drain.drain(propagation_wait=0.2, propagation_quiet=0.2, timeout=5)
    assert result.propagation == pytest.approx(0.2, abs=0.05)
    [line] = [m for m in messages(caplog) if m.startswith("propagation phase over")]
    assert line.endswith("(propagation_wait); no new request")  # none arrived: no time to give


async def test_a_configured_quiet_period_applies_to_begin_drain() -> None:
    drain = serving(propagation_wait=10, propagation_quiet=0.2)
    with anyio.fail_after(5):  # not the 10 s wait
        result = await drain.drain(timeout=20)
    assert result.propagation is not None and result.propagation < 2.0


async def test_wait_as_long_as_the_limit_is_taken_and_a_longer_one_refused(caplog: pytest.LogCaptureFixture) -> None:
    """The budget rule (docs/middleware.md, "The budget rule"): a drain whose wait is longer than
    its limit does not begin; the state is untouched."""
    drain = serving()
    with caplog.at_level(logging.WARNING, logger="graceful"):
        drain.begin_drain("preStop", propagation_wait=2, timeout=2)
    assert messages(caplog) == []
    drain.resume()
    before = core(drain).run
    with pytest.raises(ConfigError) as caught:
        drain.begin_drain("preStop", propagation_wait=3, timeout=2)
    assert str(caught.value) == (
        "propagation_wait 3s is longer than the whole drain: this drain's timeout is 2s; "
        "shorten propagation_wait or raise this drain's timeout"
    )
    assert drain.state is State.SERVING and core(drain).run is before


async def test_resumed_run_reports_resumed_and_skips_on_drained() -> None:
    calls: list[str] = []

    async def on_drained() -> None:
        calls.append("drained")

    drain = serving(on_drained=on_drained)
    async with anyio.create_task_group() as tg:

        async def resume_soon() -> None:
            await anyio.wait_all_tasks_blocked()
            drain.resume()

        tg.start_soon(resume_soon)
        result = await drain.drain(propagation_wait=5, timeout=10)
    assert result.result == "resumed" and result.in_flight == 0
    assert calls == []
    assert drain.counters()["drains"] == {}
    assert core(drain).tally.drain_seconds == []


async def test_stopped_with_work_left_reports_it() -> None:
    drain = serving()
    release = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(hold, drain, release)
        await anyio.wait_all_tasks_blocked()

        async def stop_soon() -> None:
            await anyio.wait_all_tasks_blocked()
            drain.mark_stopped("lifespan")
            release.set()

        tg.start_soon(stop_soon)
        result = await drain.drain(timeout=10)
    assert result.result == "stopped" and result.in_flight == 1


async def test_joining_an_ended_run_returns_its_snapshot() -> None:
    drain = serving()
    release = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(hold, drain, release)
        await anyio.wait_all_tasks_blocked()
        drain.begin_drain("preStop", timeout=10)
        drain.mark_stopped("lifespan")  # before anyone led the run
        stopped = await drain.drain()
        release.set()
    assert stopped.result == "stopped" and stopped.in_flight == 1
    assert stopped.reason == "preStop"
    assert stopped.duration == 0.0 and stopped.started_at == stopped.deadline


async def test_drain_after_stop_without_any_drain() -> None:
    drain = serving()
    drain.mark_stopped()
    assert await drain.drain() == DrainResult("stopped", 0, 0.0, "", 0.0, 0.0)


async def test_a_follow_up_run_waits_for_work_admitted_after_the_drain() -> None:
    """A pinned connection's one more request arrives after the drain has drained: a second
    drain() waits for it within the same deadline."""
    drain = serving(admit_during_propagation=True)
    core(drain).set_launcher("a test", lambda: {"peer"})  # an open connection, pinned at the drain's start
    first = await drain.drain(timeout=5)
    assert first.drained
    assert core(drain).admit_arrival() is False  # the propagation phase is over
    assert core(drain).admit_pinned("peer") is True  # its one more request
    assert core(drain).admit_pinned("peer") is False  # once
    item = Item(core(drain).ledger)
    assert core(drain).ledger.admit_item(item)
    async with anyio.create_task_group() as tg:

        async def finish_soon() -> None:
            await anyio.wait_all_tasks_blocked()
            item.finish(COMPLETED)

        tg.start_soon(finish_soon)
        with anyio.fail_after(5):
            second = await drain.drain()
    assert second.drained and second.deadline == first.deadline
    assert drain.counters()["drains"] == {"drained": 1}  # a follow-up is not a new drain
    assert await drain.drain() is second  # nothing in flight: the same result


async def test_a_pinned_peer_is_refused_after_the_deadline() -> None:
    drain = serving(admit_during_propagation=True)
    core(drain).set_launcher("a test", lambda: {"peer"})
    await drain.drain(timeout=0.05)
    await anyio.sleep(0.1)  # past the deadline
    assert core(drain).admit_pinned("peer") is False
    assert core(drain).admit_pinned(None) is False


async def test_a_pinned_peer_is_served_until_the_deadlines_instant_not_at_it(clock: FakeTime) -> None:
    """At the deadline's instant (the clock exactly there) the work would be cut at once: refused."""
    drain = serving(admit_during_propagation=True)
    core(drain).set_launcher("a test", lambda: {"early", "late"})
    start = clock.now
    drain.begin_drain("test", timeout=5)
    clock.now = start + 4.999
    assert core(drain).admit_pinned("early") is True
    clock.now = start + 5.0
    assert core(drain).admit_pinned("late") is False


async def test_a_drain_request_at_the_deadlines_instant_starts_no_follow_up(clock: FakeTime) -> None:
    """A pinned connection's one more request is in flight after the drain drained; a drain request at
    the deadline's instant leaves no time for a follow-up run: the drain's result stands."""
    drain = serving(admit_during_propagation=True)
    core(drain).set_launcher("a test", lambda: {"peer"})
    with anyio.fail_after(5):
        first = await drain.drain(timeout=5)
    assert first.drained
    assert core(drain).admit_pinned("peer") is True
    item = Item(core(drain).ledger)
    assert core(drain).ledger.admit_item(item)
    clock.now += 5.0
    with anyio.fail_after(5):
        assert await drain.drain() is first
    item.finish(COMPLETED)


async def test_the_drain_times_out_at_the_deadlines_instant(clock: FakeTime) -> None:
    """At the deadline's instant (the clock exactly there), with a job in flight, the drain times out and
    ends it."""
    drain = serving()
    release, done = anyio.Event(), anyio.Event()
    results: list[DrainResult] = []

    async def drained() -> None:
        results.append(await drain.drain())
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold, drain, release)
        with anyio.fail_after(2):
            await anyio.wait_all_tasks_blocked()
        drain.begin_drain("test", timeout=5)
        clock.now += 5.0
        tg.start_soon(drained)
        with anyio.move_on_after(5):
            await done.wait()
        at_the_instant = done.is_set()
        clock.now += 1.0  # a run that let the instant pass ends now: the test fails rather than hangs
        release.set()
    assert at_the_instant
    [result] = results
    assert (result.result, result.truncated, result.duration) == ("timeout", 1, 5.0)


async def test_refuse_mode_refuses_during_the_wait_and_counts_the_arrival() -> None:
    drain = serving(admit_during_propagation=False)
    drain.begin_drain("preStop", propagation_wait=5, timeout=10)
    assert core(drain).admit_arrival() is False
    assert drain.status().last_request is not None
    drain.resume()
    assert core(drain).admit_arrival() is True
    stopped = serving()
    stopped.mark_stopped()
    assert core(stopped).admit_arrival() is False


async def test_on_drained_gets_half_the_reserve_past_the_deadline() -> None:
    """1. a job outlives the 0.2 s deadline and is expired 2. on_drained never returns 3. it is
    cut at deadline + reserve / 2 (2 s here), inside its 10 s hook_timeout."""
    hook: list[float] = []

    async def on_drained() -> None:
        hook.append(time.monotonic())
        try:
            await anyio.sleep_forever()
        finally:
            hook.append(time.monotonic())

    drain = serving(grace_period=30, reserve=4, hook_timeout=10, on_drained=on_drained)
    release = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(hold, drain, release)
        await anyio.wait_all_tasks_blocked()
        started = time.monotonic()
        with anyio.fail_after(20):
            result = await drain.drain(timeout=0.2)
    assert result.result == "timeout" and result.truncated == 1
    cut_after_deadline = hook[1] - (started + 0.2)
    assert 1.5 < cut_after_deadline < 2.0 + 2.0  # reserve / 2, not reserve / 3 nor 2 x reserve


async def test_on_drain_start_is_bounded_by_the_deadline(caplog: pytest.LogCaptureFixture) -> None:
    async def on_start() -> None:
        await anyio.sleep_forever()

    drain = serving(on_drain_start=on_start)
    with caplog.at_level(logging.WARNING, logger="graceful"), anyio.fail_after(5):
        result = await drain.drain(timeout=0.5)
    assert result.drained
    assert "on_drain_start hook overran its 0.5s budget and was cut off" in messages(caplog)


async def test_hook_that_raises_is_logged_by_name(caplog: pytest.LogCaptureFixture) -> None:
    async def on_drained() -> None:
        raise RuntimeError("boom")

    drain = serving(on_drained=on_drained)
    with caplog.at_level(logging.ERROR, logger="graceful"):
        await drain.drain(timeout=1)
    assert messages(caplog) == ["on_drained hook failed"]


async def test_expiry_waits_for_work_to_unwind_up_to_unwind_timeout(caplog: pytest.LogCaptureFixture) -> None:
    """1. two jobs outlive the deadline 2. each is cancelled; one unwinds for 0.2 s, the other
    never does (shielded) 3. the run waits for the first, gives up on the second after the
    0.5 s unwind_timeout 4. the summary and the warning lines say so."""
    drain = serving(unwind_timeout=0.5)
    stuck = anyio.Event()
    unwound: list[str] = []

    async def slow_unwind() -> None:
        async with drain.track("slow"):
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(0.2)
                    unwound.append("slow")

    async def never_unwinds() -> None:
        async with drain.track("stuck"):
            try:
                await stuck.wait()
            finally:
                with anyio.CancelScope(shield=True):  # ignores the cancellation until the test lets go
                    await stuck.wait()

    with caplog.at_level(logging.INFO, logger="graceful"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_unwind)
            tg.start_soon(never_unwinds)
            await anyio.wait_all_tasks_blocked()
            started = time.monotonic()
            with anyio.fail_after(5):
                result = await drain.drain(reason="preStop", timeout=0.1)
            waited = time.monotonic() - started
            stuck.set()
    assert unwound == ["slow"]
    assert result.result == "timeout" and result.in_flight == 2 and result.truncated == 2
    assert [re.sub(r"\(\d+\.\ds\)", "(age)", item) for item in result.leftover] == ["job slow (age)", "job stuck (age)"]
    assert 0.1 + 0.5 - 1e-3 <= waited < 6.0
    lines = messages(caplog)
    assert "drain deadline passed: ending 2 request(s) still in flight" in lines
    [summary] = [line for line in lines if line.startswith("drain timeout:")]
    assert re.fullmatch(
        r"drain timeout: reason=preStop duration=\d+\.\d{3}s in_flight_left=2 truncated=2 handed_off=0 completed=0 "
        r"client_disconnected=0 errors=0 cancelled=1 rejected=0 would_not_finish=0",
        summary,
    ), summary


async def test_the_summary_counts_the_refusals_admission_fits_made_apart(caplog: pytest.LogCaptureFixture) -> None:
    """The drain's summary line counts every refusal, and those of admission="fits" (would_not_finish) apart."""
    drain = serving()
    drain.begin_drain("preStop", timeout=5)
    core(drain).count_rejected("server_draining")
    core(drain).count_rejected(WOULD_NOT_FINISH)
    with caplog.at_level(logging.INFO, logger="graceful"):
        with anyio.fail_after(5):
            assert (await drain.drain()).drained
    [summary] = [line for line in messages(caplog) if line.startswith("drain drained:")]
    assert summary.endswith(" rejected=2 would_not_finish=1"), summary


async def test_the_leader_finishes_when_its_caller_is_cancelled() -> None:
    """The first caller leads the run shielded: cancelling it does not abort the drain, and a
    second caller gets the result when the job ends."""
    drain = serving()
    release = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(hold, drain, release)
        await anyio.wait_all_tasks_blocked()
        async with anyio.create_task_group() as leader:
            leader.start_soon(lambda: drain.drain(timeout=10))
            await anyio.wait_all_tasks_blocked()
            leader.cancel_scope.cancel()  # the leader's caller goes away ...

            async def let_go() -> None:
                await anyio.wait_all_tasks_blocked()
                release.set()  # ... and the job ends after that

            tg.start_soon(let_go)
        with anyio.fail_after(5):
            result = await drain.drain()
    assert result.drained and drain.counters()["drains"] == {"drained": 1}


def test_settings_are_what_a_drain_with_these_overrides_would_use() -> None:
    drain = serving(propagation_wait=10, propagation_quiet=2)
    assert core(drain).overrides().as_tuple() == (10.0, 2.0, 25.0)
    assert core(drain).overrides(propagation_wait="1s", propagation_quiet="500ms", timeout="3s").as_tuple() == (
        1.0,
        0.5,
        3.0,
    )
    assert core(drain).overrides(timeout=100).as_tuple() == (10.0, 2.0, 25.0)  # never past grace - reserve


def test_stopped_admits_nothing_even_inside_the_propagation_wait() -> None:
    drain = serving()
    drain.begin_drain("preStop", propagation_wait=5, timeout=10)
    assert core(drain).admit_arrival() is True  # admitted during the wait (the default)
    drain.mark_stopped()
    assert core(drain).admit_arrival() is False


async def test_after_the_phase_ends_it_is_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """Reading the status after the propagation phase (as /status does) neither moves its end
    nor records it again."""
    drain = serving()
    with caplog.at_level(logging.INFO, logger="graceful"):
        result = await drain.drain(propagation_wait=0.05, timeout=5)
        first = drain.status()
        second = drain.status()
    assert first.propagation_until == second.propagation_until
    assert result.propagation is not None
    assert first.propagation_until == pytest.approx(result.started_at + result.propagation)
    assert core(drain).tally.propagation_seconds == [0.0]
    assert len([m for m in messages(caplog) if m.startswith("propagation phase over")]) == 1


async def test_a_drain_that_ends_inside_the_wait_has_no_propagation_time() -> None:
    drain = serving()
    async with anyio.create_task_group() as tg:

        async def resume_soon() -> None:
            await anyio.wait_all_tasks_blocked()
            drain.resume()

        tg.start_soon(resume_soon)
        resumed = await drain.drain(propagation_wait=5, timeout=10)
    assert resumed.result == "resumed" and resumed.propagation is None


async def test_an_idle_drain_whose_wait_ends_at_the_deadline_is_drained() -> None:
    """Nothing in flight when the wait and the deadline end together: "drained", nothing ended."""
    idle = serving()
    with anyio.fail_after(5):
        result = await idle.drain(propagation_wait=0.1, timeout=0.1)
    assert result.result == "drained" and result.in_flight == 0 and result.truncated == 0
    assert core(idle).tally.drains == {"drained": 1}


async def test_the_leader_sleeps_through_the_wait_for_work_in_flight() -> None:
    """After the propagation phase, with work in flight, the run re-checks nothing until a
    release or the deadline wakes it: it is asleep, not spinning."""
    drain = serving()
    release = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(hold, drain, release)
        await anyio.wait_all_tasks_blocked()
        drain.begin_drain("preStop", propagation_wait=0.05, timeout=10)
        run = core(drain).run
        assert run is not None
        checks = 0
        settle_propagation = run.settle_propagation

        def counting(now: float) -> float:
            nonlocal checks
            checks += 1
            return settle_propagation(now)

        run.settle_propagation = counting  # type: ignore[method-assign]
        tg.start_soon(drain.drain)
        await anyio.sleep(0.1)  # past the propagation end
        before = checks
        await anyio.sleep(0.2)
        assert checks - before == 0, checks
        release.set()
    assert drain.last_result is not None and drain.last_result.drained


async def test_a_hook_with_no_time_left_is_cut_at_once(caplog: pytest.LogCaptureFixture) -> None:
    reached: list[str] = []

    async def on_drained() -> None:
        await anyio.sleep(0)
        reached.append("past the first await")

    drain = serving(hook_timeout=0, on_drained=on_drained)
    with caplog.at_level(logging.WARNING, logger="graceful"):
        await drain.drain(timeout=1)
    assert reached == []
    assert messages(caplog) == ["on_drained hook overran its 0.0s budget and was cut off"]


async def test_track_names_its_work_job_by_default() -> None:
    drain = serving()
    release = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def job() -> None:
            async with drain.track():
                await release.wait()

        tg.start_soon(job)
        await anyio.wait_all_tasks_blocked()
        result = await drain.drain(timeout=0.05)
    assert [item.rsplit(" (", 1)[0] for item in result.leftover] == ["job job"]


def test_a_quiet_period_of_zero_is_refused_as_it_was_written() -> None:
    with pytest.raises(ConfigError) as info:
        quiet_seconds(0.0)
    assert str(info.value).startswith("0.0 must be above 0;")
    with pytest.raises(ConfigError) as info:
        quiet_seconds("0ms")
    assert str(info.value).startswith("'0ms' must be above 0;")
