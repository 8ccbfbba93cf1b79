"""``graceful soak --resume``: streams handed off mid-way end ``resumed``, and a wrong continuation is caught.

Two example-server replicas behind the rollout demo's HAProxy; the soak sends its
streams through the resuming transport while replica A is taken out and drained with
``handoff_streams``.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from graceful.soak import SoakConfig, SoakReport, run_soak
from tests.resume_utils import replica, service

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


def _forgets_continuations(app: Any) -> Any:
    """An ASGI wrapper that drops continue_final_message: the server then starts its answer over."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            return await app(scope, receive, send)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        payload = json.loads(body)
        if payload.pop("continue_final_message", False):
            payload["messages"] = payload["messages"][:-1]
            payload["add_generation_prompt"] = True
        data = json.dumps(payload).encode()
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()

        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(data)).encode()))
        await app({**scope, "headers": headers}, replay, send)

    return wrapped


async def _soak_through_a_handoff(wrap: Any = None) -> tuple[SoakReport, int]:
    """1. soak streams run on A and B 2. once A has streams in flight, A leaves the balancer and
    drains with handoff_streams 3. its streams continue on B."""
    async with replica("a", handoff_streams=True) as a, replica("b", wrap=wrap, handoff_streams=True) as b:
        async with service(a, b) as balancer:
            config = SoakConfig(
                url=f"http://127.0.0.1:{balancer.port}",
                mix={"stream": 1},
                lengths={"stream": 80},
                concurrency=4,
                max_requests=8,
                duration=30,
                timeout=30,
                resume=True,
                model="graceful-example",
            )
            async with anyio.create_task_group() as tg:
                reports: list[SoakReport] = []

                async def soak() -> None:
                    reports.append(await run_soak(config))

                tg.start_soon(soak)
                with anyio.fail_after(20):
                    while a.app.drain.in_flight < 2:  # A's own ledger: its streams have started
                        await anyio.sleep(0.01)
                await balancer.remove(a.name)
                result = await a.app.drain.drain(reason="rollout")
    return reports[0], result.handed_off


async def test_soak_resume_counts_resumed_streams() -> None:
    report, handed_off = await _soak_through_a_handoff()
    counts = report.to_json()["by_reason"]
    assert handed_off >= 2
    assert counts["resumed"] == handed_off
    assert counts["ok"] + counts["resumed"] == 8
    assert report.exit_code == 0


async def test_soak_resume_catches_a_continuation_that_starts_over() -> None:
    report, handed_off = await _soak_through_a_handoff(wrap=_forgets_continuations)
    counts = report.to_json()["by_reason"]
    assert handed_off >= 2
    assert counts["token_mismatch"] == handed_off and counts["resumed"] == 0
    assert report.exit_code == 1


async def test_quick_rollout_hands_long_streams_off() -> None:
    """The long-streams-handoff scenario at --quick size: streams longer than the grace period continue
    on a new replica; nothing ends by the server, is truncated or mismatched, and the old replica leaves
    within its propagation wait + 5 s instead of at its deadline."""
    import tempfile

    from examples.rollout.report import expectations, side_summary
    from examples.rollout.scenarios import Options, run_side

    options = Options.resolve(scenario="long-streams-handoff", quick=True, seed=7)
    assert min(options.stream_tokens) / options.tokens_per_second > options.grace_period
    with tempfile.TemporaryDirectory(prefix="g-logs-") as logs:
        side = await run_side("graceful", options, log_dir=logs, log=lambda line: None)
    summary = side_summary(side, options)
    reasons = summary["by_reason"]
    assert reasons["resumed"] > 0, summary
    for reason in ("ended_by_server", "truncated", "token_mismatch", "ambiguous", "timeout", "http_error"):
        assert reasons[reason] == 0, (reason, summary)
    assert summary["exit_median"] <= options.propagation_wait + 5.0
    assert summary["sigkills"] == 0 and summary["duplicates"] == 0
    assert expectations(summary, options) == []
