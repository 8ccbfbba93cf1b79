"""Benchmark 2b: what a request executes through uvicorn, bare and wrapped, against the same in process.

``benchmarks.e2e`` times the uvicorn servers; this counts what they execute. Each server of
``benchmarks.e2e`` (the same Starlette app bare, wrapped in GracefulMiddleware with default
options, and in the pass-through floor) runs on an inherited socket, pinned to one CPU, and serves
exactly N requests after a warm-up. A client pinned to another CPU sends them over 16 keep-alive
connections: each turn sends one request on every connection, then reads every answer, so 16 are
in flight as with ``wrk -c16``.

- **callgrind** (the servers at ``PYTHONHASHSEED=0``): ``callgrind_control`` zeroes the counts after
  the warm-up and dumps them after the N requests, so start-up and shutdown are left out. Per
  request: instructions, L1 misses (instruction and data) and mispredicted branches, from
  callgrind's cache and branch simulation (a model of the caches, not the hardware's counters),
  and the instructions inside the cyclic garbage collector (``gc_collect_main``, inclusive). The
  same counts are taken for the in-process drive of ``benchmarks.instructions`` (its raw app, N
  requests minus none; the stream with 21 frames), so that what the middleware adds can be set
  side by side in the two settings. Then the C functions whose instructions moved most.
- **cProfile**, over the same N requests without valgrind: Python function calls per request
  (a coroutine counts once per resumption), every function whose count differs from bare.
- **the garbage collector, timed** (no valgrind, no profiler): collections per 1,000 requests and
  the server's CPU time inside them (``gc.callbacks``, thread CPU time), beside its CPU time per
  request.

    python -m benchmarks.e2e_profile [--requests 2000] [--gc-requests 16000] [--paths short,stream]
                                     [--variants bare,floor,wrapped]      # needs valgrind
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import re
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import AbstractContextManager as ContextManager
from typing import Any

from benchmarks import _callgrind
from benchmarks._common import machine, table
from benchmarks._live import root
from benchmarks._uvicorn import Server, cpu_ns, cpus, drive, launched, pin
from benchmarks.e2e import PATHS

VARIANTS = {
    "bare": "bare app",
    "floor": "pass-through wrapper (floor)",
    "send_only": "ablation: send wrapped as Call.send wraps it",
    "receive_too": "ablation: the same, and receive wrapped in a coroutine as Call.receive",
    "wrapped": "GracefulMiddleware (default options)",
}
# Where uvicorn finds each: the apps of benchmarks.e2e and the two ablations (benchmarks/_drive.py).
TARGETS = {name: f"benchmarks.apps:{name}" for name in VARIANTS}
# The same variants in benchmarks.instructions' in-process drive (the ablations have none).
IN_PROCESS = {
    "bare": "bare app",
    "floor": "pass-through wrapper (floor)",
    "wrapped": "GracefulMiddleware, request-id echo off",
}
IN_PROCESS_FRAMES = {"short": 0, "stream": 21}  # the Starlette stream: 20 frames and [DONE], then the end
CONNECTIONS = 16
# Bounds on every wait for another process: a valgrind run of a few thousand requests takes minutes.
CLIENT_LIMIT = 900.0
TOOL_LIMIT = 600.0
WARM_UP = 200
EVENTS = {"instructions": ("Ir",), "L1 misses": ("I1mr", "D1mr", "D1mw"), "mispredicts": ("Bcm", "Bim")}

# The server: uvicorn on the inherited socket, as in benchmarks.e2e. SIGUSR1 starts what the mode
# measures (cProfile, the gc timing) and SIGUSR2 writes it out. A long keep-alive timeout, so that a
# connection waiting under valgrind is not closed (uvicorn arms the same timer per request either way).
_CHILD = """\
import cProfile, gc, json, os, signal, socket, sys, time, uvicorn
target, fd, out, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
profile = cProfile.Profile() if mode == "profile" else None
on, began, gc_ns, runs = [False], [0], [0, 0, 0], [0, 0, 0]
def timed(phase, info):
    if phase == "start":
        began[0] = time.thread_time_ns()
    elif on[0]:
        gc_ns[info["generation"]] += time.thread_time_ns() - began[0]
        runs[info["generation"]] += 1
