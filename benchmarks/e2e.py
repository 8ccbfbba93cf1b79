"""Benchmark 2: requests per second under uvicorn, with and without GracefulMiddleware.

Two uvicorn processes serve the same Starlette app (``benchmarks.apps``), one bare and
one wrapped, both pinned to one CPU; wrk, pinned to another CPU, loads one of them at a
time on 127.0.0.1. So the server under load has a core to itself and never shares it with
wrk or with the other server. Each round runs wrk once against each server, in alternating
order, and gives one paired ratio, wrapped req/s over bare req/s.

The figure is the median of the rounds' ratios, with a 95% confidence interval for that
median which assumes nothing about how the ratios are distributed (the sign-test interval):
the k-th smallest to the k-th largest of the n ratios, with k the largest for which a
Binomial(n, 1/2) count falls in [k, n - k] with probability >= 95%. It needs 6 rounds at
least, and a stalled round moves it by one rank at most. The verdict is "met" when the whole
interval is at or above the target, "missed" when it is all below, and "not settled" when it
spans the target.

The server's CPU time per request (``/proc/PID/schedstat`` over the wrk run, divided by the
requests wrk counted; the user-space part from ``/proc/PID/stat``) is reported beside it: how
much longer the wrapped server works on one request, in microseconds, and bare / wrapped CPU
time per request, the req/s ratio of two servers that each have a core to themselves, which
other processes taking turns on the server's core do not move as they move req/s (same
interval). "Busy" is the server's CPU time over the wall time of the wrk run: below 100%, wrk
or other processes set part of the pace. Access logs are off in both.

    python -m benchmarks.e2e [--rounds 20] [--duration 2] [--connections 16] [--paths short,stream]
                             [--server-cpu N] [--wrk-cpu N]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from benchmarks._common import machine, median, table
from benchmarks._uvicorn import cpu_ns, cpus, pin, uvicorn_server

PATHS = {"short": "/v1/hello", "stream": "/v1/stream"}  # a short JSON response; a 20-frame SSE stream
TARGET = 0.97
CONFIDENCE = 0.95
_RPS = re.compile(rb"Requests/sec:\s+([0-9.]+)")
_REQUESTS = re.compile(rb"(\d+) requests in ")


def user_sys_ticks(pid: int) -> tuple[int, int]:
    """Process ``pid``'s user and system CPU time, in clock ticks (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


_TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Run:
    rps: float
    cpu_us: float = 0.0  # server CPU per request (schedstat, ns resolution)
    user_us: float = 0.0  # of which in user space (/proc/PID/stat, clock-tick resolution)
    busy: float = 0.0  # share of the wall time the server ran


def wrk(port: int, path: str, duration: float, connections: int, cpu: int | None = None, pid: int | None = None) -> Run:
    """One wrk run; with ``pid``, also the server's CPU time over it."""
    before = cpu_ns(pid) if pid is not None else 0
    ticks = user_sys_ticks(pid) if pid is not None else (0, 0)
    t0 = time.monotonic()
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", f"http://127.0.0.1:{port}{path}"],
        capture_output=True,
        check=True,
        timeout=duration + 30,
        preexec_fn=None if cpu is None else pin(cpu),
    ).stdout
    wall = time.monotonic() - t0
    rps, requests = _RPS.search(out), _REQUESTS.search(out)
    if rps is None or requests is None:
        raise RuntimeError(f"no Requests/sec in wrk output: {out!r}")
    if pid is None:
        return Run(float(rps.group(1)))
    used = cpu_ns(pid) - before
    user = user_sys_ticks(pid)[0] - ticks[0]
    n = max(1, int(requests.group(1)))
    return Run(float(rps.group(1)), used / 1000 / n, user * _TICK_US / n, used / 1e9 / wall)


