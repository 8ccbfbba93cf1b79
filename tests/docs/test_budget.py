"""docs/budget.md: the ``graceful advise`` and ``graceful drain`` sessions, run as the page shows them.

- The advise sessions read fixed evidence, so their output is the page's to the character:
  docs_src/budget/status.json is the example server's status (``graceful status --json``) after the
  traffic the page names (``graceful run examples.server:app`` with GRACEFUL_EXAMPLE_TOKENS_PER_SECOND=50
  and ``--grace-period 30``; 40 completions of 32 tokens, 10 streams of 100 tokens, 3 of 600, 2
  completions of 400 tokens); the vLLM pair reads docs_src/budget/vllm_status.json and the histogram
  of vLLM's /metrics page saved with it (docs_src/budget/vllm_metrics.txt), served here on 127.0.0.1.
  Each session runs in bash in a scratch folder holding the evidence, its commands in order, so
  ``echo $?`` reads the exit code of the command before it.
- The drain's opening line comes from a live example server that saw the traffic that makes it.
- The rollout demo's command lines go to the demo's own command (tests/docs/recorded.py); its two
  runs are tests/test_rollout_advice.py's, and the output the page shows is one run's record.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.docs.recorded import check_started, recorded
from tests.docs.shown import console, unmatched
from tests.servers import Launched
from tests.utils import ROOT

pytestmark = pytest.mark.timeout(60)

STATUS = "docs_src/budget/status.json"
SESSIONS = [
    "docs_src/budget/advise.console",
    "docs_src/budget/advise_max_grace_period.console",
    "docs_src/budget/advise_hook_flags.console",
    "docs_src/budget/advise_bad_duration.console",
    "docs_src/budget/advise_admission.console",  # issue 54: what each admission mode does in the wait
]
VLLM_STATUS = "docs_src/budget/vllm_status.json"
VLLM_METRICS = "docs_src/budget/vllm_metrics.txt"
VLLM_SESSION = "docs_src/budget/advise_vllm.console"
DRAIN = "docs_src/budget/drain_opening_line.console"
ROLLOUT = "docs_src/budget/rollout.console"
MARK = "@@ next command @@"


def read(path: str) -> str:
    return (Path(ROOT) / path).read_text()


def run_session(commands: list[str], folder: Path, **env: str) -> list[str]:
    """The commands in one bash, in ``folder``, one after the other: what each printed (stdout and
    stderr together). Between two commands the exit code of the first is kept for the next."""
    script = "exec 2>&1\n" + "".join(f'{command}\n__s=$?; echo "{MARK}"; (exit $__s)\n' for command in commands)
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])
    ran = subprocess.run(
        ["bash", "-c", script],
        cwd=folder,
        env={**os.environ, "PATH": path, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    printed = ran.stdout.split(MARK + "\n")
    assert len(printed) == len(commands) + 1, ran.stdout + ran.stderr
    return printed[:-1]


def assert_shown(session: str, printed: list[str], varies: re.Pattern[str] | None = None) -> None:
    for (command, shown), output in zip(console(session), printed, strict=True):
        assert unmatched(shown, output, varies) == [], f"$ {command}\n{output}"


@pytest.mark.parametrize("path", SESSIONS)
def test_each_advise_session_prints_what_the_page_shows(path: str, tmp_path: Path) -> None:
    """The session's commands, as typed, next to the saved status: every line the page shows, in order
    (``...`` cuts aside), and the exit codes it shows."""
    shutil.copy(Path(ROOT) / STATUS, tmp_path / "status.json")
    sockets = tmp_path / "no-servers"  # no server answers here: the evidence is the file
    sockets.mkdir(mode=0o700)
    session = read(path)
    printed = run_session([command for command, _ in console(session)], tmp_path, GRACEFUL_SOCKET_DIR=str(sockets))
    assert_shown(session, printed)


def test_a_changed_advice_fails_the_check(tmp_path: Path) -> None:
    """The check can fail: the same session against a status with one more long stream."""
    shutil.copy(Path(ROOT) / STATUS, tmp_path / "status.json")
    status = (tmp_path / "status.json").read_text()
    (tmp_path / "status.json").write_text(
        status.replace('"completed": 55', '"completed": 56', 1).replace(
            "[0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 0, 3,", "[0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 0, 4,", 1
        )
    )
    session = read(SESSIONS[0])
    printed = run_session([command for command, _ in console(session)], tmp_path)
    [(_, shown)] = console(session)
    assert unmatched(shown, printed[0], None) != []


class Page(BaseHTTPRequestHandler):
    """Serves the saved metrics page at /metrics, as the engine served it."""

    text = b""

    def do_GET(self) -> None:
        found = self.path == "/metrics"
        body = self.text if found else b"not found\n"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@contextmanager
def serving_the_page(path: str) -> Iterator[str]:
    handler = type("SavedPage", (Page,), {"text": (Path(ROOT) / path).read_bytes()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


def test_the_vllm_pair_gives_the_same_advice_both_ways(tmp_path: Path) -> None:
    """The vLLM's saved status and its saved page: each session as typed (the page's address is the one
    it was saved from, 127.0.0.1:8000; here the server that serves it), every line the page shows."""
    shutil.copy(Path(ROOT) / VLLM_STATUS, tmp_path / "vllm_status.json")
    session = read(VLLM_SESSION)
    with serving_the_page(VLLM_METRICS) as url:
        here = session.replace("http://127.0.0.1:8000", url)
        printed = run_session([command for command, _ in console(here)], tmp_path)
    assert_shown(here, printed)


# What varies from run to run in the drain's lines: the worker's pid, the times (tenths of a second),
# the time to the deadline (whole seconds: the start of a drain on a busy machine may take a
# second's part of it); every count and the forecast are held.
DRAIN_VARIES = re.compile(r"(?<=worker )\d+|\d+\.\d(?= s)|\d+(?= s to the deadline)|(?<=deadline in )\d+")
RATE = 50  # tokens per second of the example server


def complete(server: Launched, tokens: int, *, stream: bool) -> None:
    with httpx.Client(timeout=30) as client:
        body = {"model": "m", "prompt": "hi", "max_tokens": tokens, "stream": stream}
        answer = client.post(server.url("/v1/completions"), json=body)
        assert answer.status_code == 200, answer.text


def counted(server: Launched) -> int:
    """The finished requests whose durations the server has counted (``graceful status --json``)."""
    answer = subprocess.run(
        [sys.executable, "-m", "graceful", "status", "--json", "--socket-dir", server.socket_dir],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert answer.returncode == 0, answer.stderr
    [status] = json.loads(answer.stdout)
    durations = status["durations"]
    return sum(sum(durations[kind]["counts"]) for kind in ("plain", "stream"))


def test_the_drains_opening_line_is_the_pages(launch: Callable[..., Launched], tmp_path: Path) -> None:
    """1. the example server (50 tokens/s) sees 55 requests: 50 completions of one token, 2 streams of
    2 s and 3 of 8 s 2. a stream of 3 s begins 3. the page's command: 6 s to the deadline, and of the 5
    streams seen past the new stream's age, 3 ran past that age + 6 s: "1 may outlast it (about 0.6
    expected to be cut)"; the progress lines while it runs; then it drains."""
    server = launch(
        app="examples.server:app",
        GRACEFUL_EXAMPLE_TOKENS_PER_SECOND=str(RATE),
        GRACEFUL_EXAMPLE_LOAD_DELAY="0",
    )
    server.wait_ready()
    history = [(2 * RATE, True)] * 2 + [(8 * RATE, True)] * 3 + [(1, False)] * 50
    workers = [threading.Thread(target=complete, args=(server, tokens), kwargs={"stream": s}) for tokens, s in history]
    for worker in workers[:5]:
        worker.start()
    for worker in workers[5:]:  # one at a time beside the streams
        worker.start()
        worker.join(30)
    for worker in workers[:5]:
        worker.join(30)
    assert not any(worker.is_alive() for worker in workers)
    # The server counts a finished request's duration at its next sweep (0.1 s apart): the forecast reads
    # all 55 only once they are counted (on a busy machine the drain came first, once: "54 requests").
    deadline = time.monotonic() + 10
    while counted(server) < len(history):
        assert time.monotonic() < deadline, "the server had not counted the 55 requests within 10 s"
    streaming = threading.Event()
    chunks: list[str] = []

    def stream() -> None:
        body = {"model": "m", "prompt": "hi", "max_tokens": 3 * RATE, "stream": True}
        with httpx.Client(timeout=30) as client, client.stream("POST", server.url("/v1/completions"), json=body) as r:
            for chunk in r.iter_text():
                streaming.set()
                chunks.append(chunk)

    in_flight = threading.Thread(target=stream)
    in_flight.start()
    try:
        assert streaming.wait(10), "the stream never began"
        session = read(DRAIN)
        printed = run_session(
            [command for command, _ in console(session)], tmp_path, GRACEFUL_SOCKET_DIR=server.socket_dir
        )
    finally:
        in_flight.join(30)
    assert_shown(session, printed, DRAIN_VARIES)
    assert "data: [DONE]" in "".join(chunks)
    assert "drained 1 of 1 worker" in printed[0], printed[0]


def test_the_rollout_demos_command_lines_are_ones_it_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two runs of the page: the second with the grace period the first's advice recommends
    (tests/test_rollout_advice.py runs both)."""
    started = recorded(ROLLOUT, tmp_path)
    assert [name for name, _ in started] == ["python", "python"], started
    check_started(started, monkeypatch)