if mode == "gc":
    gc.callbacks.append(timed)
def start(*_):
    on[0] = True
    if profile is not None:
        profile.enable()
    open(out + ".on", "w").close()
def stop(*_):
    if profile is not None:
        profile.disable()
        profile.dump_stats(out + ".pstats")
    on[0] = False
    with open(out + ".tmp", "w") as f:
        json.dump({"gc_ns": gc_ns, "collections": runs}, f)
    os.replace(out + ".tmp", out + ".json")
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
config = uvicorn.Config(target, log_level="warning", access_log=False, timeout_keep_alive=600)
uvicorn.Server(config).run(sockets=[socket.socket(fileno=fd)])
"""


def _drive_pinned(port: int, path: str, n: int, cpu: int) -> None:
    """``drive`` in a process of its own on ``cpu``, off the server's CPU."""
    command = [sys.executable, "-m", "benchmarks.e2e_profile", "--client", str(port), path, str(n)]
    subprocess.run(command, cwd=root(), check=True, timeout=CLIENT_LIMIT, preexec_fn=pin(cpu))


# -- the server --------------------------------------------------------------------------------


def server(target: str, mode: str, out: str, cpu: int, prefix: tuple[str, ...] = ()) -> ContextManager[Server]:
    return launched(
        lambda fd: [*prefix, sys.executable, "-c", _CHILD, target, str(fd), out, mode],
        target,
        cpu,
        env=_callgrind.env(),
        start_limit=300,  # valgrind starts an interpreter in seconds, not milliseconds
        stop_limit=60,
    )


def _signal_and_wait(pid: int, signum: int, path: str) -> None:
    os.kill(pid, signum)
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not answer signal {signum}")
        time.sleep(0.01)


# -- callgrind ---------------------------------------------------------------------------------

_CALLGRIND = (*_callgrind.CALLGRIND, "--cache-sim=yes", "--branch-sim=yes")


def _per_request(counts: dict[str, int], n: int) -> dict[str, float]:
    return {name: sum(counts.get(e, 0) for e in events) / n for name, events in EVENTS.items()}


def through_uvicorn(name: str, path: str, n: int, cpus_: tuple[int, int], tmp: str) -> tuple[dict[str, float], str]:
    out = os.path.join(tmp, f"{name}-{path.strip('/').replace('/', '-')}")
    prefix = (*_CALLGRIND, f"--callgrind-out-file={out}")
    with server(TARGETS[name], "callgrind", out, cpus_[0], prefix) as s:
        _drive_pinned(s.port, path, WARM_UP, cpus_[1])
        subprocess.run(["callgrind_control", "-z", str(s.pid)], check=True, capture_output=True, timeout=TOOL_LIMIT)
        _drive_pinned(s.port, path, n, cpus_[1])
        subprocess.run(
            ["callgrind_control", "-d", "measured", str(s.pid)], check=True, capture_output=True, timeout=TOOL_LIMIT
        )
    dump = out + ".1"  # the first dump; the one at exit is ``out``
    got = _per_request(_callgrind.summary(dump), n)
    got["in the garbage collector"] = _callgrind.annotate(dump, inclusive=True).get("gc_collect_main", 0) / n
    return got, dump


def in_process(name: str, frames: int, n: int, tmp: str) -> dict[str, float]:
    counts = []
    for requests in (0, n):
        # With no requests the stream's frames do not matter: one run serves both paths.
        out = os.path.join(tmp, f"inprocess-{name}-{frames if requests else 0}-{requests}")
        if os.path.exists(out):
            counts.append(_callgrind.summary(out))
            continue
        subprocess.run(
            [*_CALLGRIND, f"--callgrind-out-file={out}", sys.executable, "-m"]
            + ["benchmarks.instructions", "--child", IN_PROCESS[name], str(frames), str(requests)],
            cwd=root(),
            capture_output=True,
            check=True,
            timeout=CLIENT_LIMIT,
            env=_callgrind.env(),
        )
        counts.append(_callgrind.summary(out))
    return _per_request({e: counts[1][e] - counts[0][e] for e in counts[0]}, n)


# -- cProfile and the garbage collector, without valgrind -----------------------------------------


