"""Benchmark 2: requests per second under uvicorn, with and without GracefulMiddleware.

Two uvicorn processes serve the same Starlette app (``benchmarks.apps``), one bare and
one wrapped; wrk, a separate process, loads 127.0.0.1. Rounds alternate between the two
servers and the figure is the median of each round's wrapped/bare ratio, so drift in the
machine's load cancels out. Access logs are off in both.

    python -m benchmarks.e2e [--rounds 5] [--duration 3] [--connections 16]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from benchmarks._common import machine, median, table, verdict

PATHS = {"short": "/v1/hello", "stream": "/v1/stream"}  # a short JSON response; a 20-frame SSE stream
_RPS = re.compile(rb"Requests/sec:\s+([0-9.]+)")


def _answers(port: int) -> bool:
    """Whether the server behind ``port`` answers an HTTP request (any status)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            return bool(sock.recv(1))
    except OSError:
        return False


# uvicorn on a listening socket it inherits. Not uvicorn's own --fd: that wraps the descriptor as
# AF_UNIX whatever it is, so asyncio leaves TCP_NODELAY off on the TCP connections, and Nagle's
# algorithm against delayed ACKs then holds each small response about 40 ms (both variants stall
# near 370 req/s at 16 connections). socket(fileno=...) reads the real family from the descriptor.
_LAUNCH = """\
import socket, sys, uvicorn
sock = socket.socket(fileno=int(sys.argv[2]))
uvicorn.Server(uvicorn.Config(sys.argv[1], log_level="warning", access_log=False)).run(sockets=[sock])
"""


@contextmanager
def uvicorn_server(target: str) -> Iterator[int]:
    # uvicorn inherits a socket bound and listening here: no window for another process.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    port = int(listener.getsockname()[1])
    command = [sys.executable, "-c", _LAUNCH, target, str(listener.fileno())]
    # wrk cuts its connections mid-stream when it stops; asyncio logs each cut write on stderr.
    proc = subprocess.Popen(command, cwd=_root(), stderr=subprocess.DEVNULL, pass_fds=(listener.fileno(),))
    listener.close()
    try:
        deadline = time.monotonic() + 20
        while not _answers(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn {target} did not start")
            time.sleep(0.02)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wrk(port: int, path: str, duration: float, connections: int) -> float:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", f"http://127.0.0.1:{port}{path}"],
        capture_output=True,
        check=True,
        timeout=duration + 30,
    ).stdout
    match = _RPS.search(out)
    if match is None:
        raise RuntimeError(f"no Requests/sec in wrk output: {out!r}")
    return float(match.group(1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset of: " + ", ".join(PATHS))
    args = parser.parse_args(argv)
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: install it from the system packages (apt-get install wrk)")
    duration = max(1, round(args.duration))
    paths = {label: PATHS[label] for label in args.paths.split(",") if label}
    rows = []
    ratios: dict[str, float] = {}
    with uvicorn_server("benchmarks.apps:bare") as bare, uvicorn_server("benchmarks.apps:wrapped") as wrapped:
        for label, path in paths.items():
            for port in (bare, wrapped):  # warm-up, not counted
                wrk(port, path, 1, args.connections)
            bare_rps: list[float] = []
            wrapped_rps: list[float] = []
            pair_ratios: list[float] = []
            for i in range(args.rounds):
                # Alternate which goes first so neither always gets the quieter half of a round.
                first, second = (bare, wrapped) if i % 2 == 0 else (wrapped, bare)
                got = {first: wrk(first, path, duration, args.connections)}
                got[second] = wrk(second, path, duration, args.connections)
                bare_rps.append(got[bare])
                wrapped_rps.append(got[wrapped])
                pair_ratios.append(got[wrapped] / got[bare])
            ratios[label] = median(pair_ratios)
            rows.append(
                [
                    label,
                    f"{median(bare_rps):.0f}",
                    f"{median(wrapped_rps):.0f}",
                    f"{ratios[label]:.3f}",
                    f"{min(pair_ratios):.3f} - {max(pair_ratios):.3f}",
                    verdict(ratios[label] >= 0.97),
                ]
            )
    print(f"Machine: {machine()}\n")
    print(
        f"wrk -t1 -c{args.connections} -d{duration}s, {args.rounds} alternating rounds per path, "
        "uvicorn (1 worker, no access log), Starlette app.\n"
    )
    print(
        table(
            [
                "path",
                "bare (req/s, median)",
                "GracefulMiddleware (req/s, median)",
                "ratio (median of rounds)",
                "ratio range",
                "target >= 0.97",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