def sign_rank(n: int, confidence: float = CONFIDENCE) -> tuple[int, float] | None:
    """The rank k and the coverage of the distribution-free interval for the median of n values.

    [x_(k), x_(n+1-k)] of the sorted values covers the median with probability 1 - 2 P(B < k),
    B ~ Binomial(n, 1/2); k is the largest that keeps that at or above ``confidence``. None when
    no k does (fewer than 6 values for 95%).
    """
    best = None
    below = 0  # P(B < k) * 2**n
    for k in range(1, n // 2 + 1):
        below += math.comb(n, k - 1)
        coverage = 1 - 2 * below / 2**n
        if coverage < confidence:
            break
        best = (k, coverage)
    return best


def median_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The sign-test interval for the median of ``values`` (see ``sign_rank``)."""
    rank = sign_rank(len(values))
    if rank is None:
        return None
    ordered = sorted(values)
    return ordered[rank[0] - 1], ordered[len(values) - rank[0]]


def verdict(interval: tuple[float, float] | None, ratio: float) -> str:
    if interval is None:
        return ("met" if ratio >= TARGET else "**missed**") + " (median only: no interval below 6 rounds)"
    low, high = interval
    if low >= TARGET:
        return "met"
    if high < TARGET:
        return "**missed**"
    return "not settled (the interval spans it)"


def _nth(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 < 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=20, help="paired runs per path (6 or more for an interval)")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset of: " + ", ".join(PATHS))
    parser.add_argument("--server-cpu", type=int, help="CPU the servers run on (default: the first allowed)")
    parser.add_argument("--wrk-cpu", type=int, help="CPU wrk runs on (default: the second allowed)")
    parser.add_argument("--floor", action="store_true", help="a third server: the pass-through floor (context)")
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: install it from the system packages (apt-get install wrk)")
    server_cpu, wrk_cpu = cpus("benchmarks.e2e")
    server_cpu = server_cpu if args.server_cpu is None else args.server_cpu
    wrk_cpu = wrk_cpu if args.wrk_cpu is None else args.wrk_cpu
    if server_cpu == wrk_cpu:
        sys.exit(f"--server-cpu and --wrk-cpu are both {server_cpu}: give them different CPUs")
    duration = max(1, round(args.duration))
    paths = {label: PATHS[label] for label in args.paths.split(",") if label}
    names = ["bare", "wrapped", *(["floor"] if args.floor else [])]
    runs: dict[str, dict[str, list[Run]]] = {label: {name: [] for name in names} for label in paths}
    load_before = os.getloadavg()[0]
    with ExitStack() as stack:
        servers = {name: stack.enter_context(uvicorn_server(f"benchmarks.apps:{name}", server_cpu)) for name in names}
        for path in paths.values():
            for server in servers.values():  # warm-up, not counted
                wrk(server.port, path, 1, args.connections, wrk_cpu)
        # Rounds outside, paths inside: every path's rounds spread over the whole run.
        for i in range(args.rounds):
            # Alternate the order so no server always gets the quieter part of a round.
            order = names if i % 2 == 0 else names[::-1]
            for label, path in paths.items():
                for name in order:
                    server = servers[name]
                    runs[label][name].append(wrk(server.port, path, duration, args.connections, wrk_cpu, server.pid))
    rows = []
    cpu_rows = []
    for label, got in runs.items():
        for name in names[1:]:
            row, cpu_row = _rows(label if name == "wrapped" else f"{label}, pass-through floor", got["bare"], got[name])
            if name == "floor":
                row[-1] = "(context)"
            rows.append(row)
            cpu_rows.append(cpu_row)
    rank = sign_rank(args.rounds)
    print(f"Machine: {machine()} at the end of the run ({load_before:.2f} before it)\n")
    print(
        f"wrk -t1 -c{args.connections} -d{duration}s on CPU {wrk_cpu}; the uvicorn servers (1 worker, no access log, "
        f"Starlette app) on CPU {server_cpu}, one loaded at a time; {args.rounds} rounds per path, alternating which "
        "server goes first. Ratio: wrapped / bare req/s in each round, median over rounds. Interval: "
        + (
            f"the sign-test interval for the median, from the {_nth(rank[0])} lowest to the {_nth(rank[0])} highest "
            f"of the rounds (distribution-free, coverage {rank[1]:.1%}).\n"
            if rank
            else "none (6 rounds or more give one).\n"
        )
    )
    print(
        table(
            [
                "path",
                "bare (req/s, median)",
                "GracefulMiddleware (req/s, median)",
                "ratio (median of rounds)",
                "95% interval",
                "rounds' range",
                f"target >= {TARGET}",
            ],
            rows,
        )
    )
    print()
    print(
        table(
            [
                "path",
                "bare: server CPU per request, us (user)",
                "GracefulMiddleware, us (user)",
                "added, us (median of rounds)",
                "95% interval",
                "bare / wrapped CPU per request (median of rounds)",
                "95% interval",
                "server core busy (bare / wrapped)",
            ],
            cpu_rows,
        )
    )


def _rows(label: str, bare: list[Run], wrapped: list[Run]) -> tuple[list[str], list[str]]:
    """One path's row of each table: the req/s ratio, and the server CPU per request."""
    ratios = [w.rps / b.rps for b, w in zip(bare, wrapped)]
    ratio = median(ratios)
    interval = median_interval(ratios)
    added = [w.cpu_us - b.cpu_us for b, w in zip(bare, wrapped)]
    added_interval = median_interval(added)
    row = [
        label,
        f"{median([r.rps for r in bare]):.0f}",
        f"{median([r.rps for r in wrapped]):.0f}",
        f"{ratio:.3f}",
        "-" if interval is None else f"{interval[0]:.3f} - {interval[1]:.3f}",
        f"{min(ratios):.3f} - {max(ratios):.3f}",
        verdict(interval, ratio),
    ]
    # The req/s ratio a server with its core to itself would give: bare / wrapped CPU per request.
    cpu_ratios = [b.cpu_us / w.cpu_us for b, w in zip(bare, wrapped)]
    cpu_interval = median_interval(cpu_ratios)
    cpu_row = [
        label,
        f"{median([r.cpu_us for r in bare]):.1f} ({median([r.user_us for r in bare]):.1f})",
        f"{median([r.cpu_us for r in wrapped]):.1f} ({median([r.user_us for r in wrapped]):.1f})",
        f"{median(added):+.2f}",
        "-" if added_interval is None else f"{added_interval[0]:+.2f} - {added_interval[1]:+.2f}",
        f"{median(cpu_ratios):.3f}",
        "-" if cpu_interval is None else f"{cpu_interval[0]:.3f} - {cpu_interval[1]:.3f}",
        f"{median([r.busy for r in bare]):.0%} / {median([r.busy for r in wrapped]):.0%}",
    ]
    return row, cpu_row


if __name__ == "__main__":
    main()
