"""docs/resume.md's examples, as a reader runs them.

- ``docs_src/resume/clients.py`` (the openai SDK's clients, sync and async) and ``docs_src/resume/gateway.py``
  (a gateway's upstream client) run as modules; each client, pointed at the balancer in front of two
  example-server replicas (its address is the one thing that changes), reads one whole stream while the
  replica serving it drains with ``handoff_streams``.
- ``docs_src/resume/run_handoff.sh``: ``graceful run app:app --handoff-streams`` with bash (``--port 0``
  added), and the variable its comment names in place of the flag: a resumable stream in flight is handed
  off at the drain, with graceful's resumable final event.
"""

from __future__ import annotations

import json
import re
import runpy
import subprocess
import textwrap
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import httpx
import pytest

from tests.docs.commands import Typed, shell_commands, terminal_env, words
from tests.resume_utils import expected_text, replica, service

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

CLIENTS = "docs_src/resume/clients.py"
GATEWAY = "docs_src/resume/gateway.py"
RUN = "docs_src/resume/run_handoff.sh"
TOKENS = 120  # 3 s at the replicas' 40 tokens per second: the drain comes long before the end
PROMPT = "Count for me please"


def run_module(name: str) -> dict[str, Any]:
    return runpy.run_path(str(Path(__file__).resolve().parents[2] / name))


async def test_the_documented_clients_read_one_stream_across_a_handoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """1. replica A alone behind the balancer; the SDK's sync client (completions), its async client (chat)
    and the gateway's upstream client (chat, raw events) each start a stream on A
    2. once each has read 5 events, B joins and A drains with handoff: A ends the three streams
    3. each client continues its stream on B: every caller reads the exact text of an uncut answer."""
    monkeypatch.setenv("OPENAI_API_KEY", "unused")  # the SDK wants a key, as for any server
    sdk, gateway = run_module(CLIENTS), run_module(GATEWAY)
    client, aclient, upstream = sdk["client"], sdk["aclient"], gateway["upstream"]
    started = {name: anyio.Event() for name in ("sync", "async", "gateway")}
    texts: dict[str, str] = {}
    try:
        async with replica("a", handoff_streams=True) as a, replica("b") as b, service(a) as balancer:
            base = f"http://127.0.0.1:{balancer.port}"
            client.base_url = aclient.base_url = base + "/v1"
            upstream.base_url = base
            token = anyio.lowlevel.current_token()

            def sync_sdk() -> None:
                stream = client.completions.create(model="m", prompt=PROMPT, max_tokens=TOKENS, stream=True)
                texts["sync"] = ""
                for count, chunk in enumerate(stream, 1):
                    texts["sync"] += chunk.choices[0].text
                    if count == 5:
                        anyio.from_thread.run_sync(started["sync"].set, token=token)

            async def async_sdk() -> None:
                messages = [{"role": "user", "content": PROMPT}]
                stream = await aclient.chat.completions.create(
                    model="m", messages=messages, max_tokens=TOKENS, stream=True
                )
                texts["async"] = ""
                count = 0
                async for chunk in stream:
                    texts["async"] += chunk.choices[0].delta.content or "" if chunk.choices else ""
                    count += 1
                    if count == 5:
                        started["async"].set()

            async def relay() -> None:
                body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": TOKENS}
                texts["gateway"] = ""
                count = 0
                async with upstream.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as answer:
                    async for line in answer.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        texts["gateway"] += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                        count += 1
                        if count == 5:
                            started["gateway"].set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.to_thread.run_sync, sync_sdk)
                tg.start_soon(async_sdk)
                tg.start_soon(relay)
                with anyio.fail_after(20):
                    for event in started.values():
                        await event.wait()
                await balancer.add(b.name, b.port)
                result = await a.app.drain.drain(reason="rollout")
    finally:
        client.close()
        await aclient.close()
        await upstream.aclose()
    assert result.handed_off == 3, result
    assert texts == dict.fromkeys(started, expected_text(TOKENS))


APP = """
    import anyio
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route


    async def completions(request):
        async def events():
            for index in range(100):
                yield f'data: {{"choices": [{{"index": 0, "text": "t{index} ", "finish_reason": null}}]}}\\n\\n'
                await anyio.sleep(0.05)
            yield "data: [DONE]\\n\\n"

        return StreamingResponse(events(), media_type="text/event-stream")


    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
"""


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_the_handoff_command_hands_off_a_resumable_stream(how: str, socket_dir: str, tmp_path: Path) -> None:
    """1. the user's app (app.py, a 5 s event stream) under the page's `graceful run` command, or the same
    command with the variable its comment names in place of the flag  2. a stream marked resumable is read
    3. `graceful drain`: the stream ends at once with the final event, resumable; the drain says so."""
    (command,) = shell_commands(RUN)
    (tmp_path / "app.py").write_text(textwrap.dedent(APP))
    env: dict[str, str] = {}
    typed = command.split("#")[0].strip() + " --port 0"
    if how == "variable":
        variable = re.search(r"# or (\w+=\S+)", command)
        assert variable, command
        name, _, value = variable.group(1).partition("=")
        env[name] = value
        typed = typed.replace(" --handoff-streams", "")
        assert "--handoff-streams" in words(command)[1] and typed != command
    server = Typed(typed, socket_dir, tmp_path / "server.log", cwd=str(tmp_path), **env)
    try:
        server.wait_ready()
        first, lines = threading.Event(), []

        def read() -> None:
            body = {"model": "m", "prompt": "p", "stream": True}
            headers = {"x-graceful-resumable": "1"}
            with httpx.stream("POST", server.url("/v1/completions"), json=body, headers=headers, timeout=20) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line[6:])
                        first.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert first.wait(10), server.log
        drained = subprocess.run(
            ["bash", "-c", "graceful drain"], env=terminal_env(GRACEFUL_SOCKET_DIR=socket_dir),
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        reader.join(20)
    finally:
        server.stop()
    assert drained.returncode == 0, drained.stderr
    assert "1 stream handed off" in drained.stderr, drained.stderr
    final = json.loads(lines[-1])["error"]
    assert final["type"] == "server_shutdown" and final["resumable"] is True
    assert len(lines) < 50, "the stream ran on: it was not handed off"
