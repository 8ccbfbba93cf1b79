"""``graceful soak``: the SDK retry rules, SSE parsing details, cut connections, CLI errors and signals."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from click.testing import CliRunner

from graceful._cli_soak import soak_command
from graceful._soak import SoakConfig, run_soak
from graceful._soak_report import SoakReport
from tests.apps_openai import Answer, Frames, OpenAIApp, Status, chunk, completion, read_request
from tests.utils import free_port, run_uvicorn

pytestmark = pytest.mark.anyio

SMALL = {"short": 4, "long": 16, "stream": 8}


def config(port: int, **overrides: Any) -> SoakConfig:
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
            report = await run_soak(config(server.port, mix={cls: 1}, **overrides))
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
        assert wait < 0.3


async def test_refused_then_the_server_comes_up_and_the_retry_succeeds() -> None:
    """1. nothing listens on the port: the first attempt is refused 2. a server starts during the
    backoff (0.75 to 1 s) 3. the retry reaches it: ok, one execution, no blind retry."""
    port = free_port()
    answered: list[bytes] = []

    async def answer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            request = await read_request(stream)
            answered.append(request)
            body = completion(SMALL["short"], "length")
            head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-served-by: late\r\n"
            await stream.send(head + b"content-length: %d\r\n\r\n" % len(body) + body)

    async def start_late() -> None:
        # The first attempt is a local connect, done within milliseconds; the backoff is at least 0.75 s.
        await anyio.sleep(0.25)
        async with await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port) as listener:
            await listener.serve(answer)

    async with anyio.create_task_group() as tg:
        tg.start_soon(start_late)
        report = await run_soak(config(port, mix={"short": 1}, retry="sdk", retry_base=1.0, max_requests=1))
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
    args = [f"http://127.0.0.1:{free_port()}", "--max-requests", "2", "--duration", "2s", "--report", str(missing)]
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
    code = "from graceful._cli_soak import soak_command; soak_command()"
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
