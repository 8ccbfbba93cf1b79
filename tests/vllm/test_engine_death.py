"""A replica whose engine died says so at once, inside a real vLLM on the CPU.

vLLM's API server stays up for a moment after its engine core dies (its watchdog checks every
5 s, vllm/entrypoints/launchers/launcher.py), and answers every request that reaches it with
a 500 (EngineDeadError). graceful has seen the engine's death in the streams it was carrying,
so it fails readiness and refuses new work as not started: behind a balancer, the resumed
callers' continuations and everyone's new requests go elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import openai
import pytest

import graceful
from examples.rollout.balancer import HAProxy, open_balancer
from examples.rollout.haproxy import find_haproxy
from tests.vllm.conftest import VllmServer
from tests.vllm.test_vllm import (
    CLIENT,
    PROMPT,
    RECIPE,
    Stream,
    body,
    engine_core,
    first_503,
    graceful_cli,
    path,
    token_stream,
)

pytestmark = [pytest.mark.timeout(600), pytest.mark.vllm_late]
CALLERS = 6
TOKENS = 400


async def caller(client: openai.AsyncOpenAI, model: str, got: dict[str, Any], reading: anyio.Event) -> None:
    """One caller through the openai SDK: the token ids it reads, its text, and its [DONE] and resumes."""
    ids: list[int] = []
    text: list[str] = []
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], stream=True, max_tokens=TOKENS,
        temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True},
    )  # fmt: skip
    async with stream:
        async for chunk in stream:
            for choice in chunk.choices:
                ids += (choice.model_extra or {}).get("token_ids") or []
                text.append(choice.delta.content or "")
            if len(ids) >= 50:
                reading.set()
        got["resumes"] = stream.response.extensions["graceful_resumes"]
    got.update(ids=ids, text="".join(text))


def a_status(server: VllmServer) -> dict[str, Any]:
    answer = graceful_cli("status", "--json", "--socket-dir", server.socket_dir)
    assert answer.returncode == 0, answer.stderr
    [status] = json.loads(answer.stdout)
    return dict(status)


@pytest.mark.anyio
@pytest.mark.skipif(find_haproxy() is None, reason="HAProxy is not installed (bash scripts/setup-tests installs it)")
async def test_every_resumed_caller_of_a_dead_engine_gets_its_answer_behind_haproxy(
    replica: VllmServer,
    start_vllm: Callable[..., VllmServer],
) -> None:
    """1. replica B (the shared one) streams the answer alone: the reference token ids
    2. A and B behind HAProxy (mode tcp, round robin, like a Service); six callers stream the same
       greedy request through the openai SDK with graceful's AsyncResumingTransport
    3. once a caller has 50 tokens and A carries some of the streams, A's engine core is SIGKILLed (not
       once every caller has: on a machine busy elsewhere, B's callers reached 50 tokens after A's
       streams had ended)
    4. A stays listed for 1 s more (a readiness probe's period), then the balancer drops it
    5. every caller, 6 of 6, reads the reference's token ids and text exactly; those that were on A
       were resumed; A's /status says FAILED with the engine's error"""
    first = start_vllm(**RECIPE)
    first.wait_ready()
    payload = {"model": replica.model, **body("chat", TOKENS, return_token_ids=True)}
    with httpx.Client(timeout=120) as plain:
        reference_ids, reference_text, _ = token_stream(plain, replica.url(path("chat")), payload)
    assert len(reference_ids) == TOKENS

    results: list[dict[str, Any]] = [{} for _ in range(CALLERS)]
    async with open_balancer("haproxy", slots=4) as balancer:
        assert isinstance(balancer, HAProxy)
        await balancer.add("A", first.port)
        await balancer.add("B", replica.port)
        http = httpx.AsyncClient(transport=graceful.AsyncResumingTransport(), timeout=120)
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{balancer.port}/v1", api_key="unused", http_client=http, max_retries=0
        )
        async with http, anyio.create_task_group() as tg:
            reading = anyio.Event()  # a caller has 50 tokens
            for got in results:
                tg.start_soon(caller, client, replica.model, got, reading)
            with anyio.fail_after(120):
                await reading.wait()
            on_a = (await anyio.to_thread.run_sync(a_status, first))["in_flight"]
            assert on_a >= 1, "no stream runs on replica A"
            os.kill(engine_core(first), signal.SIGKILL)
            await anyio.sleep(1.0)  # A is still listed: what a readiness probe's period leaves
            await balancer.remove("A")
    for index, got in enumerate(results):
        assert got["ids"] == reference_ids, f"caller {index}: {len(got['ids'])} ids, resumes {got['resumes']}"
        assert got["text"] == reference_text, index
    assert sum(1 for got in results if got["resumes"]) >= on_a


def test_after_the_engine_dies_ready_fails_within_a_second_and_new_requests_get_the_not_started_503(
    start_vllm: Callable[..., VllmServer],
) -> None:
    """VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 keeps vLLM's API server up with a dead engine (otherwise its
    watchdog shuts it down within 5 s), so that what graceful answers there can be read for as long as
    the test needs:
    1. a stream is in flight  2. the engine core is SIGKILLed
    3. /ready answers 503 within 1 s of the kill
    4. a new chat request gets the not-started 503 (server_failed, Retry-After, the marker), not vLLM's 500,
       and so does the next one; vLLM's own /health says 503 (liveness stays with the app)
    5. graceful status shows FAILED with the engine's error; graceful resume refuses (exit 1); the
       metrics count the failure
    6. engine mode reads vLLM's frozen page and failing /health: the engine is dead (exit 1)"""
    server = start_vllm(**RECIPE, VLLM_KEEP_ALIVE_ON_ENGINE_DEATH="1")
    server.wait_ready()
    stream = Stream("chat", 4000).run(server)
    assert stream.first.wait(60)
    killed = time.monotonic()
    os.kill(engine_core(server), signal.SIGKILL)
    assert first_503(server, killed, limit=5.0) <= 1.0
    for _ in range(2):
        answer = CLIENT.post(
            server.url("/v1/chat/completions"),
            json={"model": server.model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4},
        )
        assert answer.status_code == 503, answer.text
        assert answer.headers["x-graceful-not-started"] == "1" and answer.headers["retry-after"] == "1"
        assert answer.json()["error"]["type"] == "server_failed"
    assert CLIENT.get(server.url("/live")).status_code == 200
    assert CLIENT.get(server.url("/health")).status_code == 503
    stream.wait(60)
    status = a_status(server)
    assert status["state"] == "FAILED" and status["failure"]["reason"] == "engine_dead"
    assert "EngineCore encountered an issue" in status["failure"]["detail"]
    assert status["counters"]["failures"] == {"engine_dead": 1}
    shown = graceful_cli("status", "--socket-dir", server.socket_dir)
    assert "FAILED" in shown.stdout and "engine_dead" in shown.stdout
    resumed = graceful_cli("resume", "--socket-dir", server.socket_dir)
    assert resumed.returncode == 1 and "is not resumed" in resumed.stderr
    assert a_status(server)["state"] == "FAILED"
    # Engine mode, for an engine graceful does not wrap: vLLM's page keeps its last values, its
    # /health says 503: the hook reports the engine dead (exit 1), not idle and not busy to the end.
    hook = graceful_cli(
        "drain", "--engine", "vllm", "--metrics-url", server.url("/metrics"), "--grace-period", "60", "--json"
    )
    assert hook.returncode == 1, (hook.stdout, hook.stderr)
    assert json.loads(hook.stdout)["result"] == "dead" and "the engine is dead" in hook.stderr
