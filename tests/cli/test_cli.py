"""The `graceful` CLI in-process (CliRunner) against a real server, and as real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from graceful import State
from graceful.cli import cli, drain_command, main
from tests.apps.workers import FakeWorker, chunk, http_error, ndjson, ndjson_head, status_line
from tests.servers import Served
from tests.utils import ROOT, refusing_port


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
    sent = time.monotonic()  # before the stream's request: its 14 sleeps of 0.1 s all come after this
    thread, outcome = served.stream_in_background(frames=14)
    result = invoke("drain", "--socket-dir", served.socket_dir)
    returned = time.monotonic()
    in_flight_at_return = served.mw.drain.in_flight
    thread.join(10)
    assert result.exit_code == 0, result.output
    assert isinstance(outcome[0], str) and outcome[0].endswith("done\n")
    assert "draining 1 worker: 1 in flight" in result.stderr
    assert "deadline in" in result.stderr
    # The drain waited for the stream: it returned once the stream had ended (the order), so no
    # sooner than the app's own 1.4 s of sleeps after the request was sent; 14 s only catches a hang.
    assert in_flight_at_return == 0
    assert 1.4 - 1e-3 <= returned - sent < 14.0


def test_grace_period_bounds_the_drain_and_leftover_is_reported(served: Served) -> None:
    """--grace-period 2: reserve defaults to 1 s, so the drain gets 1 s; the 10 s stream is left over."""
    thread, _ = served.stream_in_background(frames=100)
    started = time.monotonic()
    result = invoke("drain", "--socket-dir", served.socket_dir, "--grace-period", "2", "--quiet")
    thread.join(10)
    assert result.exit_code == 1, result.output
    assert time.monotonic() - started < 10  # the 1 s drain, not the 10 s stream; 10x safety bound
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


def test_a_failed_worker_shows_its_cause_is_never_resumed_and_drains(served: Served) -> None:
    """1. the engine died: FAILED  2. status shows FAILED and the cause  3. resume refuses it, exit 1, naming
    the cause; the state stays FAILED  4. a drain (the preStop hook) waits for its stream, ends 0, still FAILED"""
    served.mw.drain.mark_failed("engine_dead", "500 InternalServerError: EngineCore encountered an issue.")
    status = invoke("status", "--socket-dir", served.socket_dir)
    assert status.exit_code == 0
    [row] = status.stdout.splitlines()[1:]
    assert row.split()[1] == "FAILED" and row.endswith(
        "engine_dead: 500 InternalServerError: EngineCore encountered an issue."
    )
    resumed = invoke("resume", "--socket-dir", served.socket_dir)
    assert resumed.exit_code == 1
    assert "FAILED" in resumed.stdout and "(resumed)" not in resumed.stdout
    assert (
        "graceful resume: worker" in resumed.stderr
        and "engine_dead" in resumed.stderr
        and "not resumed" in resumed.stderr
    )
    assert served.mw.drain.state is State.FAILED
    drained = invoke("drain", "--socket-dir", served.socket_dir, "--propagation-wait", "0.2s", "--json")
    assert drained.exit_code == 0, drained.output
    assert json.loads(drained.stdout)["workers"][0]["result"]["result"] == "drained"
    assert served.mw.drain.state is State.FAILED


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
        (["drain", "--grace-period", "0"], "'--grace-period'"),
        (["drain", "--socket-dir", "/tmp", "--socket", "/tmp/x.sock"], "not both"),
        (["run", "tests.apps.streaming:app", "--drain-timeout", "abc"], "'abc'"),
        (["run", "tests.apps.streaming:nope"], "tests.apps.streaming:nope"),
        (["run", "tests.apps.streaming:app", "--grace-period", "5", "--reserve", "9"], "reserve"),
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
    with refusing_port() as port:  # nothing listens there
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
    # Refused on the first read: no engine was ever there (a typo'd port), not an engine that is gone.
    assert result.exit_code == 3, result.output
    assert f"graceful drain: no engine at http://127.0.0.1:{port}/metrics (connection refused); " in result.output


def test_metric_alone_means_engine_mode_and_asks_for_the_url() -> None:
    result = invoke("drain", "--metric", "vllm:num_requests_running")
    assert result.exit_code == 2
    assert "url" in result.output.lower()


def test_engine_mode_gets_the_drains_budget_rule() -> None:
    """1. a vLLM page that stays busy, served on 127.0.0.1 2. `graceful drain --engine vllm
    --grace-period 1 --timeout 25s` runs the real engine drain 3. its budget is the drain's rule,
    grace - reserve (0.5 s), not kthena's 70% (0.7 s) nor the timeout 4. it ends at that budget, exit 1."""
    from tests.engine.test_engine import BUSY, threaded_engine

    with threaded_engine(BUSY) as url:
        started = time.monotonic()
        result = invoke("drain", "--engine", "vllm", "--metrics-url", url, "--grace-period", "1", "--timeout", "25s",
                        "--interval", "100ms", "--json")  # fmt: skip
        elapsed = time.monotonic() - started
    assert result.exit_code == 1, result.output
    outcome = json.loads(result.stdout)
    assert outcome["result"] == "timeout" and outcome["limit"] == pytest.approx(0.5)
    assert 0.5 <= outcome["duration"] and elapsed < 5.0  # a 10x safety bound
    assert "budget of 0.5s ran out with running=1 waiting=0" in result.stderr


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


