"""Resume inside a real LiteLLM proxy: callers that run none of graceful's code read one unbroken stream.

Two example-server replicas (graceful inside) sit behind HAProxy in mode tcp, like a Service; a real
LiteLLM proxy (scripts/setup-litellm) is the gateway in front of it, with graceful's handler in its
callbacks. The callers are ``curl -N`` and the openai SDK for Node (where node is installed). Each
test cuts the stream on replica A one way and checks what every caller read, and what LiteLLM's own
usage logging recorded. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from examples.rollout.replica import Replica as ProcessReplica
from examples.rollout.replica import ReplicaSettings
from graceful._asgi._frames import resumable_final_frame
from graceful._asgi._types import Receive, Scope, Send
from graceful._drain._state import core
from tests.litellm.proxy import Answer, Caller, LiteLLMProxy, deployment, needs_litellm, node_available, write_config
from tests.resume_utils import TOKENS_PER_SECOND, Replica, expected_text, replica, service
from tests.utils import ROOT, run_uvicorn

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240), needs_litellm]

TOKENS = 160  # 4 s at the example engine's 40 tokens per second: still running at every cut


async def start_proxy(tmp_path: Path, api_base: str, *, resume: bool = True, **params: Any) -> LiteLLMProxy:
    entries = [deployment("example", "openai/graceful-example", api_base, resume=resume, **params)]
    proxy = LiteLLMProxy(write_config(tmp_path / "config.yaml", entries), tmp_path / "litellm.log")
    return await anyio.to_thread.run_sync(proxy.wait_serving)


class Callers:
    """curl -N and, where node is installed, the Node openai SDK: one stream each through the proxy."""

    def __init__(self, proxy: LiteLLMProxy, model: str = "example", tokens: int = TOKENS) -> None:
        kinds = ["curl", "node"] if node_available() else ["curl"]
        self.callers = [Caller(kind, proxy.base, model, tokens) for kind in kinds]

    def __len__(self) -> int:
        return len(self.callers)

    async def reading(self) -> None:
        """Until every caller has read its first lines."""
        for caller in self.callers:
            assert await anyio.to_thread.run_sync(caller.reading.wait, 60), f"{caller.kind} read nothing"

    async def answers(self) -> dict[str, Answer]:
        return {caller.kind: await anyio.to_thread.run_sync(caller.answer) for caller in self.callers}


async def one_answer(proxy: LiteLLMProxy, model: str, tokens: int) -> Answer:
    return await anyio.to_thread.run_sync(Caller("curl", proxy.base, model, tokens).answer)


async def streaming_on(a: Replica, count: int) -> None:
    """Until ``count`` streams on replica A have sent frames (the cut must find them mid-stream)."""
    with anyio.fail_after(60):
        while not (a.app.drain.in_flight >= count and all(item.last for item in core(a.app.drain).items())):
            await anyio.sleep(0.02)


def check(answers: dict[str, Answer], proxy: LiteLLMProxy) -> None:
    """Every caller: the exact text, one finish, one id, one [DONE] (curl), the whole usage; LiteLLM logged
    each request once, with every completion token."""
    for name, answer in answers.items():
        answer.assert_whole(expected_text(TOKENS), TOKENS, done=name == "curl")
    logged = proxy.usage()
    assert len(logged) == len(answers), logged
    assert all(entry["completion_tokens"] == TOKENS for entry in logged), logged


async def test_a_drain_with_handoff_is_continued_inside_the_gateway(tmp_path: Path) -> None:
    """1. both callers stream through LiteLLM to replica A (handoff_streams on)  2. B joins the
    balancer; A drains (propagation wait 0): it hands both streams off with the resumable final event
    3. LiteLLM's transport continues each on B  4. every caller reads the whole answer; A's drain
    ended without waiting for them"""
    if node_available() is False:
        print("node or tests/node's openai SDK missing: curl only")
    async with replica("a", handoff_streams=True) as a, replica("b") as b, service(a) as balancer:
        proxy = await start_proxy(tmp_path, f"http://127.0.0.1:{balancer.port}/v1")
        try:
            callers = Callers(proxy)
            await streaming_on(a, len(callers))
            await balancer.add(b.name, b.port)
            result = await a.app.drain.drain(reason="rollout", propagation_wait=0)
            answers = await callers.answers()
        finally:
            proxy.stop()
    assert result.drained and result.handed_off == len(answers)
    assert result.duration < TOKENS / TOKENS_PER_SECOND / 2  # it did not wait for the streams
    check(answers, proxy)
    assert b.app.drain.counters()["requests"]["completed"] == len(answers)


async def test_a_stream_the_deadline_cuts_is_continued_inside_the_gateway(tmp_path: Path) -> None:
    """1. both callers stream through LiteLLM to replica A (handoff off)  2. B joins; A drains with a
    1 s limit: the deadline ends both streams with the resumable final event  3. continued on B
    4. every caller reads the whole answer"""
    async with replica("a") as a, replica("b") as b, service(a) as balancer:
        proxy = await start_proxy(tmp_path, f"http://127.0.0.1:{balancer.port}/v1")
        try:
            callers = Callers(proxy)
            await streaming_on(a, len(callers))
            await balancer.add(b.name, b.port)
            result = await a.app.drain.drain(reason="rollout", propagation_wait=0, timeout=1.0)
            answers = await callers.answers()
        finally:
            proxy.stop()
    assert result.result == "timeout" and result.truncated == len(answers)
    check(answers, proxy)


async def test_a_replica_killed_mid_stream_is_continued_inside_the_gateway(tmp_path: Path) -> None:
    """1. both callers stream through LiteLLM to replica K (its own `graceful run` process)  2. B joins;
    K is SIGKILLed: the streams are cut with no final event  3. continued on B (K's dead endpoint is
    still listed: its refused continuations are sent again)  4. every caller reads the whole answer"""
    settings = ReplicaSettings(
        kind="graceful", grace_period=30, propagation_wait=0.2, tokens_per_second=TOKENS_PER_SECOND, load_delay=0.0,
        log_dir=str(tmp_path),
    )  # fmt: skip
    killed = ProcessReplica("k", settings)
    await killed.start()
    try:
        await killed.wait_started(timeout=30)
        async with replica("b") as b, service() as balancer:
            await balancer.add("k", killed.port)
            proxy = await start_proxy(tmp_path, f"http://127.0.0.1:{balancer.port}/v1")
            try:
                callers = Callers(proxy)
                await callers.reading()
                await balancer.add(b.name, b.port)
                killed.kill()
                answers = await callers.answers()
            finally:
                proxy.stop()
    finally:
        await killed.stop()
    check(answers, proxy)
    assert b.app.drain.counters()["requests"]["completed"] == len(answers)


# -- which deployments resume ----------------------------------------------------------------------------


class Recorder:
    """An upstream that records each request's headers and body. A first request gets three chunks and then
    graceful's final event (resumable when the request said it is); a continuation gets the rest."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] != "POST" or not scope["path"].endswith("/chat/completions"):
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        headers = {name.decode(): value.decode() for name, value in scope["headers"]}
        payload = json.loads(body)
        self.requests.append((headers, payload))
        resumable = headers.get("x-graceful-resumable") == "1"
        first = not payload.get("continue_final_message")
        words = ["one ", "two ", "three "] if first else ["four"]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for index, word in enumerate(words):
            finish = None if first or index < len(words) - 1 else "stop"
            chunk = {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 1, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": finish}]}  # fmt: skip
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + json.dumps(chunk).encode() + b"\n\n",
                    "more_body": True,
                }
            )
        if first:
            final = resumable_final_frame(b"text/event-stream") if resumable else None
            frame = final or b'data: {"error":{"type":"server_shutdown","retryable":true,"code":503}}\n\n'
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        else:
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})


