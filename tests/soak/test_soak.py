"""``graceful soak``: each end reason produced for real on 127.0.0.1 and classified right."""

from __future__ import annotations

import json
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from click.testing import CliRunner

from graceful._cli._soak import soak_command
from graceful._drain._budget import ConfigError
from graceful._soak._attempt import Outcome
from graceful._soak._report import RequestRecord, SoakReport
from graceful._soak._runner import SoakConfig, endpoint, parse_weights, run_soak
from tests.apps.openai_app import (
    Answer,
    Frames,
    Mode,
    OpenAIApp,
    Status,
    chunk,
    close_without_answer,
    completion,
    headers_then_cut,
    keepalive_then_close,
    raw_http_server,
    read_request,
)
from tests.utils import refusing_port, run_uvicorn

pytestmark = pytest.mark.anyio

SMALL = {"short": 4, "long": 16, "stream": 8}


def config(port: int, **overrides: Any) -> SoakConfig:
    settings: dict[str, Any] = {
        "url": f"http://127.0.0.1:{port}",
        "duration": 5.0,
        "concurrency": 2,
        "lengths": SMALL,
        "timeout": 5.0,
        "max_requests": 6,
        "seed": 1,
        "retry_base": 0.01,
    }
    settings.update(overrides)
    return SoakConfig(**settings)


def only(cls: str) -> dict[str, int]:
    return {cls: 1}


def reasons(report: SoakReport) -> dict[str, int]:
    return {reason: count for reason, count in report.by_reason().items() if count}


async def test_all_classes_complete_and_are_recorded() -> None:
    """1. short, long and stream requests against a healthy server 2. every one ends ok with all its tokens."""
    app = OpenAIApp(served_by="replica-a")
    seen: list[RequestRecord] = []
    async with run_uvicorn(app) as server:
        report = await run_soak(config(server.port, max_requests=30, concurrency=4), on_record=seen.append)
    assert reasons(report) == {"ok": 30}
    assert len(seen) == 30 and {r.cls for r in seen} == {"short", "long", "stream"}
    assert all(r.tokens == r.expected_tokens == SMALL[r.cls] for r in report.records)
    assert all(r.served_by == "replica-a" and r.attempts == 1 and r.bytes > 0 for r in report.records)
    assert sorted(app.request_ids) == sorted(r.request_id for r in report.records)
    assert len({r.idempotency_key for r in report.records}) == 30
    assert report.exit_code == 0 and report.served_by() == {"replica-a": 30}


async def test_503_with_not_started_header_is_rejected_retryable_and_without_it_http_error() -> None:
    """1. a drain's 503 (x-graceful-not-started) 2. a plain 503 3. only the first is explicitly not started."""
    app = OpenAIApp(plan=lambda n, body: "reject" if body["stream"] else "reject_plain")
    async with run_uvicorn(app) as server:
        report = await run_soak(config(server.port, mix={"short": 1, "stream": 1}, max_requests=10))
    for record in report.records:
        assert record.reason == ("rejected_retryable" if record.cls == "stream" else "http_error")
        assert record.status == 503
    assert report.exit_code == (1 if any(r.cls == "short" for r in report.records) else 0)
    assert not app.executions


async def test_server_shutdown_frame_is_ended_by_server_and_never_retried() -> None:
    """1. a stream ends with the server_shutdown error frame 2. counted ended_by_server, not retried under sdk."""
    app = OpenAIApp(plan=lambda n, body: "shutdown_frame")
    async with run_uvicorn(app) as server:
        report = await run_soak(config(server.port, mix=only("stream"), retry="sdk", max_requests=4))
    assert reasons(report) == {"ended_by_server": 4}
    assert all(r.attempts == 1 and 0 < r.tokens < r.expected_tokens for r in report.records)
    assert report.exit_code == 0


@pytest.mark.parametrize("cls", ["short", "stream"])
async def test_body_cut_is_truncated_and_never_retried(cls: str) -> None:
    """1. headers and half the body 2. the connection closes 3. truncated, one attempt even under sdk."""
    app = OpenAIApp(plan=lambda n, body: "cut")
    async with run_uvicorn(app, log_level="critical") as server:
        report = await run_soak(config(server.port, mix=only(cls), retry="sdk", max_requests=3))
    assert reasons(report) == {"truncated": 3}
    assert all(r.attempts == 1 and r.status == 200 for r in report.records)
    assert report.exit_code == 1 and report.losses() == {"truncated": 3}