# The `graceful` CLI: `drain --json` with workers that fail in different ways,


@pytest.fixture
def fake(socket_dir: str) -> Iterator[list[FakeWorker]]:
    workers: list[FakeWorker] = []
    yield workers
    for worker in workers:
        worker.close()


def stale(socket_dir: str, pid: int) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(os.path.join(socket_dir, f"{pid}.sock"))  # bound, never listening
    return sock


def test_drain_json_shape_with_a_worker_answering_an_http_error(
    served: Served, fake: list[FakeWorker], socket_dir: str
) -> None:
    """One worker drains, the other answers 503: exit 1, and the JSON names both, one with its error."""
    broken = FakeWorker(os.path.join(socket_dir, "4100.sock"), http_error(503, {"error": "busy"}))
    fake.append(broken)
    result = invoke("drain", "--socket-dir", socket_dir, "--json", "--quiet")
    assert result.exit_code == 1, result.output
    outcome = json.loads(result.stdout)
    assert set(outcome) == {"result", "workers"}
    assert outcome["result"] == "timeout"
    by_socket = {w["socket"]: w for w in outcome["workers"]}
    assert set(by_socket) == {broken.path, os.path.join(socket_dir, f"{os.getpid()}.sock")}
    for worker in outcome["workers"]:
        assert set(worker) == {"socket", "pid", "result", "error"}
    assert by_socket[broken.path] == {
        "socket": broken.path,
        "pid": None,
        "result": None,
        "error": 'HTTP 503: {"error": "busy"}',
    }
    ours = by_socket[os.path.join(socket_dir, f"{os.getpid()}.sock")]
    assert ours["pid"] == os.getpid() and ours["error"] is None and ours["result"]["result"] == "drained"
    # --quiet still reports when something went wrong.
    assert f'{broken.path}: HTTP 503: {{"error": "busy"}}' in result.stderr
    assert "drained 1 of 2 workers" in result.stderr
    assert served.mw.drain.state is State.DRAINING


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        # The worker died mid-stream: the chunked body never ends.
        (ndjson_head() + chunk(ndjson(status_line(4200))), "lost the connection before the drain ended"),
        # The worker ended the stream cleanly but never sent its result line.
        (
            ndjson_head() + chunk(ndjson(status_line(4200))) + b"0\r\n\r\n",
            "the server closed the connection before the drain ended",
        ),
        # Not NDJSON at all (something else listens on the socket).
        (ndjson_head() + chunk(b"<html>\n") + b"0\r\n\r\n", "lost the connection before the drain ended"),
    ],
    ids=["dropped", "no-result", "not-json"],
)
def test_drain_reports_a_worker_that_ends_without_a_result(
    fake: list[FakeWorker], socket_dir: str, reply: bytes, message: str
) -> None:
    worker = FakeWorker(os.path.join(socket_dir, "4200.sock"), reply)
    fake.append(worker)
    result = invoke("drain", "--socket-dir", socket_dir, "--json")
    assert result.exit_code == 1, result.output
    (reported,) = json.loads(result.stdout)["workers"]
    assert message in reported["error"]
    assert reported["result"] is None
    assert message in result.stderr
    assert "drained 0 of 1 worker" in result.stderr
    assert "Traceback" not in result.output


