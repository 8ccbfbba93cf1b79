"""``graceful soak --resume``: continued streams end ``resumed``, a wrong continuation ``token_mismatch``.

Two example-server replicas run in this event loop behind the rollout demo's HAProxy.
The scenario of each end-to-end test:

1. only replica A is in the balancer; the soak opens its streams, all on A;
2. once A has them all in flight, replica B joins the balancer and A drains with
   ``handoff_streams``;
3. after A's propagation wait, A ends each stream with the final ``server_shutdown``
   event and soak's resuming transport continues it on B;
4. soak judges each spliced stream against the example server's count.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest
from click.testing import CliRunner

from graceful import ConfigError
from graceful._drain._state import core
from graceful._soak._attempt import count_mismatch
from graceful.cli import soak_command
from graceful.soak import RequestRecord, SoakConfig, SoakReport, run_soak
from tests.resume_utils import Replica, replica, service

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

TOKENS = 120  # 3 s at 40 tokens/s: the drain hands them off after 0.2 s
STREAMS = 4


async def _in_flight(one: Replica, count: int) -> None:
    """Until ``count`` requests run on the replica (its own ledger; bounded)."""
    with anyio.fail_after(20):
        while one.app.drain.in_flight < count:
            await anyio.sleep(0.01)


def _config(url: str, **extra: object) -> SoakConfig:
    return SoakConfig(
        url=url,
        concurrency=STREAMS,
        max_requests=STREAMS,
        mix={"short": 0, "long": 0, "stream": 1},
        lengths={"stream": TOKENS},
        timeout=30.0,
        resume=True,
        **extra,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(("max_resumes", "reason", "resumes"), [(3, "resumed", 1), (0, "ended_by_server", 0)])
async def test_streams_handed_off_mid_way_end_resumed_with_the_exact_count(
    max_resumes: int, reason: str, resumes: int
) -> None:
    async with replica("a", handoff_streams=True) as a, replica("b") as b:
        async with service(a) as balancer:
            url = f"http://127.0.0.1:{balancer.port}"
            seen: list[RequestRecord] = []
            report: SoakReport | None = None

            async def soak() -> None:
                nonlocal report
                report = await run_soak(_config(url, max_resumes=max_resumes), on_record=seen.append)

            async with anyio.create_task_group() as tg:
                tg.start_soon(soak)
                await _in_flight(a, STREAMS)
                await balancer.add(b.name, b.port)
                result = await a.app.drain.drain(reason="rollout")
    assert report is not None
    assert result.handed_off == STREAMS and result.truncated == 0
    assert [r.reason for r in report.records] == [reason] * STREAMS, [r.error for r in report.records]
    assert [r.resumes for r in report.records] == [resumes] * STREAMS
    assert all(r.served_by == "a" for r in report.records)
    if reason == "resumed":
        # The spliced usage: every completion token, once.
        assert [r.tokens for r in report.records] == [TOKENS] * STREAMS
        assert b.app.drain.counters()["requests"]["completed"] == STREAMS
    assert report.exit_code == 0 and report.losses() == {}
    assert report.by_reason()["token_mismatch"] == 0
    table = report.render()
    assert "resumed" in table.splitlines()[0] and "mismatch" in table.splitlines()[0]


async def test_a_continuation_with_other_tokens_is_a_token_mismatch_and_exit_1(tmp_path: Path) -> None:
    """B counts in another word (``tik0 tik1 ...``): its continuation of A's ``tok`` count is wrong text."""
    out = tmp_path / "report.json"
    async with replica("a", handoff_streams=True) as a, replica("b", token_word="tik") as b:
        async with service(a) as balancer:
            argv = [
                sys.executable,
                "-m",
                "graceful",
                "soak",
                f"http://127.0.0.1:{balancer.port}",
                "--resume",
                "--concurrency",
                str(STREAMS),
                "--max-requests",
                str(STREAMS),
                "--mix",
                "short=0,long=0,stream=1",
                "--lengths",
                f"stream={TOKENS}",
                "--timeout",
                "30s",
                "--report",
                str(out),
            ]
            async with await anyio.open_process(argv, stdout=subprocess.PIPE, stderr=None) as process:
                await _in_flight(a, STREAMS)
                await balancer.add(b.name, b.port)
                await a.app.drain.drain(reason="rollout")
                assert process.stdout is not None
                chunks = []
                with anyio.fail_after(30):
                    async for chunk in process.stdout:  # to its end: the process exits after the table
                        chunks.append(chunk)
                    code = await process.wait()
                stdout = b"".join(chunks).decode()
    assert code == 1, stdout
    data = json.loads(out.read_text())
    assert data["by_reason"]["token_mismatch"] == STREAMS
    assert data["by_reason"]["resumed"] == 0 and data["by_reason"]["ok"] == 0
    assert data["losses"] == {"token_mismatch": STREAMS}
    assert "verdict: LOSS (token_mismatch=4)" in stdout


