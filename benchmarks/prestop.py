"""The preStop hook's start-up, counted in instructions by valgrind's callgrind.

``graceful drain`` runs inside the grace period, and readiness fails only once it has
started and reached the admin socket. Wall-clock start-up times on a shared machine
swing several-fold; instruction counts do not. Each command runs once under callgrind;
the bare interpreter (``python -c pass``) is the floor, and the figure that matters is
each command's count above it. The socket path names nothing, so every command stops
at "no server" (exit 3) after its whole start-up.

Every command runs as a container image runs the hook: in a clean venv with this repository
``pip install``-ed into it (``benchmarks/_venv.py``, built once under ``.bench-venv/``), the
hook being that venv's console script ``bin/graceful``, so no version-manager shim and no
``.pth`` file of the development interpreter is counted. One more row counts the development
interpreter's own ``python -c pass`` (``sys.executable``, with whatever its site-packages run at
start-up), for comparison only.

    python -m benchmarks.prestop            # needs valgrind (Debian package)
"""

from __future__ import annotations

import os
import sys

from ._callgrind import collected, require
from ._common import machine, table
from ._venv import clean_venv

NOWHERE = "/nonexistent/graceful.sock"
FLOOR = "clean venv: python -c pass"
DRAIN = "clean venv: bin/graceful drain (admin socket)"
# The hook's start-up up to its request: the console script's code run as it is, until the first socket is
# made (the "socket.__new__" audit event ends the process there). Each audit event costs a Python call, so
# this row includes a little more than the start-up itself.
TO_SOCKET = """import os, sys
def at(event, args):
    if event == "socket.__new__":
        os._exit(0)
sys.addaudithook(at)
script = sys.argv.pop(1)
sys.argv[0] = script
exec(compile(open(script).read(), script, "exec"))"""


def commands() -> dict[str, list[str]]:
    venv = clean_venv()
    return {
        FLOOR: [venv.python, "-c", "pass"],
        "clean venv: python -c 'import click' (the CLI framework alone)": [venv.python, "-c", "import click"],
        DRAIN: [venv.python, venv.graceful, "drain", "--socket", NOWHERE],
        "clean venv: bin/graceful drain, to its first socket call": [
            venv.python,
            "-P",  # the working directory (a checkout) stays off sys.path: the venv's install is run
            "-c",
            TO_SOCKET,
            venv.graceful,
            "drain",
            "--socket",
            NOWHERE,
        ],
        "clean venv: bin/graceful status": [venv.python, venv.graceful, "status", "--socket", NOWHERE],
        "this machine's development interpreter: python -c pass (context)": [
            os.path.realpath(sys.executable),
            "-c",
            "pass",
        ],
    }


def main() -> None:
    require("benchmarks.prestop")
    print(f"Machine: {machine()}\n")
    # A console script is run by its venv's interpreter, as its shebang does; every command stops at
    # "no server" (exit 3), so a non-zero exit is expected. The environment is left as it is.
    counts = {name: collected(command, check=False, fixed_seed=False) for name, command in commands().items()}
    floor = counts[FLOOR]
    rows = [[name, f"{n / 1e6:.1f} M", f"{(n - floor) / 1e6:+.1f} M"] for name, n in counts.items()]
    print(table(["command", "instructions", "above the interpreter"], rows))
    above = counts[DRAIN] - floor
    click = counts["clean venv: python -c 'import click' (the CLI framework alone)"] - floor
    print()
    print(f"graceful drain above the clean interpreter: {above / 1e6:.1f} M instructions (importing click alone:")
    print(f"{click / 1e6:.1f} M, which the drain path leaves out); the wall-clock target is drain_reaction's.")


if __name__ == "__main__":
    main()
