"""docs/cli.md's examples, run: curl on the admin socket of a real server, a refused ``graceful drain``,
and the preStop hook's manifest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml  # type: ignore[import-untyped]

from graceful import Budget, parse_duration
from tests.docs.shown import console, unmatched
from tests.servers import Launched
from tests.test_manifests import drain_params, pod_specs, prestop
from tests.utils import ROOT

ADMIN_SOCKET = Path(ROOT) / "docs_src/cli/admin_socket.console"
DRAIN_REFUSED = Path(ROOT) / "docs_src/cli/drain_refused.console"
PRESTOP = Path(ROOT) / "docs_src/cli/prestop.yaml"
SHOWN_SOCKET = "/tmp/graceful-0/1234.sock"


def shell(command: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A command line as a user's shell runs it, with this environment's ``graceful`` and curl on PATH."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])
    return subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        env={**os.environ, "PATH": path, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_curl_on_the_admin_socket_shows_what_the_page_shows(launch: Callable[..., Launched]) -> None:
    """1. a server with three streams in flight 2. the page's ``curl .../status``: SERVING, 3 in flight
    3. the page's ``curl -N -X POST .../drain``: the status line, a progress line a second, the
    propagation over after 3 s, and the result once the streams end 4. every stream ended whole."""
    server = launch("--grace-period", "90", "--reserve", "27")
    server.wait_ready()
    (socket,) = server.sockets()
    outcomes: list[Any] = []

    def stream() -> None:
        try:
            outcomes.append(httpx.get(server.url("/stream"), params={"frames": 60, "interval": 0.1}, timeout=30).text)
        except httpx.HTTPError as exc:
            outcomes.append(exc)

    streams = [threading.Thread(target=stream) for _ in range(3)]
    for thread in streams:
        thread.start()
    (status_step, drain_step) = console(ADMIN_SOCKET.read_text())
    status_command = status_step[0].replace(SHOWN_SOCKET, socket)
    for _ in range(200):  # until the three streams are in flight: about a second at most
        status = shell(status_command)
        if status.returncode == 0 and json.loads(status.stdout)["in_flight"] == 3:
            break
    assert json.loads(status.stdout)["state"] == "SERVING", status.stdout
    assert unmatched(status_step[1], status.stdout) == [], status.stdout

    drained = shell(drain_step[0].replace(SHOWN_SOCKET, socket))
    assert drained.returncode == 0, drained.stderr
    assert unmatched(drain_step[1], drained.stdout) == [], drained.stdout
    events = [json.loads(line) for line in drained.stdout.splitlines()]
    assert (events[0]["event"], events[0]["in_flight"]) == ("status", 3)
    assert (events[-1]["result"], events[-1]["in_flight"], events[-1]["propagation"]) == ("drained", 0, 3.0)
    for thread in streams:
        thread.join(30)
    assert [o.endswith("frame 59\ndone\n") if isinstance(o, str) else o for o in outcomes] == [True] * 3


def test_a_wait_longer_than_the_drain_is_refused_as_the_page_shows(socket_dir: str) -> None:
    """The hook judges its own flags before it looks for a server: exit 2 and the page's one line,
    word for word, with no server at all."""
    ((command, shown),) = console(DRAIN_REFUSED.read_text())
    done = shell(command, GRACEFUL_SOCKET_DIR=socket_dir)
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr == shown + "\n"


def test_the_prestop_manifest_parses_and_its_budget_works() -> None:
    """The hook's flags parse as ``graceful drain`` reads them; its grace period is the pod's, and
    the propagation wait fits the drain that grace period leaves."""
    (document,) = yaml.safe_load_all(PRESTOP.read_text())
    ((spec, container),) = [(spec, c) for spec in pod_specs(document) for c in spec["containers"]]
    params = drain_params(prestop(container))
    grace = spec["terminationGracePeriodSeconds"]
    assert parse_duration(params["grace_period"]) == grace
    budget = Budget.resolve(grace_period=grace, propagation_wait=params["propagation_wait"])  # raises if it cannot work
    assert budget.longest_covered(admit=True) > 0
