"""docs/vllm.md's examples, as a reader runs them.

- The recipe is the pod of ``examples/kubernetes/vllm-middleware.yaml`` (its ``recipe`` section), which
  tests/test_manifests.py checks: budgets, probes, the preStop hook, the logging ConfigMap.
- ``docs_src/vllm/check_env.sh``, the check of the ``GRACEFUL_*`` variables before the weights load, run
  with bash in the CPU recipe's environment (exit 0) and with a wrong variable (the ConfigError naming it).
- ``docs_src/vllm/serve_cpu.sh``, the CPU recipe: without vLLM, its environment is the one tests/vllm and
  the rollout demo give vLLM, the model script it names exists, and the middleware it names loads the way
  ``vllm serve --middleware`` loads it. tests/vllm/conftest.py starts every real vLLM with its
  ``vllm serve`` flags.
- ``docs_src/vllm/sigterm_log.out``, the log of a SIGTERM: graceful's lines come out of a real server with
  streams in flight, through the logging file the page gives vLLM (``examples/vllm/logging.json``);
  tests/vllm holds all three lines, vLLM's own included, to a real vLLM.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml  # type: ignore[import-untyped]
from fastapi import FastAPI

from examples.rollout.vllm import VLLM_ENV
from graceful import GracefulMiddleware
from tests.docs.commands import (
    command_with,
    exports,
    quoted_commands,
    read,
    section,
    terminal_env,
)
from tests.docs.shown import unmatched
from tests.servers import Launched, listening_port
from tests.test_manifests import drain_params, load
from tests.utils import ROOT

pytestmark = pytest.mark.timeout(60)

PAGE = "docs/vllm.md"
MANIFEST = "examples/kubernetes/vllm-middleware.yaml"
LOGGING = "examples/vllm/logging.json"
CHECK = "docs_src/vllm/check_env.sh"
SERVE = "docs_src/vllm/serve_cpu.sh"
SIGTERM_LOG = "docs_src/vllm/sigterm_log.out"


def test_the_recipe_is_the_pod_of_the_checked_manifest() -> None:
    """The page shows the manifest's pod spec, whole: what tests/test_manifests.py checks is what a reader copies."""
    assert f'--8<-- "{MANIFEST}:recipe"' in read(PAGE)
    shown = yaml.safe_load(textwrap.dedent(section(MANIFEST, "recipe")))
    (deployment,) = [doc for doc in load(Path(ROOT) / MANIFEST) if doc["kind"] == "Deployment"]
    assert shown == {"spec": deployment["spec"]["template"]["spec"]}
    (container,) = shown["spec"]["containers"]
    assert "graceful.GracefulMiddleware" in container["args"]


def test_the_logging_file_is_the_one_the_tests_give_vllm() -> None:
    assert f'--8<-- "{LOGGING}"' in read(PAGE)
    assert VLLM_ENV["VLLM_LOGGING_CONFIG_PATH"] == str(Path(ROOT) / LOGGING)


def check(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", CHECK], cwd=ROOT, env=terminal_env(**env), capture_output=True, text=True, timeout=60
    )


def test_the_variables_check_passes_in_the_recipes_environment() -> None:
    """1. the CPU recipe's exports  2. the check: exit 0, nothing printed."""
    recipe = exports(SERVE)
    assert {key for key in recipe if key.startswith("GRACEFUL_")} >= {"GRACEFUL_GRACE_PERIOD", "GRACEFUL_EXEMPT_PATHS"}
    done = check(**recipe)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        ({"GRACEFUL_GRACE_PERIOD": "soon"}, ["GRACEFUL_GRACE_PERIOD", "'soon'"]),
        # The budget rule: a propagation wait longer than what the 60 s grace period leaves the drain.
        ({"GRACEFUL_PROPAGATION_WAIT": "50s"}, ["GRACEFUL_PROPAGATION_WAIT", "GRACEFUL_GRACE_PERIOD"]),
    ],
)
def test_the_variables_check_names_a_wrong_variable(wrong: dict[str, str], named: list[str]) -> None:
    """The page: "otherwise prints the same ConfigError", the variable's name in its last line."""
    done = check(**{**exports(SERVE), **wrong})
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("graceful.") and "ConfigError: " in last, done.stderr
    for word in named:
        assert word in last, last


