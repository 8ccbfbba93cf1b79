"""Benchmark 1: in-process cost per request and per streamed frame, four variants side by side.

The ASGI callables are driven directly, with no network and no server (``benchmarks/_drive.py``).
Variants are interleaved in rounds and each figure is the median over rounds, which keeps a
noisy neighbour from favouring one variant.

Back to back, every variant runs with its code and data in the CPU's caches: the figures are
warm-cache figures. With ``--evict KIB``, each request is timed alone, after a copy of a buffer
of that size has evicted them, as a server's own work between two requests does (uvicorn runs
about 230,000 instructions per short request: ``benchmarks.e2e_profile``). The copy is not timed.

    python -m benchmarks.inprocess [--rounds 15] [--requests 4000] [--streams 300] [--frames 100]
                                   [--evict KIB]
"""

from __future__ import annotations

import argparse
import asyncio
import random

from benchmarks._common import machine, median, table, verdict
from benchmarks._drive import BARE, BASEHTTP, FLOOR, GRACEFUL, VARIANTS, make_app, timed


async def measure(rounds: int, requests: int, streams: int, frames: int, evict: bytes) -> dict[str, dict[str, float]]:
    short = {name: wrap(make_app(0)) for name, wrap in VARIANTS.items()}
    stream = {name: wrap(make_app(frames)) for name, wrap in VARIANTS.items()}
    # BaseHTTPMiddleware is ~100x slower: fewer iterations keep a round short, the median is unaffected.
    scale = {name: 20 if name == BASEHTTP else 1 for name in VARIANTS}
    for name in VARIANTS:  # warm up caches, the request-id counter, the specialising interpreter
        await timed(short[name], max(1, requests // (10 * scale[name])), evict=evict)
        await timed(stream[name], max(1, streams // (10 * scale[name])), evict=evict)
    samples: dict[str, dict[str, list[float]]] = {name: {"short": [], "stream": []} for name in VARIANTS}
    order = list(VARIANTS)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            samples[name]["short"].append(await timed(short[name], max(1, requests // scale[name]), evict=evict))
            samples[name]["stream"].append(await timed(stream[name], max(1, streams // scale[name]), evict=evict))
    result: dict[str, dict[str, float]] = {}
    for name in VARIANTS:
        per_request = median(samples[name]["short"])
        # Each round's own stream-minus-short difference, so a slow round cancels out.
        per_frame = median(
            [(s - r) / frames for s, r in zip(samples[name]["stream"], samples[name]["short"], strict=True)]
        )
        result[name] = {"request": per_request, "frame": per_frame, "stream": median(samples[name]["stream"])}
    return result


def report(result: dict[str, dict[str, float]], frames: int, evict_kib: int) -> str:
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
            + (f"; every request timed alone after a {evict_kib} KiB copy (--evict)" if evict_kib else ""),
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
    evict = bytes(args.evict << 10)
    result = asyncio.run(measure(args.rounds, args.requests, args.streams, args.frames, evict))
    print(report(result, args.frames, args.evict))


if __name__ == "__main__":
    main()
