"""The `graceful` CLI in-process (CliRunner) against a real server, and as real subprocesses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import click
import httpx
import pytest
import uvicorn
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from graceful import GracefulMiddleware, State
from graceful.cli import cli, drain_command, main
from tests.apps_streaming import app as streaming_app
from tests.utils import free_port


@dataclass
class Served:
    mw: GracefulMiddleware
    port: int
    socket_dir: str

    def stream_in_background(self, frames: int, interval: float = 0.1) -> tuple[threading.Thread, list[object]]:
        outcome: list[object] = []

        def get() -> None:
            try:
                with httpx.Client(timeout=30) as client:
                    outcome.append(
                        client.get(
                            f"http://127.0.0.1:{self.port}/stream", params={"frames": frames, "interval": interval}
                        ).text
                    )
            except httpx.TransportError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=get)
        thread.start()
        deadline = time.monotonic() + 5
        while self.mw.drain.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.mw.drain.in_flight == 1
        return thread, outcome


@pytest.fixture
def served(socket_dir: str) -> Iterator[Served]:
    """A real uvicorn in a thread (CliRunner runs its own event loop on this one)."""
    mw = GracefulMiddleware(
        streaming_app, registry=CollectorRegistry(), socket_dir=socket_dir, grace_period=6, reserve=1
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(mw, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    try:
        yield Served(mw, port, socket_dir)
    finally:
        server.should_exit = True
        thread.join(10)


def invoke(*args: str) -> click.testing.Result:
    return CliRunner().invoke(cli, list(args))


def test_drain_with_nothing_in_flight(served: Served) -> None:
    result = invoke("drain", "--socket-dir", served.socket_dir, "--propagation-wait", "0.2s", "--json")
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.stdout)
    assert outcome["result"] == "drained"
    assert [w["pid"] for w in outcome["workers"]] == [os.getpid()]
    assert "drained 1 of 1 worker" in result.stderr
    assert served.mw.drain.state is State.DRAINING


def test_drain_waits_for_the_stream_and_shows_progress(served: Served) -> None:
    thread, outcome = served.stream_in_background(frames=14)
    started = time.monotonic()
    result = invoke("drain", "--socket-dir", served.socket_dir)
    elapsed = time.monotonic() - started
    thread.join(10)
    assert result.exit_code == 0, result.output
    assert isinstance(outcome[0], str) and outcome[0].endswith("done\n")
    assert "draining 1 worker: 1 in flight" in result.stderr
    assert "deadline in" in result.stderr
    assert 1.0 < elapsed < 3.0


def test_grace_period_bounds_the_drain_and_leftover_is_reported(served: Served) -> None:
    """--grace-period 2: reserve defaults to 1 s, so the drain gets 1 s; the 10 s stream is left over."""
    thread, _ = served.stream_in_background(frames=100)
    started = time.monotonic()
    result = invoke("drain", "--socket-dir", served.socket_dir, "--grace-period", "2", "--quiet")
    thread.join(10)
    assert result.exit_code == 1, result.output
    assert time.monotonic() - started < 4
    assert f"worker {os.getpid()}: timeout with 1 in flight" in result.stderr
    assert "  left: " in result.stderr
    assert "draining" not in result.stderr  # --quiet


def test_status_and_resume(served: Served) -> None:
    result = invoke("status", "--socket-dir", served.socket_dir)
    assert result.exit_code == 0
    assert "SERVING" in result.stdout and str(os.getpid()) in result.stdout
    served.mw.drain.begin_drain("test")
    rows = json.loads(invoke("status", "--socket-dir", served.socket_dir, "--json").stdout)
    assert rows[0]["state"] == "DRAINING"
    result = invoke("resume", "--socket", rows[0]["socket"])
    assert result.exit_code == 0
    assert "SERVING (resumed)" in result.stdout
    assert served.mw.drain.state is State.SERVING


@pytest.mark.parametrize("command", ["drain", "status", "resume"])
def test_no_server_exits_3(socket_dir: str, command: str) -> None:
    result = invoke(command, "--socket-dir", socket_dir)
    assert result.exit_code == 3
    assert "no graceful server found" in result.stderr


def test_only_stale_sockets_exits_3(socket_dir: str) -> None:
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(os.path.join(socket_dir, "4242.sock"))
        result = invoke("drain", "--socket-dir", socket_dir)
    assert result.exit_code == 3
    assert "nothing is listening" in result.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["drain", "--timeout", "soon"], "'soon'"),
        (["drain", "--propagation-wait", "-1"], "'-1'"),
        (["drain", "--interval", "1x"], "'1x'"),
        (["drain", "--grace-period", "0"], "grace_period"),
        (["drain", "--socket-dir", "/tmp", "--socket", "/tmp/x.sock"], "not both"),
        (["run", "tests.apps_streaming:app", "--drain-timeout", "abc"], "'abc'"),
        (["run", "tests.apps_streaming:nope"], "tests.apps_streaming:nope"),
        (["run", "tests.apps_streaming:app", "--grace-period", "5", "--reserve", "9"], "reserve"),
    ],
)
def test_bad_input_exits_2_naming_the_value(args: list[str], named: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert named in result.output
    assert "Traceback" not in result.output


def test_main_returns_exit_codes(socket_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["drain", "--socket-dir", socket_dir]) == 3
    assert main(["drain", "--timeout", "x"]) == 2
    assert main(["--help"]) == 0
    assert "drain" in capsys.readouterr().out


def test_drain_command_embeds_in_another_cli(served: Served) -> None:
    @click.group()
    def app_cli() -> None:
        pass

    app_cli.add_command(drain_command)
    result = CliRunner().invoke(app_cli, ["drain", "--socket-dir", served.socket_dir, "--propagation-wait=0.1s"])
    assert result.exit_code == 0, result.output
    assert served.mw.drain.state is State.DRAINING


def test_engine_mode_dispatches_to_engine_drain() -> None:
    port = free_port()  # nothing listens there
    result = invoke(
        "drain",
        "--engine",
        "vllm",
        "--metrics-url",
        f"http://127.0.0.1:{port}/metrics",
        "--timeout",
        "1s",
        "--interval",
        "100ms",
        "--quiet",
    )
    # Only the engine drain reads metrics URLs: seeing ours in the output proves the dispatch.
    assert f"127.0.0.1:{port}/metrics" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_metric_alone_means_engine_mode_and_asks_for_the_url() -> None:
    result = invoke("drain", "--metric", "vllm:num_requests_running")
    assert result.exit_code == 2
    assert "url" in result.output.lower()


def test_engine_mode_gets_the_70_percent_rule_not_the_server_reserve(monkeypatch: pytest.MonkeyPatch) -> None:
    import graceful._cli_engine

    seen: dict[str, object] = {}

    def fake_engine_drain(**options: object) -> int:  # records what the CLI hands over, nothing else
        seen.update(options)
        return 0

    monkeypatch.setattr(graceful._cli_engine, "run_engine_drain", fake_engine_drain)
    result = invoke("drain", "--engine", "vllm", "--grace-period", "30", "--timeout", "25s")
    assert result.exit_code == 0, result.output
    assert seen["timeout"] == 25.0 and seen["grace_period"] == 30.0


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graceful", *args], capture_output=True, text=True, timeout=30, cwd=os.getcwd()
    )


def test_subprocess_help_and_exit_codes(socket_dir: str) -> None:
    assert run_cli("--help").returncode == 0
    missing = run_cli("drain", "--socket-dir", socket_dir)
    assert missing.returncode == 3
    assert "no graceful server found" in missing.stderr
    bad = run_cli("drain", "--timeout=later")
    assert bad.returncode == 2
    assert "'later'" in bad.stderr and "Traceback" not in bad.stderr


def test_subprocess_env_socket_dir(served: Served) -> None:
    env = {**os.environ, "GRACEFUL_SOCKET_DIR": served.socket_dir}
    result = subprocess.run(
        [sys.executable, "-m", "graceful", "status", "--json"], capture_output=True, text=True, timeout=30, env=env
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["pid"] == os.getpid()