def test_stale_socket_is_skipped_with_a_note(served: Served, socket_dir: str) -> None:
    with stale(socket_dir, 999999):
        result = invoke("drain", "--socket-dir", socket_dir, "--json")
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.stdout)
    assert outcome["result"] == "drained"
    assert [w["pid"] for w in outcome["workers"]] == [os.getpid()]
    stale_path = os.path.join(socket_dir, "999999.sock")
    assert f"graceful drain: skipped {stale_path}: nothing listening (stale socket)" in result.stderr
    assert "drained 1 of 1 worker" in result.stderr


def test_status_and_resume_with_several_workers(served: Served, fake: list[FakeWorker], socket_dir: str) -> None:
    """Our worker, a second worker (another pid), a stale socket and a non-socket file:
    `status` shows the two that answer, `resume` talks to every one of them."""
    since = time.time() - 60
    other = {"pid": 4300, "state": "DRAINING", "in_flight": 3, "since": since, "resumed": True}
    body = json.dumps(other).encode()
    reply = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    fake.append(FakeWorker(os.path.join(socket_dir, "4300.sock"), reply))
    Path(socket_dir, "notes.sock").write_text("not a socket")
    served.mw.drain.begin_drain("test")
    with stale(socket_dir, 999998):
        status = invoke("status", "--socket-dir", socket_dir)
        rows = json.loads(invoke("status", "--socket-dir", socket_dir, "--json").stdout)
        resumed = invoke("resume", "--socket-dir", socket_dir)
    assert status.exit_code == 0, status.output
    lines = status.stdout.splitlines()
    assert lines[0].split() == ["PID", "STATE", "IN", "FLIGHT", "SINCE"]
    assert len(lines) == 3
    # Rows follow the socket names' order, which depends on this process's pid.
    by_pid = {line.split()[0]: line.split() for line in lines[1:]}
    assert by_pid[str(os.getpid())][1:3] == ["DRAINING", "0"]
    assert by_pid["4300"] == ["4300", "DRAINING", "3", time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))]
    assert sorted(row["socket"] for row in rows) == sorted(
        [os.path.join(socket_dir, f"{os.getpid()}.sock"), os.path.join(socket_dir, "4300.sock")]
    )
    assert resumed.exit_code == 0, resumed.output
    assert sorted(resumed.stdout.splitlines()) == sorted(
        [f"worker {os.getpid()}: SERVING (resumed)", "worker 4300: DRAINING (resumed)"]
    )
    assert served.mw.drain.state is State.SERVING


@pytest.mark.parametrize("command", ["status", "resume"])
def test_only_stale_sockets_exits_3_naming_them(socket_dir: str, command: str) -> None:
    with stale(socket_dir, 999997):
        result = invoke(command, "--socket-dir", socket_dir)
    assert result.exit_code == 3
    assert f"nothing is listening on {os.path.join(socket_dir, '999997.sock')}" in result.stderr


@pytest.mark.parametrize("command", ["drain", "status", "resume"])
def test_missing_socket_dir_exits_3_naming_it(socket_dir: str, command: str) -> None:
    missing = os.path.join(socket_dir, "nope")
    result = invoke(command, "--socket-dir", missing)
    assert result.exit_code == 3
    assert f"cannot read socket dir {missing!r} (No such file or directory)" in result.stderr


@pytest.mark.parametrize("command", ["status", "resume"])
def test_socket_and_socket_dir_together_exit_2(socket_dir: str, command: str) -> None:
    result = invoke(command, "--socket-dir", socket_dir, "--socket", os.path.join(socket_dir, "1.sock"))
    assert result.exit_code == 2
    assert "use --socket-dir or --socket, not both" in result.stderr


def test_embedding_cli_may_give_durations_as_seconds(served: Served, socket_dir: str) -> None:
    """An app's own CLI can set drain defaults as plain floats through click's default_map."""

    @click.group()
    def app_cli() -> None:
        pass

    app_cli.add_command(drain_command)
    defaults = {"drain": {"propagation_wait": 0.4, "socket_dir": socket_dir}}
    started = time.monotonic()
    result = CliRunner().invoke(app_cli, ["drain", "--json"], default_map=defaults)
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started >= 0.4  # the propagation wait was honoured
    (worker,) = json.loads(result.stdout)["workers"]
    assert worker["result"]["result"] == "drained"


def test_main_shows_click_errors_and_returns_their_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["drain", "--no-such-option"]) == 2
    err = capsys.readouterr().err
    assert "No such option" in err and "--no-such-option" in err and "Traceback" not in err


