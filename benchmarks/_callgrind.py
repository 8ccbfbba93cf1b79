"""Instruction counts from valgrind's callgrind, the one figure a shared, noisy machine does not move.

The same binary, inputs and environment give the same count whatever else runs. Every count
runs its process at ``PYTHONHASHSEED=0``: with a random seed the layout of the dicts built at
start-up changes and the counts move by about 2% from run to run; with a fixed one they repeat
to within about 0.3%.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

__all__ = [
    "CALLGRIND",
    "LIMIT",
    "annotate",
    "arguments",
    "collected",
    "env",
    "per_request_and_frame",
    "require",
    "summary",
]

CALLGRIND = ("valgrind", "--tool=callgrind")
# A bound on one process under callgrind: the longest, 2,000 BaseHTTPMiddleware requests, takes minutes.
LIMIT = 1800.0


def arguments(doc: str | None, child: Callable[[str, int, int], None]) -> argparse.Namespace | None:
    """The command line of an instruction-count benchmark (``--requests``, ``--frames``): None once it has
    run ``child`` instead, for the ``--child VARIANT FRAMES N`` process that callgrind counts."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--child", nargs=3, metavar=("VARIANT", "FRAMES", "N"))
    args = parser.parse_args()
    if args.child:
        variant, frames, n = args.child
        child(variant, int(frames), int(n))
        return None
    return args


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONHASHSEED": "0"}


def require(what: str, fallback: str = "") -> None:
    """Exit with one line when valgrind is missing."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit(f"{what} needs valgrind: apt-get install valgrind{fallback}")


def collected(command: Sequence[str], *, check: bool = True, fixed_seed: bool = True) -> int:
    """Instructions of one whole process, ``command`` run under callgrind.

    ``check``: a non-zero exit is an error. ``fixed_seed``: ``PYTHONHASHSEED=0`` (the preStop
    counts run with the environment as it is, as a container starts the hook).
    """
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [*CALLGRIND, f"--callgrind-out-file={os.path.join(tmp, 'out')}", *command],
            capture_output=True,
            text=True,
            check=check,
            timeout=LIMIT,
            env=env() if fixed_seed else None,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:  # pragma: no cover - valgrind's output format
        raise RuntimeError(done.stderr[-2000:])
    return int(found.group(1))


def per_request_and_frame(
    module: str, variants: Sequence[str], requests: int, frames: int, *, jobs: int = 1
) -> dict[str, dict[str, float]]:
    """Instructions per short request and per frame of each variant, as 0-vs-N differences.

    ``python -m MODULE --child VARIANT FRAMES N`` drives N requests of ``VARIANT`` in process.
    Per request: the count with N short requests minus the count with none, over N. Per frame:
    the same for N // 10 streams of FRAMES frames, minus a short request, over FRAMES.
    """
    streams = max(1, requests // 10)
    runs = [(name, f, n) for name in variants for f, n in ((0, 0), (0, requests), (frames, 0), (frames, streams))]

    def one(run: tuple[str, int, int]) -> int:
        name, f, n = run
        # sys.executable as it is, not its real path: in a virtualenv that is a symlink, and the
        # interpreter it points at would start without the virtualenv's packages.
        return collected([sys.executable, "-m", module, "--child", name, str(f), str(n)])

    with ThreadPoolExecutor(jobs) as pool:
        got = dict(zip(runs, pool.map(one, runs), strict=True))
    result = {}
    for name in variants:
        short = (got[name, 0, requests] - got[name, 0, 0]) / requests
        stream = (got[name, frames, streams] - got[name, frames, 0]) / streams
        result[name] = {"request": short, "frame": (stream - short) / frames}
    return result


def summary(dump: str) -> dict[str, int]:
    """The totals of a callgrind dump, by event (Ir, I1mr, D1mr, ...)."""
    events: list[str] = []
    with open(dump) as f:
        for line in f:
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("summary:"):
                return dict(zip(events, map(int, line.split()[1:])))
    raise RuntimeError(f"no summary in {dump}")


def annotate(dump: str, inclusive: bool) -> dict[str, int]:
    """Instructions by C function (self, or inclusive), summed over the files a function's code comes from."""
    out = subprocess.run(
        [
            "callgrind_annotate",
            "--show=Ir",
            "--threshold=100",
            "--auto=no",
            f"--inclusive={'yes' if inclusive else 'no'}",
        ]
        + [dump],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    costs: dict[str, int] = {}
    total = 0
    for line in out.splitlines():
        found = re.match(r"\s*([\d,]+) (?:\([^)]*\))?\s+(.*?)(?: \[.*\])?$", line)
        if found is None:
            continue
        value = int(found.group(1).replace(",", ""))
        if "PROGRAM TOTALS" in line:
            total = value
            continue
        # Start-up frames (main, Py_RunMain, ...) show the whole dump as their own: left out.
        if not inclusive and total and value >= 0.99 * total:
            continue
        name = found.group(2).rsplit(":", 1)[-1]
        costs[name] = costs.get(name, 0) + value
    return costs
