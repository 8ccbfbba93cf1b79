"""The demo's own traffic, judged by ``graceful advise``: what the graceful side's old replicas counted.

Once an old replica's preStop drain has ended, before SIGTERM, the demo saves every worker's
admin status (its budget, request durations and drains: ``Termination.observed``).
``graceful advise --from`` reads them all at the end, as a user reads the statuses saved from
their own pods.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from .replica import ROOT
from .scenarios import Options, SideResult

__all__ = ["advise"]


def advise(side: SideResult, options: Options, log_dir: str) -> tuple[list[str], dict[str, Any] | None]:
    """The advice's lines for the table, and its JSON for ``--report`` (([], None) without statuses)."""
    statuses = [status for record in side.terminations for status in record.observed]
    if not statuses:
        return [], None
    path = os.path.join(log_dir, "statuses.json")
    with open(path, "w", encoding="utf-8") as out:
        json.dump(statuses, out)
    argv = [sys.executable, "-m", "graceful", "advise", "--from", path]
    if options.propagation_quiet is not None:
        argv += ["--propagation-quiet", f"{options.propagation_quiet:g}s"]
    text = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60)
    data = subprocess.run([*argv, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    lines = (text.stdout or text.stderr).rstrip().splitlines()
    try:
        return lines, json.loads(data.stdout)
    except ValueError:
        return lines, None
