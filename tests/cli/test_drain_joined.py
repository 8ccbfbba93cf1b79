"""A second ``graceful drain`` while one is under way joins it (its clock and deadline are kept, as
``Drain.begin_drain`` documents) and says so, with the options of its own that were not applied (issue 51)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graceful import State
from tests.docs.commands import terminal_env
from tests.docs.shown import console, unmatched
from tests.servers import Served
from tests.utils import ROOT

pytestmark = pytest.mark.servers  # the console script as processes (tests/tiers.py)


def hook(*args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "graceful", "drain", *args]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_second_drain_says_it_joined_the_first_and_what_it_did_not_apply(served: Served) -> None:
    """1. a 3 s stream is in flight  2. `graceful drain --propagation-wait 0.2s` begins the drain
    3. `graceful drain --propagation-wait 4s --timeout 4.5s` joins it: one line says so and names both of its
    options as not applied  4. both end 0 when the stream ends, and the drain's propagation phase was the
    first's 0.2 s, not 4 s"""
    thread, outcome = served.stream_in_background(frames=30)
    first = hook("--socket-dir", served.socket_dir, "--propagation-wait", "0.2s")
    second = None
    try:
        deadline = time.monotonic() + 15
        while served.mw.drain.state is not State.DRAINING:  # the first drain has reached the server
            assert time.monotonic() < deadline and first.poll() is None, "the first drain never began"
            time.sleep(0.01)
        second = hook("--socket-dir", served.socket_dir, "--propagation-wait", "4s", "--timeout", "4.5s")
        _, joined = second.communicate(timeout=30)
        _, began = first.communicate(timeout=30)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.communicate()
    assert second.returncode == 0, joined
    assert first.returncode == 0, began
    [line] = [line for line in joined.splitlines() if "already draining" in line]
    assert re.fullmatch(
        rf"graceful drain: worker {os.getpid()} was already draining \(begun by cli\): joined that drain, which "
        r"keeps its own clock and deadline \(deadline in \d+ s\); not applied: --propagation-wait 4s, --timeout 4.5s",
        line,
    ), line
    assert "already draining" not in began
    result = served.mw.drain.last_result
    assert result is not None and result.drained
    assert result.propagation is not None and result.propagation < 1.0  # the first drain's 0.2 s wait
    thread.join(15)
    assert isinstance(outcome[0], str) and outcome[0].endswith("done\n")


def test_a_drain_that_joins_one_begun_by_sigterm_prints_the_pages_line(served: Served) -> None:
    """docs/cli.md, "Messages": 1. a stream is in flight  2. SIGTERM's drain is under way  3. the page's
    command, typed as shown, prints the page's line (the pid and the seconds as this run has them)"""
    ((command, shown),) = console((Path(ROOT) / "docs_src/cli/drain_joined.console").read_text())
    thread, _ = served.stream_in_background(frames=20)
    served.mw.drain.begin_drain("SIGTERM", propagation_wait=0.1)
    done = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=terminal_env(GRACEFUL_SOCKET_DIR=served.socket_dir),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert unmatched(shown, done.stderr) == [], done.stderr
    thread.join(15)
