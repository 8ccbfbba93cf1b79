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

import httpx
import pytest

from .compat import ROOT, Server, sockets, start

SERVERS = ["uvicorn-h11", "uvicorn-httptools", "hypercorn-asyncio", "hypercorn-trio", "granian", "gunicorn"]


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


def drain_during_streams(server: Server, *, streams: int = 4, http2: bool = False) -> subprocess.CompletedProcess[str]:
    """
    1. `streams` SSE streams start and each receives its first frame
    2. `graceful drain` runs in another process
    3. while it runs: /ready is 503 and a new request gets a not-started 503
    4. every stream ends with [DONE]; the drain exits 0
    """
    results: list[list[str]] = [[] for _ in range(streams)]
    firsts = [threading.Event() for _ in range(streams)]
    threads = [stream_in_thread(server.base, results[i], firsts[i], http2=http2) for i in range(streams)]
    for first in firsts:
        assert first.wait(10), server.output()
    drain = subprocess.Popen(
        [sys.executable, "-m", "graceful", "drain", "--socket-dir", server.socket_dir, "--propagation-wait", "0.3s",
         "--timeout", "20s"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 5
    ready = 200
    while ready != 503 and time.monotonic() < deadline:  # the drain command needs a moment to start
        ready = httpx.get(server.base + "/ready", timeout=2).status_code
    assert ready == 503
    # The app streams until it sees the drain, so these were in flight when it began.
    assert not any(frames and frames[-1] == "data: [DONE]" for frames in results)
    # Every worker is draining, whichever one answers.
    for _ in range(6):
        with httpx.Client(timeout=5, http1=not http2, http2=http2) as fresh:
            refused = fresh.post(server.base + "/short")
        assert refused.status_code == 503
        assert refused.headers["x-graceful-not-started"] == "1"
        assert refused.json()["error"]["type"] == "server_draining"
        if http2:
            assert "connection" not in refused.headers
    out, err = drain.communicate(timeout=30)
    for thread in threads:
        thread.join(10)
    for frames in results:
        assert frames[-1] == "data: [DONE]", (frames[-3:], server.output())
        assert frames[:-1] == [f"data: {i}" for i in range(len(frames) - 1)]
    return subprocess.CompletedProcess(drain.args, drain.returncode, out, err)


@pytest.mark.parametrize("name", SERVERS)
def test_drain_behaves_the_same_on_every_server(name: str, socket_dir: str) -> None:
    with start(name, socket_dir) as server:
        workers = 2 if name == "gunicorn" else 1
        deadline = time.monotonic() + 10
        while len(sockets(socket_dir)) < workers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(sockets(socket_dir)) == workers
        done = drain_during_streams(server)
        assert done.returncode == 0, done.stderr + server.output()
        if workers == 2:
            assert "2 workers" in done.stderr or done.stderr.count(".sock") >= 2, done.stderr
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(20) is not None


@pytest.mark.parametrize("name", SERVERS)
def test_default_serves_new_work_until_the_wait_ends_on_every_server(name: str, socket_dir: str) -> None:
    """graceful's default under every server: 1. a stream is in flight 2. `graceful drain
    --propagation-wait 2s` 3. /ready turns 503 and new work is still served 4. once the wait is
    over, new work gets the not-started 503 5. the stream ends whole and the drain exits 0."""
    with start(name, socket_dir, COMPAT_ADMIT="default") as server:
        workers = 2 if name == "gunicorn" else 1
        deadline = time.monotonic() + 10
        while len(sockets(socket_dir)) < workers and time.monotonic() < deadline:
            time.sleep(0.05)
        frames: list[str] = []
        first = threading.Event()
        thread = stream_in_thread(server.base, frames, first)
        assert first.wait(10), server.output()
        started = time.monotonic()
        drain = subprocess.Popen(
            [sys.executable, "-m", "graceful", "drain", "--socket-dir", socket_dir, "--propagation-wait", "2s",
             "--timeout", "20s"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        ready = 200
        while ready != 503 and time.monotonic() < deadline + 10:
            ready = httpx.get(server.base + "/ready", timeout=2).status_code
        assert ready == 503
        with httpx.Client(timeout=5) as fresh:
            assert fresh.post(server.base + "/short").status_code == 200
        refused = None
        while time.monotonic() < started + 15:
            with httpx.Client(timeout=5) as fresh:
                answer = fresh.post(server.base + "/short")
            if answer.status_code == 503:
                refused = answer
                break
            time.sleep(0.05)
        refused_at = time.monotonic()
        assert refused is not None, server.output()
        assert refused.headers["x-graceful-not-started"] == "1"
        assert refused_at - started >= 2.0  # never before the wait is over
        out, err = drain.communicate(timeout=30)
        assert drain.returncode == 0, err + server.output()
        thread.join(10)
        assert frames[-1] == "data: [DONE]", frames[-3:]
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(20) is not None


def test_fastapi_add_middleware_and_streaming_response(socket_dir: str) -> None:
    with start("uvicorn-h11", socket_dir, target="tests.apps_fastapi:app") as server:
        done = drain_during_streams(server, streams=2)
        assert done.returncode == 0, done.stderr


def test_http2_streams_whole_and_no_connection_close(socket_dir: str) -> None:
    with start("hypercorn-asyncio", socket_dir) as server:
        done = drain_during_streams(server, streams=3, http2=True)
        assert done.returncode == 0, done.stderr


def test_multiprocess_metrics_aggregate_across_workers(socket_dir: str, tmp_path: object) -> None:
    metrics_dir = os.path.join(socket_dir, "prom")
    os.mkdir(metrics_dir)
    with start("gunicorn", socket_dir, PROMETHEUS_MULTIPROC_DIR=metrics_dir) as server:
        pids = set()
        with httpx.Client(base_url=server.base, timeout=5) as client:
            for _ in range(40):
                with httpx.Client(base_url=server.base, timeout=5) as fresh:  # new connections spread the load
                    pids.add(fresh.post("/short").json()["pid"])
            assert len(pids) == 2, "both workers should have served"
            time.sleep(1.2)  # the mirror pushes once a second; this is the documented staleness bound
            page = client.get("/metrics").text
        from prometheus_client.parser import text_string_to_metric_families

        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(page)
            for s in f.samples
        }
        assert samples[("graceful_requests_total", (("outcome", "completed"),))] == 40.0
        assert samples[("graceful_state", (("state", "SERVING"),))] == 2.0
        assert samples[("graceful_in_flight", ())] == 0.0


@pytest.mark.parametrize("name", ["hypercorn-asyncio", "hypercorn-trio", "granian", "gunicorn"])
def test_refusal_of_a_large_post_arrives_on_every_server(name: str, socket_dir: str) -> None:
    """The refusal-body rule under the other servers (uvicorn: tests/test_refusal_body.py): after a
    drain, 20 POSTs of 1 MB and 20 of 8 MiB (under the 16 MiB limit) from a raw socket each get a
    complete 503, no reset."""
    from .test_refusal_body import post

    with start(name, socket_dir) as server:
        workers = 2 if name == "gunicorn" else 1
        deadline = time.monotonic() + 10
        while len(sockets(socket_dir)) < workers and time.monotonic() < deadline:
            time.sleep(0.05)
        drained = subprocess.run(
            [sys.executable, "-m", "graceful", "drain", "--socket-dir", socket_dir, "--quiet"],
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
        assert outcomes == {size: ["503"] * 20 for size in (1_000_000, 8 << 20)}, (outcomes, server.output())
