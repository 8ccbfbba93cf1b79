"""``python -m examples.rollout.ignore_term CMD...``: a PID 1 that ignores SIGTERM, as a shell entrypoint often does.

The server runs as its child and never hears the SIGTERM sent to the container's
main process, so only SIGKILL at the end of the grace period stops it.
"""

from __future__ import annotations

import signal
import subprocess
import sys


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m examples.rollout.ignore_term CMD [ARGS...]", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(argv)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
