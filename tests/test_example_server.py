"""The example inference server: OpenAI shapes, slots and queue, probes, idempotency, metrics, drain."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import httpx
import openai
import pytest
from asgi_lifespan import LifespanManager
from click.testing import CliRunner
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import graceful
from examples.server import ENV, Config, ExampleServer, create_app
from examples.server.__main__ import cli
from graceful import ConfigError, State
from tests.resume_utils import replica, service
from tests.utils import run_uvicorn

pytestmark = pytest.mark.anyio

FAST = Config(tokens_per_second=1000.0, load_delay=0.0, slots=2, queue_size=2)


def make(registry: CollectorRegistry, config: Config = FAST, **options: Any) -> ExampleServer:
    return create_app(config, registry=registry, admin=False, name="pod-a", **options)


@asynccontextmanager
async def client(app: ExampleServer) -> AsyncIterator[httpx.AsyncClient]:
    async with LifespanManager(app, startup_timeout=5):
        with anyio.fail_after(5):
            while app.drain.state is State.STARTING:
                await anyio.sleep(0.001)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield http


def sse_events(body: str) -> list[str]:
    return [line[len("data: ") :] for line in body.split("\n\n") if line.startswith("data: ")]


async def wait_for(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not condition():
            await anyio.sleep(0.002)


async def test_completion_json_shape(registry: CollectorRegistry) -> None:
    app = make(registry)
    async with client(app) as http:
        response = await http.post("/v1/completions", json={"model": "m", "prompt": "one two three", "max_tokens": 5})
    assert response.status_code == 200
    assert response.headers["x-served-by"] == "pod-a"
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["model"] == FAST.model
    assert body["choices"][0]["text"] == "tok0 tok1 tok2 tok3 tok4"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


async def test_chat_stream_one_event_per_token_then_done(registry: CollectorRegistry) -> None:
    app = make(registry)
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    async with client(app) as http:
        response = await http.post("/v1/chat/completions", json=payload)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 4
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "tok0"}
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == "tok0 tok1 tok2 tok3"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]


async def test_models_and_default_max_tokens(registry: CollectorRegistry) -> None:
    app = make(registry, Config(load_delay=0.0, tokens_per_second=1000.0, default_max_tokens=3, model="tiny"))
    async with client(app) as http:
        models = (await http.get("/v1/models")).json()
        chat = await http.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "u", "content": ""}]}
        )
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert chat.json()["choices"][0]["message"]["content"] == "tok0 tok1 tok2"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", b"{not json", None),
        ("/v1/completions", b"[1, 2]", None),
        ("/v1/completions", b'{"prompt": "x"}', "model"),
        ("/v1/completions", b'{"model": "m"}', "prompt"),
        ("/v1/completions", b'{"model": "m", "prompt": "x", "max_tokens": 0}', "max_tokens"),
        ("/v1/completions", b'{"model": "m", "prompt": "x", "max_tokens": true}', "max_tokens"),
        ("/v1/completions", b'{"model": "m", "prompt": "x", "max_tokens": 99999}', "max_tokens"),
        ("/v1/completions", b'{"model": "m", "prompt": "x", "stream": "yes"}', "stream"),
        ("/v1/chat/completions", b'{"model": "m", "messages": []}', "messages"),
        ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "u", "content": 3}]}', "messages[0].content"),
    ],
)
async def test_bad_requests_get_400_naming_the_field(
    registry: CollectorRegistry, path: str, body: bytes, param: str | None
) -> None:
    app = make(registry)
    async with client(app) as http:
        response = await http.post(path, content=body)
        after = await http.get("/debug/executions")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]
    assert app.engine.running == 0
    assert after.json() == {}


async def test_model_load_delay_keeps_startup_and_ready_unready(registry: CollectorRegistry) -> None:
    """1. app starts with a 0.3 s load 2. probes during the load 3. probes after it."""
    app = make(registry, Config(load_delay=0.3, tokens_per_second=1000.0))
    async with LifespanManager(app, startup_timeout=5):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            assert (await http.get("/startup")).status_code == 503
            assert (await http.get("/ready")).status_code == 503
            assert (await http.get("/live")).status_code == 200
            early = await http.post("/v1/completions", json={"model": "m", "prompt": "x"})
            assert early.status_code == 503
            assert early.json()["error"]["type"] == "server_starting"
            assert early.headers["x-served-by"] == "pod-a"
            await wait_for(lambda: app.drain.state is State.SERVING)
            assert (await http.get("/startup")).status_code == 200
            assert (await http.get("/ready")).status_code == 200


async def test_slots_then_queue_then_overload(registry: CollectorRegistry) -> None:
    """2 slots, 2 queue places: the 5th concurrent request is refused with a retryable 503."""
    app = make(registry, Config(tokens_per_second=50.0, load_delay=0.0, slots=2, queue_size=2))
    results: list[httpx.Response] = []
    async with client(app) as http:

        async def one() -> None:
            results.append(await http.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 10}))

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(one)
            await wait_for(lambda: app.engine.running == 2 and app.engine.waiting == 2)
            refused = await http.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 10})
        assert refused.status_code == 503
        assert refused.json()["error"]["type"] == "server_overloaded"
        assert refused.headers["retry-after"] == "1"
    assert [r.status_code for r in results] == [200] * 4
    assert app.engine.running == 0 and app.engine.waiting == 0


async def test_metrics_page_shows_running_and_waiting(registry: CollectorRegistry) -> None:
    app = make(registry, Config(tokens_per_second=50.0, load_delay=0.0, slots=1, queue_size=4, model="m1"))

    def gauges(page: str) -> dict[str, float]:
        found: dict[str, float] = {}
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.name.startswith("vllm:num_requests_"):
                    assert sample.labels == {"model_name": "m1", "engine": "0"}
                    found[sample.name] = sample.value
                elif sample.name == "graceful_in_flight":
                    found[sample.name] = sample.value
        return found

    async with client(app) as http:
        assert gauges((await http.get("/metrics")).text) == {
            "vllm:num_requests_running": 0.0,
            "vllm:num_requests_waiting": 0.0,
            "graceful_in_flight": 0.0,
        }
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(
                    partial(http.post, "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 5})
                )
            await wait_for(lambda: app.engine.waiting == 2)
            assert gauges((await http.get("/metrics")).text) == {
                "vllm:num_requests_running": 1.0,
                "vllm:num_requests_waiting": 2.0,
                "graceful_in_flight": 3.0,
            }


async def test_idempotency_replays_and_counts_executions(registry: CollectorRegistry) -> None:
    app = make(registry, Config(tokens_per_second=100.0, load_delay=0.0))
    payload = {"model": "m", "prompt": "x", "max_tokens": 3, "stream": True}
    async with client(app) as http:
        async with anyio.create_task_group() as tg:
            first: list[httpx.Response] = []

            async def run_first() -> None:
                first.append(await http.post("/v1/completions", json=payload, headers={"Idempotency-Key": "k1"}))

            tg.start_soon(run_first)
            await wait_for(lambda: app.store.running("k1"))
            busy = await http.post("/v1/completions", json=payload, headers={"Idempotency-Key": "k1"})
        replay = await http.post("/v1/completions", json=payload, headers={"Idempotency-Key": "k1"})
        other = await http.post("/v1/completions", json=payload, headers={"Idempotency-Key": "k2"})
        counts = (await http.get("/debug/executions")).json()
    assert busy.status_code == 409
    assert busy.json()["error"]["param"] == "Idempotency-Key"
    assert "x-idempotent-replay" not in first[0].headers
    assert replay.headers["x-idempotent-replay"] == "true"
    assert replay.text == first[0].text
    assert sse_events(replay.text)[-1] == "[DONE]"
    assert "x-idempotent-replay" not in other.headers
    assert counts == {"k1": 1, "k2": 1}
    assert app.engine.generated_tokens == 6


async def test_idempotency_store_is_bounded(registry: CollectorRegistry) -> None:
    app = make(registry, Config(tokens_per_second=1000.0, load_delay=0.0, idempotency_keys=2))
    async with client(app) as http:
        for key in ("a", "b", "c"):
            await http.post(
                "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}, headers={"Idempotency-Key": key}
            )
        again = await http.post(
            "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}, headers={"Idempotency-Key": "a"}
        )
    assert "x-idempotent-replay" not in again.headers  # "a" was evicted, so it ran again
    assert app.store.lookup("c") is not None
    assert len(app.store.executions()) == 2


async def test_queued_requests_finish_during_drain_and_new_ones_are_refused(registry: CollectorRegistry) -> None:
    """1. one slot busy, one request queued 2. drain begins 3. a new request -> 503 4. both admitted ones finish."""
    app = make(registry, Config(tokens_per_second=100.0, load_delay=0.0, slots=1, queue_size=4))
    results: list[httpx.Response] = []
    async with client(app) as http:

        async def one() -> None:
            results.append(await http.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 10}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
            await wait_for(lambda: app.engine.running == 1 and app.engine.waiting == 1)
            app.drain.begin_drain("test")
            # From another connection: the busy ones are pinned (one more request each).
            other = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app, client=("10.0.0.9", 9)), base_url="http://t"
            )
            async with other:
                refused = await other.post("/v1/completions", json={"model": "m", "prompt": "x"})
            result = await app.drain.drain()
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "server_draining"
    assert [r.status_code for r in results] == [200, 200]
    assert all(r.json()["choices"][0]["text"].endswith("tok9") for r in results)
    assert result.drained


async def test_selftest_consumer_stops_taking_work_when_draining(registry: CollectorRegistry) -> None:
    app = make(registry, Config(tokens_per_second=1000.0, load_delay=0.0, selftest_interval=0.01))
    async with client(app):
        await wait_for(lambda: app.engine.selftests >= 2)
        result = await app.drain.drain()
        seen = app.engine.selftests
        await anyio.sleep(0.05)  # five intervals: a consumer that ignored the drain would run again
        assert app.engine.selftests == seen
    assert result.drained
    assert app.drain.counters()["requests"]["completed"] >= 2


async def test_stream_started_before_drain_ends_with_done_under_uvicorn(registry: CollectorRegistry) -> None:
    """1. a 20-token stream starts 2. after its first token the drain begins
    3. a new request gets 503 with X-Served-By 4. the stream ends with [DONE] 5. the drain reports drained."""
    app = make(registry, Config(tokens_per_second=100.0, load_delay=0.0))
    payload = {"model": "m", "prompt": "x", "max_tokens": 20, "stream": True}
    async with run_uvicorn(app) as server:
        await wait_for(lambda: app.drain.state is State.SERVING)
        base = f"http://127.0.0.1:{server.port}"
        async with httpx.AsyncClient(base_url=base, timeout=5) as http, anyio.create_task_group() as tg:
            events: list[str] = []
            drained: list[bool] = []
            async with http.stream("POST", "/v1/completions", json=payload) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    events.append(line[6:])
                    if len(events) == 1:

                        async def drain() -> None:
                            drained.append((await app.drain.drain(reason="test")).drained)

                        tg.start_soon(drain)
                        await wait_for(lambda: app.drain.state is State.DRAINING)
                        async with httpx.AsyncClient(base_url=base, timeout=5) as other:
                            refused = await other.post("/v1/completions", json=payload)
                        assert refused.status_code == 503
                        assert refused.headers["x-served-by"] == "pod-a"
                        assert refused.headers["x-graceful-not-started"] == "1"
                # Its headers went out before the drain, so only later responses carry Connection: close.
                assert response.headers.get("connection") != "close"
    assert events[-1] == "[DONE]"
    assert len(events) == 21
    assert drained == [True]


async def test_client_leaving_a_stream_frees_its_slot(registry: CollectorRegistry) -> None:
    app = make(registry, Config(tokens_per_second=50.0, load_delay=0.0, slots=1))
    payload = {"model": "m", "prompt": "x", "max_tokens": 500, "stream": True}
    async with run_uvicorn(app) as server:
        await wait_for(lambda: app.drain.state is State.SERVING)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5) as http:
            async with http.stream("POST", "/v1/completions", json=payload, headers={"Idempotency-Key": "gone"}) as r:
                async for _ in r.aiter_lines():
                    break
        await wait_for(lambda: app.engine.running == 0 and app.drain.in_flight == 0)
        assert not app.store.running("gone")
        assert app.store.lookup("gone") is None


def test_config_from_env_names_the_variable() -> None:
    config = Config.from_env({ENV["slots"]: "3", ENV["load_delay"]: "1m30s", ENV["tokens_per_second"]: "7.5"})
    assert (config.slots, config.load_delay, config.tokens_per_second) == (3, 90.0, 7.5)
    with pytest.raises(ConfigError, match="GRACEFUL_EXAMPLE_SLOTS.*'many'"):
        Config.from_env({ENV["slots"]: "many"})
    with pytest.raises(ConfigError, match="GRACEFUL_EXAMPLE_SLOTS"):
        Config.from_env({ENV["slots"]: "0"})
    with pytest.raises(ConfigError, match="GRACEFUL_EXAMPLE_LOAD_DELAY"):
        Config.from_env({ENV["load_delay"]: "soon"})


def test_serve_rejects_bad_flags_in_one_line() -> None:
    result = CliRunner().invoke(cli, ["serve", "--slots", "0"])
    assert result.exit_code == 2
    assert "slots=0" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(cli, ["serve", "--load-delay", "later"])
    assert result.exit_code == 2
    assert "'later'" in result.output


def test_drain_command_is_embedded() -> None:
    import graceful.cli as cli_module

    assert cli.commands["drain"] is cli_module.drain_command
    result = CliRunner().invoke(cli, ["drain", "--help"])
    assert result.exit_code == 0
    assert "--propagation-wait" in result.output


# -- the Responses API, in vLLM's framing (examples/server/_responses.py names the vLLM files) ------------


def responses_events(body: str) -> list[tuple[str, dict[str, Any]]]:
    """Each ``event: <type>`` / ``data: <json>`` pair of a Responses stream."""
    pairs = []
    for block in body.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if "event" in lines:
            pairs.append((lines["event"], json.loads(lines["data"])))
    return pairs


RESPONSES_OPENING = ["response.created", "response.in_progress", "response.output_item.added"]
RESPONSES_CLOSING = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


async def test_responses_stream_in_vllms_framing(registry: CollectorRegistry) -> None:
    """A streamed Responses answer: vLLM's events in vLLM's order, one delta per token, one run of sequence
    numbers from 0, and ``response.completed`` with the whole text, the usage and status ``incomplete`` (it
    ended at ``max_output_tokens``, as every answer of the example's "model" does)."""
    app = make(registry)
    payload = {"model": "m", "input": "Count for me please", "max_output_tokens": 4, "stream": True}
    async with client(app) as http:
        response = await http.post("/v1/responses", json=payload)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = responses_events(response.text)
    kinds = [kind for kind, _ in events]
    assert kinds == [*RESPONSES_OPENING, "response.content_part.added", *["response.output_text.delta"] * 4,
                     *RESPONSES_CLOSING]  # fmt: skip
    assert all(data["type"] == kind for kind, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert "".join(data["delta"] for kind, data in events if kind.endswith(".delta")) == "tok0 tok1 tok2 tok3"
    created, completed = events[0][1]["response"], events[-1][1]["response"]
    assert created["id"] == completed["id"] and created["id"].startswith("resp_") and created["status"] == "in_progress"
    assert completed["status"] == "incomplete" and completed["incomplete_details"] == {"reason": "max_output_tokens"}
    assert completed["output"][0]["content"][0]["text"] == "tok0 tok1 tok2 tok3"
    usage = completed["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (4, 4, 8)
    item = {data["item"]["id"] for kind, data in events if "item" in data}
    assert item == {data["item_id"] for _, data in events if "item_id" in data} and len(item) == 1


async def test_responses_not_streamed_and_continued(registry: CollectorRegistry) -> None:
    """The response as one JSON object; an assistant message last in ``input`` whose status is ``incomplete``
    is continued (vLLM's continue_final_message), and ``request_id`` names the response."""
    app = make(registry)
    carried = [
        {"role": "user", "content": "Count for me please"},
        {"type": "message", "role": "assistant", "status": "incomplete",
         "content": [{"type": "output_text", "text": "tok0 tok1"}]},
    ]  # fmt: skip
    async with client(app) as http:
        whole = await http.post("/v1/responses", json={"model": "m", "input": "Count for me please"})
        continued = await http.post(
            "/v1/responses", json={"model": "m", "input": carried, "max_output_tokens": 2, "request_id": "resp_x"}
        )
        refused = await http.post("/v1/responses", json={"model": "m", "input": "x", "previous_response_id": "r"})
        bad = await http.post("/v1/responses", json={"model": "m", "input": [{"type": "function_call"}]})
    body = whole.json()
    assert body["object"] == "response" and body["status"] == "incomplete"
    assert body["output"][0]["content"][0]["text"] == expected_tokens(FAST.default_max_tokens)
    assert body["usage"]["input_tokens"] == 4 and body["usage"]["output_tokens"] == FAST.default_max_tokens
    answer = continued.json()
    assert answer["id"] == "resp_x" and answer["output"][0]["content"][0]["text"] == " tok2 tok3"
    assert answer["usage"]["input_tokens"] == 4 + 2
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "previous_response_id"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[0]"


def expected_tokens(count: int) -> str:
    return " ".join(f"tok{i}" for i in range(count))


RESPONSES_TOKENS = 120  # 3 s at 40 tokens per second: still running when the drain hands it off


@dataclass
class ReadResponse:
    """What one openai SDK caller read of a Responses stream."""

    ids: set[str] = field(default_factory=set)
    sequence: list[int] = field(default_factory=list)
    text: str = ""
    final: dict[str, Any] = field(default_factory=dict)
    resumes: int = -1  # graceful_resumes, where the SDK shows the response

    def take(self, event: Any) -> None:
        self.sequence.append(event.sequence_number)
        if event.type in ("response.created", "response.completed"):
            self.ids.add(event.response.id)
        if event.type == "response.output_text.delta":
            self.text += event.delta
        if event.type == "response.completed":
            self.final = event.response.model_dump()


async def read_responses(url: str, how: str, seen: ReadResponse, reading: anyio.Event) -> None:
    """One Responses answer through the openai SDK over graceful's resuming transport: ``create`` is
    ``responses.create(stream=True)``, ``stream`` the ``responses.stream()`` helper."""
    http = httpx.AsyncClient(transport=graceful.AsyncResumingTransport(), timeout=30)
    sdk = openai.AsyncOpenAI(base_url=url, api_key="unused", http_client=http, max_retries=0)
    request = {"model": "graceful-example", "input": "Count for me please", "max_output_tokens": RESPONSES_TOKENS}
    async with sdk:
        if how == "create":
            stream = await sdk.responses.create(**request, stream=True)
            async with stream:
                async for event in stream:
                    seen.take(event)
                    if len(seen.sequence) == 8:
                        reading.set()
                seen.resumes = stream.response.extensions["graceful_resumes"]
        else:
            async with sdk.responses.stream(**request) as helper:
                async for event in helper:
                    seen.take(event)
                    if len(seen.sequence) == 8:
                        reading.set()
                whole = await helper.get_final_response()
            assert whole.output_text == seen.text


def same_answer(read: ReadResponse, uncut: ReadResponse) -> None:
    """One response: one id, one run of sequence numbers from 0, the deltas and response.completed with the
    uncut run's whole text and usage."""
    assert len(read.ids) == 1, read.ids
    assert read.sequence == list(range(len(uncut.sequence))), read.sequence
    assert read.text == uncut.text == expected_tokens(RESPONSES_TOKENS)
    [message] = read.final["output"]
    assert message["content"][0]["text"] == uncut.text and message["id"] != ""
    usage = ("input_tokens", "output_tokens", "total_tokens")
    assert {name: read.final["usage"][name] for name in usage} == {name: uncut.final["usage"][name] for name in usage}
    assert read.final["status"] == uncut.final["status"] == "incomplete"


async def test_responses_through_the_openai_sdk_continue_across_a_drain() -> None:
    """1. replica A alone behind the balancer; the openai SDK (``responses.create(stream=True)`` and
    ``responses.stream()``, over AsyncResumingTransport) streams one Responses answer each from it
    2. B joins; A drains with handoff_streams (propagation wait 0): it ends both streams with the Responses
    error event graceful sends, resumable  3. the transport continues each on B
    4. each caller read one response equal to an uncut run on B: one id, one run of sequence numbers,
    response.completed with the whole text and usage; A's drain ended within 4 s"""
    async with replica("a", handoff_streams=True) as a, replica("b") as b, service(a) as balancer:
        url = f"http://127.0.0.1:{balancer.port}/v1"
        uncut = ReadResponse()
        await read_responses(f"http://127.0.0.1:{b.port}/v1", "create", uncut, anyio.Event())
        seen = {how: ReadResponse() for how in ("create", "stream")}
        reading = {how: anyio.Event() for how in seen}
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for how in seen:
                    tg.start_soon(read_responses, url, how, seen[how], reading[how])
                for event in reading.values():
                    await event.wait()
                await balancer.add(b.name, b.port)
                result = await a.app.drain.drain(reason="rollout", propagation_wait=0)
    assert result.drained and result.handed_off == 2 and result.duration < 4
    for read in seen.values():
        same_answer(read, uncut)
    assert seen["create"].resumes == 1  # the helper hides the response, and its count, from its caller
    assert b.app.drain.counters()["requests"]["completed"] == 3