async def test_stream_error_event_is_http_error_and_unreadable_counts_are_noted() -> None:
    """1. a stream carries an error event that is not server_shutdown 2. http_error
    3. the executions URL answers 404 4. the report notes it and keeps header-only detection."""
    app = OpenAIApp(plan=lambda n, body: "error_event")
    async with run_uvicorn(app) as server:
        missing = f"http://127.0.0.1:{server.port}/nothing"
        report = await run_soak(config(server.port, mix=only("stream"), max_requests=2, executions_urls=(missing,)))
    assert reasons(report) == {"http_error": 2}
    assert all(r.error is not None and "overloaded" in r.error for r in report.records)
    assert report.executions is None and "could not read execution counts" in report.notes[0]
    assert "note: could not read" in report.render()


@pytest.mark.parametrize("mode", ["short_length", "bad_json"])
async def test_incomplete_complete_bodies_are_truncated(mode: Mode) -> None:
    """1. a whole 200 body with half the tokens for finish_reason length, or invalid JSON 2. truncated."""
    app = OpenAIApp(plan=lambda n, body: mode)
    async with run_uvicorn(app) as server:
        report = await run_soak(config(server.port, mix=only("long"), max_requests=2))
    assert reasons(report) == {"truncated": 2}


async def test_refused_is_retried_by_sdk_and_is_not_blind() -> None:
    """1. nothing listens on the port 2. refused 3. sdk retries twice, none of them blind."""
    with refusing_port() as port:
        report = await run_soak(config(port, retry="sdk", max_requests=2))
        strict = await run_soak(config(port, max_requests=1))
    assert reasons(report) == {"refused": 2}
    assert all(r.attempts == 3 and r.blind_retries == 0 and r.served_by is None for r in report.records)
    assert report.exit_code == 0
    assert strict.records[0].attempts == 1


async def test_connection_closed_after_request_is_ambiguous_and_sdk_retries_blindly() -> None:
    """1. the server reads the request and closes without a byte 2. ambiguous 3. sdk retries are blind."""
    async with raw_http_server(close_without_answer) as port:
        strict = await run_soak(config(port, max_requests=2))
        sdk = await run_soak(config(port, retry="sdk", max_requests=2))
    assert reasons(strict) == {"ambiguous": 2} and strict.exit_code == 1
    assert reasons(sdk) == {"ambiguous": 2}
    assert all(r.attempts == 3 and r.blind_retries == 2 for r in sdk.records)
    assert sdk.to_json()["blind_retries"] == 4
    assert len(sdk.possible_duplicates()) == 2


async def test_keepalive_connection_closed_under_the_next_request_is_ambiguous() -> None:
    """1. a request is answered on a keep-alive connection 2. the client reuses it for the next one
    3. the server reads that one and closes 4. ambiguous (the pool did not hide it)."""
    async with raw_http_server(keepalive_then_close) as port:
        report = await run_soak(config(port, concurrency=1, max_requests=2, mix=only("short")))
    assert [r.reason for r in report.records] == ["ok", "ambiguous"]
    assert report.records[1].error is not None and "RemoteProtocolError" in report.records[1].error


async def test_raw_headers_then_close_is_truncated() -> None:
    """1. headers and one SSE event, then the socket closes 2. truncated, with the bytes counted."""
    async with raw_http_server(headers_then_cut) as port:
        report = await run_soak(config(port, mix=only("stream"), retry="sdk", max_requests=2))
    assert reasons(report) == {"truncated": 2}
    assert all(r.attempts == 1 and r.tokens == 1 and r.served_by == "raw" for r in report.records)


async def test_timeouts_before_and_after_headers() -> None:
    """1. no answer at all, then 2. a stalled body 3. both timeout; only the first is retried by sdk."""
    before = OpenAIApp(plan=lambda n, body: "stall")
    after = OpenAIApp(plan=lambda n, body: "stall_body")
    async with run_uvicorn(before) as one, run_uvicorn(after) as two:
        r1 = await run_soak(config(one.port, retry="sdk", timeout=0.2, max_requests=1, mix=only("short")))
        r2 = await run_soak(config(two.port, retry="sdk", timeout=0.2, max_requests=2, mix=only("stream")))
    assert reasons(r1) == {"timeout": 1} and r1.records[0].attempts == 3 and r1.records[0].blind_retries == 2
    assert reasons(r2) == {"timeout": 2} and all(r.attempts == 1 for r in r2.records)


async def test_sdk_retries_not_started_503_into_success() -> None:
    """1. the first attempt of each request meets a drain's 503 2. sdk retries with the same key 3. ok."""
    prompts: set[str] = set()

    def first_rejected(n: int, body: dict[str, Any]) -> Mode:
        prompt = body["messages"][0]["content"]
        if prompt in prompts:
            return "ok"
        prompts.add(prompt)
        return "reject"

    app = OpenAIApp(plan=first_rejected)
    async with run_uvicorn(app) as server:
        report = await run_soak(config(server.port, retry="sdk", max_requests=4))
    assert reasons(report) == {"ok": 4}
    for record in report.records:
        assert [a.reason for a in record.history] == ["rejected_retryable", "ok"]
        assert record.blind_retries == 0
    assert report.exit_code == 0 and max(app.executions.values()) == 1