def test_count_mismatch_names_the_first_wrong_token() -> None:
    count = "tok0 tok1 tok2"
    assert count_mismatch(count, 3, {"completion_tokens": 3}, 3) is None
    assert count_mismatch("tok0 tok1tik0", 3, {}, 3) == "token 1 is 'tok1tik0', expected 'tok1'"
    assert count_mismatch("tok0 tok1 tok3", 3, {}, 3) == "token 2 is 'tok3', expected 'tok2'"
    assert count_mismatch("tok0 tok1", 2, {}, 3) == "2 tokens of the count, expected 3"
    assert (
        count_mismatch(count, 3, {"completion_tokens": 5}, 3) == "usage says 5 completion tokens, the stream carried 3"
    )
    assert count_mismatch("Hello there", 2, {}, 3) is None  # not the example server's count: not judged


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_bad_max_resumes_is_one_line(value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^max_resumes: {value!r} is not a whole number of 0 or more; use e\.g\. 3"):
        SoakConfig(url="http://127.0.0.1:8000", resume=True, max_resumes=value)  # type: ignore[arg-type]


def test_cli_max_resumes_needs_resume() -> None:
    result = CliRunner().invoke(soak_command, ["http://127.0.0.1:9", "--max-resumes", "5"])
    assert result.exit_code == 2
    assert "--max-resumes 5 only applies with --resume; add --resume or drop it" in result.output
    assert "Traceback" not in result.output


async def _one_request(connection: anyio.abc.SocketStream, body: bytes, extra: str) -> bytes:
    """Send one POST on a connection opened before the drain; return the response head."""
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: a\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}\r\n"
    )
    await connection.send(head.encode() + body)
    data = b""
    with anyio.fail_after(10):
        while b"\r\n\r\n" not in data:
            data += await connection.receive()
    return data.split(b"\r\n\r\n")[0].lower()


async def test_a_handing_off_replica_refuses_a_resumable_request_it_would_only_hand_off() -> None:
    """1. replica A drains with handoff; a plain stream (not resumable) keeps the drain running
    2. once the handoff has begun, two connections opened before the drain (pinned: each may
       bring one more request) send a request each
    3. the resumable stream is refused with a 503 marked not started, so its client goes on
       elsewhere without spending a resume; the plain request is served."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "count"}]}
    async with replica("a", handoff_streams=True) as a:
        drain = a.app.drain
        pinned = [await anyio.connect_tcp("127.0.0.1", a.port) for _ in range(2)]
        peers = {connection.extra(anyio.abc.SocketAttribute.local_address) for connection in pinned}
        core(drain).set_launcher("a test", lambda: peers)  # as graceful run pins its open connections
        async with anyio.create_task_group() as tg, httpx.AsyncClient(timeout=30) as client:
            body = {**chat, "max_tokens": 400, "stream": True}
            async with client.stream("POST", f"http://127.0.0.1:{a.port}/v1/chat/completions", json=body) as held:
                with anyio.fail_after(10):
                    await anext(held.aiter_lines())  # its first event: the stream runs
                tg.start_soon(drain.drain)
                with anyio.fail_after(10):
                    while not core(drain).handing_off:
                        await anyio.sleep(0.01)
                stream = json.dumps({**chat, "max_tokens": 40, "stream": True}).encode()
                refused = await _one_request(pinned[0], stream, "x-graceful-resumable: 1\r\n")
                plain = json.dumps({**chat, "max_tokens": 2}).encode()
                served = await _one_request(pinned[1], plain, "")
            # Leaving the held stream ends the last request in flight: the drain finishes.
        for connection in pinned:
            await connection.aclose()
    assert refused.startswith(b"http/1.1 503") and b"x-graceful-not-started" in refused
    assert served.startswith(b"http/1.1 200") and b"connection: close" in served
    assert drain.counters()["requests"]["handed_off"] == 0
