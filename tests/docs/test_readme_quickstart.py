"""The README's "Try it in five minutes", run as written from a plain folder outside the clone.

1. the first shell block: a folder, a fresh virtualenv, ``pip install`` from the clone
2. the Python block saved as ``myapp.py``; ``graceful run`` in the first terminal
3. the stream with curl in a second terminal
4. while it runs, ``graceful drain`` and one more request in a third terminal: the stream ends
   whole, the drain exits 0 with its summary, the request gets the not-started 503
5. Ctrl-C in the first terminal: ``graceful run`` exits 0

Each block runs verbatim in bash. Only the port changes: ``--port 0``, then the port the server
names in its log, so no port is raced for. The outside world is pinned down: ``PATH`` holds
``python3`` (this interpreter's base, outside any virtualenv), curl and bash, and no
``graceful``, so the only ``graceful`` is the one the walkthrough installs;
``GRACEFUL_SOCKET_DIR`` is private, so the drain reaches this server only. Every line of the
output the README shows must appear in what the steps printed; only process ids, the port and
the drain's duration may differ.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.utils import ROOT

pytestmark = [
    pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the walkthrough's shell steps are POSIX"),
    # A fresh virtualenv and a pip install: about 10 s with a warm pip cache, more without one.
    pytest.mark.timeout(400),
]

README = Path(ROOT) / "README.md"
SECTION = re.compile(r"<!-- --8<-- \[start:try-it\] -->\n(.*?)<!-- --8<-- \[end:try-it\] -->", re.S)
BLOCK = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```$", re.S | re.M)
# A process id, the port, a drain's duration ("drained in 8.0 s").
VARIES = re.compile(r"(?<=worker )\d+|(?<=process \[)\d+|(?<=127\.0\.0\.1:)\d+|(?<= in )\d+\.\d(?= s\b)")
RUNNING = re.compile(r"running on http://127\.0\.0\.1:(\d+)")


def walkthrough() -> tuple[list[str], str, list[str]]:
    """The section's shell blocks, its Python block and its shown outputs, in order."""
    found = SECTION.search(README.read_text())
    assert found, "README.md has no try-it section (the snippet markers start:try-it / end:try-it)"
    blocks = BLOCK.findall(found.group(1))
    shells = [body for kind, body in blocks if kind == "bash"]
    pythons = [body for kind, body in blocks if kind == "python"]
    shown = [body for kind, body in blocks if kind == "text"]
    assert len(shells) == 4 and len(pythons) == 1, "the walkthrough's steps changed: update this test with them"
    setup, run, stream, drain = shells
    assert "pip install" in setup and "graceful run" in run and "curl -N" in stream and "graceful drain" in drain
    return shells, pythons[0], shown


def unmatched_lines(shown: str, printed: str) -> list[str]:
    """The lines of ``shown`` (output the README shows) that no line of ``printed`` matches.

    A line matches a printed line that equals it but for what changes from run to run: process
    ids, the port, and how long a drain took. ``...`` inside a line stands for anything; a line
    that is only ``...`` (a cut) is skipped, as are blank lines.
    """
    printed_lines = [line.rstrip() for line in printed.splitlines()]
    unmatched = []
    for line in shown.splitlines():
        line = line.rstrip()
        if not line or line == "...":
            continue
        parts = [
            re.escape(VARIES.sub("VARIES", part)).replace("VARIES", r"\d+(?:\.\d+)?") for part in line.split("...")
        ]
        if not any(re.fullmatch(".*".join(parts), candidate) for candidate in printed_lines):
            unmatched.append(line)
    return unmatched


