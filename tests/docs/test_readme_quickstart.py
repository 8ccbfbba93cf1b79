"""The README's "Try it in five minutes", run as written from a plain folder outside the clone.

1. ``docs_src/readme/try_setup.sh``: a folder, a fresh virtualenv, ``pip install`` from the clone
2. ``try_myapp.py`` saved as ``myapp.py``; ``try_run.sh`` (``graceful run``) in the first terminal
3. ``try_stream.sh``: the stream with curl in a second terminal
4. while it runs, ``try_drain.sh`` (``graceful drain`` and one more request) in a third terminal: the
   stream ends whole, the drain exits 0 with its summary, the request gets the not-started 503
5. Ctrl-C in the first terminal: ``graceful run`` exits 0

The README shows each of these files, and the output it shows is ``try_*.out`` (tests/docs/test_blocks.py
holds the README's blocks equal to the files). Each step runs verbatim in bash. Only the port changes:
``--port 0``, then the port the server names in its log, so no port is raced for. The outside world is
pinned down: ``PATH`` holds ``python3`` (this interpreter's base, outside any virtualenv), curl and bash,
and no ``graceful``, so the only ``graceful`` is the one the walkthrough installs; ``GRACEFUL_SOCKET_DIR``
is private, so the drain reaches this server only. Each ``.out`` file is held against what its step
printed by tests/docs/shown.py's rules: its lines in order, ``...`` for a cut, any number for a number.

With ``GRACEFUL_WHEEL=<path of a built wheel>`` (``scripts/check-dist`` sets it), step 1 installs that
wheel in place of the clone, and the clone is not in the folder: the same walkthrough then runs against
the distribution a release would publish.
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

import graceful
from tests.docs.shown import unmatched
from tests.utils import ROOT

pytestmark = [
    pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the walkthrough's shell steps are POSIX"),
    # A fresh virtualenv and a pip install: about 10 s with a warm pip cache, more without one.
    pytest.mark.timeout(400),
]

# The walkthrough's files, in the README's order.
SETUP = "docs_src/readme/try_setup.sh"
APP = "docs_src/readme/try_myapp.py"
RUN, RUN_OUT = "docs_src/readme/try_run.sh", "docs_src/readme/try_run.out"
STREAM, STREAM_OUT = "docs_src/readme/try_stream.sh", "docs_src/readme/try_stream.out"
DRAIN, DRAIN_OUT = "docs_src/readme/try_drain.sh", "docs_src/readme/try_drain.out"
CTRL_C_OUT = "docs_src/readme/try_ctrl_c.out"
# The one word of the set-up step that names the clone, which a wheel replaces.
CLONE = re.compile(r"(?<=pip install )\.\./graceful(?= )")

RUNNING = re.compile(r"running on http://127\.0\.0\.1:(\d+)")


def read(name: str) -> str:
    return (Path(ROOT) / name).read_text()


def outside_world(tmp_path: Path) -> tuple[dict[str, str], str]:
    """The environment of a terminal outside any virtualenv, and its ``PATH``: ``python3`` (this
    interpreter's base), curl and bash, no ``graceful``, nothing of this test run's Python set-up."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "python3").symlink_to(os.path.realpath(sys._base_executable))  # type: ignore[attr-defined]
    found_tools = [shutil.which(tool) for tool in ("curl", "bash")]
    path = os.pathsep.join(dict.fromkeys([str(tools), *(os.path.dirname(tool) for tool in found_tools if tool)]))
    assert shutil.which("graceful", path=path) is None, f"a graceful outside the fresh virtualenv is on {path}"
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "COVERAGE_PROCESS_START", "GRACEFUL_WHEEL"}
    env = {key: value for key, value in os.environ.items() if key not in drop}
    env.update(PATH=path, PYTHONUNBUFFERED="1")
    return env, path


