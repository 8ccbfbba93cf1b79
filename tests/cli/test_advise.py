"""``graceful advise`` and the drain's outlook, against the example server under ``graceful run``
(two workers), fed a known mix of durations; the Prometheus family; bad input."""

from __future__ import annotations

import bisect
import http.server
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from graceful import GracefulMiddleware
from graceful._asgi._types import Message, Receive, Scope, Send
from graceful._drain._observed import BOUNDS
from graceful._drain._state import core
from tests.servers import Launched
from tests.utils import ROOT

ENGINE_FIXTURES = Path(__file__).resolve().parent.parent / "engine" / "fixtures" / "engines"
RATE = 50  # tokens per second of the example server
EXAMPLE = {"GRACEFUL_EXAMPLE_TOKENS_PER_SECOND": str(RATE), "GRACEFUL_EXAMPLE_LOAD_DELAY": "0"}


def graceful(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graceful", *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout
    )


# One client for every request: a client per request builds an SSL context each time, which holds
# the GIL for tens of milliseconds and stalls the other threads. No connection is kept: a kept one
# would outlive the server it went to.
CLIENT = httpx.Client(timeout=30, limits=httpx.Limits(max_keepalive_connections=0))


def send(server: Launched, tokens: int, stream: bool) -> None:
    """One completion of ``tokens`` tokens: the example server takes ``tokens / RATE`` seconds."""
    body = {"model": "m", "prompt": "hi", "max_tokens": tokens, "stream": stream}
    answer = CLIENT.post(server.url("/v1/completions"), json=body)
    assert answer.status_code == 200, answer.text


def bucket(seconds: float) -> int:
    return bisect.bisect_left(BOUNDS, seconds)


def within_one_bucket(reported: float, tokens: int) -> bool:
    """The server's figure is a bucket's upper bound. The truth is the example server's time for
    ``tokens`` tokens; the request's own overhead and the sweep's rounding up (less than 0.1 s)
    may lift it into the next bucket, never lower."""
    return bucket(tokens / RATE) <= bucket(reported) <= bucket(tokens / RATE) + 1


@pytest.fixture
def example(launch: Callable[..., Launched]) -> Iterator[Launched]:
    server = launch("--workers", "2", app="examples.server:app", **EXAMPLE)
    server.wait_ready(sockets=2)
    yield server


def test_a_known_mix_is_reported_within_a_bucket_and_the_share_at_risk_exactly(example: Launched) -> None:
    """10 plain requests of 10 tokens (0.2 s), 4 streams of 40 (0.8 s) and 2 of 200 (4 s), over both workers.
    Judged with grace 8 s, reserve 1 s, wait 1 s (admitting: requests of up to 3 s covered), the two
    long streams, 2 of 16, are at risk; refusing during the wait (7 s covered), none."""
    mix = [(10, False)] * 10 + [(40, True)] * 4 + [(200, True)] * 2
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda job: send(example, *job), mix))
    budget = ("--grace-period", "8s", "--reserve", "1s", "--propagation-wait", "1s")
    done = graceful("advise", "--socket-dir", example.socket_dir, "--json", *budget)
    assert done.returncode == 1, (done.stdout, done.stderr)  # something is at risk, and --max-cut is 0
    advice = json.loads(done.stdout)
    assert advice["requests"] == 16 and advice["source"] == "2 workers"
    figures = advice["percentiles"]
    assert within_one_bucket(figures["plain"]["max"], 10)
    assert within_one_bucket(figures["stream"]["p50"], 40)
    assert within_one_bucket(figures["stream"]["max"], 200)
    assert within_one_bucket(figures["all"]["p50"], 10)
    assert within_one_bucket(figures["all"]["p95"], 200)
    assert advice["in_force"]["covers"] == 3.0
    assert advice["at_risk"] == {"plain": 0, "stream": 2, "all": 2, "share": 0.125}
    assert advice["verdict"] == "cuts"
    # The recommended grace period covers them all: judged by it, the same traffic is not at risk.
    grace = advice["recommended"]["grace_period"]
    assert grace is not None and grace > 8
    again = graceful("advise", "--socket-dir", example.socket_dir, "--json", "--grace-period", f"{grace:g}s",
                     "--reserve", "1s", "--propagation-wait", "1s")  # fmt: skip
    assert again.returncode == 0 and json.loads(again.stdout)["at_risk"]["all"] == 0, again.stdout
    refusing = graceful("advise", "--socket-dir", example.socket_dir, *budget, "--no-admit-during-propagation")
    assert refusing.returncode == 0, refusing.stdout
    assert "verdict: the budget in force holds" in refusing.stdout
    allowed = graceful("advise", "--socket-dir", example.socket_dir, *budget, "--max-cut", "20%")
    assert allowed.returncode == 0 and "2 of 16 requests (12.50%; 2 stream)" in allowed.stdout, allowed.stdout
    # Saved by graceful status --json (as from pods about to go), read back later: the same advice.
    status = graceful("status", "--socket-dir", example.socket_dir, "--json")
    saved = Path(example.socket_dir) / "statuses.json"
    saved.write_text(status.stdout)
    offline = graceful("advise", "--from", str(saved), "--json", *budget)
    assert offline.returncode == 1 and json.loads(offline.stdout)["at_risk"] == advice["at_risk"], offline.stdout