def wait_for(path: Path, pattern: re.Pattern[str], process: subprocess.Popen[bytes], limit: float) -> re.Match[str]:
    deadline = time.monotonic() + limit
    while not (found := pattern.search(path.read_text(errors="replace"))):
        assert process.poll() is None, (
            f"exited with {process.returncode} before {pattern.pattern!r}:\n{path.read_text()}"
        )
        assert time.monotonic() < deadline, f"no {pattern.pattern!r} within {limit} s:\n{path.read_text()}"
        time.sleep(0.05)
    return found


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def test_the_readme_walkthrough_runs_as_written(tmp_path: Path, socket_dir: str) -> None:
    (setup, run, stream, drain), app, shown = walkthrough()
    port_flag = re.search(r"--port (\d+)", run)
    assert port_flag, "the walkthrough's `graceful run` names no --port"
    readme_port = port_flag.group(1)
    assert f":{readme_port}/" in stream and f":{readme_port}/" in drain

    # The folder the reader starts in holds their clone, named `graceful` as the README says.
    start = tmp_path / "start"
    start.mkdir()
    (start / "graceful").symlink_to(ROOT, target_is_directory=True)
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "python3").symlink_to(os.path.realpath(sys._base_executable))  # type: ignore[attr-defined]
    found_tools = [shutil.which(tool) for tool in ("curl", "bash")]
    path = os.pathsep.join(dict.fromkeys([str(tools), *(os.path.dirname(tool) for tool in found_tools if tool)]))
    assert shutil.which("graceful", path=path) is None, f"a graceful outside the fresh virtualenv is on {path}"
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "COVERAGE_PROCESS_START"}
    env = {key: value for key, value in os.environ.items() if key not in drop}
    env.update(PATH=path, GRACEFUL_SOCKET_DIR=socket_dir, PYTHONUNBUFFERED="1")

    # 1. The set-up block, in bash as typed; then where it left the reader.
    here = tmp_path / "here"
    done = subprocess.run(
        ["bash", "-e", "-c", f"{setup}\npwd > {here}"],
        cwd=start, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Successfully installed" in done.stdout and "graceful-drain" in done.stdout, done.stdout
    folder = Path(here.read_text().strip())
    assert folder.is_dir() and not folder.resolve().is_relative_to(Path(ROOT).resolve())
    venv = folder / ".venv"
    assert (venv / "bin" / "graceful").exists(), "the set-up block made no virtualenv with graceful in it"

    # 2. myapp.py, and `graceful run` in the first terminal, which the set-up block activated.
    (folder / "myapp.py").write_text(app)
    terminal_1 = {**env, "PATH": os.pathsep.join([str(venv / "bin"), path]), "VIRTUAL_ENV": str(venv)}
    server_log, stream_out = tmp_path / "server.log", tmp_path / "stream.out"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        with open(server_log, "wb") as out:
            server = subprocess.Popen(
                ["bash", "-c", run.replace(f"--port {readme_port}", "--port 0")],
                cwd=folder, env=terminal_1, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        processes.append(server)
        port = wait_for(server_log, RUNNING, server, limit=60).group(1)

        # 3. The stream, in a second terminal.
        with open(stream_out, "wb") as out:
            curl = subprocess.Popen(
                ["bash", "-c", stream.replace(f":{readme_port}/", f":{port}/")],
                cwd=start, env=env, stdout=out, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        processes.append(curl)
        wait_for(stream_out, re.compile(r"data: token 1\n"), curl, limit=15)

        # 4. The drain and one more request, in a third terminal, while the stream runs.
        assert curl.poll() is None, "the stream ended before the drain could start: make it longer"
        drained = subprocess.run(
            ["bash", "-e", "-c", drain.replace(f":{readme_port}/", f":{port}/")],
            cwd=start, env=env, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        drain_output = f"{drained.stdout}\n{drained.stderr}"
        # bash -e: a drain that exits non-zero stops the block before the request.
        assert drained.returncode == 0, drain_output
        assert re.search(r"^drained 1 of 1 worker in \d+\.\d s$", drained.stderr, re.M), drain_output
        assert re.search(r"^worker \d+: 1 in flight at the drain's start", drained.stderr, re.M), drain_output
        assert re.search(r"^HTTP/1\.1 503 ", drained.stdout, re.M), drain_output
        assert re.search(r"^x-graceful-not-started: 1\r?$", drained.stdout, re.M | re.I), drain_output

        # The stream ended whole: every token in order, then its end.
        assert curl.wait(15) == 0
        events = [line for line in stream_out.read_text().splitlines() if line]
        assert events[-1] == "data: [DONE]", events
        assert events[:-1] == [f"data: token {i}" for i in range(1, len(events))], events
        # ... and as the README shows it: its first events, a cut, its last ones.
        [shown_stream] = [output for output in shown if "data: [DONE]" in output]
        parts = [[line for line in part.splitlines() if line] for part in shown_stream.split("...")]
        head, tail = parts[0], parts[-1]
        assert events[: len(head)] == head and events[-len(tail) :] == tail, (shown_stream, events)

        # 5. Ctrl-C in the first terminal (SIGINT to its foreground process group).
        os.killpg(server.pid, signal.SIGINT)
        assert server.wait(30) == 0, server_log.read_text()
    finally:
        for process in processes:
            stop(process)

    log = server_log.read_text()
    assert "Finished server process" in log, log
    printed = "\n".join([log, stream_out.read_text(), drain_output])
    missing = [line for output in shown for line in unmatched_lines(output, printed)]
    assert not missing, (
        "the README shows output that the steps did not print:\n" + "\n".join(missing) + "\n---\n" + printed
    )