def profiled(name: str, path: str, n: int, cpus_: tuple[int, int], tmp: str) -> dict[str, float]:
    """Python calls per request, by function."""
    out = os.path.join(tmp, f"profile-{name}-{path.strip('/').replace('/', '-')}")
    with server(TARGETS[name], "profile", out, cpus_[0]) as s:
        _drive_pinned(s.port, path, WARM_UP, cpus_[1])
        _signal_and_wait(s.pid, signal.SIGUSR1, out + ".on")
        _drive_pinned(s.port, path, n, cpus_[1])
        _signal_and_wait(s.pid, signal.SIGUSR2, out + ".json")
    calls: dict[str, float] = {}
    raw: dict[tuple[str, int, str], tuple[Any, ...]] = pstats.Stats(out + ".pstats").stats  # type: ignore[attr-defined]
    for (filename, line, function), (_, ncalls, *_rest) in raw.items():
        where = filename.split("site-packages/")[-1].replace(root() + os.sep, "")
        # A built-in's name carries its type's address, which differs from process to process.
        key = f"{function} ({where}:{line})" if line else re.sub(r" at 0x[0-9a-f]+", "", function)
        calls[key] = calls.get(key, 0) + ncalls / n
    return calls


def gc_timed(name: str, path: str, n: int, cpus_: tuple[int, int], tmp: str) -> dict[str, float]:
    out = os.path.join(tmp, f"gc-{name}-{path.strip('/').replace('/', '-')}")
    with server(TARGETS[name], "gc", out, cpus_[0]) as s:
        _drive_pinned(s.port, path, WARM_UP * 5, cpus_[1])
        _signal_and_wait(s.pid, signal.SIGUSR1, out + ".on")
        before = cpu_ns(s.pid)
        _drive_pinned(s.port, path, n, cpus_[1])
        used = cpu_ns(s.pid) - before
        _signal_and_wait(s.pid, signal.SIGUSR2, out + ".json")
    with open(out + ".json") as f:
        got = json.load(f)
    return {
        "collections": sum(got["collections"]) * 1000 / n,
        "full": got["collections"][2] * 1000 / n,
        "gc_us": sum(got["gc_ns"]) / 1000 / n,
        "cpu_us": used / 1000 / n,
    }


# -- the report --------------------------------------------------------------------------------