def run_graceful(*args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "graceful", *args]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_worker_resumed_during_the_drain_exits_1(served: Served) -> None:
    """1. a 6 s stream keeps the drain open 2. `graceful drain` reaches the server 3. `graceful
    resume` 4. the drain exits 1 at once, naming the worker as resumed, and the worker serves again."""
    thread, outcome = served.stream_in_background(frames=60)
    drain = run_graceful("drain", "--socket-dir", served.socket_dir)
    try:
        deadline = time.monotonic() + 15
        while served.mw.drain.state is not State.DRAINING:  # the drain has reached the server
            assert time.monotonic() < deadline and drain.poll() is None, "the drain never began"
            time.sleep(0.01)
        resumed = invoke("resume", "--socket-dir", served.socket_dir)
        assert resumed.exit_code == 0, resumed.output
        out, err = drain.communicate(timeout=15)
        assert served.mw.drain.in_flight == 1  # it did not wait for the stream
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.communicate()
    assert drain.returncode == 1, err
    [summary] = [line for line in err.splitlines() if line.startswith(f"worker {os.getpid()}: resumed")]
    assert summary.endswith("(graceful resume): serving again, with 1 in flight"), summary
    assert "deadline" not in summary  # a resumed drain ended by no deadline, and cut nothing (issue 51)
    assert "drained 0 of 1 worker" in err
    assert served.mw.drain.state is State.SERVING
    thread.join(15)
    assert isinstance(outcome[0], str) and outcome[0].endswith("done\n")


def test_ctrl_c_during_a_drain_prints_aborted_and_exits_1(fake: list[FakeWorker], socket_dir: str) -> None:
    """1. a worker that never finishes its drain 2. `graceful drain` waits 3. Ctrl-C (SIGINT)
    4. "Aborted!" on stderr, exit 1, no traceback."""
    worker = FakeWorker(
        os.path.join(socket_dir, "4400.sock"), ndjson_head() + chunk(ndjson(status_line(4400))), hold=True
    )
    fake.append(worker)
    drain = run_graceful("drain", "--socket-dir", socket_dir)
    try:
        assert worker.got_request.wait(15)
        assert drain.stderr is not None
        # Once a progress line shows the worker's 2 in flight, the client has read the status
        # line and waits on the stream (lines before that may still show 0).
        progress = ""
        while not progress.startswith("draining 1 worker: 2 in flight"):
            progress = drain.stderr.readline()
            assert progress, "graceful drain ended before its status line"
        drain.send_signal(signal.SIGINT)
        out, err = drain.communicate(timeout=10)
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.communicate()
    assert drain.returncode == 1, err
    assert err.rstrip().endswith("Aborted!")
    assert "Traceback" not in err


def test_run_on_a_busy_port_exits_with_uvicorns_code_without_traceback(socket_dir: str) -> None:
    """uvicorn raises SystemExit(3) (its STARTUP_FAILURE) when it cannot bind; main() passes
    the code on instead of a traceback."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = run_graceful("run", "tests.apps.streaming:app", "--port", str(port), "--socket-dir", socket_dir)
        out, err = run.communicate(timeout=30)
    assert run.returncode == 3, err
    assert "address already in use" in err.lower()
    assert "Traceback" not in err
    assert os.listdir(socket_dir) == []  # the admin socket did not outlive the failed start


PLAIN_APP = """
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello from a plain folder"})
"""


def test_graceful_run_finds_a_module_in_the_current_directory(tmp_path: Path) -> None:
    """1. a folder outside the repository holds myapp.py  2. `graceful run myapp:app` from it serves it
    (as uvicorn does: --app-dir, default the current directory)  3. SIGTERM: it exits 0"""
    import re

    import httpx

    (tmp_path / "myapp.py").write_text(PLAIN_APP)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["GRACEFUL_SOCKET_DIR"] = str(tmp_path)
    log = tmp_path / "log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "graceful", "run", "myapp:app", "--port", "0"],
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (found := re.search(r"running on http://127\.0\.0\.1:(\d+)", log.read_text())):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        answer = httpx.get(f"http://127.0.0.1:{found.group(1)}/", timeout=5)
        assert answer.status_code == 200 and answer.text == "hello from a plain folder"
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_a_port_out_of_range_is_a_usage_error(port: str) -> None:
    result = invoke("run", "examples.server:app", "--port", port)
    assert result.exit_code == 2
    assert f"Invalid value for '--port': {port} is not in the range 0<=x<=65535" in result.stderr
