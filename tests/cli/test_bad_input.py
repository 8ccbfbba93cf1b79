"""Bad input on the command line, table-driven (issue 46): each gets its exit code and one line on stderr
in the command's voice, naming the value as the user gave it (the flag as typed, the variable as set),
and never a traceback. Each row runs the real console script in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.commands import terminal_env
from tests.docs.shown import console
from tests.utils import ROOT

pytestmark = pytest.mark.servers  # each row runs the console script as a process (tests/tiers.py)

PLAIN_APP = """
async def app(scope, receive, send):
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
"""

# (id, arguments, environment, exit code, what the one line starts with, what it must name)
ROWS = [
    ("run-port-high", ["run", "examples.server:app", "--port", "99999"], {}, 2, "graceful run:", ["'--port'", "99999"]),
    ("run-port-negative", ["run", "examples.server:app", "--port", "-1"], {}, 2, "graceful run:", ["'--port'", "-1"]),
    (
        "run-grace-negative",
        ["run", "x:app", "--grace-period", "-1"],
        {},
        2,
        "graceful run:",
        ["'--grace-period'", "'-1' is negative"],
    ),
    (
        "run-grace-negative-s",
        ["run", "x:app", "--grace-period", "-1s"],
        {},
        2,
        "graceful run:",
        ["'--grace-period'", "'-1s' is negative"],
    ),
    (
        "run-grace-variable",
        ["run", "plain:app", "--app-dir", "{dir}"],
        {"GRACEFUL_GRACE_PERIOD": "abc"},
        2,
        "graceful run:",
        ["GRACEFUL_GRACE_PERIOD", "'abc'"],
    ),
    (
        "run-reserve-variable",
        ["run", "plain:app", "--app-dir", "{dir}"],
        {"GRACEFUL_RESERVE": "40"},
        2,
        "graceful run:",
        ["GRACEFUL_RESERVE", "40"],
    ),
    (
        "run-socket-mode-variable",
        ["run", "plain:app", "--app-dir", "{dir}"],
        {"GRACEFUL_SOCKET_MODE": "777"},
        2,
        "graceful run:",
        ["GRACEFUL_SOCKET_MODE", "'777'"],
    ),
    (
        "run-example-variable",
        ["run", "examples.server:app"],
        {"GRACEFUL_EXAMPLE_PROPAGATION_WAIT": "60s"},
        2,
        "graceful run:",
        ["GRACEFUL_EXAMPLE_PROPAGATION_WAIT=60s"],
    ),
    (
        "run-socket-dir-file",
        ["run", "x:app", "--socket-dir", "{file}"],
        {},
        2,
        "graceful run:",
        ["'--socket-dir'", "{file}"],
    ),
    ("run-no-module", ["run", "no_such_module_here:app"], {}, 2, "graceful run:", ["no_such_module_here:app"]),
    # Issue 54: the admission option's flag and variable name the value and the choices.
    ("run-admission", ["run", "x:app", "--admission", "maybe"], {}, 2, "graceful run:", ["'maybe'", "'all', 'fits'"]),
    (
        "run-admission-variable",
        ["run", "plain:app", "--app-dir", "{dir}"],
        {"GRACEFUL_ADMISSION": "maybe"},
        2,
        "graceful run:",
        ["GRACEFUL_ADMISSION: 'maybe'", "all or fits"],
    ),
    # Issue 51: the flag or the variable the user actually used, the value as typed, in every command.
    (
        "run-socket-dir-under-a-file",
        ["run", "plain:app", "--app-dir", "{dir}", "--socket-dir", "{file}/sub"],
        {},
        2,
        "graceful run:",
        ["'--socket-dir'", "'{file}/sub'", "is not a directory"],
    ),
    (
        "run-socket-dir-variable-file",
        ["run", "plain:app", "--app-dir", "{dir}"],
        {"GRACEFUL_SOCKET_DIR": "{file}"},
        2,
        "graceful run:",
        ["environment variable GRACEFUL_SOCKET_DIR: '{file}' is a file"],
    ),
    (
        "run-socket-dir-variable-relative",
        ["run", "plain:app", "--app-dir", "{dir}"],
        {"GRACEFUL_SOCKET_DIR": "relative/dir"},
        2,
        "graceful run:",
        ["environment variable GRACEFUL_SOCKET_DIR: 'relative/dir' is a relative path", "absolute"],
    ),
    (
        "run-drain-timeout-zero",
        ["run", "plain:app", "--app-dir", "{dir}", "--drain-timeout", "0"],
        {},
        2,
        "graceful run:",
        ["'--drain-timeout'", "'0' leaves no time to drain"],
    ),
    (
        "run-drain-timeout-variable-zero",
        ["run", "plain:app", "--app-dir", "{dir}"],
        {"GRACEFUL_DRAIN_TIMEOUT": "0s"},
        2,
        "graceful run:",
        ["environment variable GRACEFUL_DRAIN_TIMEOUT: '0s' leaves no time to drain"],
    ),
    (
        "run-grace-over-a-year",
        ["run", "plain:app", "--app-dir", "{dir}", "--grace-period", "99999999999999999999"],
        {},
        2,
        "graceful run:",
        ["'--grace-period'", "'99999999999999999999' is longer than a year"],
    ),
    (
        "run-grace-variable-over-a-year",
        ["run", "plain:app", "--app-dir", "{dir}"],
        {"GRACEFUL_GRACE_PERIOD": "1e20"},
        2,
        "graceful run:",
        ["environment variable GRACEFUL_GRACE_PERIOD: '1e20' is longer than a year"],
    ),
    ("no-command", ["nosuch"], {}, 2, "graceful:", ["'nosuch'"]),
    (
        "drain-both-sockets",
        ["drain", "--socket-dir", "{dir}", "--socket", "{dir}/1.sock"],
        {},
        2,
        "graceful drain:",
        ["--socket-dir", "--socket"],
    ),
    ("drain-bad-duration", ["drain", "--timeout=later"], {}, 2, "graceful drain:", ["'--timeout'", "'later'"]),
    (
        "drain-missing-value",
        ["drain", "--propagation-wait"],
        {},
        2,
        "graceful drain:",
        ["'--propagation-wait' requires an argument", "graceful drain --help"],
    ),
    (
        "drain-socket-dir-file",
        ["drain", "--socket-dir", "{file}"],
        {},
        2,
        "graceful drain:",
        ["'--socket-dir'", "'{file}' is a file"],
    ),
    (
        "drain-socket-dir-variable-file",
        ["drain"],
        {"GRACEFUL_SOCKET_DIR": "{file}"},
        2,
        "graceful drain:",
        ["environment variable GRACEFUL_SOCKET_DIR: '{file}' is a file"],
    ),
    (
        "drain-grace-zero",
        ["drain", "--grace-period", "0"],
        {},
        2,
        "graceful drain:",
        ["'--grace-period'", "'0' leaves no time to drain"],
    ),
    (
        "drain-grace-over-a-year",
        ["drain", "--grace-period", "99999999999999999999"],
        {},
        2,
        "graceful drain:",
        ["'--grace-period'", "'99999999999999999999' is longer than a year"],
    ),
    (
        "drain-quiet-over-wait",
        ["drain", "--propagation-quiet", "5", "--propagation-wait", "2"],
        {},
        2,
        "graceful drain:",
        ["--propagation-quiet 5s is longer than --propagation-wait 2s"],
    ),
    ("drain-unknown-option", ["drain", "--no-such-option"], {}, 2, "graceful drain:", ["'--no-such-option'"]),
    (
        "drain-wait-over-budget",
        ["drain", "--grace-period", "10", "--propagation-wait", "20s"],
        {},
        2,
        "graceful drain:",
        ["--propagation-wait 20s", "--grace-period 10s"],
    ),
    ("drain-no-server", ["drain", "--socket", "{dir}/1.sock"], {}, 3, "graceful drain:", ["{dir}/1.sock"]),
    (
        "drain-no-engine",
        ["drain", "-q", "--engine", "vllm", "--metrics-url", "http://127.0.0.1:1/metrics"],
        {},
        3,
        "graceful drain:",
        ["no engine at http://127.0.0.1:1/metrics"],
    ),
    (
        "status-both-sockets",
        ["status", "--socket-dir", "{dir}", "--socket", "{dir}/1.sock"],
        {},
        2,
        "graceful status:",
        ["--socket-dir", "--socket"],
    ),
    ("status-no-server", ["status", "--socket", "{dir}/1.sock"], {}, 3, "graceful status:", ["{dir}/1.sock"]),
    (
        "status-socket-dir-file",
        ["status", "--socket-dir", "{file}"],
        {},
        2,
        "graceful status:",
        ["'--socket-dir'", "'{file}' is a file"],
    ),
    (
        "status-socket-dir-variable-file",
        ["status"],
        {"GRACEFUL_SOCKET_DIR": "{file}"},
        2,
        "graceful status:",
        ["environment variable GRACEFUL_SOCKET_DIR: '{file}' is a file"],
    ),
    ("status-missing-value", ["status", "--socket"], {}, 2, "graceful status:", ["'--socket' requires an argument"]),
    (
        "advise-two-sources",
        ["advise", "--engine", "vllm", "--from", "{status}"],
        {},
        2,
        "graceful advise:",
        ["--engine vllm", "--from {status}"],
    ),
    ("advise-wrong-shape", ["advise", "--from", "{wrong}"], {}, 2, "graceful advise:", ["--from {wrong}"]),
    (
        "advise-bad-duration",
        ["advise", "--from", "{status}", "--grace-period", "soon"],
        {},
        2,
        "graceful advise:",
        ["--grace-period", "'soon'"],
    ),
]


@pytest.mark.parametrize(
    ("argv", "env", "code", "prefix", "named"), [row[1:] for row in ROWS], ids=[row[0] for row in ROWS]
)
def test_bad_input_gets_one_line_in_the_commands_voice(
    argv: list[str], env: dict[str, str], code: int, prefix: str, named: list[str], tmp_path: Path
) -> None:
    places = {
        "dir": str(tmp_path),
        "file": str(tmp_path / "a-file"),
        "status": str(tmp_path / "status.json"),
        "wrong": str(tmp_path / "wrong.json"),
    }
    (tmp_path / "a-file").write_text("not a directory")
    (tmp_path / "plain.py").write_text(PLAIN_APP)
    (tmp_path / "status.json").write_text("[]")
    (tmp_path / "wrong.json").write_text(json.dumps({"hello": "world"}))
    environ = {key: value for key, value in os.environ.items() if not key.startswith("GRACEFUL_")}
    environ |= {"GRACEFUL_SOCKET_DIR": str(tmp_path), **{name: value.format(**places) for name, value in env.items()}}
    done = subprocess.run(
        [sys.executable, "-m", "graceful", *(arg.format(**places) for arg in argv)],
        cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(prefix + " "), lines[0]
    for text in named:
        assert text.format(**places) in lines[0], lines[0]


def test_a_grace_period_no_pod_can_have_is_refused_as_the_page_shows(tmp_path: Path) -> None:
    """docs/cli.md, "Messages": the page's command, typed as shown, prints the page's one line, exit 2."""
    ((command, shown),) = console((Path(ROOT) / "docs_src/cli/grace_refused.console").read_text())
    done = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=terminal_env(GRACEFUL_SOCKET_DIR=str(tmp_path)),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr == shown + "\n"
