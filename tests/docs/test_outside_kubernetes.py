"""docs/outside-kubernetes.md's examples, run: the Compose service's command and health check under
the stop Docker performs, the systemd unit's ExecStart under the stop ``KillMode=mixed`` performs (and
``systemd-analyze verify`` where it exists), and the Nomad task's clocks.

No Docker daemon, systemd or Nomad runs here: each platform's part is the signal it sends (SIGTERM to
the server, after ``init: true``'s tini or to the unit's main process), sent by the test.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml  # type: ignore[import-untyped]

from graceful import Budget, parse_duration
from tests.servers import Launched
from tests.utils import ROOT, listening_socket

COMPOSE = Path(ROOT) / "docs_src/outside-kubernetes/compose.yaml"
UNIT = Path(ROOT) / "docs_src/outside-kubernetes/api.service"
NOMAD = Path(ROOT) / "docs_src/outside-kubernetes/api.nomad.hcl"
# The user's `app:app`: the tests' streaming app wrapped in the middleware, configured by GRACEFUL_*.
APP_MODULE = """from graceful import GracefulMiddleware
from tests.apps.streaming import app as inner

app = GracefulMiddleware(inner)
"""


def user_app(folder: Path) -> str:
    """A folder holding ``app.py``, and a PYTHONPATH that finds it and this repository's tests."""
    (folder / "app.py").write_text(APP_MODULE)
    return os.pathsep.join([str(folder), ROOT])


def limit(grace: float) -> tuple[float, float]:
    budget = Budget.resolve(grace_period=grace)
    return budget.reserve, budget.limit


class Stream(threading.Thread):
    """A stream of ``seconds`` read to its end in a thread; ``first`` is set at its first frame."""

    def __init__(self, url: str, seconds: float) -> None:
        super().__init__()
        self.url, self.frames = url, int(seconds / 0.1)
        self.first = threading.Event()
        self.body: Any = None

    def run(self) -> None:
        try:
            params = {"frames": self.frames, "interval": 0.1}
            with httpx.stream("GET", self.url + "/stream", params=params, timeout=30) as response:
                chunks = []
                for chunk in response.iter_text():
                    chunks.append(chunk)
                    self.first.set()
                self.body = "".join(chunks)
        except httpx.HTTPError as exc:
            self.body = exc
        finally:
            self.first.set()

    @property
    def whole(self) -> bool:
        return isinstance(self.body, str) and self.body.endswith(f"frame {self.frames - 1}\ndone\n")


def test_the_compose_service_drains_on_docker_stop(
    launch: Callable[..., Launched], tmp_path: Path, socket_dir: str
) -> None:
    """1. the service's command serves ``app:app`` with its environment; its health check passes
    2. ``docker stop`` (tini forwards SIGTERM) with a stream in flight 3. the health check fails at
    once 4. the stream ends whole and the server exits long before ``stop_grace_period``."""
    (service,) = yaml.safe_load(COMPOSE.read_text())["services"].values()
    grace = parse_duration(service["stop_grace_period"])
    assert parse_duration(service["environment"]["GRACEFUL_GRACE_PERIOD"]) == grace  # one clock
    assert limit(grace) == (18, 42)  # the page: "Grace 60 s: reserve 18 s, limit 42 s"
    assert service["init"] is True  # tini: the signal reaches the server

    program, app, *flags = service["command"]
    assert program == "uvicorn"
    # Bound to 127.0.0.1 and a port the kernel picks, here; the rest as written.
    flags = [{"0.0.0.0": "127.0.0.1", "8000": "0"}.get(flag, flag) for flag in flags]
    server = launch(*flags, app=app, server="uvicorn", PYTHONPATH=user_app(tmp_path), **service["environment"])
    server.wait_ready()
    port = str(server.port)

    check_kind, *check = service["healthcheck"]["test"]
    assert check_kind == "CMD" and check[0] == "python"
    check = [sys.executable, *(part.replace(":8000/", f":{port}/") for part in check[1:])]

    def healthy() -> bool:
        return subprocess.run(check, capture_output=True, timeout=30).returncode == 0

    assert healthy()
    stream = Stream(server.base, seconds=2)
    stream.start()
    assert stream.first.wait(10), server.log
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert not healthy(), "the health check still passes during the drain"
    stream.join(30)
    assert stream.whole, (stream.body, server.log)
    # uvicorn raises the signal again after its shutdown: the exit status is SIGTERM's.
    assert server.wait_exit(20) == -signal.SIGTERM
    assert time.monotonic() - sent < grace


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd's keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def exec_start(parser: configparser.ConfigParser) -> list[str]:
    """ExecStart= as systemd splits it: a trailing backslash continues the line."""
    return shlex.split(parser["Service"]["ExecStart"].replace("\\\n", " "))


