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

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile

from graceful._asgi._types import ASGIApp

from ._common import machine, table
from .inprocess import SCOPE, VARIANTS, make_app, receive, sink

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


def count(variant: str, frames: int, n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={os.path.join(tmp, 'out')}",
                os.path.realpath(sys.executable),
                "-m",
                "benchmarks.instructions",
                "--child",
                variant,
                str(frames),
                str(n),
            ],
            capture_output=True,
            text=True,
            check=True,
            # A fixed hash seed makes the counts repeat to within about 0.3% from run to run (with a
            # random one they move by about 2%: the layout of the dicts built at start-up changes).
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:  # pragma: no cover - valgrind's output format
        raise RuntimeError(done.stderr[-2000:])
    return int(found.group(1))


def per_request(variant: str, frames: int, n: int) -> float:
    return (count(variant, frames, n) - count(variant, frames, 0)) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--child", nargs=3, metavar=("VARIANT", "FRAMES", "N"))
    args = parser.parse_args()
    if args.child:
        variant, frames, n = args.child
        child(variant, int(frames), int(n))
        return
    if shutil.which("valgrind") is None:
        sys.exit("benchmarks.instructions needs valgrind: apt-get install valgrind")
    names = [*VARIANTS][:3] + [NO_REQUEST_ID]
    short = {name: per_request(name, 0, args.requests) for name in names}
    stream = {name: per_request(name, args.frames, args.requests // 10) for name in names}
    frame = {name: (stream[name] - short[name]) / args.frames for name in names}
    bare, floor = names[0], names[1]
    rows = []
    for name in names:
        added_req = short[name] - short[bare]
        added_frame = frame[name] - frame[bare]
        floor_req = short[floor] - short[bare]
        floor_frame = frame[floor] - frame[bare]
        rows.append(
            [
                name,
                f"{short[name]:,.0f}",
                "-" if name == bare else f"+{added_req:,.0f}",
                "-" if name in (bare, floor) else f"{added_req / floor_req:.2f}x",
                f"{frame[name]:,.0f}",
                "-" if name == bare else f"+{added_frame:,.0f}",
                "-" if name in (bare, floor) else f"{added_frame / floor_frame:.2f}x",
            ]
        )
    print(f"machine: {machine()}\n")
    print(
        table(
            [
                "variant",
                "instructions / request",
                "added",
                "added / floor's",
                "instructions / frame",
                "added",
                "added / floor's",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
