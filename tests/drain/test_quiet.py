"""Observed propagation: ``propagation_quiet`` ends the propagation wait once requests stop.

The rule: the wait ends early once no new request has arrived for ``quiet`` seconds;
probes and exempt paths don't count, admitted and refused requests do;
``propagation_wait`` stays the upper bound; the wait never ends before one quiet period
from drain start. Most tests drive the Drain's own clock (a fake ``time`` in
graceful._drain._state and graceful._drain._run) so that every instant is exact; the runner tests use real time with
lower bounds and order of events.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest

import graceful._drain._core
import graceful._drain._run
import graceful._drain._state
from graceful import ConfigError, Drain, GracefulMiddleware, State
from graceful._admin._client import WorkerDrain
from graceful._asgi._types import Message, Receive, Scope, Send
from graceful._cli._drain_client import _progress_line
from graceful._drain._state import core
from tests.drain.conftest import FakeTime

pytestmark = pytest.mark.anyio


async def ok_app(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def middleware(**options: Any) -> GracefulMiddleware:
    options.setdefault("grace_period", 60)
    options.setdefault("reserve", 10)
    mw = GracefulMiddleware(ok_app, registry=CollectorRegistry(), admin=False, exempt_paths=["/metrics"], **options)
    mw.drain.mark_serving()
    return mw


async def get(mw: GracefulMiddleware, path: str = "/v1/completions") -> int:
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "path": path,
        "headers": [],
        "client": ("127.0.0.1", 40000),
    }
    status: list[int] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await mw(scope, receive, send)
    return status[0]


def propagation_left(drain: Drain, clock: FakeTime) -> float:
    """Seconds until the propagation phase ends, as the drain sees it now (settling the phase as the
    run's leader does when it wakes: ``status()`` only reads)."""
    run = core(drain).run
    assert run is not None
    run.settle_propagation(graceful._drain._run.time.monotonic())
    until = drain.status().propagation_until
    assert until is not None
    return until - clock.time()


# -- the rule, instant by instant ---------------------------------------------------------------


async def test_probes_and_exempt_paths_do_not_reset_it_requests_do(clock: FakeTime) -> None:
    mw = middleware(propagation_wait=30, propagation_quiet=2)
    mw.drain.begin_drain("test")
    clock.now += 1.0
    assert await get(mw) == 200  # a request: the quiet period restarts at t=1
    assert propagation_left(mw.drain, clock) == pytest.approx(2.0)
    clock.now += 1.5
    for path in ("/ready", "/live", "/startup", "/metrics"):
        await get(mw, path)
    assert propagation_left(mw.drain, clock) == pytest.approx(0.5)  # still ends at t=3
    clock.now += 0.5
    assert await get(mw) == 503  # t=3: quiet for 2 s, so the phase is over and this is refused
    assert core(mw.drain).tally.propagation_seconds == [pytest.approx(1.0)]
    clock.now += 0.5
    assert await get(mw) == 503  # a refusal after the phase does not reopen it
    assert core(mw.drain).tally.propagation_seconds == [pytest.approx(1.0)]


async def test_refused_requests_count_too(clock: FakeTime) -> None:
    """Refusing during the wait, each refusal is traffic that has not stopped yet."""
    mw = middleware(propagation_wait=30, propagation_quiet=2, admit_during_propagation=False)
    mw.drain.begin_drain("test")
    for step in (1.5, 1.5, 1.9):  # t = 1.5, 3.0, 4.9: each within 2 s of the one before
        clock.now += step
        assert await get(mw) == 503
        assert propagation_left(mw.drain, clock) == pytest.approx(2.0)
    assert core(mw.drain).tally.propagation_seconds == []
    clock.now += 2.0
    assert propagation_left(mw.drain, clock) == pytest.approx(0.0)
    assert core(mw.drain).tally.propagation_seconds == [pytest.approx(4.9)]


async def test_propagation_wait_stays_the_upper_bound(clock: FakeTime) -> None:
    mw = middleware(propagation_wait=5, propagation_quiet=2)
    mw.drain.begin_drain("test")
    for _ in range(4):  # a request every second: never 2 s of quiet
        clock.now += 1.0
        assert await get(mw) == 200
    clock.now += 0.999
    assert await get(mw) == 200  # t=4.999
    clock.now += 0.001
    assert await get(mw) == 503  # t=5: the wait's end, although the last request came 1 ms ago
    assert core(mw.drain).tally.propagation_seconds == [pytest.approx(4.999)]


async def test_never_shorter_than_one_quiet_period(clock: FakeTime) -> None:
    mw = middleware(propagation_wait=30, propagation_quiet=2)
    mw.drain.begin_drain("test")
    assert propagation_left(mw.drain, clock) == pytest.approx(2.0)  # not 0: no request is not "quiet since"
    clock.now += 1.999
    assert propagation_left(mw.drain, clock) == pytest.approx(0.001, abs=1e-6)
    clock.now += 0.001
    assert await get(mw) == 503
    assert core(mw.drain).tally.propagation_seconds == [0.0]


async def test_without_quiet_the_last_arrival_is_still_measured(clock: FakeTime) -> None:
    mw = middleware(propagation_wait=3)
    mw.drain.begin_drain("test")
    clock.now += 0.7
    assert await get(mw) == 200
    clock.now += 2.0
    assert await get(mw, "/ready") == 503
    assert propagation_left(mw.drain, clock) == pytest.approx(0.3)
    last = mw.drain.status().last_request
    assert last is not None and last == pytest.approx(clock.time() - 2.0)
    clock.now += 0.3
    assert await get(mw) == 503
    assert core(mw.drain).tally.propagation_seconds == [pytest.approx(0.7)]


async def test_resume_and_a_new_drain_start_a_fresh_measurement(clock: FakeTime) -> None:
    drain = Drain(grace_period=60, reserve=10, propagation_wait=30, propagation_quiet=2)
    drain.mark_serving()
    drain.begin_drain("first")
    clock.now += 1.0
    assert core(drain).admit_arrival()
    drain.resume()
    clock.now += 10.0
    assert drain.status().last_request is None or drain.state is State.SERVING
    drain.begin_drain("second")
    assert drain.status().last_request is None
    clock.now += 2.0
    assert not core(drain).admit_arrival()
    assert core(drain).tally.propagation_seconds == [0.0]  # the resumed drain recorded nothing


async def test_a_request_in_the_drains_first_instant_is_its_last_new_request(
    clock: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    """A request at the drain's start (the clock has not moved since it began) is a new request of the
    phase, 0 s after drain start: in the status, the phase's log line and the drain's result."""
    mw = middleware(propagation_wait=3)
    mw.drain.begin_drain("test")
    assert await get(mw) == 200  # t=0
    assert mw.drain.status().last_request == pytest.approx(clock.time(), abs=1e-6)
    clock.now += 3.0
    with caplog.at_level(logging.INFO, logger="graceful"), anyio.fail_after(5):
        result = await mw.drain.drain()
    assert result.drained and result.last_request == 0.0
    assert any("last new request 0.000s after drain start" in r.getMessage() for r in caplog.records)


async def test_a_wait_that_ends_at_the_deadline_drains_at_that_instant(clock: FakeTime) -> None:
    """The budget rule lets a wait as long as the drain's limit through: with nothing in flight, the drain
    ends at that instant drained, not timed out."""
    drain = Drain(grace_period=60, reserve=10)
    drain.mark_serving()
    drain.begin_drain("test", propagation_wait=5, timeout=5)
    clock.now += 5.0  # t=5: the wait's end and the deadline
    with anyio.fail_after(5):
        result = await drain.drain()
    assert (result.result, result.propagation) == ("drained", 5.0)


# -- the drain runner: event-driven, real time ------------------------------------------------


async def test_drain_ends_one_quiet_period_after_the_last_request() -> None:
    """1. drain with wait 30 s, quiet 0.3 s 2. requests every 0.1 s for 0.6 s 3. they stop
    4. the drain ends no sooner than 0.3 s after the last one, and far before 30 s."""
    mw = middleware(propagation_wait=30, propagation_quiet=0.3)
    results: list[Any] = []
    sent: list[float] = []

    async def run() -> None:
        results.append(await mw.drain.drain(reason="test"))
        sent.append(anyio.current_time())

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await anyio.sleep(0)
        for _ in range(6):
            await anyio.sleep(0.1)
            last = anyio.current_time()  # the request arrives after this instant
            assert await get(mw) == 200
    [result] = results
    assert result.drained
    assert sent[0] - last >= 0.3 - 1e-3  # never before one quiet period after the last request
    assert result.propagation is not None and result.last_request is not None
    assert result.propagation == pytest.approx(result.last_request + 0.3)
    assert result.duration < 3.0  # 30 s is the upper bound; 10 x the expected 0.9 s as a safety bound
    [seconds] = core(mw.drain).tally.propagation_seconds
    assert 0.6 - 0.05 <= seconds <= result.duration - 0.3 + 0.01


async def test_drain_with_no_traffic_ends_after_one_quiet_period() -> None:
    mw = middleware(propagation_wait=30, propagation_quiet=0.2)
    result = await mw.drain.drain(reason="test")
    assert result.drained and 0.2 <= result.duration < 2.0
    assert core(mw.drain).tally.propagation_seconds == [0.0]


async def test_upper_bound_holds_with_steady_traffic() -> None:
    """Requests every 50 ms never leave 0.3 s of quiet: the 0.6 s wait ends the phase."""
    mw = middleware(propagation_wait=0.6, propagation_quiet=0.3)
    statuses: list[int] = []
    async with anyio.create_task_group() as tg:

        async def traffic() -> None:
            while True:
                statuses.append(await get(mw))
                await anyio.sleep(0.05)

        tg.start_soon(traffic)
        result = await mw.drain.drain(reason="test")
        tg.cancel_scope.cancel()
    assert result.drained and 0.6 <= result.duration < 6.0
    # Never 0.3 s of quiet: served all along the wait (a request racing the drain's end may be refused).
    assert statuses[0] == 200 and statuses == sorted(statuses)
    assert await get(mw) == 503  # the wait is over
    [seconds] = core(mw.drain).tally.propagation_seconds
    assert seconds <= 0.6


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "needles"),
    [
        (
            {"propagation_wait": 1, "propagation_quiet": "2s"},
            ["propagation_quiet 2s is longer than propagation_wait 1s", "raise propagation_wait"],
        ),
        ({"propagation_wait": 10, "propagation_quiet": 0}, ["propagation_quiet: 0 must be above 0", "e.g. 2s"]),
        ({"propagation_wait": 10, "propagation_quiet": "soon"}, ["propagation_quiet", "'soon'"]),
    ],
)
def test_quiet_is_validated_against_the_wait(options: dict[str, Any], needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        Drain(**options)
    for needle in needles:
        assert needle in str(info.value)


def test_bad_quiet_on_a_drain_call_leaves_the_state_untouched() -> None:
    drain = Drain(grace_period=60, reserve=10, propagation_wait=10)
    drain.mark_serving()
    with pytest.raises(ConfigError, match="propagation_quiet 20s is longer than propagation_wait 10s"):
        drain.begin_drain("x", propagation_quiet="20s")
    with pytest.raises(ConfigError, match="propagation_wait 1s"):
        drain.begin_drain("x", propagation_wait="1s", propagation_quiet="2s")
    assert drain.state is State.SERVING


def test_quiet_with_no_wait_configured_waits_for_a_drain_request_that_brings_one() -> None:
    """The preStop hook often brings the wait: a server-side quiet alone is not an error."""
    drain = Drain(grace_period=60, reserve=10, propagation_quiet=2)
    assert drain.budget.propagation_quiet == 2.0
    wait, quiet, _ = core(drain).overrides(propagation_wait="30s").as_tuple()
    assert (wait, quiet) == (30.0, 2.0)


def test_env_variable_sets_it_and_names_itself_when_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRACEFUL_PROPAGATION_QUIET", "1500ms")
    assert Drain(propagation_wait=10).budget.propagation_quiet == 1.5
    assert Drain(propagation_wait=10, propagation_quiet=3).budget.propagation_quiet == 3.0  # the option wins
    monkeypatch.setenv("GRACEFUL_PROPAGATION_QUIET", "soon")
    with pytest.raises(ConfigError, match="GRACEFUL_PROPAGATION_QUIET"):
        Drain(propagation_wait=10)
    monkeypatch.setenv("GRACEFUL_PROPAGATION_QUIET", "20s")
    with pytest.raises(ConfigError) as info:
        Drain(propagation_wait=10)
    assert "propagation_quiet (GRACEFUL_PROPAGATION_QUIET) 20s" in str(info.value)
    assert "propagation_wait 10s" in str(info.value)


@pytest.mark.parametrize("off", ["none", "off", " None "])
def test_env_variable_none_turns_it_off(monkeypatch: pytest.MonkeyPatch, off: str) -> None:
    """docs/middleware.md's environment table: a duration, or none."""
    monkeypatch.setenv("GRACEFUL_PROPAGATION_QUIET", off)
    assert Drain(propagation_wait=10).budget.propagation_quiet is None
    assert Drain(propagation_wait=10, propagation_quiet=3).budget.propagation_quiet == 3.0  # the option still wins


# -- what users see: metric, progress, log ------------------------------------------------------


async def test_metric_is_exposed_at_scrape_time(clock: FakeTime, caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    mw = GracefulMiddleware(ok_app, registry=registry, admin=False, propagation_wait=20, propagation_quiet=2)
    mw.drain.mark_serving()
    mw.drain.begin_drain("test")
    clock.now += 1.25
    await get(mw)
    clock.now += 2.0
    with caplog.at_level(logging.INFO, logger="graceful"):
        assert await get(mw) == 503
    page = generate_latest(registry).decode()
    assert "graceful_propagation_seconds_count 1.0" in page
    assert "graceful_propagation_seconds_sum 1.25" in page
    assert 'graceful_propagation_seconds_bucket{le="1.0"} 0.0' in page
    assert 'graceful_propagation_seconds_bucket{le="2.0"} 1.0' in page
    assert "last new request" in page  # the help text says what is measured
    assert any("no new request for 2s" in r.getMessage() for r in caplog.records)


def test_progress_line_shows_the_time_since_the_last_new_request() -> None:
    worker = WorkerDrain("/tmp/x.sock", pid=1, in_flight=2, since_last_request=1.25, progressed=True)
    assert "last new request 1.2 s ago" in _progress_line([worker], 3.0)
    quiet = WorkerDrain("/tmp/y.sock", pid=2, progressed=True)
    assert "no new request since the drain began" in _progress_line([quiet], 3.0)
    over = WorkerDrain("/tmp/z.sock", pid=3, since_last_request=9.0, progressed=True, propagation_over=True)
    line = _progress_line([over], 12.0)
    assert line.endswith(", propagation over") and "last new request" not in line
    assert "last new request 1.2 s ago" in _progress_line([worker, over], 12.0)


# -- through the admin socket and the CLI -----------------------------------------------------


def test_cli_option_reaches_the_server(served: Any) -> None:
    """`graceful drain --propagation-wait 5s --propagation-quiet 0.3s` with no traffic ends
    far before 5 s: the quiet period reached the server; the JSON carries the outcome."""
    from graceful._cli._main import cli

    result = CliRunner().invoke(
        cli,
        ["drain", "--socket-dir", served.socket_dir, "--propagation-wait", "5s", "--propagation-quiet", "0.3s"]
        + ["--json"],
    )
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.stdout)
    [worker] = outcome["workers"]
    assert worker["result"]["result"] == "drained"
    assert 0.3 <= worker["result"]["duration"] < 4.0
    assert worker["result"]["propagation"] == pytest.approx(0.3) and worker["result"]["last_request"] is None
    assert "(propagation phase 0.3 s, ended by the quiet rule, no new request)" in result.stderr
    assert worker["result"]["propagation_ended_by"] == "quiet" and worker["result"]["announced"] is None
    assert core(served.mw.drain).tally.propagation_seconds == [0.0]


def test_cli_refuses_quiet_longer_than_the_wait_before_draining(served: Any) -> None:
    from graceful._cli._main import cli

    result = CliRunner().invoke(
        cli, ["drain", "--socket-dir", served.socket_dir, "--propagation-wait", "1s", "--propagation-quiet", "5s"]
    )
    assert result.exit_code == 2, result.output
    assert "--propagation-quiet 5s is longer than --propagation-wait 1s" in result.stderr
    assert served.mw.drain.state is State.SERVING


def test_server_refuses_quiet_longer_than_its_own_wait(served: Any) -> None:
    """Without --propagation-wait the server's wait (0 here) bounds the quiet period: it answers 400,
    and the command exits 2 as for its own wrong options."""
    from graceful._cli._main import cli

    result = CliRunner().invoke(cli, ["drain", "--socket-dir", served.socket_dir, "--propagation-quiet", "5s"])
    assert result.exit_code == 2, result.output
    assert "propagation_quiet 5s is longer than propagation_wait 0s" in result.stderr
    assert served.mw.drain.state is State.SERVING


def test_cli_refuses_quiet_in_engine_mode() -> None:
    from graceful._cli._main import cli

    result = CliRunner().invoke(cli, ["drain", "--engine", "vllm", "--propagation-quiet", "2s"])
    assert result.exit_code == 2
    assert "--propagation-quiet needs a graceful server" in result.stderr


@pytest.mark.parametrize("how", ["option", "env"])
def test_graceful_run_takes_it_from_the_option_or_the_environment(
    how: str, launch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`graceful run --propagation-wait 30s` plus the quiet period (flag or GRACEFUL_PROPAGATION_QUIET):
    with no traffic, SIGTERM ends the propagation phase after 0.5 s, not 30 s, and the process exits 0."""
    import signal

    options = ["--propagation-wait", "30s"]
    if how == "option":
        options += ["--propagation-quiet", "0.5s"]
    else:
        monkeypatch.setenv("GRACEFUL_PROPAGATION_QUIET", "0.5s")
    server = launch(*options, "--grace-period", "60")
    server.wait_ready()
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(15) == 0  # a 30 s wait would be cut at 15 s here
    assert "propagation phase over" in server.log and "no new request for 0.5s" in server.log


def test_drain_progress_shows_the_last_new_request(served: Any) -> None:
    """1. `graceful drain --propagation-wait 2.5s` 2. once /ready fails, one new request arrives
    3. the progress lines say how long ago the last new request came."""
    import threading
    import time

    import httpx

    from graceful._cli._main import cli

    statuses: list[int] = []

    def one_request() -> None:
        deadline = time.monotonic() + 5
        while served.mw.drain.state is not State.DRAINING and time.monotonic() < deadline:
            time.sleep(0.005)
        statuses.append(httpx.get(f"http://127.0.0.1:{served.port}/hello", timeout=5).status_code)

    thread = threading.Thread(target=one_request)
    thread.start()
    result = CliRunner().invoke(cli, ["drain", "--socket-dir", served.socket_dir, "--propagation-wait", "2.5s"])
    thread.join(10)
    assert result.exit_code == 0, result.output
    assert statuses == [200]  # admitted during the wait (the default)
    assert "s ago" in result.stderr and "last new request" in result.stderr, result.stderr
