"""Streams continue on another replica, read through the real ``openai`` SDK (sync and async).

Two example-server replicas run behind the rollout demo's HAProxy. The scenario of a
rolling update:

1. only replica A is in the balancer; four streams start on it (sync and async SDK,
   chat and completions), each asking for a final usage chunk;
2. once every stream has its first tokens, replica B joins the balancer and A drains
   with ``handoff_streams``;
3. after A's propagation wait, A ends each stream with the final ``server_shutdown``
   event; the transport continues it through the balancer (A, still listed, refuses
   with 503 and the continuation is sent again until B takes it);
4. every caller reads the exact token sequence of an uncut stream, one role delta, one
   id and one usage with the original prompt tokens; A drained long before the streams
   would have ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import httpx
import openai
import pytest
from prometheus_client import generate_latest

import graceful
from tests.resume_utils import TOKENS_PER_SECOND, expected_text, replica, service

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

TOKENS = 120  # 3 s at 40 tokens/s: far longer than the drain is allowed to take
PROMPT = "Count for me please"  # 4 tokens for the example server
MESSAGES = [{"role": "user", "content": PROMPT}]


@dataclass
class Seen:
    """What one caller read from its stream."""

    text: str = ""
    ids: set[str] = field(default_factory=set)
    roles: int = 0
    usage: list[dict[str, int]] = field(default_factory=list)
    resumes: int = -1
    chunks: int = 0

    def take(self, chunk: Any, kind: str) -> None:
        self.chunks += 1
        self.ids.add(chunk.id)
        if chunk.usage is not None:
            self.usage.append(chunk.usage.model_dump(include={"prompt_tokens", "completion_tokens", "total_tokens"}))
        for choice in chunk.choices:
            if kind == "chat":
                self.roles += choice.delta.role is not None
                self.text += choice.delta.content or ""
            else:
                self.text += choice.text


def _request(kind: str) -> dict[str, Any]:
    common: dict[str, Any] = {
        "model": "graceful-example",
        "max_tokens": TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
        "seed": 7,
        "temperature": 0.0,
    }
    return {**common, "messages": MESSAGES} if kind == "chat" else {**common, "prompt": PROMPT}


def sync_caller(url: str, kind: str, seen: Seen, started: anyio.Event) -> None:
    http = httpx.Client(transport=graceful.ResumingTransport(), timeout=30)
    client = openai.OpenAI(base_url=url, api_key="unused", http_client=http, max_retries=0)
    with client:
        api = client.chat.completions if kind == "chat" else client.completions
        stream = api.create(**_request(kind))
        with stream:
            for chunk in stream:
                seen.take(chunk, kind)
                if seen.chunks == 5:
                    anyio.from_thread.run_sync(started.set)
            seen.resumes = stream.response.extensions["graceful_resumes"]


async def async_caller(url: str, kind: str, seen: Seen, started: anyio.Event) -> None:
    http = httpx.AsyncClient(transport=graceful.AsyncResumingTransport(), timeout=30)
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", http_client=http, max_retries=0)
    async with client:
        api = client.chat.completions if kind == "chat" else client.completions
        stream = await api.create(**_request(kind))
        async with stream:
            async for chunk in stream:
                seen.take(chunk, kind)
                if seen.chunks == 5:
                    started.set()
            seen.resumes = stream.response.extensions["graceful_resumes"]


async def test_streams_drained_mid_way_continue_exactly_on_the_other_replica() -> None:
    async with replica("a", handoff_streams=True) as a, replica("b", handoff_streams=True) as b:
        async with service(a) as balancer:
            url = f"http://127.0.0.1:{balancer.port}/v1"
            callers = [(mode, kind) for mode in ("sync", "async") for kind in ("chat", "completion")]
            seen = {caller: Seen() for caller in callers}
            started = {caller: anyio.Event() for caller in callers}
            async with anyio.create_task_group() as tg:
                for caller in callers:
                    mode, kind = caller
                    if mode == "sync":
                        tg.start_soon(anyio.to_thread.run_sync, sync_caller, url, kind, seen[caller], started[caller])
                    else:
                        tg.start_soon(async_caller, url, kind, seen[caller], started[caller])
                with anyio.fail_after(20):
                    for event in started.values():
                        await event.wait()
                assert a.app.drain.in_flight == 4
                await balancer.add(b.name, b.port)
                result = await a.app.drain.drain(reason="rollout")
            for caller, one in seen.items():
                assert one.text == expected_text(TOKENS), caller
                assert one.roles == (1 if caller[1] == "chat" else 0), caller
                assert len(one.ids) == 1, caller
                assert one.usage == [{"prompt_tokens": 4, "completion_tokens": TOKENS, "total_tokens": 4 + TOKENS}]
                assert one.resumes == 1, caller
    # A handed its four streams off after its 0.2 s propagation wait instead of waiting ~3 s for them.
    assert result.result == "drained" and result.handed_off == 4 and result.truncated == 0
    assert result.duration < TOKENS / TOKENS_PER_SECOND / 2
    counters = a.app.drain.counters()["requests"]
    assert counters["handed_off"] == 4 and counters["cancelled"] == 0
    assert b'graceful_requests_total{outcome="handed_off"} 4.0' in generate_latest(a.app.registry)
    assert b.app.drain.counters()["requests"]["completed"] == 4