async def test_only_opted_in_deployments_are_marked_and_continued(tmp_path: Path) -> None:
    """1. two deployments of one upstream: "resumed" with graceful_resume, "plain" without
    2. the upstream cuts each first stream with graceful's final event
    3. "resumed": marked x-graceful-resumable, continued, the caller reads one whole answer
    4. "plain": no header, no continuation: LiteLLM hands the caller the cut as an error"""
    recorder = Recorder()
    async with run_uvicorn(recorder, lifespan="off") as server:
        base = f"http://127.0.0.1:{server.port}/v1"
        entries = [
            deployment("resumed", "hosted_vllm/m", base, resume=True),
            deployment("plain", "hosted_vllm/m", base, resume=False),
        ]
        proxy = LiteLLMProxy(write_config(tmp_path / "config.yaml", entries), tmp_path / "litellm.log")
        try:
            await anyio.to_thread.run_sync(proxy.wait_serving)
            resumed = await one_answer(proxy, "resumed", 20)
            marked = list(recorder.requests)
            recorder.requests.clear()
            plain = await one_answer(proxy, "plain", 20)
        finally:
            proxy.stop()
    assert [headers.get("x-graceful-resumable") for headers, _ in marked] == ["1", "1"]
    assert marked[1][1]["continue_final_message"] is True
    assert resumed.error is None and resumed.text == "one two three four" and resumed.done == 1
    assert [headers.get("x-graceful-resumable") for headers, _ in recorder.requests] == [None]
    assert plain.error is not None and plain.text == "one two three "