def test_the_cpu_recipe_is_what_the_vllm_tests_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without vLLM: 1. the recipe's VLLM_* exports are the CPU environment tests/vllm and the rollout demo
    give vLLM  2. the model script it runs exists and makes the model `vllm serve` serves  3. the flag that
    loads graceful names a class that loads as vLLM loads it (``app.add_middleware(cls)``, no arguments),
    configured by the recipe's GRACEFUL_* exports."""
    recipe = exports(SERVE)
    cpu = {key: value for key, value in recipe.items() if key.startswith("VLLM_")}
    assert cpu and cpu.items() <= VLLM_ENV.items()
    make = command_with(SERVE, "python")
    assert (Path(ROOT) / make[1]).is_file() and make[1] == "tests/vllm/make_model.py"
    serve = command_with(SERVE, "vllm", "serve")
    assert serve[2] == make[2], "vllm serve serves another model than the one the recipe makes"
    middleware = serve[serve.index("--middleware") + 1]
    module, _, name = middleware.rpartition(".")
    loaded = getattr(importlib.import_module(module), name)
    assert loaded is GracefulMiddleware
    for key, value in recipe.items():
        if key.startswith("GRACEFUL_"):
            monkeypatch.setenv(key, value)
    app = FastAPI()
    app.add_middleware(loaded)
    stack = app.build_middleware_stack()
    while not isinstance(stack, GracefulMiddleware):
        stack = stack.app
    assert stack.drain.budget.grace_period == float(recipe["GRACEFUL_GRACE_PERIOD"])


def test_graceful_logs_the_sigterm_lines_the_page_shows(socket_dir: str, tmp_path: Path) -> None:
    """Through the page's logging file, under a plain server (uvicorn; vLLM's own line is tests/vllm's):
    1. a stream in flight  2. SIGTERM  3. the stream ends whole, the server exits
    4. the log holds graceful's shown lines, in order (times and numbers aside)."""
    server = Launched(
        "uvicorn", "tests.apps.streaming:wrapped", ("--log-config", LOGGING), socket_dir, tmp_path / "server.log"
    )
    try:
        deadline = time.monotonic() + 20
        while not server.port:  # the logging file silences uvicorn's own "running on" line: ask /proc
            assert server.process.poll() is None and time.monotonic() < deadline, server.log
            server.port = listening_port(server.process.pid) or 0
            time.sleep(0.02)
        server.wait_ready()
        first, outcome = threading.Event(), []

        def stream() -> None:
            with httpx.stream("GET", server.url("/stream"), params={"frames": 15, "interval": 0.1}, timeout=20) as r:
                for chunk in r.iter_text():
                    first.set()
                    outcome.append(chunk)

        reader = threading.Thread(target=stream)
        reader.start()
        assert first.wait(10)
        os.killpg(server.process.pid, signal.SIGTERM)
        reader.join(20)
        assert "".join(outcome).endswith("done\n")
        # uvicorn raises the signal it caught again once it has shut down: SIGTERM's own exit status.
        assert server.wait_exit(20) in (0, -signal.SIGTERM), server.log
    finally:
        server.stop()
    # The lines of graceful's, the cuts between them kept: vLLM's own line is tests/vllm's to hold.
    lines = [line for line in read(SIGTERM_LOG).splitlines() if " [vllm." not in line]
    shown = "\n".join(lines[:-1] if lines[-1] == "..." else lines)
    assert shown.count(" [graceful] ") == 2
    assert unmatched(shown, server.log) == [], server.log


def test_the_shown_log_is_in_the_logging_files_format() -> None:
    """Every shown line is ``LEVEL MM-DD HH:MM:SS [logger] message``, the logging file's format, or a cut."""
    plain = json.loads(read(LOGGING))["formatters"]["plain"]
    assert (plain["format"], plain["datefmt"]) == ("%(levelname)s %(asctime)s [%(name)s] %(message)s", "%m-%d %H:%M:%S")
    for line in read(SIGTERM_LOG).splitlines():
        assert line == "..." or re.fullmatch(r"(INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+\] .+", line), line


def test_the_quoted_engine_mode_commands_parse() -> None:
    commands = quoted_commands(PAGE, "graceful drain")
    assert commands and all(drain_params(shlex.split(command))["engine"] == "vllm" for command in commands)