def check_installed(venv: Path, env: dict[str, str], cwd: Path) -> None:
    """The virtualenv's ``graceful`` is its own copy (not the clone), and ``graceful --version`` prints
    the version in graceful/__init__.py."""
    run = {**env, "PATH": os.pathsep.join([str(venv / "bin"), env["PATH"]]), "VIRTUAL_ENV": str(venv)}
    where = subprocess.run(
        ["python", "-c", "import graceful; print(graceful.__file__)"],
        cwd=cwd, env=run, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(venv), f"graceful imported from {where.stdout.strip()}"
    version = subprocess.run(["graceful", "--version"], cwd=cwd, env=run, capture_output=True, text=True, timeout=60)
    assert (version.returncode, version.stdout) == (0, f"graceful {graceful.__version__}\n"), version


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
    setup, app, run, stream, drain = read(SETUP), read(APP), read(RUN), read(STREAM), read(DRAIN)
    port_flag = re.search(r"--port (\d+)", run)
    assert port_flag, f"{RUN} names no --port"
    readme_port = port_flag.group(1)
    assert f":{readme_port}/" in stream and f":{readme_port}/" in drain

    # The folder the reader starts in holds their clone, named `graceful` as the README says; or,
    # for a built wheel, only the wheel, which the set-up step installs in the clone's place.
    start = tmp_path / "start"
    start.mkdir()
    wheel = os.environ.get("GRACEFUL_WHEEL")
    if wheel:
        assert wheel.endswith(".whl") and os.path.isfile(wheel), f"GRACEFUL_WHEEL={wheel!r} is no wheel file"
        setup, replaced = CLONE.subn(os.path.abspath(wheel), setup)
        assert replaced == 1, f"{SETUP} installs no ../graceful for the wheel to stand in for"
    else:
        (start / "graceful").symlink_to(ROOT, target_is_directory=True)
    env, path = outside_world(tmp_path)
    env["GRACEFUL_SOCKET_DIR"] = socket_dir

    # 1. The set-up step, in bash as typed; then where it left the reader.
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
    assert (venv / "bin" / "graceful").exists(), f"{SETUP} made no virtualenv with graceful in it"
    check_installed(venv, env, folder)

    # 2. myapp.py, and `graceful run` in the first terminal, which the set-up step activated.
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

        # 4. The drain and one more request, in a third terminal, while the stream runs. The terminal
        # shows the drain's lines and curl's answer as one stream, with no progress meter: curl draws
        # one only when its output is not a terminal, as here, so a .curlrc turns it off.
        assert curl.poll() is None, "the stream ended before the drain could start: make it longer"
        (tmp_path / ".curlrc").write_text("no-progress-meter\n")
        drained = subprocess.run(
            ["bash", "-e", "-c", drain.replace(f":{readme_port}/", f":{port}/")],
            cwd=start, env={**env, "CURL_HOME": str(tmp_path)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=90,
        )  # fmt: skip
        drain_output = drained.stdout
        # bash -e: a drain that exits non-zero stops the step before the request.
        assert drained.returncode == 0, drain_output
        assert re.search(r"^worker \d+: 1 in flight at the drain's start", drain_output, re.M), drain_output
        assert re.search(r"^drained 1 of 1 worker in \d+\.\d s\nHTTP/1\.1 503 ", drain_output, re.M), drain_output
        assert re.search(r"^x-graceful-not-started: 1\r?$", drain_output, re.M | re.I), drain_output

        # The stream ended whole: every token in order, then its end.
        assert curl.wait(15) == 0
        events = [line for line in stream_out.read_text().splitlines() if line]
        assert events[-1] == "data: [DONE]", events
        assert events[:-1] == [f"data: token {i}" for i in range(1, len(events))], events
        # ... and as the README shows it: its first events, a cut, its last ones.
        parts = [[line for line in part.splitlines() if line] for part in read(STREAM_OUT).split("...")]
        head, tail = parts[0], parts[-1]
        assert events[: len(head)] == head and events[-len(tail) :] == tail, (parts, events)

        # 5. Ctrl-C in the first terminal (SIGINT to its foreground process group).
        os.killpg(server.pid, signal.SIGINT)
        assert server.wait(30) == 0, server_log.read_text()
    finally:
        for process in processes:
            stop(process)

    log = server_log.read_text()
    assert "Finished server process" in log, log
    printed = {RUN_OUT: log, STREAM_OUT: stream_out.read_text(), DRAIN_OUT: drain_output, CTRL_C_OUT: log}
    missing = [f"{name}: {line}" for name, output in printed.items() for line in unmatched(read(name), output)]
    assert not missing, "\n".join(
        ["the README shows output that the steps did not print:", *missing, "---", *printed.values()]
    )
