"""Benchmark 5: 10,000 concurrent in-flight streams, in process, over raw ASGI.

Measures, each against the same app without the middleware and with the pass-through floor:
memory added per in-flight request (tracemalloc), the cost of ``Drain.status()``, of the
``/status`` JSON (in process and over the real admin Unix socket) and of ``/ready`` at 0
and at N in flight, and how long after the last stream's final frame ``Drain.drain()`` returns.

    python -m benchmarks.scale [--streams 10000] [--repeat 300]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from prometheus_client import CollectorRegistry

from benchmarks._common import machine, median, table, verdict
from benchmarks._drive import SCOPE, PassThrough, receive, sink
from graceful import GracefulMiddleware
from graceful._admin._paths import socket_path
from graceful._admin._server import AdminServer
from graceful._asgi._types import ASGIApp, Receive, Scope, Send

FRAME = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n'


class Streams:
    """An app whose streams send one frame, then wait to be released before their final frame.

    Streams are released in batches of ``batch``, one batch per millisecond (all at once when
    batch >= n). ``control`` is set at the instant the last stream's final frame has been
    sent: a plain waiter on it shows how long the loop itself takes to wake anyone then.
    """

    def __init__(self, n: int, batch: int | None = None) -> None:
        self.n = n
        self.batch = batch or n
        self.gates = [anyio.Event() for _ in range(-(-n // self.batch))]
        self.started = 0
        self.finished = 0
        self.last_final = 0.0
        self.control = anyio.Event()

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": FRAME, "more_body": True})
        gate = self.gates[self.started // self.batch]
        self.started += 1
        await gate.wait()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.finished += 1
        if self.finished == self.n:
            self.last_final = time.perf_counter()
            self.control.set()

    async def release(self) -> None:
        for gate in self.gates:
            gate.set()
            if len(self.gates) > 1:
                await anyio.sleep(0.001)


async def _until(check: Callable[[], bool]) -> None:
    while not check():
        await anyio.sleep(0.001)


async def hold(app: Any, streams: Streams, n: int, body: Callable[[], Awaitable[None]]) -> None:
    """Run ``n`` streams through ``app``, call ``body`` while all are in flight, then release them."""
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(app, dict(SCOPE), receive, sink)
        await _until(lambda: streams.started == n)
        await body()
        await streams.release()


async def memory_per_request(variant: str, n: int) -> float:
    """Bytes traced while ``n`` streams are held open, divided by n."""
    streams = Streams(n)
    app: ASGIApp = streams.app
    if variant == "floor":
        app = PassThrough(app)
    elif variant == "graceful":
        app = _graceful(app)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held = 0

    async def snapshot() -> None:
        nonlocal held
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before

    await hold(app, streams, n, snapshot)
    tracemalloc.stop()
    return held / n


def _graceful(app: ASGIApp) -> GracefulMiddleware:
    mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False)
    mw.drain.mark_serving()
    return mw


def _per_call(fn: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


async def _async_per_call(fn: Callable[[], Awaitable[object]], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        await fn()
    return (time.perf_counter() - start) / repeat


async def _admin_status(path: str) -> bytes:
    async with await anyio.connect_unix(path) as stream:
        await stream.send(b"GET /status HTTP/1.1\r\nhost: graceful\r\n\r\n")
        chunks = []
        try:
            while True:
                chunks.append(await stream.receive())
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass
    return b"".join(chunks)


async def status_costs(mw: GracefulMiddleware, admin_path: str, repeat: int) -> dict[str, float]:
    drain = mw.drain
    ready_scope = {**SCOPE, "method": "GET", "path": "/ready"}

    async def ready() -> None:
        await mw(ready_scope, receive, sink)

    def status_json() -> bytes:
        return json.dumps(drain.status().as_dict()).encode()

    costs: dict[str, float] = {}
    # With the collector on, a call that allocates can pay for a full collection of every
    # live object (10,000 tasks); with it off, what is left is the call's own cost.
    for collector in ("gc on", "gc off"):
        if collector == "gc off":
            gc.collect()
            gc.disable()
        try:
            costs[f"Drain.status() ({collector})"] = _per_call(drain.status, repeat)
            costs[f"/status JSON: status().as_dict() + json.dumps ({collector})"] = _per_call(status_json, repeat)
            costs[f"/ready probe through the middleware ({collector})"] = await _async_per_call(ready, repeat)
        finally:
            gc.enable()
    costs["/status over the admin Unix socket, round trip"] = await _async_per_call(
        lambda: _admin_status(admin_path), max(10, repeat // 10)
    )
    return costs


async def drain_latency(n: int, batch: int | None) -> dict[str, Any]:
    """Release ``n`` held streams during a drain; time from the last final frame to drain() returning."""
    streams = Streams(n, batch)
    mw = _graceful(streams.app)
    drain = mw.drain
    out: dict[str, Any] = {}

    async with anyio.create_task_group() as tg:

        async def run_drain() -> None:
            await drain.drain(propagation_wait=0, timeout=120)
            out["drain"] = time.perf_counter()

        async def control() -> None:
            await streams.control.wait()
            out["control"] = time.perf_counter()

        async def body() -> None:
            out["in_flight"] = drain.in_flight
            tg.start_soon(run_drain)
            tg.start_soon(control)
            await _until(lambda: drain.state.value == "DRAINING")

        await hold(mw, streams, n, body)
    out["drain"] -= streams.last_final
    out["control"] -= streams.last_final
    out["result"] = drain.last_result.result if drain.last_result else "?"
    return out


async def scale(n: int, repeat: int, rounds: int = 7) -> dict[str, Any]:
    results: dict[str, Any] = {"memory": {}}
    for variant in ("bare", "floor", "graceful"):
        results["memory"][variant] = await memory_per_request(variant, n)

    # Two middlewares side by side: one holds n streams, the other none. Their costs are
    # sampled alternately while the streams are held, so load drift hits both alike.
    streams = Streams(n)
    busy_mw = _graceful(streams.app)
    idle_mw = _graceful(Streams(1).app)
    samples: dict[str, dict[str, list[float]]] = {"idle": {}, "busy": {}}
    with (
        tempfile.TemporaryDirectory(prefix="gb-", dir="/tmp") as idle_dir,
        tempfile.TemporaryDirectory(prefix="gb-", dir="/tmp") as busy_dir,
    ):
        async with anyio.create_task_group() as admin_tg:
            paths = {}
            for which, mw, socket_dir in (("idle", idle_mw, idle_dir), ("busy", busy_mw, busy_dir)):
                await admin_tg.start(AdminServer(mw.drain, socket_dir=socket_dir).serve)
                paths[which] = socket_path(socket_dir, os.getpid())

            async def sample() -> None:
                results["in_flight"] = busy_mw.drain.in_flight
                for i in range(rounds):
                    order = (("idle", idle_mw), ("busy", busy_mw))
                    for which, mw in order if i % 2 == 0 else order[::-1]:
                        for name, value in (await status_costs(mw, paths[which], repeat)).items():
                            samples[which].setdefault(name, []).append(value)

            await hold(busy_mw, streams, n, sample)
            admin_tg.cancel_scope.cancel()
    for which in ("idle", "busy"):
        results[which] = {name: median(values) for name, values in samples[which].items()}
    results["at_once"] = await drain_latency(n, None)
    results["staggered"] = await drain_latency(n, max(1, n // 100))
    return results


def report(r: dict[str, Any], n: int) -> str:
    us = 1e6
    memory = r["memory"]
    added = memory["graceful"] - memory["bare"]
    floor_added = memory["floor"] - memory["bare"]
    mem_rows = [
        ["bare app", f"{memory['bare']:.0f}", "-", "-"],
        ["pass-through wrapper (floor)", f"{memory['floor']:.0f}", f"{floor_added:+.0f}", "-"],
        [
            "GracefulMiddleware",
            f"{memory['graceful']:.0f}",
            f"{added:+.0f}",
            f"{added / floor_added:.2f}x" if floor_added > 0 else "-",
        ],
    ]
    cost_rows = []
    growth_gc_off = 0.0
    for name, idle in r["idle"].items():
        busy = r["busy"][name]
        if "gc off" in name:
            growth_gc_off = max(growth_gc_off, busy / idle)
        cost_rows.append([name, f"{idle * us:.2f}", f"{busy * us:.2f}", f"{busy / idle:.2f}x"])
    drain_rows = []
    for label, key in ((f"all {n} released at once", "at_once"), ("released 1% per ms over ~100 ms", "staggered")):
        d = r[key]
        drain_rows.append(
            [
                label,
                f"{d['drain'] * 1e3:.2f}",
                f"{d['control'] * 1e3:.2f}",
                f"{(d['drain'] - d['control']) * 1e3:+.2f}",
                d["result"],
            ]
        )
    worst = max(r["at_once"]["drain"], r["staggered"]["drain"])
    own = max(r[k]["drain"] - r[k]["control"] for k in ("at_once", "staggered"))
    ok = all(r[k]["result"] == "drained" for k in ("at_once", "staggered"))
    targets = [
        ["memory added per in-flight request", f"{added:.0f} B", "<= 2048 B", verdict(added <= 2048)],
        [
            f"status/probe cost at {n} vs 0 in flight (worst, gc off)",
            f"{growth_gc_off:.2f}x",
            "does not grow (~1x)",
            verdict(growth_gc_off <= 1.5),
        ],
        [
            "drain() returns after the last final frame (worst case)",
            f"{worst * 1e3:.2f} ms",
            "<= 100 ms",
            verdict(ok and worst <= 0.1),
        ],
        [
            "the same, minus the control waiter (graceful's own part)",
            f"{own * 1e3:+.2f} ms",
            "<= 100 ms",
            verdict(ok and own <= 0.1),
        ],
    ]
    return "\n\n".join(
        [
            f"Machine: {machine()}",
            f"{n} streams held open at once (in flight seen by the Drain: {r['in_flight']}).",
            table(["variant", "bytes per in-flight stream", "added over bare", "added / floor"], mem_rows),
            table(["call", "0 in flight (us)", f"{n} in flight (us)", "ratio"], cost_rows),
            table(
                [
                    "streams end",
                    "drain() returns after last frame (ms)",
                    "plain waiter woken (ms, control)",
                    "drain minus control (ms)",
                    "result",
                ],
                drain_rows,
            ),
            table(["scale", "measured", "target", ""], targets),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=300, help="calls per status-cost sample")
    parser.add_argument("--rounds", type=int, default=7, help="alternating idle/busy samples")
    args = parser.parse_args(argv)
    result = anyio.run(scale, args.streams, args.repeat, args.rounds)
    print(report(result, args.streams))


if __name__ == "__main__":
    main()
