"""Resume inside a real LiteLLM proxy in front of real vLLM replicas: a caller that runs none of graceful's
code reads one unbroken stream.

Two vLLM replicas (CPU, the tests' tiny model, graceful inside) sit behind HAProxy in mode tcp, round
robin, like a Service; a real LiteLLM proxy (scripts/setup-litellm) is the gateway in front of it, with
graceful's handler in its callbacks and one deployment, opted in (``graceful_resume: true``), whose
api_base is HAProxy. Each test runs once per provider that reaches vLLM: ``hosted_vllm/<model>`` (LiteLLM's
own HTTP handler) and ``openai/<model>`` (the openai SDK inside LiteLLM). The caller is ``curl -N``, and
its request asks vLLM for ``return_token_ids``, greedy, with ``ignore_eos``. Replica A's stream is cut one
way; what the caller read is compared with the same request sent straight to replica B, uncut.

LiteLLM 1.110.2 keeps vLLM's per-choice ``token_ids`` when it re-chunks the stream, for both providers
(it drops them only where a guardrail or post-call rule could rewrite the text, and none is set here),
so the caller's token ids are compared exactly, as well as its text. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from examples.rollout.balancer import HAProxy, open_balancer
from examples.rollout.haproxy import find_haproxy
from tests.litellm.proxy import Answer, Caller, LiteLLMProxy, deployment, needs_litellm, request_body, write_config
from tests.vllm.conftest import VllmServer, long_lived, serving
from tests.vllm.test_vllm import (
    RECIPE,
    engine_core,
    graceful_cli,
    status_of,
    token_stream,
    tokens_for,
    wait_for,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(600),
    needs_litellm,
    pytest.mark.skipif(
        find_haproxy() is None, reason="HAProxy is not installed (bash scripts/setup-tests installs it)"
    ),
]

PROVIDERS = ["hosted_vllm", "openai"]
MODEL = "tiny"  # the deployment's model_name: what the caller asks LiteLLM for
# vLLM's own fields, passed through by LiteLLM: token ids in every chunk (the transport continues by
# them), greedy, and every token asked for.
EXTRA = {"return_token_ids": True, "temperature": 0, "ignore_eos": True}
# The tiny model's greedy answer soon repeats one token for good, and LiteLLM ends a stream with a 500 error
# event once 100 chunks in a row carry the same text of 3 or more characters (streaming_handler.py,
# raise_on_model_repetition): its own limit, raised here so that the uncut answer passes it whole.
REPETITION_LIMIT = "1000000"


@dataclass(frozen=True)
class Reference:
    """The request sent straight to replica B, uncut: its length, token ids, text and usage."""

    tokens: int
    ids: list[int]
    text: str
    usage: dict[str, Any]


@pytest.fixture(scope="module")
def reference(shared_replica: VllmServer) -> Reference:
    """The caller's request, sent to B alone. Sized to run at least 12 s by the faster of two measurements:
    the cuts come 1 to 3 s after LiteLLM's first chunk, which a busy machine delays, and a rate measured
    while it is busy sizes a stream that a machine no longer busy ends first."""
    replica = serving(shared_replica)
    tokens = max(tokens_for(replica, 12) for _ in range(2))
    print(f"{tokens} tokens")
    with httpx.Client(timeout=120) as plain:
        ids, text, events = token_stream(
            plain, replica.url("/v1/chat/completions"), request_body(replica.model, tokens, EXTRA)
        )
    [usage] = [event["usage"] for event in events if isinstance(event, dict) and event.get("usage")]
    assert len(ids) == tokens == usage["completion_tokens"]
    return Reference(tokens, ids, text, usage)


@pytest.fixture(scope="module")
def handoff_replica(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """Replica A of the handoff tests: the recipe's environment and GRACEFUL_HANDOFF_STREAMS=1."""
    log = tmp_path_factory.mktemp("vllm-a") / "log"
    with long_lived(model_dir, (), log, {**RECIPE, "GRACEFUL_HANDOFF_STREAMS": "1"}) as server:
        yield server


