"""docs/kubernetes.md's examples, as a reader runs them.

- ``docs_src/kubernetes/example_server.sh``: each command runs with bash from the clone, as typed, but for
  what a shared test machine must change: the port (``--port 0``, then the one the server names in its
  log, for ``--port 8000`` and ``localhost:8000``), a private ``GRACEFUL_SOCKET_DIR``, and the drain's
  propagation wait (1 s, not 10 s: the flag is what is checked). ``pip install -e '.[examples]'`` is
  not run (the test run has it installed): the extra it names is checked to exist.
- The pod the page shows is the ``server`` section of ``examples/kubernetes/deployment.yaml``, which
  tests/test_manifests.py checks; the hooks the text quotes are the manifests' own.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import textwrap
import time
import tomllib
from pathlib import Path

import httpx
import pytest
import yaml  # type: ignore[import-untyped]

from tests.docs.commands import Typed, quoted_commands, read, section, shell_commands, terminal_env
from tests.resume_utils import expected_text
from tests.test_manifests import drain_params, load, prestop
from tests.utils import ROOT

pytestmark = pytest.mark.timeout(90)

PAGE = "docs/kubernetes.md"
COMMANDS = "docs_src/kubernetes/example_server.sh"
DEPLOYMENT = "examples/kubernetes/deployment.yaml"
VLLM = "examples/kubernetes/vllm.yaml"


def bash(command: str, socket_dir: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=terminal_env(GRACEFUL_SOCKET_DIR=socket_dir),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def streamed_text(output: str) -> tuple[str, int]:
    """The text of a completions event stream, and how many ``[DONE]`` it ended with."""
    data = [line[6:] for line in output.splitlines() if line.startswith("data: ")]
    text = "".join(json.loads(event)["choices"][0]["text"] for event in data if event != "[DONE]")
    return text, data.count("[DONE]")


def test_the_example_server_commands_run_as_written(socket_dir: str, tmp_path: Path) -> None:
    """1. `serve` starts the example server; the curl command streams its 5 tokens, one [DONE]
    2. the embedded `drain` drains it: exit 0, /ready 503  3. `graceful run examples.server:app` starts
    the same server; the curl command streams the same answer from it."""
    install, serve, run, drain, curl = shell_commands(COMMANDS)
    extras = tomllib.loads(read("pyproject.toml"))["project"]["optional-dependencies"]
    assert re.fullmatch(r"pip install -e '\.\[(\w+)\]'", install) and "examples" in extras
    for command in (serve, run, curl):
        assert "8000" in command, command
    for index, command in enumerate((serve, run)):
        server = Typed(command.replace("--port 8000", "--port 0"), socket_dir, tmp_path / f"server-{index}.log")
        try:
            server.wait_ready(limit=30)
            streamed = bash(curl.replace("localhost:8000", f"localhost:{server.port}"), socket_dir)
            assert streamed.returncode == 0, streamed.stderr
            assert streamed_text(streamed.stdout) == (expected_text(5), 1), streamed.stdout
            if command is serve:
                quick = drain.replace("--propagation-wait=10s", "--propagation-wait=1s")
                assert quick != drain
                drained = bash(quick, socket_dir)
                assert drained.returncode == 0, drained.stderr
                assert httpx.get(server.url("/ready"), timeout=5).status_code == 503
        finally:
            server.stop()
        deadline = time.monotonic() + 10
        while server.sockets() and time.monotonic() < deadline:  # the next server gets the folder to itself
            time.sleep(0.05)


def test_the_page_shows_the_example_servers_pod() -> None:
    """What the page shows is the manifest's pod, its anti-affinity aside: what tests/test_manifests.py checks."""
    assert f'--8<-- "{DEPLOYMENT}:server"' in read(PAGE)
    shown = yaml.safe_load(textwrap.dedent(section(DEPLOYMENT, "server")))
    (deployment,) = load(Path(ROOT) / DEPLOYMENT)
    pod = deployment["spec"]["template"]["spec"]
    assert set(shown) == {"terminationGracePeriodSeconds", "containers"} and set(pod) - set(shown) == {"affinity"}
    assert shown == {key: pod[key] for key in shown}


def test_the_quoted_hooks_are_the_manifests() -> None:
    """The text quotes two preStop hooks: each parses, and each is its manifest's, word for word."""
    hooks = {" ".join(prestop(c)) for path in (DEPLOYMENT, VLLM) for spec in _pods(path) for c in spec["containers"]}
    quoted = quoted_commands(PAGE, "graceful drain")
    assert len(quoted) == 2
    for command in quoted:
        drain_params(shlex.split(command))
        assert command in hooks, command


def _pods(path: str) -> list[dict[str, object]]:
    return [doc["spec"]["template"]["spec"] for doc in load(Path(ROOT) / path) if doc["kind"] == "Deployment"]
