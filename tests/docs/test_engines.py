"""docs/engines.md's examples, as a reader runs them.

- ``docs_src/engines/vllm.yaml`` and ``sglang.yaml``, the pods drained by engine mode: their preStop hooks
  parse as ``graceful drain`` options and fit the budget rule of their pod's grace period, as
  ``graceful drain`` builds it (tests/test_manifests.py also holds SGLang's pods to ``--enable-metrics``).
- every ``graceful drain`` command line the page quotes in its text parses; the two that name their own
  ``--metrics-url`` run with bash against an engine page of that shape, its address this test's.
- ``docs_src/engines/drain_result.json``: ``--json`` prints an object with exactly its keys.
- ``docs_src/engines/wait_idle.py`` runs as a script against an engine where the ``vllm`` preset reads it.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import re
import runpy
import shlex
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from graceful import parse_duration
from graceful.engine import PRESETS, EngineConfig
from tests.docs.commands import quoted_commands, read, terminal_env
from tests.engine.test_engine import BUSY, IDLE, threaded_engine
from tests.test_manifests import argv, drain_params, pod_specs, prestop
from tests.utils import ROOT

pytestmark = pytest.mark.timeout(60)

PAGE = "docs/engines.md"
PODS = ["docs_src/engines/vllm.yaml", "docs_src/engines/sglang.yaml"]
RESULT = "docs_src/engines/drain_result.json"
WAIT_IDLE = "docs_src/engines/wait_idle.py"
# Each page of an engine the quoted commands watch, idle: only the metrics they name, at zero.
PAGES = {
    "my_inflight_requests": "my_inflight_requests 0\n",
    "nv_inference_pending_request_count": (
        'nv_inference_pending_request_count{model="my_model",version="1"} 0\nmy_model_executing{model="my_model"} 0\n'
    ),
}


@pytest.mark.parametrize("name", PODS)
def test_the_pods_hook_parses_and_fits_its_grace_period(name: str) -> None:
    """1. the page includes the file  2. the hook is a `graceful drain --engine` whose options parse
    3. its --grace-period is the pod's  4. its settings make an EngineConfig, as the command builds one:
    the propagation wait fits the budget, and the budget leaves the reserve for SIGTERM and exit."""
    assert f'--8<-- "{name}"' in read(PAGE)
    (spec,) = pod_specs(yaml.safe_load(read(name)))
    (container,) = spec["containers"]
    params = drain_params(prestop(container))
    assert params["engine"] == Path(name).stem == container["name"]
    grace = float(spec["terminationGracePeriodSeconds"])
    assert parse_duration(params["grace_period"]) == grace
    config = EngineConfig(
        params["engine"],
        metrics_url=params["metrics_url"],
        metrics=params["metrics"],
        interval=params["interval"],
        idle_reads=params["idle_reads"],
        kv_buffer=params["kv_buffer"],
        propagation_wait=params["propagation_wait"],
        timeout=params["timeout"],
        grace_period=grace,
    )
    assert config.propagation_wait + float(config.kv_buffer) < config.limit < grace
    if params["engine"] == "sglang":
        assert "--enable-metrics" in argv(container)


def test_every_quoted_drain_command_parses() -> None:
    """A renamed flag or preset fails here: each command line the text quotes, through the command's parser."""
    commands = quoted_commands(PAGE, "graceful drain")
    assert len(commands) == 2, commands
    for command in commands:
        drain_params(shlex.split(command))


@pytest.mark.parametrize("metric", sorted(PAGES))
def test_the_quoted_commands_with_their_own_url_drain_an_idle_engine(metric: str) -> None:
    """1. the page's command for a metric of one's own, its --metrics-url's host and port this test's engine
    2. bash runs it: the engine reads idle, exit 0, the idle line on stderr."""
    (command,) = [c for c in quoted_commands(PAGE, "graceful drain --metrics-url") if f"--metric {metric}" in c]
    with threaded_engine(PAGES[metric]) as url:
        address = url.removesuffix("/metrics").removeprefix("http://")
        ran = re.sub(r"(?<=--metrics-url http://)[^/\s]+", address, command)
        assert ran != command
        done = subprocess.run(
            ["bash", "-c", ran], cwd=ROOT, env=terminal_env(), capture_output=True, text=True, timeout=30
        )
    assert done.returncode == 0, done.stderr
    assert "graceful drain: engine idle" in done.stderr


def test_json_prints_the_keys_the_page_shows() -> None:
    """``--json``'s object has the shown object's keys, and the shown values are of the real ones' types."""
    shown = json.loads(read(RESULT))
    with threaded_engine(IDLE) as url:
        done = subprocess.run(
            ["bash", "-c", f"graceful drain --engine vllm --metrics-url {url} --interval 0.2s --json"],
            cwd=ROOT, env=terminal_env(), capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert list(printed) == list(shown)
    assert {key: type(value) for key, value in printed.items()} == {key: type(value) for key, value in shown.items()}
    assert printed["values"].keys() == shown["values"].keys()


class DeadEngine(http.server.BaseHTTPRequestHandler):
    """vLLM whose engine died: its page keeps the last busy gauges, its /health answers 500."""

    def do_GET(self) -> None:
        status, body = (500, b"") if self.path == "/health" else (200, BUSY.encode())
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_wait_idle_script_prints_why_the_engine_is_not_idle(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """1. a dead vLLM where the ``vllm`` preset reads its page (this test's port in the preset's URL)
    2. the script runs (its 5 s propagation wait first): the engine is dead, and it prints the result and the
    last values."""
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), DeadEngine) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        monkeypatch.setitem(PRESETS, "vllm", dataclasses.replace(PRESETS["vllm"], url=url))  # type: ignore[arg-type]
        try:
            runpy.run_path(str(Path(ROOT) / WAIT_IDLE), run_name="__main__")
        finally:
            server.shutdown()
            thread.join(5)
    out = capsys.readouterr().out
    assert out == "dead {'vllm:num_requests_running': 1.0, 'vllm:num_requests_waiting': 0.0}\n"