@pytest.fixture
def handing_off(handoff_replica: VllmServer) -> VllmServer:
    """Replica A serving: the drain of a test before is resumed first."""
    if status_of(handoff_replica, "/ready").status_code != 200:
        resumed = graceful_cli("resume", "--socket-dir", handoff_replica.socket_dir)
        assert resumed.returncode == 0, resumed.stderr
    wait_for(lambda: status_of(handoff_replica, "/ready").status_code == 200, 10, "replica A serving again")
    return handoff_replica


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, provider: str, a: VllmServer) -> AsyncIterator[tuple[HAProxy, LiteLLMProxy]]:
    """HAProxy (mode tcp) with replica A alone, and a LiteLLM proxy whose one deployment, ``<provider>/<model>``
    at HAProxy, is opted in; A may still be starting when this is entered.

    A new proxy each time: a connection it kept from an earlier test would still lead to the replica HAProxy
    paired it with then. It runs in the test's session (``own_session=False``, see LiteLLMProxy), and it serves
    one short stream before the test's: a fresh proxy's first stream pays for its lazy set-up, seconds on a
    busy machine, while vLLM already generates, and the cut must find the test's stream still running on A.
    A gateway that has served before is also the one a rollout cuts."""
    async with open_balancer("haproxy") as balancer:
        assert isinstance(balancer, HAProxy)
        api_base = f"http://127.0.0.1:{balancer.port}/v1"
        entries = [deployment(MODEL, f"{provider}/{a.model}", api_base, resume=True)]
        proxy = LiteLLMProxy(
            write_config(tmp_path / "config.yaml", entries), tmp_path / "litellm.log", own_session=False,
            REPEATED_STREAMING_CHUNK_LIMIT=REPETITION_LIMIT,
        )  # fmt: skip
        try:
            await anyio.to_thread.run_sync(proxy.wait_serving)
            await anyio.to_thread.run_sync(a.wait_ready)
            await balancer.add("A", a.port)
            warm = await anyio.to_thread.run_sync(Caller("curl", proxy.base, MODEL, 8, extra=EXTRA).answer)
            assert warm.error is None and warm.finishes == ["length"], warm
            await anyio.to_thread.run_sync(wait_for, lambda: len(proxy.usage()) == 1, 10, "the first stream logged")
            yield balancer, proxy
        finally:
            proxy.stop()


@contextlib.asynccontextmanager
async def streaming(proxy: LiteLLMProxy, tokens: int) -> AsyncIterator[Caller]:
    """``curl -N`` streaming the request through the proxy, once it has read its first lines; killed if
    the test ends before it does."""
    caller = Caller("curl", proxy.base, MODEL, tokens, extra=EXTRA)
    try:
        assert await anyio.to_thread.run_sync(caller.reading.wait, 60), "curl read nothing"
        yield caller
    finally:
        if caller.process.poll() is None:
            caller.process.kill()
            caller.process.wait(10)


async def sessions(balancer: HAProxy) -> dict[int, int]:
    """The connections HAProxy has sent to each replica's port so far."""
    return {int(row["addr"].rsplit(":", 1)[1]): int(row["stot"]) for row in await balancer.stats()}


def first_difference(got: list[int], want: list[int]) -> tuple[int, int | None, int | None] | None:
    """Where two lists of token ids part: (index, got, wanted)."""
    for index, (one, other) in enumerate(itertools.zip_longest(got, want)):
        if one != other:
            return index, one, other
    return None


