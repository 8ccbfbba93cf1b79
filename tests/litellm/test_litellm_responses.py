"""Every API through a real LiteLLM proxy: the native Responses path, the bridged one and Completions, resumed
for opted-in deployments and untouched for the others, read by callers that run none of graceful's code.

One LiteLLM proxy serves the whole module (its start-up takes seconds), with graceful's handler in its
callbacks. Its deployments lead to HAProxy in mode tcp, like a Service, in front of the example-server
replicas each test starts (graceful inside), and to a recording upstream. The callers are ``curl -N`` on
LiteLLM's ``/v1/responses`` and ``/v1/completions`` and, where node is installed, the openai SDK for Node
(``responses.create({stream: true})`` and ``responses.stream()``). Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from examples.rollout.balancer import HAProxy
from examples.rollout.replica import Replica as ProcessReplica
from examples.rollout.replica import ReplicaSettings
from graceful._asgi._frames import responses_final_event, resumable_final_frame
from graceful._asgi._types import Receive, Scope, Send
from tests.litellm.proxy import (
    PROMPT,
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
from tests.litellm.test_litellm import streaming_on
from tests.resume_utils import TOKENS_PER_SECOND, expected_text, replica, service
from tests.utils import ROOT, run_uvicorn

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300), needs_litellm]

TOKENS = 160  # 4 s at the example engine's 40 tokens per second: still running at every cut
PROVIDERS = ["openai", "hosted_vllm"]
MODEL = "graceful-example"
DOCS_BRIDGED = Path(ROOT) / "docs_src" / "litellm" / "bridged.yaml"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the module, so that its proxy, balancer and recorder serve every test."""
    return "asyncio"


# -- a recording upstream: which requests are marked, and which are continued ----------------------------


class Recorder:
    """An upstream that records each request's path, headers and body. Every first request gets three words
    and then graceful's final event (resumable where the request was marked); a continuation gets "four" and
    the answer's end. Chat, completions and Responses, each in vLLM's framing."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["path"].rstrip("/")
        api = next((name for name in ("chat", "completions", "responses") if path.endswith(_PATHS[name])), None)
        if scope["method"] != "POST" or api is None:
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        headers = {name.decode(): value.decode() for name, value in scope["headers"]}
        payload = json.loads(body)
        self.requests.append((api, headers, payload))
        marked = headers.get("x-graceful-resumable") == "1"
        frames = _responses(payload, marked) if api == "responses" else _chunks(api, payload, marked)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for frame in frames:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    def marks(self, api: str) -> list[str | None]:
        """The x-graceful-resumable header of each request of ``api`` so far."""
        return [headers.get("x-graceful-resumable") for name, headers, _ in self.requests if name == api]


_PATHS = {"chat": "/chat/completions", "completions": "/completions", "responses": "/responses"}


def _continued(api: str, payload: dict[str, Any]) -> bool:
    if api == "chat":
        return bool(payload.get("continue_final_message"))
    if api == "completions":
        return payload.get("prompt") != PROMPT
    given = payload.get("input")
    return isinstance(given, list) and given[-1].get("status") == "incomplete"


def _chunks(api: str, payload: dict[str, Any], marked: bool) -> list[bytes]:
    first = not _continued(api, payload)
    words = ["one ", "two ", "three "] if first else ["four"]
    frames = []
    for index, word in enumerate(words):
        finish = None if first or index < len(words) - 1 else "stop"
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        choice.update({"delta": {"content": word}} if api == "chat" else {"text": word})
        kind = "chat.completion.chunk" if api == "chat" else "text_completion"
        chunk = {"id": "cmpl-r", "object": kind, "created": 1, "model": "m", "choices": [choice]}
        frames.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    if first:
        final = resumable_final_frame(b"text/event-stream") if marked else None
        frames.append(final or b'data: {"error":{"type":"server_shutdown","retryable":true,"code":503}}\n\n')
    else:
        frames.append(b"data: [DONE]\n\n")
    return frames


def _responses(payload: dict[str, Any], marked: bool) -> list[bytes]:
    first = not _continued("responses", payload)
    item = {"id": "msg_r", "content": [], "role": "assistant", "status": "in_progress", "type": "message"}
    begun = {"id": "resp_r", "object": "response", "created_at": 1, "model": "m", "status": "in_progress",
             "output": [], "usage": None}  # fmt: skip
    at = {"content_index": 0, "item_id": "msg_r", "output_index": 0}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": begun},
        {"type": "response.in_progress", "response": begun},
        {"type": "response.output_item.added", "item": item, "output_index": 0},
        {"type": "response.content_part.added", **at, "part": {"type": "output_text", "text": "", "annotations": []}},
    ]
    words = ["one ", "two ", "three "] if first else ["four"]
    events += [{"type": "response.output_text.delta", **at, "delta": word, "logprobs": []} for word in words]
    if not first:
        part = {"type": "output_text", "text": "four", "annotations": []}
        done = {**item, "status": "completed", "content": [part]}
        usage = {"input_tokens": 8, "output_tokens": 1, "total_tokens": 9}
        events += [
            {"type": "response.output_text.done", **at, "text": "four", "logprobs": []},
            {"type": "response.content_part.done", **at, "part": part},
            {"type": "response.output_item.done", "item": done, "output_index": 0},
            {
                "type": "response.completed",
                "response": {**begun, "status": "completed", "output": [done], "usage": usage},
            },
        ]
    frames = [
        f"event: {event['type']}\ndata: ".encode() + json.dumps({**event, "sequence_number": number}).encode() + b"\n\n"
        for number, event in enumerate(events)
    ]
    if first:
        frames.append(responses_final_event(len(events), resumable=marked))
    return frames


# -- the module's proxy ----------------------------------------------------------------------------------


@dataclass
class Gateway:
    """The module's LiteLLM proxy, the balancer its example deployments lead to, and the recording upstream."""

    proxy: LiteLLMProxy
    balancer: HAProxy
    recorder: Recorder


