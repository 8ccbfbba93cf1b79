"""Benchmark 1: in-process cost per request and per streamed frame, four variants side by side.

The ASGI callables are driven directly (no network, no server): a minimal scope, a
receive that hands over an empty body and a send that drops the message. Nothing in
the drive suspends, so one task runs many requests back to back and the event loop
adds nothing per request. Variants are interleaved in rounds and each figure is the
median over rounds, which keeps a noisy neighbour from favouring one variant.

Back to back, every variant runs with its code and data in the CPU's caches: the figures are
warm-cache figures. With ``--evict KIB``, each request is timed alone, after a copy of a buffer
of that size has evicted them, as a server's own work between two requests does (uvicorn runs
about 230,000 instructions per short request; see RESULTS.md #2). The copy is not timed.

    python -m benchmarks.inprocess [--rounds 15] [--requests 4000] [--streams 300] [--frames 100]
                                   [--evict KIB]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import Response

from benchmarks._common import machine, median, table, verdict
from graceful import GracefulMiddleware
from graceful._asgi._types import ASGIApp, Message, Receive, Scope, Send

# The headers a uvicorn scope typically carries for an OpenAI-style POST.
SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0", "spec_version": "2.4"},
    "http_version": "1.1",
    "server": ("127.0.0.1", 8000),
    "client": ("127.0.0.1", 50000),
    "scheme": "http",
    "method": "POST",
    "root_path": "",
    "path": "/v1/chat/completions",
    "raw_path": b"/v1/chat/completions",
    "query_string": b"",
    "headers": [
        (b"host", b"127.0.0.1:8000"),
        (b"user-agent", b"bench/1.0"),
        (b"accept", b"*/*"),
        (b"content-type", b"application/json"),
        (b"content-length", b"0"),
    ],
    "state": {},
}
BODY = b'{"id":"x","object":"chat.completion"}'
FRAME = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n'


async def receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def sink(message: Message) -> None:
    pass


def make_app(frames: int) -> ASGIApp:
    """A short JSON response (frames=0) or an SSE stream of ``frames`` frames plus the closing empty body."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream" if frames else b"application/json")],
            }
        )
        for _ in range(frames):
            await send({"type": "http.response.body", "body": FRAME, "more_body": True})
        await send({"type": "http.response.body", "body": b"" if frames else BODY, "more_body": False})

    return app