def _added(value: float, base: float, fmt: str) -> str:
    return f"{value:{fmt}} ({value - base:+{fmt}})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000, help="requests counted under callgrind and cProfile")
    parser.add_argument("--gc-requests", type=int, default=16000, help="requests in the timed garbage-collector run")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset of: " + ", ".join(PATHS))
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated subset of: " + ", ".join(VARIANTS)
    )
    parser.add_argument("--no-callgrind", action="store_true", help="only the cProfile and garbage-collector runs")
    parser.add_argument("--client", nargs=3, metavar=("PORT", "PATH", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        port, path, n = args.client
        drive(int(port), path, int(n), CONNECTIONS)
        return
    if not args.no_callgrind:
        _callgrind.require("benchmarks.e2e_profile", ", or --no-callgrind")
    pinned = cpus("benchmarks.e2e_profile")
    names = [v for v in args.variants.split(",") if v]
    if names[0] != "bare":
        sys.exit("--variants must start with bare: every figure is set against it")
    paths = {label: PATHS[label] for label in args.paths.split(",") if label}
    n = args.requests
    load_before = os.getloadavg()[0]
    out: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in paths.items():
            out.append(f"### {label} ({path})\n")
            if not args.no_callgrind:
                uv = {}
                dumps = {}
                for name in names:
                    uv[name], dumps[name] = through_uvicorn(name, path, n, pinned, tmp)
                ip = {name: in_process(name, IN_PROCESS_FRAMES[label], n, tmp) for name in names if name in IN_PROCESS}
                out.append(_counts_table(names, ip, uv))
                out.append(_functions_table(dumps[names[0]], dumps[names[-1]], n, names[-1]))
            calls = {name: profiled(name, path, n, pinned, tmp) for name in (names[0], names[-1])}
            out.append(_calls_table(calls[names[0]], calls[names[-1]], names[-1]))
            gcs = {name: gc_timed(name, path, args.gc_requests, pinned, tmp) for name in names}
            out.append(_gc_table(gcs, args.gc_requests))
    print(f"Machine: {machine()} at the end of the run ({load_before:.2f} before it)\n")
    print(
        f"Servers on CPU {pinned[0]}, the client on CPU {pinned[1]}; {n} requests counted after {WARM_UP} of "
        f"warm-up, {CONNECTIONS} keep-alive connections, {CONNECTIONS} in flight. Counts per request; in brackets, "
        "added over bare.\n"
    )
    print("\n\n".join(out))


def _counts_table(names: list[str], ip: dict[str, dict[str, float]], uv: dict[str, dict[str, float]]) -> str:
    rows = []
    for where, got in (("in process", ip), ("through uvicorn", uv)):
        base = got[names[0]]
        for name in names:
            if name not in got:
                continue
            row = [VARIANTS[name], where]
            for event in EVENTS:
                value = got[name][event]
                row.append(f"{value:,.0f}" if name == names[0] else _added(value, base[event], ",.0f"))
            gc_cost = got[name].get("in the garbage collector")
            row.append("-" if gc_cost is None else f"{gc_cost:,.0f}")
            rows.append(row)
    headers = ["variant", "where", "instructions", "L1 misses (simulated)", "mispredicted branches (simulated)"]
    return "callgrind:\n\n" + table([*headers, "instructions in the garbage collector"], rows)


def _functions_table(bare_dump: str, other_dump: str, n: int, other: str) -> str:
    bare, wrapped = _callgrind.annotate(bare_dump, inclusive=False), _callgrind.annotate(other_dump, inclusive=False)
    moved = sorted(set(bare) | set(wrapped), key=lambda k: -abs(wrapped.get(k, 0) - bare.get(k, 0)))[:12]
    rows = [
        [
            f"`{k}`",
            f"{bare.get(k, 0) / n:,.0f}",
            f"{wrapped.get(k, 0) / n:,.0f}",
            f"{(wrapped.get(k, 0) - bare.get(k, 0)) / n:+,.0f}",
        ]
        for k in moved
    ]
    title = (
        "Through uvicorn, the C functions whose own instructions per request moved most, "
        f"{VARIANTS[other]} against bare:"
    )
    return title + "\n\n" + table(["C function (self)", "bare", VARIANTS[other], "difference"], rows)


def _calls_table(bare: dict[str, float], other: dict[str, float], name: str) -> str:
    moved = sorted(
        (k for k in set(bare) | set(other) if abs(other.get(k, 0) - bare.get(k, 0)) >= 0.5),
        key=lambda k: (-abs(other.get(k, 0) - bare.get(k, 0)), k),
    )
    rows = [
        [f"`{k}`", f"{bare.get(k, 0):.2f}", f"{other.get(k, 0):.2f}", f"{other.get(k, 0) - bare.get(k, 0):+.2f}"]
        for k in moved
    ]
    rows.append(
        [
            "all",
            f"{sum(bare.values()):.1f}",
            f"{sum(other.values()):.1f}",
            f"{sum(other.values()) - sum(bare.values()):+.1f}",
        ]
    )
    title = (
        f"cProfile through uvicorn, Python calls per request that differ by 0.5 or more, {VARIANTS[name]} against bare:"
    )
    return title + "\n\n" + table(["function", "bare", VARIANTS[name], "difference"], rows)


def _gc_table(gcs: dict[str, dict[str, float]], n: int) -> str:
    base = next(iter(gcs.values()))
    rows = [
        [
            VARIANTS[name],
            f"{got['collections']:.1f} ({got['full']:.2f})",
            _added(got["gc_us"], base["gc_us"], ".2f"),
            f"{got['cpu_us']:.1f}",
        ]
        for name, got in gcs.items()
    ]
    title = f"The garbage collector, timed ({n} requests, no valgrind, no profiler):"
    headers = [
        "variant",
        "collections per 1,000 requests (full)",
        "server CPU us per request in them",
        "server CPU us per request (one run each, not interleaved)",
    ]
    return title + "\n\n" + table(headers, rows)


if __name__ == "__main__":
    main()
