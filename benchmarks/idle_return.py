"""Benchmark 4: from the last stream's final frame to the drain being over.

Three figures, each p50/p99 over trials:

- in process: ``await Drain.drain()`` returning after the last held stream sends its final frame;
- ``graceful drain`` (the preStop CLI) exiting, against a real ``graceful run`` server;
- ``graceful run`` exiting after SIGTERM, once its last stream has ended.

The stream's end is timed where it is observed: by the app in process, by the client (the
final chunk arriving) for the CLI figures. The hooks used in the field poll every 1-5 s, so
the table also gives how many times sooner than a 1 s poll each one returns.

    python -m benchmarks.idle_return [--trials 200] [--cli-trials 10] [--run-trials 5]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import time

import anyio
from prometheus_client import CollectorRegistry

from benchmarks._common import machine, median, percentile, table, verdict
from benchmarks._drive import SCOPE, receive, sink
from benchmarks._live import HeldStream, Server, get, graceful_run, wait_for
from graceful import GracefulMiddleware
from graceful._asgi._types import Receive, Scope, Send

POLL = 1.0


async def in_process(trials: int) -> list[float]:
    out = []
    for _ in range(trials):
        release = anyio.Event()
        last = 0.0

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            nonlocal last
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
            await release.wait()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            last = time.perf_counter()

        mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False)
        mw.drain.mark_serving()
        returned = 0.0
        async with anyio.create_task_group() as tg:
            tg.start_soon(mw, dict(SCOPE), receive, sink)
            while mw.drain.in_flight == 0:
                await anyio.sleep(0)

            async def run_drain() -> None:
                nonlocal returned
                await mw.drain.drain(propagation_wait=0, timeout=30)
                returned = time.perf_counter()

            tg.start_soon(run_drain)
            while mw.drain.state.value != "DRAINING":
                await anyio.sleep(0)
            await anyio.sleep(0.001)  # let drain() reach its wait
            release.set()
        out.append(returned - last)
    return out


def _draining(server: Server) -> bool:
    conn = server.probe()
    try:
        return get(conn, "/ready") == 503
    except OSError:
        return False
    finally:
        conn.close()


def cli_drain(server: Server) -> float:
    stream = HeldStream(server.port)
    proc = subprocess.Popen(
        server.cli("drain", "--propagation-wait", "0", "--quiet"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: _draining(server), what="the CLI's drain to begin")
    time.sleep(0.05)  # the CLI is now reading the drain's progress stream
    last = stream.finish()
    proc.wait(30)
    exited = time.perf_counter()
    server.resume()
    return exited - last


def run_exit() -> float:
    with graceful_run("benchmarks.apps:holder", "--propagation-wait", "0") as server:
        stream = HeldStream(server.port)
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: _draining(server), what="SIGTERM to start the drain")
        last = stream.finish()
        server.proc.wait(30)
        return time.perf_counter() - last


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=200, help="in-process trials")
    parser.add_argument("--cli-trials", type=int, default=10, help="`graceful drain` trials")
    parser.add_argument(
        "--run-trials", type=int, default=5, help="`graceful run` + SIGTERM trials (a fresh server each)"
    )
    args = parser.parse_args(argv)
    results = {"in process: last frame -> Drain.drain() returns": (anyio.run(in_process, args.trials), 0.010)}
    cli = []
    if args.cli_trials:
        with graceful_run("benchmarks.apps:holder", "--propagation-wait", "0") as server:
            cli = [cli_drain(server) for _ in range(args.cli_trials)]
    results["CLI: last frame -> `graceful drain` exits"] = (cli, 0.050)
    results["CLI: last frame -> `graceful run` exits after SIGTERM"] = (
        [run_exit() for _ in range(args.run_trials)],
        0.050,
    )
    ms = 1e3
    rows = []
    for label, (values, target) in results.items():
        if not values:
            continue
        p50, p99 = median(values), percentile(values, 99)
        rows.append(
            [
                label,
                len(values),
                f"{p50 * ms:.2f}",
                f"{p99 * ms:.2f}",
                f"<= {target * ms:.0f} ms",
                verdict(p99 <= target),
                f"{POLL / p50:.0f}x sooner (mean poll wait {POLL / 2 / p50:.0f}x)",
            ]
        )
    print(f"Machine: {machine()}\n")
    print(
        table(
            ["from -> to", "trials", "p50 (ms)", "p99 (ms)", "target (p99)", "", "vs a 1 s poll (p50)"],
            rows,
        )
    )


if __name__ == "__main__":
    main()
