"""The preStop hook's start-up, counted in instructions by valgrind's callgrind.

``graceful drain`` runs inside the grace period, and readiness fails only once it has
started and reached the admin socket. Wall-clock start-up times on a shared machine
swing several-fold; instruction counts do not. Each command runs once under callgrind;
the bare interpreter (``python -c pass``) is the floor, and the figure that matters is
each command's count above it. The socket path names nothing, so every command stops
at "no server" (exit 3) after its whole start-up.

    python -m benchmarks.prestop            # needs valgrind (Debian package)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

from ._common import machine, table, verdict

NOWHERE = "/nonexistent/graceful.sock"
COMMANDS = {
    "bare interpreter: python -c pass": ["-c", "pass"],
    "python -c 'import click' (the CLI framework alone)": ["-c", "import click"],
    "graceful drain (admin socket)": ["-m", "graceful", "drain", "--socket", NOWHERE],
    "graceful status": ["-m", "graceful", "status", "--socket", NOWHERE],
}
# graceful drain's start-up above the bare interpreter, before the admin client lost asyncio and httpx.
BEFORE = 323_000_000
TARGET_RATIO = 0.5


def count(args: list[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={os.path.join(tmp, 'out')}"]
            + [os.path.realpath(sys.executable), *args],
            capture_output=True,
            text=True,
            timeout=300,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:  # pragma: no cover - valgrind's output format
        raise RuntimeError(done.stderr[-2000:])
    return int(found.group(1))


def main() -> None:
    print(f"Machine: {machine()}\n")
    counts = {name: count(args) for name, args in COMMANDS.items()}
    floor = counts["bare interpreter: python -c pass"]
    rows = [[name, f"{n / 1e6:.1f} M", f"{(n - floor) / 1e6:+.1f} M"] for name, n in counts.items()]
    print(table(["command", "instructions", "above the interpreter"], rows))
    above = counts["graceful drain (admin socket)"] - floor
    ratio = above / BEFORE
    print()
    print(
        table(
            ["figure", "measured", "target", ""],
            [
                [
                    "drain start-up above the interpreter / before",
                    f"{ratio:.2f}",
                    f"<= {TARGET_RATIO}",
                    verdict(ratio <= TARGET_RATIO),
                ]
            ],
        )
    )


if __name__ == "__main__":
    main()
