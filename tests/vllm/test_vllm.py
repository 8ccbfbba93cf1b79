"""graceful inside a real vLLM (``vllm serve --middleware graceful.GracefulMiddleware``) on the CPU.

What nobody here wrote judges these: vLLM's own server, launcher, SIGTERM handling, engine
and metrics, with a model the tests make (tests/vllm/conftest.py). Each test carries its
scenario as numbered steps; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

import graceful
from graceful import Budget
from graceful._drain._advice import Evidence, advise
from graceful._drain._observed import Histogram
from graceful._engine._histogram import read_histogram
from tests.docs.commands import read
from tests.docs.shown import unmatched
from tests.utils import ROOT
from tests.vllm.conftest import SHARED_RECIPE, VllmServer, sse_events

pytestmark = pytest.mark.timeout(600)

PROMPT = "hello world, the server drains"
# Exempt from refusal, as the recipe says: the kubelet's and the engine hook's reads of vLLM's own pages.
RECIPE = SHARED_RECIPE


def graceful_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The graceful command as the preStop hook runs it, from the test's own environment."""
    return subprocess.run(
        [sys.executable, "-m", "graceful", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def body(kind: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    common = {"temperature": 0, "ignore_eos": True, "stream": True, "max_tokens": max_tokens, **extra}
    if kind == "chat":
        return {"messages": [{"role": "user", "content": PROMPT}], **common}
    return {"prompt": PROMPT, **common}


def path(kind: str) -> str:
    return "/v1/chat/completions" if kind == "chat" else "/v1/completions"


@dataclass
class Stream:
    """One streamed completion read in a thread: its events, and when it started and ended."""

    kind: str
    max_tokens: int
    events: list[dict[str, Any] | str] = field(default_factory=list)
    status: int = 0
    error: BaseException | None = None
    first: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)
    ended_at: float = 0.0

    def run(self, server: VllmServer, **extra: Any) -> Stream:
        payload = {"model": server.model, **body(self.kind, self.max_tokens, **extra)}

        def read() -> None:
            try:
                with CLIENT.stream("POST", server.url(path(self.kind)), json=payload, timeout=120) as response:
                    self.status = response.status_code
                    for event in sse_events(response.iter_lines()):
                        self.events.append(event)
                        self.first.set()
            except BaseException as exc:
                self.error = exc
            finally:
                self.ended_at = time.monotonic()
                self.first.set()
                self.ended.set()

        threading.Thread(target=read, daemon=True).start()
        return self

    def wait(self, limit: float = 120) -> Stream:
        assert self.ended.wait(limit), f"stream still running after {limit}s"
        return self

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [event for event in self.events if isinstance(event, dict) and "choices" in event]

    def assert_whole(self) -> None:
        """200, every token asked for, finish_reason "length", then [DONE] last."""
        assert self.error is None and self.status == 200, (self.status, repr(self.error), self.events[-3:])
        assert self.events[-1] == "[DONE]", self.events[-3:]
        finishes = [c["finish_reason"] for chunk in self.chunks for c in chunk["choices"] if c.get("finish_reason")]
        assert finishes == ["length"], finishes
        assert not any(isinstance(event, dict) and "error" in event for event in self.events)


def tokens_for(server: VllmServer, seconds: float) -> int:
    """``max_tokens`` for a stream that runs at least ``seconds`` alone on this machine now: the
    rate of one 128-token stream, measured. A stream beside others runs no faster, so it lasts at
    least as long. On two cores the rate falls several times over under load (stress-ng --cpu 4),
    and a fixed length either ends before the drain it is meant to test or outlives its deadline."""
    stream = Stream("completion", 128).run(server)
    assert stream.first.wait(60)
    started = time.monotonic()
    stream.wait(60).assert_whole()
    rate = 127 / max(stream.ended_at - started, 1e-3)
    return min(max(64, int(rate * seconds)), 12000)  # inside the server's --max-model-len of 16384


def wait_for(check: Callable[[], bool], limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {limit}s"
        time.sleep(0.05)


# One client for the short requests: a new httpx client per call builds an SSL context each time, and
# that (tens of ms, holding the GIL) stalls the threads that read the streams.
# No connection is kept: a kept one would outlive the server it went to.
CLIENT = httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0))


def status_of(server: VllmServer, route: str) -> httpx.Response:
    return CLIENT.get(server.url(route))


def new_request(server: VllmServer) -> httpx.Response:
    return CLIENT.post(
        server.url("/v1/completions"),
        json={"model": server.model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0},
    )


def test_probes_and_a_prestop_drain_with_streams_in_flight(replica: VllmServer) -> None:
    """1. the middleware answers /ready, /live and /startup; vLLM's /health and /metrics answer too
    2. three streams (completions and chat) are in flight
    3. the preStop hook: graceful drain --propagation-wait 8s
    4. /ready turns 503 at once; a new request during the wait is served
    5. after the wait a new request gets the not-started 503, and /health and /metrics (exempt) still 200
    6. every stream ends whole with [DONE]; the hook exits 0
    7. graceful resume: the replica serves again"""
    for probe in ("/ready", "/live", "/startup", "/health", "/metrics"):
        assert status_of(replica, probe).status_code == 200, probe
    streams = [Stream(kind, 1500).run(replica) for kind in ("completion", "chat", "completion")]
    for stream in streams:
        assert stream.first.wait(60)
    started = time.monotonic()
    hook = subprocess.Popen(
        [sys.executable, "-m", "graceful", "drain", "--socket-dir", replica.socket_dir, "--propagation-wait", "8s",
         "--grace-period", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    wait_for(lambda: status_of(replica, "/ready").status_code == 503, 5, "/ready 503")
    sent = time.monotonic()
    during = new_request(replica)
    assert sent - started < 8, "the request meant for the propagation wait was sent after it"
    assert during.status_code == 200, during.text
    wait_for(lambda: new_request(replica).status_code == 503, 10, "refusal after the propagation wait")
    refused = new_request(replica)
    assert refused.headers["x-graceful-not-started"] == "1"
    assert refused.json()["error"]["type"] == "server_draining"
    assert status_of(replica, "/health").status_code == 200
    assert status_of(replica, "/metrics").status_code == 200
    for stream in streams:
        stream.wait().assert_whole()
    out, err = hook.communicate(timeout=120)
    assert hook.returncode == 0, (out, err)
    assert graceful_cli("resume", "--socket-dir", replica.socket_dir).returncode == 0
    assert status_of(replica, "/ready").status_code == 200
    assert new_request(replica).status_code == 200


def engine_hook(server: VllmServer, *options: str, timeout: float = 120) -> dict[str, Any]:
    done = graceful_cli(
        "drain", "--engine", "vllm", "--metrics-url", server.url("/metrics"), "--interval", "0.2s", "--json", *options,
        timeout=timeout,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["exit_code"] == done.returncode, (done.stdout, done.stderr)
    return result


def test_engine_mode_reads_the_real_metrics_page(replica: VllmServer) -> None:
    """graceful drain --engine vllm against vLLM's own /metrics:
    1. idle: exits 0 with running=0 waiting=0
    2. a stream in flight and a 1 s timeout: exits 1 with running=1
    3. a stream in flight and time enough: exits 0, after the stream has ended"""
    idle = engine_hook(replica, "--timeout", "20s")
    assert idle["result"] == "idle" and idle["values"] == {"vllm:num_requests_running": 0.0,
                                                           "vllm:num_requests_waiting": 0.0}  # fmt: skip
    assert idle["reads"] == 2, idle  # idle_reads' default: the second read in a row at zero ends it
    busy = Stream("completion", 4000).run(replica)
    assert busy.first.wait(60) and not busy.ended.is_set(), (busy.status, busy.events[-2:], repr(busy.error))
    short = engine_hook(replica, "--timeout", "1s")
    assert short["result"] == "timeout" and short["values"]["vllm:num_requests_running"] == 1.0, short
    waited = engine_hook(replica, "--timeout", "90s")
    hook_ended = time.monotonic()
    assert waited["result"] == "idle"
    busy.wait().assert_whole()
    assert busy.ended_at <= hook_ended


def seen_by_graceful(server: VllmServer) -> Histogram:
    """Every kind the middleware counted, merged: graceful status --json, as graceful advise reads it."""
    done = graceful_cli("status", "--socket-dir", server.socket_dir, "--json")
    assert done.returncode == 0, done.stderr
    merged = None
    for worker in json.loads(done.stdout):
        durations = worker["durations"]
        for kind in ("plain", "stream"):
            seen = Histogram.from_dict(durations["bounds"], durations[kind])
            merged = seen if merged is None else merged.merged(seen)
    assert merged is not None
    return merged


def seen_by_vllm(server: VllmServer) -> Histogram:
    return read_histogram(CLIENT.get(server.url("/metrics")).text, "vllm:e2e_request_latency_seconds")


def since(before: Histogram, after: Histogram) -> Histogram:
    return Histogram(
        after.bounds, tuple(a - b for a, b in zip(after.counts, before.counts)), after.total - before.total
    )


def test_the_advice_from_vllms_page_is_the_advice_from_gracefuls_counts(replica: VllmServer) -> None:
    """The same burst, counted by the middleware and by vLLM's own e2e histogram (its page, as
    graceful advise --engine vllm reads it): two streams of at least 15 s and four short completions.
    Both give the same share at risk, the same longest request and the same recommended numbers,
    for a budget that cuts the streams and for one that holds them. Between 10 and 60 s the two
    bucket sets are the same, so a stream's bucket is the same in both. The streams are sized by the
    faster of two measurements of the rate: one taken while the machine was busy sized a stream that
    ended in 7.5 s once it no longer was (seen beside the other tiers' lane)."""
    tokens = max(tokens_for(replica, 15) for _ in range(2))
    ours_before, theirs_before = seen_by_graceful(replica), seen_by_vllm(replica)
    streams = [Stream(kind, tokens).run(replica) for kind in ("completion", "chat")]
    for _ in range(4):
        assert new_request(replica).status_code == 200
    for stream in streams:
        stream.wait().assert_whole()
    wait_for(lambda: seen_by_vllm(replica).count - theirs_before.count == 6, 10, "vLLM counting the burst")
    ours = since(ours_before, seen_by_graceful(replica))
    theirs = since(theirs_before, seen_by_vllm(replica))
    assert ours.count == theirs.count == 6, (ours, theirs)
    assert 10 < ours.longest() <= 60, ours  # the region where both bucket sets agree
    for grace in (30.0, 200.0):  # admitting, 30 s covers (20 - 0) / 2 = 10 s: the streams are at risk
        budget = Budget.resolve(grace_period=grace)
        a = advise(Evidence({"all": ours}), budget, admit=True)
        b = advise(Evidence({"all": theirs}), budget, admit=True)
        assert (a.at_risk["all"], a.longest, a.grace_period, a.drain_timeout) == (
            b.at_risk["all"],
            b.longest,
            b.grace_period,
            b.drain_timeout,
        )
        assert a.at_risk["all"] == (2 if grace == 30.0 else 0)


def abort(server: VllmServer, request_id: str) -> None:
    """vLLM's own abort call (--enable-scale-out), as its disaggregated serving uses it."""
    answer = CLIENT.post(server.url("/inference/v1/abort_requests"), json={"request_ids": [request_id]})
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_a_stream_the_engine_aborts_ends_marked(replica: VllmServer, kind: str) -> None:
    """1. a stream with stream_options.include_usage is in flight  2. vLLM aborts it (its abort call)
    3. vLLM sends finish_reason "abort", the usage chunk and [DONE]; the client gets the first two,
       then graceful's retryable server_shutdown event, and no [DONE]
    4. through the openai SDK the same abort raises an APIError instead of ending quietly"""
    request_id = "abort-" + os.urandom(4).hex()
    stream = Stream(kind, 8000)
    stream.run(replica, stream_options={"include_usage": True}, request_id=request_id)
    assert stream.first.wait(60)
    # vLLM's engine ids: chat's is its response id, a completion's adds the prompt's index
    # (vllm/entrypoints/openai/completion/serving.py).
    abort(replica, f"chatcmpl-{request_id}" if kind == "chat" else f"cmpl-{request_id}-0")
    stream.wait(60)
    assert stream.error is None and stream.status == 200
    assert "[DONE]" not in stream.events
    finishes = [c.get("finish_reason") for chunk in stream.chunks for c in chunk["choices"] if c.get("finish_reason")]
    assert finishes == ["abort"]
    last = stream.events[-1]
    assert isinstance(last, dict) and last["error"]["type"] == "server_shutdown" and last["error"]["retryable"]

    sdk_id = "abort-" + os.urandom(4).hex()
    with openai.OpenAI(base_url=replica.url("/v1"), api_key="unused", max_retries=0) as client:
        chunks = client.chat.completions.create(
            model=replica.model, messages=[{"role": "user", "content": PROMPT}], stream=True, max_tokens=8000,
            temperature=0, extra_body={"ignore_eos": True, "request_id": sdk_id},
        )  # fmt: skip
        with pytest.raises(openai.APIError, match="shutting down"):
            for index, _ in enumerate(chunks):
                if index == 5:
                    abort(replica, "chatcmpl-" + sdk_id)


class Router(httpx.BaseTransport):
    """Sends the first request to one replica and every later one to the other: a balancer that
    has dropped the draining replica, with the choice fixed so the test checks the engine."""

    def __init__(self, first: VllmServer, then: VllmServer) -> None:
        self.targets = [first, then]
        self.sent = 0
        self.transport = httpx.HTTPTransport()

    def close(self) -> None:
        self.transport.close()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        target = self.targets[min(self.sent, 1)]
        self.sent += 1
        request.url = request.url.copy_with(port=target.port)
        return self.transport.handle_request(request)


def token_stream(
    client: httpx.Client, url: str, payload: dict[str, Any], got: dict[str, Any] | None = None
) -> tuple[list[int], str, list[Any]]:
    """Read a stream: its completion token ids, its text, and its events. With ``got``: its
    response's extensions go under "resumes", and ``got["reading"]`` is set at 50 token ids."""
    ids: list[int] = []
    text: list[str] = []
    events: list[Any] = []
    with client.stream("POST", url, json=payload) as response:
        assert response.status_code == 200
        if got is not None:
            got["resumes"] = response.extensions
        for event in sse_events(response.iter_lines()):
            events.append(event)
            for choice in event.get("choices", []) if isinstance(event, dict) else []:
                ids += choice.get("token_ids") or []
                text.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
                if got is not None and len(ids) >= 50:
                    got["reading"].set()
    return ids, "".join(text), events


def resumed_read(
    transport: httpx.BaseTransport, url: str, payload: dict[str, Any]
) -> tuple[threading.Thread, dict[str, Any]]:
    """Read a stream through ``transport`` in a thread: (the thread, what it got: ids, text, events,
    resumes, and the event "reading", set once 50 token ids have come)."""
    got: dict[str, Any] = {"reading": threading.Event()}

    def read() -> None:
        with httpx.Client(transport=transport, timeout=120) as client:
            ids, text, events = token_stream(client, url, payload, got)
        got.update(ids=ids, text=text, events=events)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, got


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_a_stream_cut_at_the_drain_continues_exactly_on_another_replica(
    replica: VllmServer, handing_off: VllmServer, kind: str
) -> None:
    """1. replica B (the shared one) streams the whole answer alone: the reference token ids
    2. the same request, with graceful's resuming transport, starts on replica A (the shared one with
       handoff on)
    3. A is drained (propagation wait 0): it hands the stream off with the resumable final event
    4. the transport continues it on B from the token ids received
    5. the caller read one stream: the reference's token ids and text exactly, one [DONE], one resume"""
    first = handing_off
    # Long enough to outlast the hook's start on an idle machine too (600 tokens did not, once).
    tokens = tokens_for(replica, 10)
    payload = {"model": replica.model, **body(kind, tokens, return_token_ids=True)}
    with httpx.Client(timeout=120) as plain:
        reference_ids, reference_text, _ = token_stream(plain, replica.url(path(kind)), payload)
    assert len(reference_ids) == tokens

    router = Router(first, replica)
    transport = graceful.ResumingTransport(transport=router)
    thread, got = resumed_read(transport, first.url(path(kind)), payload)
    assert got["reading"].wait(60), "the stream never reached 50 tokens on replica A"
    hook = graceful_cli("drain", "--socket-dir", first.socket_dir, "--propagation-wait", "0", "--grace-period", "60")
    assert hook.returncode == 0, (hook.stdout, hook.stderr)
    assert "1 stream handed off" in hook.stderr or "handed off" in hook.stderr, hook.stderr
    thread.join(120)
    assert not thread.is_alive()
    assert router.sent == 2, "the stream was not continued on replica B"
    assert got["resumes"]["graceful_resumes"] == 1
    assert got["ids"] == reference_ids
    assert got["text"] == reference_text
    assert [event for event in got["events"] if event == "[DONE]"] == ["[DONE]"]
    assert got["events"][-1] == "[DONE]"


def engine_core(server: VllmServer) -> int:
    """The pid of the server's engine core: the process in its group whose title vLLM sets to
    ``VLLM::EngineCore`` (vllm/v1/engine/core.py, set_process_title)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != server.process.pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if b"EngineCore" in cmdline.read():
                    return int(entry)
        except (OSError, ProcessLookupError):
            continue
    raise AssertionError(f"no engine core process in the group of {server.process.pid}")


def test_a_stream_the_dead_engine_ended_continues_exactly_on_another_replica(
    replica: VllmServer, start_vllm: Callable[..., VllmServer]
) -> None:
    """1. replica B (the shared one) streams the whole answer alone: the reference token ids
    2. on replica A two streams run: a plain one, and the same request as B's through graceful's
       resuming transport
    3. A's engine core process is killed (SIGKILL) mid-stream; vLLM sends its 500 error event and
       [DONE] on every stream
    4. the plain stream ends with vLLM's error event and then graceful's retryable final frame, no
       [DONE]; A's log names the engine's error
    5. the resuming transport continues its stream on B: the caller reads the reference's token
       ids and text exactly, one [DONE], one resume"""
    first = start_vllm(**RECIPE)
    first.wait_ready()
    payload = {"model": replica.model, **body("chat", 600, return_token_ids=True)}
    with httpx.Client(timeout=120) as plain:
        reference_ids, reference_text, _ = token_stream(plain, replica.url(path("chat")), payload)
    assert len(reference_ids) == 600

    bystander = Stream("completion", 8000).run(first)
    router = Router(first, replica)
    transport = graceful.ResumingTransport(transport=router)
    thread, got = resumed_read(transport, first.url(path("chat")), payload)
    assert got["reading"].wait(60), "the stream never reached 50 tokens on replica A"
    assert bystander.first.wait(60)
    os.kill(engine_core(first), signal.SIGKILL)

    bystander.wait(60)
    assert bystander.error is None and bystander.status == 200, repr(bystander.error)
    assert "[DONE]" not in bystander.events, bystander.events[-3:]
    engine_error, final = bystander.events[-2:]
    assert isinstance(engine_error, dict) and engine_error["error"]["code"] == 500, bystander.events[-3:]
    assert isinstance(final, dict) and final["error"]["type"] == "server_shutdown" and final["error"]["retryable"]
    thread.join(120)
    assert not thread.is_alive()
    assert router.sent == 2, "the stream was not continued on replica B"
    assert got["resumes"]["graceful_resumes"] == 1
    assert got["ids"] == reference_ids
    assert got["text"] == reference_text
    assert [event for event in got["events"] if event == "[DONE]"] == ["[DONE]"]
    assert not any(isinstance(event, dict) and "error" in event for event in got["events"])
    assert "the engine ended the stream with an error (500 InternalServerError: EngineCore" in first.log


def first_503(server: VllmServer, since: float, limit: float = 5.0) -> float:
    """Seconds from ``since`` until ``/ready`` answers 503: probed over a new raw connection each
    time, so that a probe costs one round trip (an HTTP client's own set-up would dominate)."""
    request = b"GET /ready HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
    while time.monotonic() < since + limit:
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as probe:
            probe.sendall(request)
            head = probe.recv(32)
        if head.startswith(b"HTTP/1.1 503"):
            return time.monotonic() - since
    raise AssertionError(f"/ready still not 503 {limit}s after the trigger")


def test_sigterm_drains_before_vllms_own_shutdown(start_vllm: Callable[..., VllmServer]) -> None:
    """vLLM's launcher registers SIGTERM on its uvloop loop; graceful takes it first:
    1. four streams in flight
    2. the preStop path: `graceful drain` started -> /ready 503, timed; then `graceful resume`
    3. SIGTERM to vllm serve (default --shutdown-timeout 0: abort) -> /ready 503, timed the same
       way: within 1.5x of the preStop path's figure
    4. a new request served during the 4 s propagation wait, refused after it
    5. every stream ends whole with [DONE]
    6. only then vLLM's own shutdown runs, once, and the process exits 0"""
    # The promise is streams whole, not their pace: a grace period of 150 s leaves the drain 105 s, for
    # streams that take about 20 s on a quiet machine and took more than the recipe's 42 s (grace 60 s)
    # beside stress-ng --cpu 4.
    server = start_vllm(**{**RECIPE, "GRACEFUL_GRACE_PERIOD": "150"}, GRACEFUL_PROPAGATION_WAIT="4s")
    server.wait_ready()
    # Long enough (together about 20 s) that the refusals after the wait can be seen.
    streams = [Stream(kind, 2000).run(server) for kind in ("completion", "chat", "completion", "chat")]
    for stream in streams:
        assert stream.first.wait(60)
    started = time.monotonic()
    hook = subprocess.Popen(
        [sys.executable, "-m", "graceful", "drain", "--socket-dir", server.socket_dir, "--grace-period", "150"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
    )  # fmt: skip
    prestop = first_503(server, started)
    assert graceful_cli("resume", "--socket-dir", server.socket_dir).returncode == 0
    hook.wait(30)  # its drain was resumed: it reports so and exits
    assert status_of(server, "/ready").status_code == 200
    assert not any(stream.ended.is_set() for stream in streams), "a stream ended before SIGTERM"

    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    sigterm = first_503(server, sent)
    print(f"/ready 503 after: preStop hook {prestop * 1000:.1f} ms, SIGTERM {sigterm * 1000:.1f} ms")
    assert sigterm <= 1.5 * prestop, (sigterm, prestop)
    during_sent = time.monotonic()
    during = new_request(server)
    assert during_sent - sent < 4, "the request meant for the propagation wait was sent after it"
    assert during.status_code == 200, during.text
    wait_for(lambda: new_request(server).status_code == 503, 10, "refusal after the propagation wait")
    assert not all(stream.ended.is_set() for stream in streams), "the streams ended before the refusal was seen"
    for stream in streams:
        stream.wait().assert_whole()
    assert server.wait_exit(120) == 0, server.log[-4000:]
    log = server.log
    # The lines docs/vllm.md shows (docs_src/vllm/sigterm_log.out), in order: graceful drains, then vLLM shuts down.
    assert unmatched(read("docs_src/vllm/sigterm_log.out"), log) == [], log[-4000:]
    assert log.count("[shutdown] API server: shutdown triggered") == 1
    assert max(stream.ended_at for stream in streams) < time.monotonic()


def test_sigterm_past_the_budget_ends_streams_with_the_final_frame(start_vllm: Callable[..., VllmServer]) -> None:
    """--shutdown-timeout 5 (vLLM's drain mode), a budget shorter than the stream:
    grace period 16 s, reserve 8 s: the drain ends 8 s after SIGTERM, and vLLM's shutdown has its
    5 s and 3 s for its teardown (more than 1 s of it on a loaded machine).
    1. a stream that needs about 20 s more is in flight  2. SIGTERM
    3. at graceful's deadline the stream ends with the retryable server_shutdown event, no [DONE]
       (vLLM's engine never aborts it under the client)
    4. vLLM's shutdown follows and the process exits inside the grace period"""
    server = start_vllm(
        "--shutdown-timeout", "5", GRACEFUL_EXEMPT_PATHS="/health,/metrics", GRACEFUL_GRACE_PERIOD="16",
        GRACEFUL_RESERVE="8", GRACEFUL_PROPAGATION_WAIT="1s",
    )  # fmt: skip
    server.wait_ready()
    stream = Stream("completion", 15000).run(server)
    assert stream.first.wait(60)
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    stream.wait(60)
    assert stream.error is None and stream.status == 200
    last = stream.events[-1]
    assert isinstance(last, dict) and last["error"]["type"] == "server_shutdown", stream.events[-3:]
    assert "[DONE]" not in stream.events
    assert 7 <= stream.ended_at - sent < 10
    assert server.wait_exit(30) == 0, server.log[-4000:]
    assert time.monotonic() - sent < 16
    assert "[shutdown] API server: stopping engine client mode=drain timeout=5s" in server.log


def test_api_server_count_two_one_hook_drains_both(start_vllm: Callable[..., VllmServer]) -> None:
    """--api-server-count 2: two API processes, each with its own admin socket.
    1. both sockets appear  2. streams in flight  3. one graceful drain reaches both processes
    4. /ready 503 from both; streams whole  5. SIGTERM then finds them drained: the server exits 0"""
    server = start_vllm("--api-server-count", "2", "--shutdown-timeout", "30", **RECIPE)
    server.wait_ready(sockets=2)
    streams = [Stream(kind, 1000).run(server) for kind in ("completion", "chat", "completion", "chat")]
    for stream in streams:
        assert stream.first.wait(60)
    hook = graceful_cli(
        "drain", "--socket-dir", server.socket_dir, "--propagation-wait", "1s", "--grace-period", "60", "--json"
    )
    assert hook.returncode == 0, (hook.stdout, hook.stderr)
    workers = json.loads(hook.stdout)["workers"]
    assert len(workers) == 2 and {worker["result"]["result"] for worker in workers} == {"drained"}, workers
    for _ in range(6):  # new connections land on either process
        assert status_of(server, "/ready").status_code == 503
    for stream in streams:
        stream.wait().assert_whole()
    server.process.send_signal(signal.SIGTERM)
    assert server.wait_exit(60) == 0, server.log[-4000:]


def test_api_server_count_two_sigterm_to_the_parent_drains_each(start_vllm: Callable[..., VllmServer]) -> None:
    """No preStop hook: SIGTERM reaches the parent (PID 1 in a container), which sends SIGTERM to
    each API server and kills what is left after --shutdown-timeout (vllm/v1/utils.py, shutdown).
    With --shutdown-timeout above the drain's limit:
    1. streams in flight on the two API servers  2. SIGTERM to the parent
    3. /ready turns 503; after the 2 s propagation wait new requests are refused
    4. every stream ends whole with [DONE]; the server exits 0 before the shutdown timeout"""
    server = start_vllm("--api-server-count", "2", "--shutdown-timeout", "60", **RECIPE, GRACEFUL_PROPAGATION_WAIT="2s")
    server.wait_ready(sockets=2)
    # Streams that outlast the refusal below (about 3 s after SIGTERM) and end well inside the
    # drain's limit (60 s less the 18 s reserve), on a loaded machine too.
    tokens = tokens_for(server, 10)
    streams = [Stream(kind, tokens).run(server) for kind in ("completion", "chat", "completion", "chat")]
    for stream in streams:
        assert stream.first.wait(60)
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    wait_for(lambda: status_of(server, "/ready").status_code == 503, 5, "/ready 503 after SIGTERM")
    wait_for(lambda: new_request(server).status_code == 503, 10, "refusal after the propagation wait")
    assert not any(stream.ended.is_set() for stream in streams), f"{tokens} tokens: a stream ended before the refusal"
    for stream in streams:
        stream.wait().assert_whole()
    assert server.wait_exit(60) == 0, server.log[-4000:]
    assert time.monotonic() - sent < 60
    assert server.log.count("SIGTERM received: draining") == 2, server.log[-4000:]