@pytest.fixture(scope="module")
async def gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    """Deployments, all opted in but the ``plain-*`` ones: ``openai`` and ``hosted_vllm`` (native Responses)
    and ``bridged`` (docs/litellm.md's, ``use_chat_completions_api: true``) at the balancer; ``recorded-*``
    and ``plain-*`` of each at the recorder. The proxy serves a short stream of each API before the tests:
    its lazy set-up is paid."""
    tmp = tmp_path_factory.mktemp("litellm-responses")
    recorder = Recorder()
    async with service() as balancer, run_uvicorn(recorder, lifespan="off") as upstream:
        replicas = f"http://127.0.0.1:{balancer.port}/v1"
        recording = f"http://127.0.0.1:{upstream.port}/v1"
        bridge = {"use_chat_completions_api": True}
        entries = [bridged_deployment(replicas)]
        for provider in PROVIDERS:
            entries.append(deployment(provider, f"{provider}/{MODEL}", replicas, resume=True))
            entries.append(deployment(f"recorded-{provider}", f"{provider}/m", recording, resume=True))
            entries.append(deployment(f"plain-{provider}", f"{provider}/m", recording, resume=False))
        entries.append(deployment("recorded-bridged", "openai/m", recording, resume=True, **bridge))
        entries.append(deployment("plain-bridged", "openai/m", recording, resume=False, **bridge))
        proxy = LiteLLMProxy(write_config(tmp / "config.yaml", entries), tmp / "litellm.log")
        try:
            await anyio.to_thread.run_sync(proxy.wait_serving)
            for api in ("chat", "responses"):
                await anyio.to_thread.run_sync(
                    Caller("curl", proxy.base, "recorded-hosted_vllm", 16, api=api).ended, 60
                )
            recorder.requests.clear()
            yield Gateway(proxy, balancer, recorder)
        finally:
            proxy.stop()


def bridged_deployment(api_base: str) -> dict[str, Any]:
    """docs/litellm.md's deployment for the bridge (docs_src/litellm/bridged.yaml), named ``bridged``, its model
    the example's at ``api_base``."""
    (entry,) = yaml.safe_load(DOCS_BRIDGED.read_text())["model_list"]
    params = entry["litellm_params"]
    assert params["use_chat_completions_api"] is True and entry["model_info"] == {"graceful_resume": True}
    provider = params["model"].split("/", 1)[0]
    params.update(model=f"{provider}/{MODEL}", api_base=api_base, api_key="unused")
    return {**entry, "model_name": "bridged"}


@contextlib.asynccontextmanager
async def behind(balancer: HAProxy, *replicas: tuple[str, int]) -> AsyncIterator[None]:
    """``replicas`` (name, port) in the balancer for the test, taken out after it."""
    try:
        for name, port in replicas:
            await balancer.add(name, port)
        yield
    finally:
        for name in balancer.endpoints():
            await balancer.remove(name)


# -- the callers -------------------------------------------------------------------------------------------


