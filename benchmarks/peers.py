"""Peers side by side: GracefulMiddleware against the middlewares users add for the same jobs.

Every variant wraps the same raw ASGI apps as ``benchmarks.inprocess`` (a short JSON
response, and an SSE stream of FRAMES frames):

- bare app, and the pass-through wrapper (the floor every middleware that sees each frame pays);
- GracefulMiddleware, default options, metrics on (a private registry, no admin socket);
- starlette-exporter's PrometheusMiddleware; its in-progress gauge is always on. The apps have no
  router to group paths by, so ``filter_unhandled_paths=False`` makes it record every request;
- prometheus-fastapi-instrumentator's middleware (what ``Instrumentator().instrument(app)`` adds),
  with ``should_instrument_requests_inprogress=True``;
- asgi-correlation-id's CorrelationIdMiddleware, defaults (request ids);
- the BaseHTTPMiddleware in-flight counter written by hand.

Each request gets its own shallow copy of the scope, as a server gives: asgi-correlation-id
writes the id it makes into the request headers, and a shared scope would hand it that id back.

Time: one process, variants in shuffled order each round, medians over rounds; per frame is
each round's (stream - short) / FRAMES. Each variant runs about the same wall time a round.
Instructions: each variant in its own process under valgrind's callgrind, WARMUP + N requests
minus WARMUP requests, divided by N; one-time costs of a first request stay out. Timings on a
shared machine swing; instruction counts repeat.

    python -m benchmarks.peers [--rounds 25] [--round-ms 20] [--frames 100] [--requests 2000] [--no-instructions]

Run one instruction measurement by hand: python -m benchmarks.peers --child VARIANT FRAMES N
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import sys
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from benchmarks._callgrind import per_request_and_frame, require
from benchmarks._common import machine, median
from benchmarks._drive import BARE, BASEHTTP, FLOOR, GRACEFUL, make_app, side_by_side, timed
from benchmarks._drive import VARIANTS as OURS
from graceful._asgi._types import ASGIApp

PEER_PACKAGES = {
    "starlette_exporter": "starlette-exporter",
    "prometheus_fastapi_instrumentator": "prometheus-fastapi-instrumentator",
    "asgi_correlation_id": "asgi-correlation-id",
}
WARMUP = 20
_gauge_names = itertools.count()


def starlette_exporter(app: ASGIApp) -> ASGIApp:
    from starlette_exporter import PrometheusMiddleware

    # Its metrics live on the class and in the default registry: one set per process.
    return PrometheusMiddleware(app, filter_unhandled_paths=False)


def instrumentator(app: ASGIApp) -> ASGIApp:
    from prometheus_fastapi_instrumentator.middleware import PrometheusInstrumentatorMiddleware

    # The in-progress gauge goes to the default registry whatever `registry` says: one name each.
    return PrometheusInstrumentatorMiddleware(
        app,
        should_instrument_requests_inprogress=True,
        inprogress_name=f"http_requests_inprogress_{next(_gauge_names)}",
        registry=CollectorRegistry(),
    )


def correlation_id(app: ASGIApp) -> ASGIApp:
    from asgi_correlation_id import CorrelationIdMiddleware

    return CorrelationIdMiddleware(app)


VARIANTS: dict[str, Callable[[ASGIApp], ASGIApp]] = {
    BARE: OURS[BARE],
    FLOOR: OURS[FLOOR],
    GRACEFUL: OURS[GRACEFUL],
    "starlette-exporter PrometheusMiddleware": starlette_exporter,
    "prometheus-fastapi-instrumentator (in-progress gauge on)": instrumentator,
    "asgi-correlation-id CorrelationIdMiddleware": correlation_id,
    BASEHTTP: OURS[BASEHTTP],
}


def missing_peers() -> list[str]:
    """The peer distributions that are not installed, by their names on PyPI."""
    missing = []
    for module, distribution in PEER_PACKAGES.items():
        try:
            __import__(module)
        except ImportError:
            missing.append(distribution)
    return missing


async def drive(app: ASGIApp, n: int) -> float:
    """Seconds per request over ``n`` back-to-back requests, each with a fresh scope."""
    return await timed(app, n, fresh_scope=True)


async def timings(rounds: int, round_s: float, frames: int) -> dict[str, dict[str, float]]:
    """Median seconds per request (short) and per frame ((stream - short) / frames) for every variant."""
    apps = {name: {"short": wrap(make_app(0)), "stream": wrap(make_app(frames))} for name, wrap in VARIANTS.items()}
    # Warm up, and size each variant's batch so that every batch takes about round_s.
    counts = {
        name: {
            kind: max(3, int(round_s / await drive(app, 50 if kind == "short" else 5))) for kind, app in pair.items()
        }
        for name, pair in apps.items()
    }
    samples: dict[str, dict[str, list[float]]] = {name: {"short": [], "stream": []} for name in VARIANTS}
    order = list(VARIANTS)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            for kind in ("short", "stream"):
                samples[name][kind].append(await drive(apps[name][kind], counts[name][kind]))
    return {
        name: {
            "request": median(got["short"]),
            "frame": median([(s - r) / frames for s, r in zip(got["stream"], got["short"], strict=True)]),
        }
        for name, got in samples.items()
    }


def child(variant: str, frames: int, n: int) -> None:
    app = VARIANTS[variant](make_app(frames))

    async def run() -> None:
        await drive(app, WARMUP + n)

    asyncio.run(run())


def report(
    times: dict[str, dict[str, float]] | None, counts: dict[str, dict[str, float]] | None, args: argparse.Namespace
) -> str:
    parts = [f"Machine: {machine()}"]
    if counts is not None:
        parts.append(
            f"Instructions (callgrind, each variant in its own process, {args.requests} short requests and "
            f"{max(1, args.requests // 10)} {args.frames}-frame streams after {WARMUP} warm-up ones, PYTHONHASHSEED=0):"
        )
        count = "{:,.0f}".format
        parts.append(side_by_side(counts, ("instructions / request", "instructions / frame"), count, count))
    if times is not None:
        parts.append(
            f"Time (one process, {args.rounds} rounds of shuffled variants, ~{args.round_ms:g} ms per variant "
            f"and kind a round, medians; per frame from {args.frames}-frame streams):"
        )
        parts.append(
            side_by_side(times, ("us / request", "us / frame"), lambda v: f"{v * 1e6:.2f}", lambda v: f"{v * 1e6:.3f}")
        )
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--round-ms", type=float, default=20.0, help="wall time per variant and kind in a round")
    parser.add_argument("--frames", type=int, default=100, help="frames per stream")
    parser.add_argument("--requests", type=int, default=2000, help="short requests per callgrind run")
    parser.add_argument("--jobs", type=int, default=2, help="callgrind processes at a time")
    parser.add_argument("--no-time", action="store_true", help="skip the timing")
    parser.add_argument("--no-instructions", action="store_true", help="skip the callgrind counts")
    parser.add_argument("--child", nargs=3, metavar=("VARIANT", "FRAMES", "N"))
    args = parser.parse_args(argv)
    missing = missing_peers()
    if missing:
        sys.exit(f"benchmarks.peers needs {', '.join(missing)}: pip install -e '.[peers]'")
    if args.child:
        variant, frames, n = args.child
        child(variant, int(frames), int(n))
        return
    if not args.no_instructions:
        require("benchmarks.peers", ", or --no-instructions")
    times = None if args.no_time else asyncio.run(timings(args.rounds, args.round_ms / 1000, args.frames))
    counts = None
    if not args.no_instructions:
        counts = per_request_and_frame("benchmarks.peers", list(VARIANTS), args.requests, args.frames, jobs=args.jobs)
    print(report(times, counts, args))


if __name__ == "__main__":
    main()