@pytest.mark.parametrize("idempotent", [False, True])
async def test_duplicates_from_execution_counts_and_replays(idempotent: bool) -> None:
    """1. each request executes, then its answer is lost (502) 2. sdk retries blindly with the same key
    3. without idempotency the server executes it twice: duplicates; with it, the retry is a replay."""
    app = OpenAIApp(plan=lambda n, body: "lost_answer" if n % 2 == 0 else "ok", idempotent=idempotent)
    async with run_uvicorn(app) as server:
        url = f"http://127.0.0.1:{server.port}/debug/executions"
        cfg = config(server.port, retry="sdk", concurrency=1, max_requests=3, mix=only("short"))
        counted = await run_soak(cfg)
        assert counted.executions is None
        app.executions.clear()
        report = await run_soak(
            config(server.port, retry="sdk", concurrency=1, max_requests=3, mix=only("short"), executions_urls=(url,))
        )
    assert reasons(report) == {"ok": 3}
    assert all(r.blind_retries == 1 for r in report.records)
    if idempotent:
        assert report.duplicates() == [] and all(r.replay for r in report.records)
        assert report.exit_code == 0 and counted.exit_code == 0
    else:
        assert sorted(report.duplicates()) == sorted(r.idempotency_key for r in report.records)
        assert report.losses() == {"duplicates": 3} and report.exit_code == 1
        # Without the server's counts the same run can only be flagged as possible duplicates.
        assert len(counted.possible_duplicates()) == 3 and counted.exit_code == 1


async def test_rate_mode_and_stop_event() -> None:
    """1. open-loop arrivals at 200/s 2. the caller's stop event ends the run early."""
    app = OpenAIApp()
    stop = anyio.Event()
    count = 0

    def on_record(record: RequestRecord) -> None:
        nonlocal count
        count += 1
        if count == 5:
            stop.set()

    async with run_uvicorn(app) as server:
        with anyio.fail_after(5):
            report = await run_soak(
                config(server.port, rate=200.0, max_requests=1000, duration=10.0), stop=stop, on_record=on_record
            )
    assert 5 <= len(report.records) < 100
    assert reasons(report) == {"ok": len(report.records)}


