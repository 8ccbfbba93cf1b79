"""The same drain behaviour on every ASGI server users run (end to end, 127.0.0.1).

For each server: readiness flips at drain, new work gets 503, streams in flight
arrive whole, and one preStop `graceful drain` reaches every worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from tests.servers import SERVERS, Launched
from tests.utils import ROOT


def stream_in_thread(base: str, frames: list[str], first: threading.Event, *, http2: bool = False) -> threading.Thread:
    def run() -> None:
        with httpx.Client(base_url=base, timeout=20, http1=not http2, http2=http2) as client:
            with client.stream("POST", "/stream") as response:
                assert response.status_code == 200
                if http2:
                    assert response.http_version == "HTTP/2"
                    assert "connection" not in response.headers
                for line in response.iter_lines():
                    if line:
                        frames.append(line)
                        first.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# What each server's process returns after a drained SIGTERM: plain uvicorn re-raises the signal
# once it has shut down (uvicorn/server.py, capture_signals); the others exit 0.
SIGTERM_EXIT = {
    "uvicorn-h11": -signal.SIGTERM,
    "uvicorn-httptools": -signal.SIGTERM,
    "hypercorn-asyncio": 0,
    "hypercorn-trio": 0,
    "granian": 0,
    "gunicorn": 0,
}


def workers_of(name: str) -> int:
    return 2 if name == "gunicorn" else 1


def assert_full_refusal(refused: httpx.Response, *, http2: bool = False) -> None:
    """The not-started 503 whole: status, Retry-After, the not-started mark, the OpenAI-style error
    body, and Connection: close on HTTP/1.1 (the refused body has been read; none on HTTP/2)."""
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.headers["x-graceful-not-started"] == "1"
    assert refused.json()["error"]["type"] == "server_draining"
    if http2:
        assert refused.http_version == "HTTP/2"
        assert "connection" not in refused.headers
    else:
        assert refused.http_version == "HTTP/1.1"
        assert refused.headers["connection"] == "close"


def drain_during_streams(
    server: Launched, *, streams: int = 4, http2: bool = False
) -> subprocess.CompletedProcess[str]:
    """
    1. `streams` SSE streams start and each receives its first frame
    2. `graceful drain` runs in another process
    3. while it runs: /ready is 503 and a new request gets the whole not-started 503
    4. every stream ends with [DONE]; the drain exits 0
    """
    results: list[list[str]] = [[] for _ in range(streams)]
    firsts = [threading.Event() for _ in range(streams)]
    threads = [stream_in_thread(server.base, results[i], firsts[i], http2=http2) for i in range(streams)]
    for first in firsts:
        assert first.wait(10), server.log
    drain = subprocess.Popen(
        [sys.executable, "-m", "graceful", "drain", "--socket-dir", server.socket_dir, "--propagation-wait", "0.3s",
         "--timeout", "20s"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        ready = 200
        while ready != 503 and time.monotonic() < deadline:  # the drain command needs a moment to start
            ready = httpx.get(server.base + "/ready", timeout=2).status_code
        assert ready == 503
        # The app streams until it sees the drain, so these were in flight when it began.
        assert not any(frames and frames[-1] == "data: [DONE]" for frames in results)
        # Every worker is draining, whichever one answers.
        for _ in range(6):
            with httpx.Client(timeout=5, http1=not http2, http2=http2) as fresh:
                assert_full_refusal(fresh.post(server.base + "/short"), http2=http2)
    finally:  # a failed check must not leave the drain command running
        out, err = drain.communicate(timeout=30)
    for thread in threads:
        thread.join(10)
    for frames in results:
        assert frames[-1] == "data: [DONE]", (frames[-3:], server.log)
        assert frames[:-1] == [f"data: {i}" for i in range(len(frames) - 1)]
    return subprocess.CompletedProcess(drain.args, drain.returncode, out, err)


@pytest.mark.parametrize("name", SERVERS)
def test_drain_behaves_the_same_on_every_server(name: str, launch: Callable[..., Launched]) -> None:
    server = launch(server=name, app="tests.apps.compat:app")
    workers = workers_of(name)
    server.wait_ready(sockets=workers)
    assert len(server.sockets()) == workers
    done = drain_during_streams(server)
    assert done.returncode == 0, done.stderr + server.log
    if workers == 2:
        assert "drained 2 of 2 workers" in done.stderr, done.stderr
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(20) == SIGTERM_EXIT[name], server.log


@pytest.mark.parametrize("name", SERVERS)
def test_default_serves_new_work_until_the_wait_ends_on_every_server(
    name: str, launch: Callable[..., Launched]
) -> None:
    """graceful's default under every server: 1. a stream is in flight 2. `graceful drain
    --propagation-wait 2s` 3. /ready turns 503 and new work is still served 4. once the wait is
    over, new work gets the whole not-started 503 5. the stream ends whole and the drain exits 0."""
    server = launch(server=name, app="tests.apps.compat:app", COMPAT_ADMIT="default")
    server.wait_ready(sockets=workers_of(name))
    frames: list[str] = []
    first = threading.Event()
    thread = stream_in_thread(server.base, frames, first)
    assert first.wait(10), server.log
    started = time.monotonic()
    drain = subprocess.Popen(
        [sys.executable, "-m", "graceful", "drain", "--socket-dir", server.socket_dir, "--propagation-wait", "2s",
         "--timeout", "20s"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    ready = 200
    while ready != 503 and time.monotonic() < started + 10:
        ready = httpx.get(server.base + "/ready", timeout=2).status_code
    assert ready == 503
    with httpx.Client(timeout=5) as fresh:
        assert fresh.post(server.base + "/short").status_code == 200
    refused = None
    while time.monotonic() < started + 20:
        with httpx.Client(timeout=5) as fresh:
            answer = fresh.post(server.base + "/short")
        if answer.status_code == 503:
            refused = answer
            break
        time.sleep(0.05)
    refused_at = time.monotonic()
    assert refused is not None, server.log
    assert_full_refusal(refused)
    assert refused_at - started >= 2.0  # never before the wait is over
    out, err = drain.communicate(timeout=30)
    assert drain.returncode == 0, err + server.log
    thread.join(10)
    assert frames[-1] == "data: [DONE]", frames[-3:]
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(20) == SIGTERM_EXIT[name], server.log


def test_fastapi_add_middleware_and_streaming_response(launch: Callable[..., Launched]) -> None:
    server = launch(server="uvicorn-h11", app="tests.apps.fastapi_app:app")
    server.wait_ready()
    done = drain_during_streams(server, streams=2)
    assert done.returncode == 0, done.stderr


def test_http2_streams_whole_and_no_connection_close(launch: Callable[..., Launched]) -> None:
    server = launch(server="hypercorn-asyncio", app="tests.apps.compat:app")
    server.wait_ready()
    done = drain_during_streams(server, streams=3, http2=True)
    assert done.returncode == 0, done.stderr


def metric_samples(page: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(page)
        for s in f.samples
    }


def test_multiprocess_metrics_aggregate_across_workers(socket_dir: str, launch: Callable[..., Launched]) -> None:
    """1. gunicorn with two workers 2. requests on new connections until both workers have served
    3. /metrics (whichever worker answers) soon shows the sum over both: every request completed,
    both workers SERVING, nothing in flight."""
    metrics_dir = os.path.join(socket_dir, "prom")
    os.mkdir(metrics_dir)
    server = launch(server="gunicorn", app="tests.apps.compat:app", PROMETHEUS_MULTIPROC_DIR=metrics_dir)
    server.wait_ready(sockets=2)
    workers = {int(os.path.basename(path).removesuffix(".sock")) for path in server.sockets()}
    pids: set[int] = set()
    sent = 0
    while pids != workers:  # the kernel spreads new connections, but promises no order
        assert sent < 1000, f"only {pids} of {workers} served"
        with httpx.Client(base_url=server.base, timeout=5) as fresh:
            pids.add(fresh.post("/short").json()["pid"])
        sent += 1
    with httpx.Client(base_url=server.base, timeout=5) as client:
        for _ in range(40 - sent):  # at least 40 in all
            client.post("/short")
            sent += 1
    expected = {
        ("graceful_requests_total", (("outcome", "completed"),)): float(sent),
        ("graceful_state", (("state", "SERVING"),)): 2.0,
        ("graceful_in_flight", ()): 0.0,
    }
    deadline = time.monotonic() + 10  # the mirror pushes once a second (the documented staleness bound)
    with httpx.Client(base_url=server.base, timeout=5) as client:
        while True:
            samples = metric_samples(client.get("/metrics").text)
            seen = {key: samples.get(key) for key in expected}
            if seen == expected or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert samples[("graceful_requests_total", (("outcome", "completed"),))] == float(sent)
    assert samples[("graceful_state", (("state", "SERVING"),))] == 2.0
    assert samples[("graceful_in_flight", ())] == 0.0


@pytest.mark.parametrize("name", ["uvicorn-httptools", "hypercorn-asyncio", "granian"])
def test_a_file_response_counts_as_completed(name: str, launch: Callable[..., Launched]) -> None:
    """Starlette's FileResponse, which sends the file by path (http.response.pathsend) where the
    server offers it (granian does): 1. three GETs of a file arrive whole 2. /metrics counts
    three requests completed and none as an error."""
    from tests.apps import compat

    server = launch(server=name, app="tests.apps.compat:app")
    server.wait_ready()
    with open(compat.__file__, "rb") as source:
        content = source.read()
    with httpx.Client(base_url=server.base, timeout=5) as client:
        for _ in range(3):
            response = client.get("/file")
            assert response.status_code == 200 and response.content == content, server.log
        samples = metric_samples(client.get("/metrics").text)
    assert samples.get(("graceful_requests_total", (("outcome", "completed"),))) == 3.0, server.log
    assert samples.get(("graceful_requests_total", (("outcome", "error"),)), 0.0) == 0.0, server.log
    assert samples[("graceful_in_flight", ())] == 0.0


@pytest.mark.parametrize("name", ["hypercorn-asyncio", "hypercorn-trio", "granian", "gunicorn"])
def test_refusal_of_a_large_post_arrives_on_every_server(name: str, launch: Callable[..., Launched]) -> None:
    """The refusal-body rule under the other servers (uvicorn: tests/asgi/test_refusal_body.py): after a
    drain, 20 POSTs of 1 MB and 20 of 8 MiB (under the 16 MiB limit) from a raw socket each get a
    complete 503, no reset."""
    from tests.asgi.test_refusal_body import post

    server = launch(server=name, app="tests.apps.compat:app")
    server.wait_ready(sockets=workers_of(name))
    drained = subprocess.run(
        [sys.executable, "-m", "graceful", "drain", "--socket-dir", server.socket_dir, "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert drained.returncode == 0, drained.stderr
    outcomes: dict[int, list[str]] = {}
    for size in (1_000_000, 8 << 20):
        for _ in range(20):
            outcome, response, body = post(server.port, size)
            ok = outcome == "ok" and response is not None and response.status_code == 503
            ok = ok and b'"server_draining"' in body
            outcomes.setdefault(size, []).append("503" if ok else outcome)
    assert outcomes == {size: ["503"] * 20 for size in (1_000_000, 8 << 20)}, (outcomes, server.log)