def test_the_drain_says_at_its_start_what_may_outlast_it(launch: Callable[..., Launched]) -> None:
    """Streams of 5 s seen; a stream of 10 s in flight for 1 s when a drain with 3 s left begins:
    the hook's first line says it may outlast the deadline."""
    example = launch(app="examples.server:app", **EXAMPLE)
    example.wait_ready()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: send(example, 250, True), range(4)))
    long = threading.Thread(target=lambda: send_quietly(example, 500))
    long.start()
    time.sleep(1.0)  # the stream has run a while: its age is part of the judgement
    hook = graceful("drain", "--socket-dir", example.socket_dir, "--timeout", "3s", timeout=30)
    long.join(30)
    lines = hook.stderr.splitlines()
    outlook = [line for line in lines if "at the drain's start" in line]
    assert len(outlook) == 1, hook.stderr
    assert (
        "1 in flight at the drain's start, 3 s to the deadline; by the 4 requests seen, 1 may outlast it"
        in (outlook[0])
    ), hook.stderr
    assert lines[0] == outlook[0], hook.stderr  # the first line, before any progress


def send_quietly(server: Launched, tokens: int) -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": tokens, "stream": True}
    try:
        CLIENT.post(server.url("/v1/completions"), json=body)
    except httpx.HTTPError:
        pass  # the drain's deadline ends it; the test reads the hook's lines only


@pytest.mark.anyio
async def test_the_durations_are_a_prometheus_histogram_by_kind() -> None:
    """Three streams held open across a sweep of the ledger count as streams; their buckets are graceful's."""
    release = anyio.Event()

    async def stream_app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await release.wait()
        await send({"type": "http.response.body", "body": b"b"})

    registry = CollectorRegistry()
    streaming = GracefulMiddleware(stream_app, registry=registry, admin=False)
    drain = streaming.drain
    drain.mark_serving()
    scope: Scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}

    async def sink(message: Message) -> None:
        pass

    async def nothing() -> Message:
        await anyio.sleep_forever()
        return {}

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(streaming, dict(scope), nothing, sink)
        with anyio.fail_after(5):
            while drain.in_flight < 3:
                await anyio.sleep(0.01)
        core(drain).ledger.count_durations()  # the lifespan's sweep, which nothing runs here: it sees them in flight
        release.set()
    core(drain).ledger.count_durations()
    family = next(
        f for f in text_string_to_metric_families(generate_latest(registry).decode())
        if f.name == "graceful_request_duration_seconds"
    )  # fmt: skip
    counts = {(s.labels["kind"], s.name): s.value for s in family.samples if not s.name.endswith("_bucket")}
    assert counts[("stream", "graceful_request_duration_seconds_count")] == 3
    assert counts[("plain", "graceful_request_duration_seconds_count")] == 0
    buckets = [s for s in family.samples if s.name.endswith("_bucket") and s.labels["kind"] == "stream"]
    assert [float(s.labels["le"]) for s in buckets] == [*BOUNDS, float("inf")]
    assert buckets[0].value == 3  # each ran well under 0.1 s


class _Page(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_bad_input_gets_one_line_naming_the_fix(socket_dir: str) -> None:
    nobody = graceful("advise", "--socket-dir", socket_dir)
    assert nobody.returncode == 3 and nobody.stderr.count("\n") == 1, nobody.stderr
    assert "no graceful server found" in nobody.stderr
    duration = graceful("advise", "--socket-dir", socket_dir, "--grace-period", "thirty")
    assert duration.returncode == 2 and duration.stderr.count("\n") == 1, duration.stderr
    assert "--grace-period: 'thirty' is not a duration; use a number of seconds" in duration.stderr
    share = graceful("advise", "--socket-dir", socket_dir, "--max-cut", "150%")
    assert share.returncode == 2 and "give a percentage such as 1%" in share.stderr
    # vLLM with --disable-log-stats: its page has no e2e histogram (the fixture names its vLLM source).
    _Page.body = (ENGINE_FIXTURES / "vllm_disable_log_stats.txt").read_bytes()
    page = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{page.server_address[1]}/metrics"
        missing = graceful("advise", "--engine", "vllm", "--metrics-url", url)
    finally:
        page.shutdown()
        page.server_close()
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert "no histogram vllm:e2e_request_latency_seconds; start the engine with its metrics on" in missing.stderr
    unsaved = graceful("advise", "--from", "/nonexistent/statuses.json")
    assert unsaved.returncode == 2 and unsaved.stderr.count("\n") == 1, unsaved.stderr
    assert "give a file written by graceful status --json" in unsaved.stderr
    triton = graceful("advise", "--engine", "triton")
    assert triton.returncode == 2 and "name one with --histogram" in triton.stderr