# -- the gateway's own drain ------------------------------------------------------------------------------


def graceful_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graceful", *args], capture_output=True, text=True, timeout=90, cwd=ROOT
    )


@pytest.mark.parametrize("how", ["prestop", "sigterm"])
async def test_the_gateway_drains_under_graceful(tmp_path: Path, how: str) -> None:
    """LiteLLM's proxy under `graceful run` (its deployment not opted in: the gateway's drain alone):
    1. a stream through the proxy is in flight  2. the gateway drains (the preStop hook, or SIGTERM):
    /ready fails at once, a new request is still served during the 2 s propagation wait
    3. after it, a new request gets the not-started 503  4. the stream ends whole
    5. SIGTERM: LiteLLM's own shutdown finds nothing in flight, and the process exits 0"""
    socket_dir = "/tmp/" + os.urandom(4).hex()
    os.mkdir(socket_dir, 0o700)
    async with replica("a") as a:
        entries = [deployment("example", "openai/graceful-example", f"http://127.0.0.1:{a.port}/v1", resume=False)]
        options = ("--socket-dir", socket_dir, "--propagation-wait", "2s", "--grace-period", "60")
        proxy = LiteLLMProxy(
            write_config(tmp_path / "config.yaml", entries), tmp_path / "litellm.log", graceful_run=options,
            socket_dir=socket_dir,
        )  # fmt: skip
        try:
            await anyio.to_thread.run_sync(proxy.wait_serving)
            stream = Caller("curl", proxy.base, "example", TOKENS)
            await streaming_on(a, 1)
            if how == "prestop":
                hook = subprocess.Popen(
                    [sys.executable, "-m", "graceful", "drain", "--socket-dir", socket_dir],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                )  # fmt: skip
            else:
                proxy.process.send_signal(signal.SIGTERM)
            await anyio.to_thread.run_sync(_until, lambda: _status(proxy, "/ready") == 503, 10.0)
            during = await one_answer(proxy, "example", 4)
            assert during.error is None and during.text == expected_text(4)
            await anyio.to_thread.run_sync(_until, lambda: _refused(proxy), 10.0)
            answer = await anyio.to_thread.run_sync(stream.answer)
            answer.assert_whole(expected_text(TOKENS), TOKENS)
            if how == "prestop":
                out, err = await anyio.to_thread.run_sync(hook.communicate, None, 60)
                assert hook.returncode == 0, err
                proxy.process.send_signal(signal.SIGTERM)
            code = await anyio.to_thread.run_sync(proxy.wait_exit, 60.0)
        finally:
            proxy.stop()
            for leftover in proxy.sockets():
                os.unlink(leftover)
            os.rmdir(socket_dir)
    assert code == 0, proxy.log[-4000:]
    assert "Traceback" not in proxy.log, proxy.log[-4000:]


def _status(proxy: LiteLLMProxy, path: str) -> int:
    import httpx

    try:
        return httpx.get(proxy.url(path), timeout=2).status_code
    except httpx.TransportError:
        return 0


def _refused(proxy: LiteLLMProxy) -> bool:
    import httpx

    answer = httpx.post(
        proxy.url("/v1/chat/completions"), json={"model": "example", "messages": [{"role": "user", "content": "x"}]},
        headers={"authorization": "Bearer sk-graceful-test"}, timeout=10,
    )  # fmt: skip
    return answer.status_code == 503 and answer.headers.get("x-graceful-not-started") == "1"


def _until(check: Callable[[], bool], limit: float) -> None:
    import time

    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"not within {limit}s"
        time.sleep(0.05)
