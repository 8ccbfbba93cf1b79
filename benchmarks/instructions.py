"""Instructions per request and per frame, counted by valgrind's callgrind.

Timings on a shared 2-core machine swing 2-3x; instruction counts do not (the same
binary, inputs and environment give the same count whatever else runs). Each variant
runs in its own process under callgrind twice, with 0 and with N requests, and the
difference divided by N is the cost of one request. A 100-frame stream minus a short
response, divided by 100, is the cost of one frame. The children run with
``PYTHONHASHSEED=0``, so that a run repeats the last one's counts to within about 0.3%.

    python -m benchmarks.instructions            # needs valgrind (Debian package)

Run one measurement by hand: python -m benchmarks.instructions --child VARIANT FRAMES N
"""

from __future__ import annotations

import asyncio

from graceful._asgi._types import ASGIApp

from ._callgrind import arguments, per_request_and_frame, require
from ._common import machine
from ._drive import SCOPE, VARIANTS, make_app, receive, side_by_side, sink

NO_REQUEST_ID = "GracefulMiddleware, request-id echo off"


def child(variant: str, frames: int, n: int) -> None:
    from prometheus_client import CollectorRegistry

    from graceful import GracefulMiddleware

    app = make_app(frames)
    if variant == NO_REQUEST_ID:
        mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False, request_id_header=None)
        mw.drain.mark_serving()
        target: ASGIApp = mw
    else:
        target = VARIANTS[variant](app)

    async def run() -> None:
        for _ in range(n):
            await target(SCOPE, receive, sink)

    asyncio.run(run())


def main() -> None:
    args = arguments(__doc__, child)
    if args is None:
        return
    require("benchmarks.instructions")
    names = [*VARIANTS][:3] + [NO_REQUEST_ID]
    counts = per_request_and_frame("benchmarks.instructions", names, args.requests, args.frames)
    count = "{:,.0f}".format
    print(f"machine: {machine()}\n")
    print(side_by_side(counts, ("instructions / request", "instructions / frame"), count, count))


if __name__ == "__main__":
    main()