def test_config_and_option_parsing() -> None:
    assert parse_weights("short=5,stream=1", name="--mix") == {"short": 5, "stream": 1}
    assert endpoint("http://h:1") == "http://h:1/v1/chat/completions"
    assert endpoint("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert endpoint("http://h:1/v1/completions") == "http://h:1/v1/completions"
    for bad in (
        {"url": "ftp://x"},
        {"mix": {"huge": 1}},
        {"mix": {"short": 0}},
        {"lengths": {"short": 0}},
        {"concurrency": 0},
        {"duration": 0.0},
        {"rate": -1.0},
        {"max_requests": 0},
        {"retry": "always"},
        {"exact_length": "yes"},
        {"executions_urls": ("nope",)},
    ):
        with pytest.raises(ConfigError):
            SoakConfig(**{"url": "http://127.0.0.1:1", **bad})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--duration", "5x"], "'5x' is not a duration"),
        (["--timeout", "0"], "--timeout: '0' is zero"),
        (["--mix", "short=5,tiny=1"], "'tiny=1'"),
        (["--lengths", "long=many"], "'long=many'"),
        (["--retry", "maybe"], "'maybe' is not one of"),
        (["--concurrency", "0"], "--concurrency"),
    ],
)
def test_bad_options_exit_2_with_a_clear_message(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(soak_command, ["http://127.0.0.1:1", *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output


def test_bad_url_and_missing_matplotlib_exit_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    result = CliRunner().invoke(soak_command, ["localhost:8000"])
    assert result.exit_code == 2 and "'localhost:8000' is not an http(s) URL" in result.output
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = CliRunner().invoke(soak_command, ["http://127.0.0.1:1", "--plot", str(tmp_path / "t.png")])
    assert result.exit_code == 2 and "pip install 'graceful-drain[plot]'" in result.output


async def test_cli_writes_records_report_and_plot(tmp_path: Path) -> None:
    """1. the command runs against a real server 2. table, JSONL, JSON report and PNG agree."""
    app = OpenAIApp(plan=lambda n, body: "shutdown_frame" if n == 0 else "ok")
    files = {name: tmp_path / name for name in ("out.jsonl", "report.json", "timeline.png")}
    args = ["--duration", "2s", "--max-requests", "12", "--concurrency", "3", "--lengths", "short=4,long=16,stream=8"]
    args += [
        "--records",
        str(files["out.jsonl"]),
        "--report",
        str(files["report.json"]),
        "--plot",
        str(files["timeline.png"]),
    ]
    async with run_uvicorn(app) as server:
        result = await anyio.to_thread.run_sync(
            CliRunner().invoke, soak_command, [f"http://127.0.0.1:{server.port}", *args]
        )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in files["out.jsonl"].read_text().splitlines()]
    report = json.loads(files["report.json"].read_text())
    assert len(lines) == report["requests"] == 12
    assert report["by_reason"]["ok"] == sum(1 for line in lines if line["reason"] == "ok")
    assert all(line["attempts"] == 1 and line["attempt_reasons"] == [line["reason"]] for line in lines)
    assert "total" in result.output and "verdict: no unexplained loss in 12 requests" in result.output
    assert files["timeline.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_cli_exits_1_on_loss() -> None:
    app = OpenAIApp(plan=lambda n, body: "reject_plain")
    async with run_uvicorn(app) as server:
        args = [f"http://127.0.0.1:{server.port}", "--max-requests", "3", "--duration", "2s"]
        result = await anyio.to_thread.run_sync(CliRunner().invoke, soak_command, args)
    assert result.exit_code == 1, result.output
    assert "verdict: LOSS (http_error=3)" in result.output


async def test_subprocess_sigint_stops_new_requests_and_still_reports() -> None:
    """1. `soak` runs in a real process for up to 30 s 2. requests reach the server 3. SIGINT
    4. in-flight requests finish, the table is printed and the exit code judges what was sent."""
    app = OpenAIApp(token_delay=0.005)
    code = "from graceful._cli._soak import soak_command; soak_command()"
    async with run_uvicorn(app) as server:
        args = [f"http://127.0.0.1:{server.port}", "--duration", "30s", "--concurrency", "2", "--lengths", "stream=20"]
        process = await anyio.open_process([sys.executable, "-c", code, *args])
        try:
            with anyio.fail_after(10):
                while app.seen < 5:
                    await anyio.sleep(0.01)
                process.send_signal(signal.SIGINT)
                assert process.stdout is not None
                stdout = b"".join([chunk async for chunk in process.stdout]).decode()
                await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
            await process.aclose()
    assert process.returncode == 0, stdout
    assert "verdict: no unexplained loss" in stdout
    sent = int(stdout.split("verdict: no unexplained loss in ")[1].split()[0])
    assert sent == app.seen


# ``graceful soak``: the SDK retry rules, SSE parsing details, cut connections, CLI errors and signals.


def config_one(port: int, **overrides: Any) -> SoakConfig:
    settings: dict[str, Any] = {
        "url": f"http://127.0.0.1:{port}",
        "duration": 5.0,
        "concurrency": 1,
        "lengths": SMALL,
        "timeout": 5.0,
        "max_requests": 2,
        "seed": 1,
        "retry_base": 0.01,
    }
    settings.update(overrides)
    return SoakConfig(**settings)


def first_attempt(answer: Answer) -> Callable[[int, dict[str, Any]], Answer]:
    """A plan that gives each request's first attempt ``answer`` and its retries a complete one."""
    prompts: set[str] = set()

    def plan(n: int, body: dict[str, Any]) -> Answer:
        prompt = body["messages"][0]["content"]
        if prompt in prompts:
            return "ok"
        prompts.add(prompt)
        return answer

    return plan


def event(data: Any) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def content(n: int, tokens: int = SMALL["stream"]) -> list[bytes]:
    return [event(chunk(i, tokens)) for i in range(n)]


DONE = b"data: [DONE]\n\n"
SHUTDOWN = event({"error": {"type": "server_shutdown", "message": "the server is shutting down"}})


async def soak(answer: Answer, *, cls: str = "stream", **overrides: Any) -> tuple[SoakReport, OpenAIApp]:
    app = OpenAIApp(plan=first_attempt(answer))
    # Cut answers make uvicorn log "returned without completing response": expected here.
    async with run_uvicorn(app, log_level="critical") as server:
        with anyio.fail_after(10):
            report = await run_soak(config_one(server.port, mix={cls: 1}, **overrides))
    return report, app


@pytest.mark.parametrize(("code", "retried"), [(408, True), (409, True), (429, True), (400, False), (404, False)])
async def test_sdk_retries_408_409_429_and_not_other_4xx(code: int, retried: bool) -> None:
    """1. each request's first attempt gets a 4xx 2. sdk retries 408, 409 and 429 (never blind) into ok
    3. any other 4xx ends the request as http_error after one attempt."""
    report, app = await soak(Status(code), cls="short", retry="sdk")
    for record in report.records:
        if retried:
            assert [a.reason for a in record.history] == ["http_error", "ok"]
            assert [a.status for a in record.history] == [code, 200]
            assert record.blind_retries == 0 and record.reason == "ok"
        else:
            assert [a.reason for a in record.history] == ["http_error"] and record.status == code
            assert record.error is not None and f"HTTP {code}" in record.error
    assert report.exit_code == (0 if retried else 1)
    assert len(app.request_ids) == (4 if retried else 2)


@pytest.mark.parametrize(
    ("code", "hint", "retried"),
    [(503, "false", False), (500, "FALSE", False), (400, "true", True), (422, "True", True), (429, "maybe", True)],
)
async def test_x_should_retry_header_overrides_the_status_rule(code: int, hint: str, retried: bool) -> None:
    """1. a first attempt answers `code` with `x-should-retry: hint` 2. true/false (any case) decides,
    whatever the status; any other value leaves the status rule in charge."""
    report, _ = await soak(Status(code, {"x-should-retry": hint}), cls="short", retry="sdk")
    expected = ["http_error", "ok"] if retried else ["http_error"]
    assert all([a.reason for a in r.history] == expected for r in report.records)


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (Frames([*content(1), event({"error": {"type": "overloaded"}})]), "error event"),
        (Frames([completion(8, "length")], media_type="application/json"), "got content-type 'application/json'"),
    ],
    ids=["error-event", "json-for-stream"],
)
async def test_a_2xx_body_is_never_retried_even_when_the_server_says_retry(answer: Frames, error: str) -> None:
    """1. a stream request gets a 200 with `x-should-retry: true`, whose body is an error event or
    plain JSON 2. http_error after exactly one attempt: the request ran, a retry could run it twice."""
    hinted = Frames(answer.parts, answer.media_type, headers={"x-should-retry": "true"})
    report, app = await soak(hinted, retry="sdk")
    assert [r.reason for r in report.records] == ["http_error", "http_error"]
    assert all(r.attempts == 1 and r.status == 200 and error in (r.error or "") for r in report.records)
    assert sum(app.executions.values()) == 2 and report.exit_code == 1


@pytest.mark.parametrize(
    ("retry_after", "honoured"),
    [("0.4", True), ("0", False), ("120", False), ("Wed, 21 Oct 2015 07:28:00 GMT", False)],
)
async def test_retry_after_between_0_and_60_seconds_sets_the_wait(retry_after: str, honoured: bool) -> None:
    """1. the first attempt gets 429 with Retry-After 2. a number in (0, 60] is the wait before the retry
    3. zero, more than 60 s or an HTTP date fall back to the (here 10 ms) backoff."""
    report, _ = await soak(Status(429, {"retry-after": retry_after}), cls="short", retry="sdk", max_requests=1)
    [record] = report.records
    assert [a.reason for a in record.history] == ["http_error", "ok"]
    wait = record.history[1].start - record.history[0].end
    if honoured:
        assert float(retry_after) - 0.05 <= wait < float(retry_after) + 1.0
    else:
        assert wait < 1.0  # the 10 ms backoff with a wide safety bound, not 120 s nor a date


async def test_refused_then_the_server_comes_up_and_the_retry_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    """1. nothing listens on the port (held bound, not listening): the first attempt is refused
    2. the server starts listening on it as the backoff begins 3. the retry reaches it: ok, one
    execution, no blind retry."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    port = held.getsockname()[1]
    listening = anyio.Event()
    delay = Outcome.delay

    def listen_then_delay(self: Outcome, n: int, **backoff: Any) -> float:
        held.listen()  # the attempt before has been refused; the retry after the backoff is queued here
        listening.set()
        return delay(self, n, **backoff)

    monkeypatch.setattr(Outcome, "delay", listen_then_delay)
    answered: list[bytes] = []

    async def answer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            request = await read_request(stream)
            answered.append(request)
            body = completion(SMALL["short"], "length")
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-served-by: late\r\n"
            await stream.send(head + b"content-length: %d\r\n\r\n" % len(body) + body)

    async def start_late() -> None:
        await listening.wait()
        async with await anyio.abc.SocketListener.from_socket(held) as listener:
            await listener.serve(answer)

    with held:
        async with anyio.create_task_group() as tg:
            tg.start_soon(start_late)
            report = await run_soak(config_one(port, mix={"short": 1}, retry="sdk", retry_base=0.01, max_requests=1))
            tg.cancel_scope.cancel()
    [record] = report.records
    assert [a.reason for a in record.history] == ["refused", "ok"], record.history
    assert record.history[0].error is not None and "ConnectError" in record.history[0].error
    assert record.served_by == "late" and record.blind_retries == 0 and len(answered) == 1
    assert b"x-soak-attempt: 1" in answered[0].lower() and report.exit_code == 0


@pytest.mark.parametrize(
    ("parts", "reason", "tokens", "error"),
    [
        # Role chunk, comments, other fields, CRLF, stray blank lines, an empty-delta finish chunk.
        (
            [
                event({"choices": [{"delta": {"role": "assistant"}}]}),
                b": keep-alive\n\n\n",
                b"event: message\r\nid: 7\r\n" + event(chunk(0, 8)).replace(b"\n", b"\r\n"),
                *content(8)[1:7],
                event({"choices": [{"delta": {"content": "t "}}]}),
                event({"choices": [{"delta": {}, "finish_reason": "length"}]}),
                DONE,
            ],
            "ok",
            8,
            None,
        ),
        # One event split over two data lines, joined with a newline as SSE says.
        ([b'data: {"choices":\ndata: [{"delta": {"content": "t "}}]}\n\n', DONE], "ok", 1, None),
        # include_usage: the usage frame's count wins over the number of chunks.
        ([*content(4), event({"choices": [], "usage": {"completion_tokens": 8}}), DONE], "ok", 8, None),
        ([*content(8), event({"choices": [], "usage": {"completion_tokens": 5}}), DONE], "truncated", 5, "5 of 8"),
        ([*content(8)], "truncated", 8, "stream ended without [DONE]"),
        ([*content(2), b"data: {not json\n\n", *content(8)[2:], DONE], "truncated", 8, "malformed event"),
    ],
    ids=["fields-and-comments", "multiline-data", "usage-counts", "usage-short", "no-done", "malformed"],
)
async def test_stream_parsing(parts: list[bytes], reason: str, tokens: int, error: str | None) -> None:
    """1. a complete 200 text/event-stream body, byte for byte 2. the reason and token count
    follow the SSE rules: only data lines make events, [DONE] is required, usage counts win."""
    report, _ = await soak(Frames(parts), max_requests=1)
    [record] = report.records
    assert (record.reason, record.tokens) == (reason, tokens), record.error
    assert (record.error is None) if error is None else (error in (record.error or ""))


def engine_text(n: int, finish: str | None = "length") -> list[bytes]:
    """A stream as vLLM sends it: words of its own (not the example server's count), the last
    chunk with the finish reason, some tokens in no chunk of their own."""
    words = [event({"choices": [{"delta": {"content": f" w{i}"}, "finish_reason": None}]}) for i in range(n - 1)]
    return [*words, event({"choices": [{"delta": {"content": " end"}, "finish_reason": finish}]})]


def usage(tokens: int) -> bytes:
    return event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": tokens}})


@pytest.mark.parametrize(
    ("answer", "cls", "reason", "error"),
    [
        # 8 tokens in 6 chunks: the usage counts them.
        (Frames([*engine_text(6), usage(8), DONE]), "stream", "ok", None),
        (Frames([*engine_text(5, "stop"), usage(5), DONE]), "stream", "truncated", "'stop' after 5 of 8"),
        # vLLM's engine aborted it (plain vLLM, no middleware): a quiet [DONE] after the abort.
        (Frames([*engine_text(3, "abort"), usage(3), DONE]), "stream", "truncated", "'abort' after 3 of 8"),
        (Frames([*engine_text(6), usage(9), DONE]), "stream", "truncated", "'length' after 9 of 8"),
        (Frames([*engine_text(8), DONE]), "stream", "ok", None),  # no usage sent: the finish reason alone
        (Frames([*engine_text(7, None), usage(7), DONE]), "stream", "truncated", "None after 7 of 8"),
        (Frames([completion(4, "length")], "application/json"), "short", "ok", None),
        (Frames([completion(2, "stop")], "application/json"), "short", "truncated", "'stop' after 2 of 4"),
    ],
    ids=["whole", "stopped", "aborted", "too-many", "no-usage", "no-finish", "json-whole", "json-stopped"],
)
async def test_exact_length_asks_for_every_token_and_judges_the_count(
    answer: Frames, cls: str, reason: str, error: str | None
) -> None:
    """1. exact_length: each request asks for temperature 0, ignore_eos and (streams) the usage chunk
    2. an answer of a model whose text is unknown is whole only if it stopped for length with
    max_tokens completion tokens; otherwise truncated, the finish reason and count in its error."""
    bodies: list[dict[str, Any]] = []

    def plan(n: int, body: dict[str, Any]) -> Answer:
        bodies.append(body)
        return answer

    app = OpenAIApp(plan=plan)
    async with run_uvicorn(app, log_level="critical") as server:
        with anyio.fail_after(10):
            report = await run_soak(config_one(server.port, mix={cls: 1}, max_requests=1, exact_length=True))
    [record] = report.records
    assert record.reason == reason, record.error
    assert (record.error is None) if error is None else (error in (record.error or "")), record.error
    [body] = bodies
    assert (body["temperature"], body["ignore_eos"], body["max_tokens"]) == (0, True, SMALL[cls])
    assert body.get("stream_options") == ({"include_usage": True} if cls == "stream" else None)


async def test_without_exact_length_the_body_and_verdicts_are_unchanged() -> None:
    """A stream that stopped early (finish "stop") is whole without exact_length, and the request
    carries no sampling fields."""
    bodies: list[dict[str, Any]] = []

    def plan(n: int, body: dict[str, Any]) -> Answer:
        bodies.append(body)
        return Frames([*engine_text(5, "stop"), usage(5), DONE])

    async with run_uvicorn(OpenAIApp(plan=plan), log_level="critical") as server:
        report = await run_soak(config_one(server.port, mix={"stream": 1}, max_requests=1))
    assert [r.reason for r in report.records] == ["ok"]
    assert set(bodies[0]) == {"model", "messages", "max_tokens", "stream"}


class RunCrashed(Exception):
    """run_soak raised instead of returning a report."""


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (Frames([*content(2), b"data: 12\n\n", *content(8)[2:], DONE]), "malformed event"),
        (Frames([*content(2), event({"choices": ["t "]}), *content(8)[2:], DONE]), "malformed event"),
        (Frames([b'{"choices": ["t t t t"]}'], "application/json"), "invalid completion body"),
        (Frames([b'{"choices": [{}], "usage": 4}'], "application/json"), "invalid completion body"),
    ],
    ids=["number-event", "string-choice", "string-choice-body", "number-usage-body"],
)
async def test_valid_json_of_the_wrong_shape_is_truncated_not_a_crash(answer: Frames, error: str) -> None:
    """1. a 200 whose JSON body or SSE event parses but is not an OpenAI chunk (a number, choices
    of strings, a number for usage) 2. the request is judged truncated, like invalid JSON, and the run goes on."""
    cls = "stream" if answer.media_type == "text/event-stream" else "short"
    try:
        report, _ = await soak(answer, cls=cls, max_requests=2)
    except Exception as exc:
        raise RunCrashed from exc
    assert [r.reason for r in report.records] == ["truncated", "truncated"]
    assert all(error in (r.error or "") for r in report.records)


@pytest.mark.parametrize(
    ("answer", "reasons"),
    [
        (Frames([*content(8), DONE], complete=False), ["ok"]),
        (Frames([*content(3), SHUTDOWN], complete=False), ["ended_by_server"]),
        (Frames([*content(3)], complete=False), ["truncated"]),
        (
            Frames([b'{"error": {"type": "server_dr'], "application/json", 503, {"x-graceful-not-started": "1"}, False),
            ["rejected_retryable", "ok"],
        ),
    ],
    ids=["done-then-cut", "shutdown-frame-then-cut", "cut", "not-started-503-cut"],
)
async def test_connection_cut_after_the_answer_is_judged_by_what_arrived(answer: Frames, reasons: list[str]) -> None:
    """1. the server sends part of a response, then closes the connection mid-body 2. after [DONE]
    the answer is complete (ok); after the shutdown frame it is ended_by_server; a not-started 503
    stays safe to retry even cut; otherwise truncated. None of the first three is retried."""
    report, _ = await soak(answer, retry="sdk", max_requests=1)
    [record] = report.records
    assert [a.reason for a in record.history] == reasons
    assert record.history[0].error is not None and "RemoteProtocolError" in record.history[0].error
    assert record.blind_retries == 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rate", "0"], "'--rate': 0.0 is not in the range x>0"),
        (["--max-requests", "0"], "'--max-requests': 0 is not in the range x>=1"),
        (["--duration", "0s"], "--duration: '0s' is zero"),
        (["--mix", "short=0,long=0,stream=0"], "needs weights of 0 or more with a positive total"),
        (["--mix", "short"], "'short' in 'short' is not CLASS=NUMBER"),
        (["--executions-url", "localhost:9/x"], "executions url: 'localhost:9/x' is not an http(s) URL"),
        (
            ["--records", "/nonexistent-graceful-dir/o.jsonl"],
            "No such file or directory: '/nonexistent-graceful-dir/o.jsonl'",
        ),
    ],
)
def test_more_bad_options_exit_2_before_any_request(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(soak_command, ["http://127.0.0.1:1", *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output
    assert "verdict" not in result.output


async def test_cli_report_that_cannot_be_written_exits_1_after_printing_the_table(tmp_path: Path) -> None:
    """1. --report points into a missing directory 2. the run still happens and its table is printed
    3. one line names the file, exit 1 (the run looked lossless, but its report is missing)."""
    missing = tmp_path / "missing" / "report.json"
    with refusing_port() as port:
        args = [f"http://127.0.0.1:{port}", "--max-requests", "2", "--duration", "2s", "--report", str(missing)]
        result = await anyio.to_thread.run_sync(CliRunner().invoke, soak_command, args)
    assert result.exit_code == 1, result.output
    assert "verdict: no unexplained loss in 2 requests" in result.output
    assert f"graceful soak: could not write output: [Errno 2] No such file or directory: '{missing}'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGINT])
async def test_subprocess_second_ctrl_c_aborts_a_run_waiting_for_stalled_requests(first: signal.Signals) -> None:
    """1. `soak` runs in a real process; both its requests stall on the server 2. SIGTERM or SIGINT:
    it says so, starts nothing new and waits for them 3. a second Ctrl-C, sent as soon as the
    message shows, cancels the run at once: exit 1, no verdict, no traceback."""
    app = OpenAIApp(plan=lambda n, body: "stall")
    code = "from graceful._cli._soak import soak_command; soak_command()"
    async with run_uvicorn(app) as server:
        args = [f"http://127.0.0.1:{server.port}", "--concurrency", "2", "--mix", "short=1", "--timeout", "60s"]
        process = await anyio.open_process([sys.executable, "-c", code, *args])
        assert process.stdout is not None and process.stderr is not None
        try:
            with anyio.fail_after(10):
                while app.seen < 2:
                    await anyio.sleep(0.01)
                process.send_signal(first)
                said = b""
                while b"waiting for those in flight" not in said:
                    said += await process.stderr.receive()
                assert process.returncode is None and app.seen == 2
                started = time.monotonic()
                process.send_signal(signal.SIGINT)
                stdout = b"".join([chunk async for chunk in process.stdout]).decode()
                said += b"".join([chunk async for chunk in process.stderr])
                await process.wait()
            aborted_after = time.monotonic() - started
        finally:
            if process.returncode is None:
                process.kill()
            await process.aclose()
    assert f"graceful soak: {first.name}: no new requests" in said.decode()
    assert process.returncode == 1 and "verdict" not in stdout and "Traceback" not in said.decode()
    assert aborted_after < 5 and app.seen == 2


@pytest.mark.parametrize(
    ("words", "reason"), [(["tok0", " tok1", " tok2"], "ok"), (["tok0", " tok2", " tok3"], "token_mismatch")]
)
async def test_check_count_judges_a_stream_spliced_out_of_sight_and_headers_go_with_every_request(
    words: list[str], reason: str
) -> None:
    """A gateway between client and server (no resuming transport in the client):
    1. every request carries the configured headers; streams ask for their usage chunk
    2. the gateway's copy of the replica's name (``llm_provider-x-served-by``) is the record's served_by
    3. check_count: a count with a token missing ends token_mismatch, the exact count ok
    4. the report keeps the headers' names, never their values"""
    seen: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def gateway(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.append(({k.decode(): v.decode() for k, v in scope["headers"]}, json.loads(body)))
        headers = [(b"content-type", b"text/event-stream"), (b"llm_provider-x-served-by", b"replica-z")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        frames = [{"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]} for word in words]
        frames.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        frames.append({"choices": [], "usage": {"completion_tokens": 3}})
        for frame in frames:
            await send({"type": "http.response.body", "body": event(frame), "more_body": True})
        await send({"type": "http.response.body", "body": DONE})

    key = {"authorization": "Bearer sk-secret"}
    async with run_uvicorn(gateway, lifespan="off") as server:
        report = await run_soak(
            config(
                server.port, mix=only("stream"), lengths={"stream": 3}, max_requests=2, check_count=True, headers=key
            )
        )
    assert reasons(report) == {reason: 2}
    assert all(r.served_by == "replica-z" for r in report.records)
    assert all(
        h["authorization"] == "Bearer sk-secret" and b["stream_options"] == {"include_usage": True} for h, b in seen
    )
    assert report.settings["headers"] == ["authorization"] and "sk-secret" not in json.dumps(report.to_json())
    with pytest.raises(ConfigError, match="headers: .* must map header names to strings"):
        SoakConfig(url="http://127.0.0.1:1", headers={"x-n": 1})  # type: ignore[dict-item]
