"""Benchmark 3: how fast a drain takes effect on a real ``graceful run`` server.

Each trial: the server serves; the drain is started, either by a raw ``POST /drain`` on the
admin Unix socket or by running ``graceful drain``; then one client loop alternates
``GET /ready`` and ``GET /v1/hello`` on keep-alive connections to 127.0.0.1 and notes when
each first answers 503. Times are from the admin request's last byte leaving the client
(a few microseconds before it arrives), or from the moment the CLI process is started.
The resolution is one probe round trip, which is included in every figure. After each
trial, ``POST /resume`` puts the server back to serving.

The CLI trials run the hook as a container image does: the console script ``bin/graceful`` of a
clean venv with this repository ``pip install``-ed into it (``benchmarks/_venv.py``; built once
under ``.bench-venv/``), executed directly, so no version-manager shim and no ``.pth`` file of the
development interpreter is timed. The same venv's ``python -c pass``, started and waited for in
the same way, is the interpreter floor, interleaved with the CLI trials. During a CLI trial the
probes pause 1 ms between rounds (the resolution becomes one round trip plus 1 ms), so that on a
small machine the probe loop does not take the cores the hook's start-up needs.

    python -m benchmarks.drain_reaction [--trials 200] [--cli-trials 15]
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import time

from benchmarks._common import machine, median, percentile, table, verdict
from benchmarks._live import Server, get, graceful_run, read_all
from benchmarks._venv import CleanVenv, clean_venv

CLI_PROBE_INTERVAL = 0.001
_DRAIN_STARTED = re.compile(rb'"drain_started": ([0-9.]+)')


def interpreter_floor(venv: CleanVenv) -> float:
    """Seconds from starting the clean venv's ``python -c pass`` to its exit, started as the hook is."""
    t0 = time.perf_counter()
    subprocess.run([venv.python, "-c", "pass"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def trial(server: Server, *, cli: CleanVenv | None) -> tuple[float, float, float, float]:
    """Seconds from the start to /ready 503, to the first rejected request, and (admin only, on the
    server's clock) to the state change; plus one probe's round trip."""
    ready = server.probe()
    work = server.probe()
    # Warm both connections and measure a round trip while serving.
    t = time.perf_counter()
    assert get(ready, "/ready") == 200
    rtt = time.perf_counter() - t
    assert get(work, "/v1/hello") == 200
    proc = None
    admin = None
    if cli is not None:
        command = [cli.graceful, "drain", "--propagation-wait", "0", "--quiet", "--socket-dir", server.socket_dir]
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    else:
        admin = server.admin("POST", "/drain?propagation_wait=0&reason=bench")
        t0 = time.perf_counter()
        sent_wall = time.time()
    to_ready = to_reject = 0.0
    deadline = t0 + 30
    while not (to_ready and to_reject):
        if not to_ready and get(ready, "/ready") == 503:
            to_ready = time.perf_counter() - t0
        if not to_reject and get(work, "/v1/hello") == 503:
            to_reject = time.perf_counter() - t0
        if time.perf_counter() > deadline:
            raise RuntimeError("the drain never took effect")
        if cli is not None:
            # Probing back to back would keep the server and this loop busy on two cores while
            # the hook being timed starts up; a probe pair every millisecond leaves it a core.
            time.sleep(CLI_PROBE_INTERVAL)
    to_state = float("nan")
    if admin is not None:
        reply = read_all(admin)  # nothing is in flight, so the drain's result line comes at once
        admin.close()
        started = _DRAIN_STARTED.search(reply)
        if started is not None:
            to_state = float(started.group(1)) - sent_wall
    if proc is not None:
        proc.wait(30)
    ready.close()
    work.close()
    server.resume()
    return to_ready, to_reject, to_state, rtt


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=200, help="trials through the admin socket")
    parser.add_argument("--cli-trials", type=int, default=15, help="trials through `graceful drain`")
    args = parser.parse_args(argv)
    results: dict[str, list[tuple[float, float, float, float]]] = {"admin": [], "cli": []}
    floor: list[float] = []
    venv = clean_venv() if args.cli_trials > 0 else None
    with graceful_run("benchmarks.apps:holder", "--propagation-wait", "0") as server:
        for _ in range(3):  # warm-up
            trial(server, cli=None)
        # Interleave the two kinds so that a busy spell on the machine hits both.
        every = max(1, args.trials // max(1, args.cli_trials))
        for i in range(args.trials):
            results["admin"].append(trial(server, cli=None))
            if venv is not None and i % every == 0 and len(results["cli"]) < args.cli_trials:
                results["cli"].append(trial(server, cli=venv))
                floor.append(interpreter_floor(venv))
        while venv is not None and len(results["cli"]) < args.cli_trials:
            results["cli"].append(trial(server, cli=venv))
            floor.append(interpreter_floor(venv))
    ms = 1e3
    rows = []
    for kind, label in (("admin", "admin request sent"), ("cli", "clean venv's `graceful drain` started")):
        samples = results[kind]
        if not samples:
            continue
        for index, what in ((0, "/ready answers 503"), (1, "first new request rejected (503)")):
            values = [s[index] for s in samples]
            rows.append(
                [
                    f"{label} -> {what}",
                    len(values),
                    f"{median(values) * ms:.2f}",
                    f"{percentile(values, 99) * ms:.2f}",
                    f"{max(values) * ms:.2f}",
                ]
            )
    if floor:
        rows.append(
            [
                "clean venv's `python -c pass` started -> exited (the interpreter floor)",
                len(floor),
                f"{median(floor) * ms:.2f}",
                f"{percentile(floor, 99) * ms:.2f}",
                f"{max(floor) * ms:.2f}",
            ]
        )
    state = [s[2] for s in results["admin"] if not math.isnan(s[2])]
    if state:
        rows.insert(
            0,
            [
                "admin request sent -> state DRAINING (server clock, no probe)",
                len(state),
                f"{median(state) * ms:.2f}",
                f"{percentile(state, 99) * ms:.2f}",
                f"{max(state) * ms:.2f}",
            ],
        )
    rtt = median([s[3] for s in results["admin"]])
    p99 = max(percentile([s[i] for s in results["admin"]], 99) for i in (0, 1))
    targets = [
        ["p99 after the admin request (worst of the two)", f"{p99 * ms:.2f} ms", "<= 5 ms", verdict(p99 <= 0.005)]
    ]
    if results["cli"]:
        p50 = median([s[0] for s in results["cli"]])
        targets.append(
            ["`graceful drain` started -> /ready 503, p50", f"{p50 * ms:.2f} ms", "<= 60 ms", verdict(p50 <= 0.060)]
        )
    print(f"Machine: {machine()}\n")
    if venv is not None:
        print(f"The hook: {venv.graceful} (console script of a clean venv, pip install . non-editable)\n")
    print(f"One probe round trip while serving (median): {rtt * ms:.2f} ms; every figure includes at least one.\n")
    print(table(["from -> to", "trials", "p50 (ms)", "p99 (ms)", "max (ms)"], rows))
    print()
    print(table(["drain reaction", "measured", "target", ""], targets))


if __name__ == "__main__":
    main()
