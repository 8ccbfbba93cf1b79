"""What a request admitted during a drain costs with ``admission="fits"`` (issue 54), counted by callgrind.

The middleware in its propagation wait, an OpenAI-style POST with a 200-byte JSON body: per request,
the instructions of a request admitted SERVING, admitted during the wait with ``admission="all"``, and
admitted during the wait with ``admission="fits"`` (its body read, parsed and judged by the pace seen,
then replayed to the app, which reads it). And per frame, SERVING with the pace sampler's clock
(``_http.FrameClock``) on every message: the cost of a timed frame. Each variant runs in its own
process under callgrind, with 0 and with N requests (``benchmarks._callgrind``); SERVING's row is the
one ``benchmarks.instructions`` measures, with this body.

    python -m benchmarks.admission            # needs valgrind (Debian package)

One measurement by hand: python -m benchmarks.admission --child VARIANT FRAMES N
"""

from __future__ import annotations

import asyncio
import json
import types

from graceful._asgi._http import FrameClock
from graceful._asgi._types import Message, Receive, Scope, Send
from graceful._drain._admission import Admission

from ._callgrind import arguments, per_request_and_frame, require
from ._common import machine, table
from ._drive import SCOPE, make_app, sink

SERVING = "serving"
TIMED = "serving, every frame timed"
DRAINING_ALL = "draining, admission all"
DRAINING_FITS = "draining, admission fits"
VARIANTS = (SERVING, TIMED, DRAINING_ALL, DRAINING_FITS)
BODY = json.dumps(
    {
        "model": "default",
        "messages": [{"role": "user", "content": "Say hello in three words, then stop. " * 3}],
        "max_tokens": 64,
        "stream": True,
    }
).encode()
HEADERS = [*(h for h in SCOPE["headers"] if h[0] != b"content-length"), (b"content-length", b"%d" % len(BODY))]


async def receive() -> Message:
    return {"type": "http.request", "body": BODY, "more_body": False}


def child(variant: str, frames: int, n: int) -> None:
    from prometheus_client import CollectorRegistry

    from graceful import GracefulMiddleware
    from graceful._drain._state import core

    inner = make_app(frames)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()  # the app reads its body, as an LLM API does
        await inner(scope, receive, send)

    admission: Admission = "fits" if variant == DRAINING_FITS else "all"
    mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False, admission=admission, grace_period=3600)
    mw.drain.mark_serving()
    core(mw.drain).tally.pace.record(0.2, 0.02)  # seen: 0.2 s to the first token, 20 ms a token
    if variant != SERVING:
        mw.drain.begin_drain("benchmark", propagation_wait=2000)  # every request arrives in the wait
    scope = {**SCOPE, "headers": HEADERS}
    send: Send = sink
    if variant == TIMED:
        # The pace sampler's clock on every message (it is on one stream at a time, for 32 frames at most).
        clock = FrameClock(types.SimpleNamespace(last=None), 0.0, 0.0)  # type: ignore[arg-type]
        clock.send = sink
        send = clock

    async def run() -> None:
        # One request first, in every run (N = 0 too): what the first pays once (anyio's backend, imported
        # at the first cancel scope, the JSON decoder) is then no part of the difference.
        for _ in range(n + 1):
            await mw(scope, receive, send)

    asyncio.run(run())
    # Every request was admitted and answered: the fits variant judged each one and let it through.
    assert mw.drain.counters()["requests"]["completed"] == n + 1 and not mw.drain.counters()["rejected"]


def main() -> None:
    args = arguments(__doc__, child)
    if args is None:
        return
    require("benchmarks.admission")
    counts = per_request_and_frame("benchmarks.admission", VARIANTS, args.requests, args.frames)
    serving = counts[SERVING]["request"]
    rows = [
        [
            name,
            f"{c['request']:,.0f}",
            "-" if name == SERVING else f"{c['request'] - serving:+,.0f}",
            f"{c['frame']:,.0f}",
        ]
        for name, c in counts.items()
    ]
    print(f"machine: {machine()}\n")
    print(table(["variant", "instructions / request", "over serving", "instructions / frame"], rows))


if __name__ == "__main__":
    main()
