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

The Responses tests send ``/v1/responses`` through the same deployments, which LiteLLM sends to vLLM's own
``/v1/responses`` (its native path); their callers are ``curl -N`` and the Node SDK's
``responses.create({stream: true})`` and ``responses.stream()``. vLLM streams no token ids there: a
continuation carries text, so each answer is the uncut one up to the cut (docs/resume.md, "The Responses API").
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from examples.rollout.balancer import HAProxy, open_balancer
from examples.rollout.haproxy import find_haproxy
from tests.litellm.proxy import (
    Answer,
    Caller,
    LiteLLMProxy,
    ResponsesAnswer,
    deployment,
    needs_litellm,
    node_available,
    parse_responses,
    request_body,
    write_config,
)
from tests.vllm.conftest import VllmServer, serving
from tests.vllm.test_vllm import (
    RECIPE,
    engine_core,
    graceful_cli,
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


# -- the native Responses path: LiteLLM sends /v1/responses to vLLM's own ------------------------------------

# Greedy, every token asked for. LiteLLM passes a Responses request's extra_body to the deployment (it drops
# vLLM's own ignore_eos given at the top level).
RESPONSES_EXTRA = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def responses_reference(shared_replica: VllmServer) -> ResponsesAnswer:
    """The Responses callers' request, sent to B alone with curl -N, uncut; sized as ``reference`` is."""
    replica = serving(shared_replica)
    tokens = max(tokens_for(replica, 12) for _ in range(2))
    body = request_body(replica.model, tokens, {"temperature": 0, "ignore_eos": True}, api="responses")
    with httpx.Client(timeout=180) as plain, plain.stream("POST", replica.url("/v1/responses"), json=body) as answer:
        assert answer.status_code == 200
        uncut = parse_responses([line for line in answer.iter_lines() if line.strip()])
    assert uncut.error is None and uncut.final is not None and uncut.final["usage"]["output_tokens"] == tokens
    return uncut


class ResponsesCallers:
    """curl -N and, where node is installed, the Node SDK's responses.create({stream: true}) and
    responses.stream(), each streaming the reference's request through the proxy's /v1/responses."""

    def __init__(self, proxy: LiteLLMProxy, tokens: int) -> None:
        kinds = ["curl", "node-create", "node-stream"] if node_available() else ["curl"]
        self.callers = [
            Caller(kind, proxy.base, MODEL, tokens, extra=RESPONSES_EXTRA, api="responses") for kind in kinds
        ]

    async def reading(self) -> None:
        """Until every caller has read text: the cut must come after some."""
        for caller in self.callers:
            assert await anyio.to_thread.run_sync(caller.reading.wait, 60), f"{caller.kind} read nothing"
            with anyio.fail_after(60):
                while not caller.text_so_far():
                    await anyio.sleep(0.05)

    def heads(self) -> dict[str, str]:
        """What each caller has read so far: the cut comes after it."""
        return {caller.kind: caller.text_so_far() for caller in self.callers}

    def running(self) -> bool:
        return all(caller.process.poll() is None for caller in self.callers)

    async def answers(self) -> dict[str, ResponsesAnswer]:
        return {caller.kind: await anyio.to_thread.run_sync(caller.responses_answer) for caller in self.callers}

    def stop(self) -> None:
        for caller in self.callers:
            if caller.process.poll() is None:
                caller.process.kill()
                caller.process.wait(10)


def check_responses(answers: dict[str, ResponsesAnswer], heads: dict[str, str], uncut: ResponsesAnswer) -> None:
    """Each caller read one response: one id, one run of sequence numbers from 0, response.completed with the
    deltas' text and every output token asked for, and the reference's text up to the cut (docs/resume.md,
    "The Responses API": exact to the cut, not always after). Its input tokens are the continuation's less
    those carried, as counted there: vLLM's template and the text carried, tokenized again, make them differ
    from the uncut run's."""
    assert uncut.final is not None
    wrong = [
        f"{kind}: {problem}" for kind, answer in answers.items() for problem in _problems(answer, heads[kind], uncut)
    ]
    assert not wrong, wrong


def _problems(answer: ResponsesAnswer, head: str, uncut: ResponsesAnswer) -> list[str]:
    """What is wrong with one caller's answer (check_responses's rules)."""
    assert uncut.final is not None
    if answer.error is not None or answer.final is None:
        return [f"no response: {answer.error}"]
    problems = []
    if len(answer.ids) != 1 or answer.sequence != list(range(len(answer.sequence))):
        problems.append(f"ids {answer.ids}, sequence numbers {answer.sequence[:6]}...")
    if answer.final["event"] != "response.completed" or answer.final["text"] != answer.text:
        problems.append(f"{answer.final['event']}'s text is not the deltas'")
    if answer.final["usage"]["output_tokens"] != uncut.final["usage"]["output_tokens"]:
        problems.append(f"usage {answer.final['usage']}")
    if not (head and answer.text.startswith(head) and uncut.text.startswith(head)):
        problems.append(f"not the reference's text up to the cut (read before it: {head[-40:]!r})")
    return problems


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_responses_stream_handed_off_at_the_drain_reaches_the_caller_as_one_response_through_litellm(
    replica: VllmServer,
    responses_reference: ResponsesAnswer,
    handing_off: VllmServer,
    tmp_path: Path,
    provider: str,
) -> None:
    """1. replica B (the shared one) answered the Responses request alone: the reference
    2. replica A (GRACEFUL_HANDOFF_STREAMS=1) alone behind HAProxy; curl -N and the Node SDK's create and
       stream send it through LiteLLM's opted-in ``<provider>/<model>`` deployment, whose native path sends
       it to A's own /v1/responses
    3. B joins; A is drained (graceful drain --propagation-wait 0): it hands every stream off with the
       Responses final event, and the drain ends while the callers still read
    4. inside LiteLLM the transport continues each on B: every caller reads one response, the reference's
       text up to the cut, with the whole usage"""
    a = handing_off
    assert responses_reference.final is not None
    tokens = responses_reference.final["usage"]["output_tokens"]
    async with gateway(tmp_path, provider, a) as (balancer, proxy):
        callers = ResponsesCallers(proxy, tokens)
        try:
            await callers.reading()
            await balancer.add("B", replica.port)
            heads = callers.heads()
            hook = await anyio.to_thread.run_sync(
                lambda: graceful_cli(
                    "drain", "--socket-dir", a.socket_dir, "--propagation-wait", "0", "--grace-period", "60"
                )
            )
            reading = callers.running()
            answers = await callers.answers()
        finally:
            callers.stop()
        sent = await sessions(balancer)
    assert hook.returncode == 0, (hook.stdout, hook.stderr)
    assert f"; {len(answers)} stream" in hook.stderr and "handed off" in hook.stderr, hook.stderr
    assert reading, "the drain waited for the streams to end"
    assert sent[replica.port] >= 1, sent  # the continuations went to B
    check_responses(answers, heads, responses_reference)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_responses_stream_whose_engine_died_reaches_the_caller_as_one_response_through_litellm(
    replica: VllmServer,
    responses_reference: ResponsesAnswer,
    start_vllm: Callable[..., VllmServer],
    tmp_path: Path,
    provider: str,
) -> None:
    """1. the reference on B  2. the callers stream through LiteLLM's ``<provider>/`` deployment (native
    Responses) to replica A alone  3. B joins; A's engine core is SIGKILLed mid-stream: graceful ends each
    stream with its final event  4. A stays listed 1 s more, then HAProxy drops it  5. inside LiteLLM the
    transport continues each on B: one response each, the reference's text up to the cut"""
    assert responses_reference.final is not None
    tokens = responses_reference.final["usage"]["output_tokens"]
    a = start_vllm(**RECIPE)
    async with gateway(tmp_path, provider, a) as (balancer, proxy):
        callers = ResponsesCallers(proxy, tokens)
        try:
            await callers.reading()
            await balancer.add("B", replica.port)
            heads = callers.heads()
            os.kill(engine_core(a), signal.SIGKILL)
            await anyio.sleep(1.0)
            await balancer.remove("A")
            answers = await callers.answers()
        finally:
            callers.stop()
        sent = await sessions(balancer)
    assert sent[replica.port] >= 1, sent
    check_responses(answers, heads, responses_reference)