def check(answer: Answer, reference: Reference, proxy: LiteLLMProxy) -> None:
    """The reference's text and token ids exactly, one finish, one id, one [DONE], the whole usage; LiteLLM
    logged the stream once, with every completion token."""
    answer.assert_whole(reference.text, reference.tokens)
    assert answer.token_ids == reference.ids, (len(answer.token_ids), first_difference(answer.token_ids, reference.ids))
    assert answer.usage is not None
    assert answer.usage["prompt_tokens"] == reference.usage["prompt_tokens"], (answer.usage, reference.usage)
    assert answer.usage["total_tokens"] == reference.usage["total_tokens"], (answer.usage, reference.usage)
    [stream_id] = answer.ids
    wait_for(lambda: len(proxy.usage()) >= 2, 10, "the stream logged")  # LiteLLM logs after the stream's end
    logged = [entry for entry in proxy.usage() if entry["id"] == stream_id]
    assert len(logged) == 1 and logged[0]["completion_tokens"] == reference.tokens, proxy.usage()
    assert len(proxy.usage()) == 2, proxy.usage()  # the first short stream's, and this one's


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_stream_whose_engine_died_reaches_the_caller_whole_through_litellm(
    replica: VllmServer,
    reference: Reference,
    start_vllm: Callable[..., VllmServer],
    tmp_path: Path,
    provider: str,
) -> None:
    """1. replica B (the shared one) streamed the request alone: the reference token ids and text
    2. replica A alone behind HAProxy; curl -N streams the same greedy request through LiteLLM's
       opted-in ``<provider>/<model>`` deployment, so to A
    3. B joins; A's engine core (``VLLM::EngineCore``) is SIGKILLed mid-stream: vLLM's 500 error event,
       then graceful's final event
    4. A stays listed 1 s more (a readiness probe's period), then HAProxy drops it
    5. inside LiteLLM the transport continues the stream on B: curl reads the reference's token ids
       and text exactly, one finish, one [DONE], the whole usage; LiteLLM logged the request once, with
       every completion token"""
    a = start_vllm(**RECIPE)
    async with gateway(tmp_path, provider, a) as (balancer, proxy):
        async with streaming(proxy, reference.tokens) as caller:
            await balancer.add("B", replica.port)
            os.kill(engine_core(a), signal.SIGKILL)
            await anyio.sleep(1.0)
            await balancer.remove("A")
            answer = await anyio.to_thread.run_sync(caller.answer)
        sent = await sessions(balancer)
    assert "the engine ended the stream with an error (500 InternalServerError: EngineCore" in a.log
    assert sent[replica.port] >= 1, sent  # the continuation went to B
    check(answer, reference, proxy)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_stream_handed_off_at_the_drain_reaches_the_caller_whole_through_litellm(
    replica: VllmServer,
    reference: Reference,
    handing_off: VllmServer,
    tmp_path: Path,
    provider: str,
) -> None:
    """1. replica B (the shared one) streamed the request alone: the reference token ids and text
    2. replica A (GRACEFUL_HANDOFF_STREAMS=1) alone behind HAProxy; curl -N streams the same greedy
       request through LiteLLM's opted-in ``<provider>/<model>`` deployment, so to A
    3. B joins; A is drained (graceful drain --propagation-wait 0): it hands the stream off with the
       resumable final event, and the drain ends while the caller still reads
    4. inside LiteLLM the transport continues the stream on B (A, still listed, refuses with the
       not-started 503 any continuation sent to it): curl reads the reference's token ids and text
       exactly, one finish, one [DONE], the whole usage; LiteLLM logged the request once, with every
       completion token"""
    a = handing_off
    async with gateway(tmp_path, provider, a) as (balancer, proxy):
        async with streaming(proxy, reference.tokens) as caller:
            await balancer.add("B", replica.port)
            hook = await anyio.to_thread.run_sync(
                lambda: graceful_cli(
                    "drain", "--socket-dir", a.socket_dir, "--propagation-wait", "0", "--grace-period", "60"
                )
            )
            reading = caller.process.poll() is None
            answer = await anyio.to_thread.run_sync(caller.answer)
        sent = await sessions(balancer)
    assert hook.returncode == 0, (hook.stdout, hook.stderr)
    assert "; 1 stream handed off" in hook.stderr, hook.stderr
    assert reading, "the drain waited for the stream to end"
    assert sent[replica.port] >= 1, sent  # the continuation went to B
    check(answer, reference, proxy)