def test_the_systemd_unit_drains_on_systemctl_stop(tmp_path: Path, socket_dir: str) -> None:
    """1. ExecStart's gunicorn command serves ``app:app`` with the unit's Environment= 2. the stop
    ``KillMode=mixed`` performs, SIGTERM to the main process only, with a stream in flight
    3. the stream ends whole and gunicorn exits 0, inside TimeoutStopSec."""
    service = unit()["Service"]
    key, value = service["Environment"].split("=", 1)
    grace = parse_duration(value)
    assert key == "GRACEFUL_GRACE_PERIOD" and parse_duration(service["TimeoutStopSec"]) == grace
    assert service["KillMode"] == "mixed"
    assert limit(grace) == (18, 42)  # the page: "Grace 60 s: reserve 18 s, limit 42 s"

    program, *args = exec_start(unit())
    assert Path(program).name == "gunicorn"
    bind = args.index("--bind")
    graceful_timeout = float(args[args.index("--graceful-timeout") + 1])
    assert graceful_timeout > grace, "gunicorn's master would kill the workers inside the grace period"

    sock = listening_socket()  # the unit's 127.0.0.1:8000, as a socket bound here and inherited
    args[bind + 1] = f"fd://{sock.fileno()}"
    env = {
        **os.environ,
        key: value,
        "GRACEFUL_SOCKET_DIR": socket_dir,
        "PYTHONPATH": user_app(tmp_path),
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "gunicorn.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", *args],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=(sock.fileno(),),
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    try:
        workers = int(args[args.index("--workers") + 1])
        deadline = time.monotonic() + 30
        while len(list(Path(socket_dir).glob("*.sock"))) < workers:  # every worker's admin socket
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert httpx.get(base + "/ready", timeout=5).status_code == 200
        stream = Stream(base, seconds=2)
        stream.start()
        assert stream.first.wait(10), log.read_text()
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)  # KillMode=mixed: the main process only
        stream.join(30)
        assert stream.whole, (stream.body, log.read_text())
        assert process.wait(20) == 0, log.read_text()
        assert time.monotonic() - sent < grace
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    """``systemd-analyze verify`` on the unit, with its gunicorn path pointed at one that exists here:
    no complaint at all (it warns and goes on for a misspelt setting, so its output must be empty)."""
    gunicorn = shutil.which("gunicorn", path=os.path.dirname(sys.executable))
    assert gunicorn is not None
    text = UNIT.read_text()
    program = exec_start(unit())[0]
    (tmp_path / UNIT.name).write_text(text.replace(program, gunicorn))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / UNIT.name)], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


# The HCL the Nomad block uses: blocks with optional labels, and `key = "value"` attributes.
HCL_TOKEN = re.compile(r'\s*(?:(?P<string>"[^"]*")|(?P<word>[A-Za-z_][\w-]*)|(?P<punct>[{}=]))')


def parse_hcl(text: str) -> dict[str, Any]:
    """Blocks to ``{"type label": {...}}``, attributes to ``{key: value}``; anything else raises."""
    tokens, position = [], 0
    text = text.strip()
    while position < len(text):
        token = HCL_TOKEN.match(text, position)
        assert token is not None, f"not HCL this parser knows at {text[position : position + 20]!r}"
        tokens.append(token.group(token.lastgroup or ""))
        position = token.end()
        while position < len(text) and text[position].isspace():
            position += 1

    def body(index: int) -> tuple[dict[str, Any], int]:
        found: dict[str, Any] = {}
        while index < len(tokens) and tokens[index] != "}":
            name, index = tokens[index], index + 1
            if tokens[index] == "=":
                value = tokens[index + 1]
                assert value.startswith('"'), f"{name}: only strings here, got {value!r}"
                found[name], index = value[1:-1], index + 2
                continue
            labels = []
            while tokens[index].startswith('"'):
                labels.append(tokens[index][1:-1])
                index += 1
            assert tokens[index] == "{", f"{name}: expected a block, got {tokens[index]!r}"
            found[" ".join([name, *labels])], index = body(index + 1)
            index += 1  # the closing brace
        return found, index

    parsed, end = body(0)
    assert end == len(tokens), "unbalanced braces"
    return parsed


def test_the_nomad_task_gives_the_drain_the_kill_timeout() -> None:
    """The task's clocks: ``kill_timeout`` is the grace period the middleware reads, and
    ``shutdown_delay`` a duration (the propagation the middleware then need not wait for)."""
    (task,) = parse_hcl(NOMAD.read_text()).values()
    grace = parse_duration(task["kill_timeout"])
    assert parse_duration(task["env"]["GRACEFUL_GRACE_PERIOD"]) == grace
    assert 0 < parse_duration(task["shutdown_delay"]) < grace
    assert limit(grace) == (18, 42)
    with pytest.raises(AssertionError, match="unbalanced"):
        parse_hcl(NOMAD.read_text() + "}")