class Callers:
    """Callers through the proxy on one deployment: ``curl -N`` on /v1/responses, the Node SDK's
    ``responses.create({stream: true})`` and ``responses.stream()`` (where node is installed), and, with
    ``completions``, ``curl -N`` on /v1/completions."""

    def __init__(self, proxy: LiteLLMProxy, model: str, *, completions: bool = True) -> None:
        kinds = ["curl", "node-create", "node-stream"] if node_available() else ["curl"]
        self.responses = [Caller(kind, proxy.base, model, TOKENS, api="responses") for kind in kinds]
        self.completions = [Caller("curl", proxy.base, model, TOKENS, api="completions")] if completions else []

    def __len__(self) -> int:
        return len(self.responses) + len(self.completions)

    async def reading(self) -> None:
        """Until every caller has read its first lines."""
        for caller in [*self.responses, *self.completions]:
            assert await anyio.to_thread.run_sync(caller.reading.wait, 60), f"{caller.kind} read nothing"

    async def answers(self) -> tuple[dict[str, ResponsesAnswer], list[Answer]]:
        responses = {caller.kind: await anyio.to_thread.run_sync(caller.responses_answer) for caller in self.responses}
        return responses, [await anyio.to_thread.run_sync(caller.answer) for caller in self.completions]

    def running(self) -> bool:
        """Whether every caller is still reading."""
        return all(caller.process.poll() is None for caller in [*self.responses, *self.completions])

    def stop(self) -> None:
        for caller in [*self.responses, *self.completions]:
            if caller.process.poll() is None:
                caller.process.kill()
                caller.process.wait(10)


@contextlib.contextmanager
def calling(proxy: LiteLLMProxy, model: str, *, completions: bool = True) -> Iterator[Callers]:
    callers = Callers(proxy, model, completions=completions)
    try:
        yield callers
    finally:
        callers.stop()


async def uncut_on(port: int) -> ResponsesAnswer:
    """The callers' Responses request sent straight to an example replica, uncut."""
    body = json.dumps(request_body(MODEL, TOKENS, api="responses"))
    command = ["curl", "-sS", "-N", "--max-time", "60", f"http://127.0.0.1:{port}/v1/responses",
               "-H", "content-type: application/json", "-d", body]  # fmt: skip
    done = await anyio.run_process(command, check=True)
    return parse_responses([line for line in done.stdout.decode().splitlines() if line.strip()])


async def check(
    responses: dict[str, ResponsesAnswer],
    completions: list[Answer],
    uncut: ResponsesAnswer,
    logged: Logged,
    *,
    also: int = 0,
) -> None:
    """Each Responses caller read one response equal to the uncut run; each completions caller the exact
    text, one finish, one [DONE] and the whole usage. LiteLLM logged each request once (and ``also`` more of
    the same length), with every completion token."""
    entries = await logged.entries(len(responses) + len(completions) + also)
    assert [entry["completion_tokens"] for entry in entries] == [TOKENS] * len(entries), entries
    assert uncut.text == expected_text(TOKENS)
    for kind, answer in responses.items():
        try:
            answer.assert_like(uncut)
        except AssertionError as failed:
            raise AssertionError(f"{kind}: {failed}") from None
    for answer in completions:
        answer.assert_whole(expected_text(TOKENS), TOKENS)


class Logged:
    """The proxy's usage log of one deployment from here on (tests/litellm/usage_log.py: one line per request
    LiteLLM logged)."""

    def __init__(self, proxy: LiteLLMProxy, model: str) -> None:
        self.proxy = proxy
        self.model = model
        self.start = len(proxy.usage())

    def _since(self) -> list[dict[str, Any]]:
        return [entry for entry in self.proxy.usage()[self.start :] if entry["model_group"] == self.model]

    async def entries(self, count: int) -> list[dict[str, Any]]:
        """The deployment's entries logged since, once there are ``count`` (LiteLLM logs after a stream's end),
        and a moment more for any that should not be there."""
        with anyio.fail_after(10):
            while len(self._since()) < count:
                await anyio.sleep(0.05)
        await anyio.sleep(0.5)
        return self._since()