class PassThrough:
    """The floor: the least a middleware that sees every frame must do (wrap send, forward)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def wrapped_send(message: Message) -> None:
            await send(message)

        await self.app(scope, receive, wrapped_send)


class InFlightCounter(BaseHTTPMiddleware):
    """The FastAPI ``@app.middleware("http")`` idiom; it stops counting when headers go out, not at the end."""

    in_flight = 0

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        InFlightCounter.in_flight += 1
        try:
            return await call_next(request)
        finally:
            InFlightCounter.in_flight -= 1


def graceful(app: ASGIApp) -> ASGIApp:
    mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False)
    mw.drain.mark_serving()
    return mw


VARIANTS: dict[str, Callable[[ASGIApp], ASGIApp]] = {
    "bare app": lambda app: app,
    "pass-through wrapper (floor)": PassThrough,
    "GracefulMiddleware (metrics on)": graceful,
    "BaseHTTPMiddleware counter": InFlightCounter,
}
BARE, FLOOR, GRACEFUL, BASEHTTP = VARIANTS


async def timed(app: ASGIApp, n: int) -> float:
    """Seconds per request over ``n`` back-to-back requests."""
    scope = SCOPE
    if EVICT:
        return await timed_cold(app, n, EVICT)
    start = time.perf_counter()
    for _ in range(n):
        await app(scope, receive, sink)
    return (time.perf_counter() - start) / n


EVICT = bytearray()  # set by --evict


async def timed_cold(app: ASGIApp, n: int, evict: bytearray) -> float:
    """Seconds per request, each request timed alone after ``evict`` has been copied (not timed)."""
    scope = SCOPE
    clock = time.perf_counter
    total = 0.0
    for _ in range(n):
        bytes(evict)
        start = clock()
        await app(scope, receive, sink)
        total += clock() - start
    return total / n


async def measure(rounds: int, requests: int, streams: int, frames: int) -> dict[str, dict[str, float]]:
    short = {name: wrap(make_app(0)) for name, wrap in VARIANTS.items()}
    stream = {name: wrap(make_app(frames)) for name, wrap in VARIANTS.items()}
    # BaseHTTPMiddleware is ~100x slower: fewer iterations keep a round short, the median is unaffected.
    scale = {name: 20 if name == BASEHTTP else 1 for name in VARIANTS}
    for name in VARIANTS:  # warm up caches, the request-id counter, the specialising interpreter
        await timed(short[name], max(1, requests // (10 * scale[name])))
        await timed(stream[name], max(1, streams // (10 * scale[name])))
    samples: dict[str, dict[str, list[float]]] = {name: {"short": [], "stream": []} for name in VARIANTS}
    order = list(VARIANTS)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            samples[name]["short"].append(await timed(short[name], max(1, requests // scale[name])))
            samples[name]["stream"].append(await timed(stream[name], max(1, streams // scale[name])))
    result: dict[str, dict[str, float]] = {}
    for name in VARIANTS:
        per_request = median(samples[name]["short"])
        # Each round's own stream-minus-short difference, so a slow round cancels out.
        per_frame = median(
            [(s - r) / frames for s, r in zip(samples[name]["stream"], samples[name]["short"], strict=True)]
        )
        result[name] = {"request": per_request, "frame": per_frame, "stream": median(samples[name]["stream"])}
    return result


def report(result: dict[str, dict[str, float]], frames: int) -> str:
    us = 1e6
    bare, floor = result[BARE], result[FLOOR]
    floor_req = floor["request"] - bare["request"]
    floor_frame = floor["frame"] - bare["frame"]
    rows = []
    for name, r in result.items():
        added_req = r["request"] - bare["request"]
        added_frame = r["frame"] - bare["frame"]
        rows.append(
            [
                name,
                f"{r['request'] * us:.2f}",
                f"{added_req * us:+.2f}" if name != BARE else "-",
                f"{added_req / floor_req:.2f}x" if name not in (BARE, FLOOR) and floor_req > 0 else "-",
                f"{r['frame'] * us:.3f}",
                f"{added_frame * us:+.3f}" if name != BARE else "-",
                f"{added_frame / floor_frame:.2f}x" if name not in (BARE, FLOOR) and floor_frame > 0 else "-",
                f"{r['stream'] * us:.1f}",
            ]
        )
    g = result[GRACEFUL]
    g_req = g["request"] - bare["request"]
    g_frame = g["frame"] - bare["frame"]
    targets = [
        ["added per request / floor's", f"{g_req / floor_req:.2f}x", "<= 1.5x", verdict(g_req <= 1.5 * floor_req)],
        [
            "added per frame / floor's",
            f"{g_frame / floor_frame:.2f}x" if floor_frame > 0 else "n/a (floor <= 0)",
            "<= 1.5x",
            verdict(g_frame <= 1.5 * max(floor_frame, 0.0)),
        ],
        ["added per request", f"{g_req * us:.2f} us", "<= 1 us", verdict(g_req <= 1e-6)],
        ["added per frame", f"{g_frame * us:.3f} us", "<= 0.25 us", verdict(g_frame <= 0.25e-6)],
        [
            "BaseHTTPMiddleware added / GracefulMiddleware added (per request)",
            f"{(result[BASEHTTP]['request'] - bare['request']) / g_req:.0f}x" if g_req > 0 else "n/a",
            "(context)",
            "-",
        ],
    ]
    return "\n\n".join(
        [
            f"Machine: {machine()}"
            + (f"; every request timed alone after a {len(EVICT) >> 10} KiB copy (--evict)" if EVICT else ""),
            table(
                [
                    "variant",
                    "per request (us)",
                    "added (us)",
                    "added / floor",
                    "per frame (us)",
                    "added (us)",
                    "added / floor",
                    f"{frames}-frame stream (us)",
                ],
                rows,
            ),
            table(["GracefulMiddleware", "measured", "target", ""], targets),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--requests", type=int, default=4000, help="short requests per variant per round")
    parser.add_argument("--streams", type=int, default=300, help="streams per variant per round")
    parser.add_argument("--frames", type=int, default=100, help="frames per stream")
    parser.add_argument("--evict", type=int, default=0, metavar="KIB", help="copy this much memory before each request")
    args = parser.parse_args(argv)
    if args.evict < 0:
        parser.error(f"--evict {args.evict}: give a size in KiB, 0 or more (4096 empties this machine's L2)")
    EVICT[:] = bytes(args.evict << 10)
    result = asyncio.run(measure(args.rounds, args.requests, args.streams, args.frames))
    print(report(result, args.frames))


if __name__ == "__main__":
    main()
