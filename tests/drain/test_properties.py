"""Counter invariants over random interleavings of frames, disconnects, exceptions and cancellation.

Each request follows a script (start, k body frames, then one way to end). Hypothesis
chooses how the scripts interleave and when the drain begins; a driver releases one
step at a time and checks after every step that ``in_flight`` equals the model's
count of requests admitted and not yet ended, and never goes negative.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from graceful import GracefulMiddleware
from graceful._asgi._types import Message, Receive, Scope, Send
from graceful._drain._state import core

# "late_disconnect": the response completes, then the app still calls receive() and sees
# http.disconnect, as Starlette's StreamingResponse disconnect listener does.
ENDS = ("complete", "disconnect", "raise", "cancel", "incomplete", "late_disconnect")
EXPECTED = {
    "complete": "completed",
    "disconnect": "client_disconnected",
    "raise": "error",
    "cancel": "cancelled",
    "incomplete": "error",
    "late_disconnect": "completed",
}


@dataclass
class Script:
    frames: int
    end: str
    go: list[anyio.Event] = field(default_factory=list)
    ack: list[anyio.Event] = field(default_factory=list)
    finished: anyio.Event | None = None
    scope: anyio.CancelScope | None = None


class Boom(Exception):
    pass


scripts_strategy = st.lists(
    st.tuples(st.integers(min_value=0, max_value=3), st.sampled_from(ENDS)), min_size=1, max_size=6
)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), specs=scripts_strategy)
def test_in_flight_matches_the_model_under_any_interleaving(data: st.DataObject, specs: list[tuple[int, str]]) -> None:
    # Steps per request: start, each frame, the end.
    order = data.draw(st.permutations([i for i, (frames, _) in enumerate(specs) for _ in range(frames + 2)]))
    drain_at = data.draw(st.integers(min_value=0, max_value=len(order)))
    anyio.run(_check, specs, order, drain_at)


async def _check(specs: list[tuple[int, str]], order: list[int], drain_at: int) -> None:
    scripts = [Script(frames, end) for frames, end in specs]
    for script in scripts:
        steps = script.frames + 2
        script.go = [anyio.Event() for _ in range(steps)]
        script.ack = [anyio.Event() for _ in range(steps)]
        script.finished = anyio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        script = scripts[scope["idx"]]
        await script.go[0].wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        script.ack[0].set()
        for i in range(1, script.frames + 1):
            await script.go[i].wait()
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
            script.ack[i].set()
        last = script.frames + 1
        await script.go[last].wait()
        if script.end in ("complete", "late_disconnect"):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            if script.end == "late_disconnect":
                await receive()
        elif script.end == "disconnect":
            await receive()
        elif script.end == "raise":
            raise Boom
        elif script.end == "cancel":
            assert script.scope is not None
            script.scope.cancel()
            await anyio.sleep_forever()

    mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False, grace_period=30, reserve=5)
    mw.drain.mark_serving()

    async def server_send(message: Message) -> None:
        pass

    async def disconnect() -> Message:
        return {"type": "http.disconnect"}

    async def run(idx: int) -> None:
        script = scripts[idx]
        scope = {"type": "http", "path": "/gen", "method": "POST", "headers": [], "http_version": "1.1", "idx": idx}
        with anyio.CancelScope() as script.scope:
            try:
                await mw(scope, disconnect, server_send)
            except Boom:
                pass
        assert script.finished is not None
        script.finished.set()

    ended = [False] * len(scripts)
    async with anyio.create_task_group() as tg:
        for idx in range(len(scripts)):
            tg.start_soon(run, idx)
        await anyio.wait_all_tasks_blocked()
        assert mw.drain.in_flight == len(scripts)
        position = [0] * len(scripts)
        for n, idx in enumerate(order):
            if n == drain_at:
                mw.drain.begin_drain("property")
            script = scripts[idx]
            step = position[idx]
            position[idx] += 1
            script.go[step].set()
            if step == script.frames + 1:
                assert script.finished is not None
                await script.finished.wait()
                ended[idx] = True
            else:
                await script.ack[step].wait()
            assert mw.drain.in_flight == ended.count(False)

    assert mw.drain.in_flight == 0
    counted = mw.drain.counters()["requests"]
    expected = {name: 0 for name in counted}
    for script in scripts:
        expected[EXPECTED[script.end]] += 1
    assert counted == expected
    assert sum(counted.values()) == len(scripts)
    assert not core(mw.drain).items()


@pytest.mark.parametrize("end", ENDS)
def test_each_end_alone(end: str) -> None:
    anyio.run(_check, [(2, end)], [0, 0, 0, 0], 2)
