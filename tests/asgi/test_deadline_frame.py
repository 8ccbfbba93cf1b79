"""At the drain deadline an SSE stream ends with an explicit, retryable error event.

Checked with the `openai` client library itself, against the example server under
real uvicorn: the SDK must surface the frame as an error, not as a stream that stops.
"""

from __future__ import annotations

import anyio
import openai
import pytest
from prometheus_client import CollectorRegistry

from examples.server import Config, create_app
from tests.utils import run_uvicorn

pytestmark = pytest.mark.anyio


async def test_openai_client_sees_the_final_frame_as_a_retryable_server_shutdown(registry: CollectorRegistry) -> None:
    """
    1. a long streamed completion starts (20 tokens/s, 2,000 tokens: far past the budget)
    2. the drain runs with a 0.5 s deadline
    3. the SDK raises APIError carrying our server_shutdown body, after some tokens
    4. the drain reports one truncated stream, and the app's generation was cancelled
    """
    app = create_app(
        Config(tokens_per_second=20.0, load_delay=0.0, max_tokens=4096),
        registry=registry,
        admin=False,
        grace_period=30,
        reserve=5,
    )
    async with run_uvicorn(app) as server:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0)
        tokens: list[str] = []
        first = anyio.Event()
        results: list[object] = []

        async def drain_after_first_token() -> None:
            await first.wait()
            results.append(await app.drain.drain(timeout=0.5))

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain_after_first_token)
            stream = await client.completions.create(model="m", prompt="hi", max_tokens=2000, stream=True)
            with pytest.raises(openai.APIError) as info:
                async for chunk in stream:
                    tokens.append(chunk.choices[0].text)
                    first.set()
        await client.close()
    error = info.value.body
    assert isinstance(error, dict)
    assert error["type"] == "server_shutdown" and error["retryable"] is True and error["code"] == 503
    assert 0 < len(tokens) < 2000
    [result] = results
    assert getattr(result, "truncated") == 1
    assert app.drain.counters()["truncated"] == {"deadline": 1}
    assert app.drain.counters()["requests"]["cancelled"] == 1
    assert app.drain.in_flight == 0