# -- the native Responses path, and completions, across a handoff drain and a SIGKILL -----------------------


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_drain_with_handoff_is_continued_on_every_path(gateway: Gateway, provider: str) -> None:
    """1. curl -N on /v1/responses, the Node SDK's responses.create({stream: true}) and responses.stream(),
    and curl -N on /v1/completions stream through LiteLLM's opted-in ``<provider>/`` deployment (its native
    Responses path) to replica A (handoff_streams on)  2. B joins the balancer; A drains (propagation wait 0):
    it hands every stream off with graceful's resumable final event, and returns within 4 s while they run
    3. inside LiteLLM the transport continues each on B  4. every Responses caller reads one response equal to
    an uncut run on the example server; the completions caller the exact text, one finish, one [DONE]"""
    async with replica("a", handoff_streams=True) as a, replica("b") as b:
        uncut = await uncut_on(b.port)
        async with behind(gateway.balancer, (a.name, a.port)):
            logged = Logged(gateway.proxy, provider)
            with calling(gateway.proxy, provider) as callers:
                await streaming_on(a, len(callers))
                await gateway.balancer.add(b.name, b.port)
                result = await a.app.drain.drain(reason="rollout", propagation_wait=0)
                reading = callers.running()
                responses, completions = await callers.answers()
    assert result.drained and result.handed_off == len(callers), result
    assert result.duration < 4 and reading, (result.duration, reading)  # the drain did not wait for the streams
    await check(responses, completions, uncut, logged)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_replica_killed_mid_stream_is_continued_on_every_path(
    gateway: Gateway, provider: str, tmp_path: Path
) -> None:
    """1. the same callers stream through LiteLLM's ``<provider>/`` deployment to replica K (its own
    `graceful run` process)  2. B joins; K is SIGKILLed: every stream is cut with no final event
    3. continued on B (K's dead endpoint is still listed: its refused continuations are sent again)
    4. every Responses caller reads one response equal to an uncut run; the completions caller the exact
    text, one finish, one [DONE]"""
    settings = ReplicaSettings(
        kind="graceful", grace_period=30, propagation_wait=0.2, tokens_per_second=TOKENS_PER_SECOND, load_delay=0.0,
        log_dir=str(tmp_path),
    )  # fmt: skip
    killed = ProcessReplica("k", settings)
    await killed.start()
    try:
        await killed.wait_started(timeout=30)
        async with replica("b") as b:
            uncut = await uncut_on(b.port)
            async with behind(gateway.balancer, ("k", killed.port)):
                logged = Logged(gateway.proxy, provider)
                with calling(gateway.proxy, provider) as callers:
                    await callers.reading()
                    await gateway.balancer.add(b.name, b.port)
                    killed.kill()
                    responses, completions = await callers.answers()
    finally:
        await killed.stop()
    await check(responses, completions, uncut, logged)


async def test_the_bridged_responses_path_is_continued(gateway: Gateway) -> None:
    """1. docs/litellm.md's deployment with ``use_chat_completions_api: true`` (``hosted_vllm/``): LiteLLM
    answers /v1/responses with a chat call to the replica, which graceful's handler sees as one  2. an uncut
    run through it, then curl -N and the Node SDK through it to replica A (handoff_streams on)  3. B joins,
    A drains and hands the chat streams off  4. every caller reads one response equal to the uncut run through
    the bridge; LiteLLM logged each once, with every completion token"""
    async with replica("a", handoff_streams=True) as a, replica("b") as b:
        async with behind(gateway.balancer, (a.name, a.port)):
            logged = Logged(gateway.proxy, "bridged")
            uncut = await anyio.to_thread.run_sync(
                Caller("curl", gateway.proxy.base, "bridged", TOKENS, api="responses").responses_answer
            )
            with calling(gateway.proxy, "bridged", completions=False) as callers:
                await streaming_on(a, len(callers))
                await gateway.balancer.add(b.name, b.port)
                result = await a.app.drain.drain(reason="rollout", propagation_wait=0)
                responses, _ = await callers.answers()
    assert result.drained and result.handed_off == len(callers) and result.duration < 4, result
    await check(responses, [], uncut, logged, also=1)  # the uncut run's


# -- which deployments resume -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["openai", "hosted_vllm", "bridged"])
async def test_only_opted_in_deployments_are_marked_and_continued_on_every_path(gateway: Gateway, path: str) -> None:
    """1. for each API LiteLLM serves on this path (chat, completions and Responses on the native paths,
    Responses through the bridge), a call to the opted-in ``recorded-<path>`` deployment and one to
    ``plain-<path>``, at the same upstream  2. the upstream cuts each first stream with graceful's final event
    3. opted in: marked x-graceful-resumable and continued; the caller reads one whole answer
    4. not opted in: no header, no continuation; LiteLLM hands the caller the cut"""
    recorder = gateway.recorder
    apis = ["responses"] if path == "bridged" else ["chat", "completions", "responses"]
    for api in apis:
        upstream = "chat" if path == "bridged" else api
        for opted in (True, False):
            recorder.requests.clear()
            model = f"{'recorded' if opted else 'plain'}-{path}"
            caller = Caller("curl", gateway.proxy.base, model, 16, api=api)
            answer = await anyio.to_thread.run_sync(caller.ended, 60)
            marks = recorder.marks(upstream)
            where = f"{api} on {model}"
            if opted:
                assert marks == ["1", "1"], (
                    where,
                    marks,
                    [(n, h.get("x-graceful-resumable"), list(b)) for n, h, b in recorder.requests],
                    answer,
                )
                assert answer.error is None and answer.text == "one two three four", (where, answer)
            else:
                assert marks == [None], (where, marks)
                assert answer.error is not None and answer.text == "one two three ", (where, answer)
