"""Every bad option is refused when the middleware is built, in one voice (issue 46).

One row per bad input. Passed in code, the message names the Python option as passed, the value as
written and the fix; set in a ``GRACEFUL_*`` variable, it names the variable. Nothing is left to
fail first at startup, at the first request or mid-drain. Under a server that imports the app by
name the error reads as that server's one line, without a traceback; a startup failure names its
cause, not the task group around it.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry

from graceful import ConfigError, Drain, GracefulMiddleware
from graceful._admin._paths import MAX_PATH
from graceful._drain._environ import PREFIX
from graceful._drain._errors import reported
from tests.utils import ROOT

HELP = "use a number of seconds or a duration such as 10s, 1.5s, 500ms, 2m or 1m30s"
MODES = "use 0o600 (owner only, the default) or 0o660 (group)"
PATH = "is not a path; use one that starts with /, e.g. /ready"
LIVE = "pass a function of no arguments that returns True while live"
FRAME = "pass a function of the response's content type (bytes) that returns the final frame (bytes) or None"
HOOK = "pass an async function of no arguments (async def hook(): ...)"


async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover - never called
    pass


def sync_hook() -> None:  # pragma: no cover - refused before it could run
    pass


async def hook_with_argument(reason: str) -> None:  # pragma: no cover - refused before it could run
    pass


async def async_check() -> bool:  # pragma: no cover - refused before it could run
    return True


def frame_without_argument() -> bytes:  # pragma: no cover - refused before it could run
    return b""


@pytest.fixture(autouse=True)
def no_graceful_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(PREFIX):
            monkeypatch.delenv(name)


@pytest.fixture
def a_file(tmp_path: Path) -> str:
    path = tmp_path / "not-a-dir"
    path.write_text("")
    return str(path)


def make(**options: Any) -> GracefulMiddleware:
    return GracefulMiddleware(app, registry=CollectorRegistry(), **options)


# (options passed in code, the message: the option as passed, the value as written, the fix).
# "{file}" is a regular file; "{long}" a directory name too long for a Unix socket in it.
IN_CODE: list[tuple[dict[str, Any], str]] = [
    ({"socket_mode": 0o777}, f"socket_mode: 0o777 is not an allowed socket mode; {MODES}"),
    ({"socket_mode": 0o666}, f"socket_mode: 0o666 is not an allowed socket mode; {MODES}"),
    ({"socket_mode": 600}, "socket_mode: 600 is a decimal number, not a file mode; write it in octal: 0o600"),
    ({"socket_mode": "0660"}, f"socket_mode: '0660' is not an allowed socket mode; {MODES}"),
    ({"socket_mode": True}, f"socket_mode: True is not an allowed socket mode; {MODES}"),
    (
        {"socket_dir": "{file}"},
        "socket_dir: '{file}' is a file, not a directory; choose a directory (it is made at startup if it does "
        "not exist)",
    ),
    (
        {"socket_dir": "{file}/sub"},
        "socket_dir: '{file}/sub' cannot be made: {file} is not a directory; choose a directory whose parent is one",
    ),
    ({"socket_dir": "{long}"}, "socket_dir: '{long}' is too long: a socket in it would be"),
    ({"socket_dir": 5}, "socket_dir: 5 is not a directory; use a path such as /tmp/graceful"),
    ({"socket_dir": ""}, "socket_dir: '' is not a directory; use a path such as /tmp/graceful"),
    ({"ready_path": "ready"}, f"ready_path: 'ready' {PATH}"),
    ({"live_path": None}, f"live_path: None {PATH}"),
    ({"startup_path": b"/startup"}, f"startup_path: b'/startup' {PATH}"),
    ({"metrics_path": "metrics"}, f"metrics_path: 'metrics' {PATH}"),
    (
        {"exempt_paths": "/metrics"},
        "exempt_paths: '/metrics' is not a list of paths; use e.g. ('/metrics', '/version')",
    ),
    ({"exempt_paths": 5}, "exempt_paths: 5 is not a list of paths; use e.g. ('/metrics', '/version')"),
    ({"exempt_paths": ["/ok", "metrics"]}, f"exempt_paths: ['/ok', 'metrics'] holds 'metrics', which {PATH}"),
    (
        {"ready_path": "/health", "live_path": "/health"},
        "ready_path and live_path are both '/health'; give each its own path",
    ),
    ({"metrics_path": "/ready"}, "metrics_path and ready_path are both '/ready'; give each its own path"),
    ({"retry_after": -1}, "retry_after: -1 is not a whole number of seconds; use e.g. 1"),
    ({"retry_after": "5"}, "retry_after: '5' is not a whole number of seconds; use e.g. 1"),
    ({"retry_after": 1.5}, "retry_after: 1.5 is not a whole number of seconds; use e.g. 1"),
    ({"max_in_flight": 0}, "max_in_flight: 0 is not a whole number of at least 1; use e.g. 64, or None"),
    ({"max_in_flight": "64"}, "max_in_flight: '64' is not a whole number of at least 1; use e.g. 64, or None"),
    ({"reject_over": True}, "reject_over: True is not a whole number of at least 1; use e.g. 64, or None"),
    ({"reject_over": 2.5}, "reject_over: 2.5 is not a whole number of at least 1; use e.g. 64, or None"),
    ({"live_check": "yes"}, f"live_check: 'yes' is not callable; {LIVE}"),
    ({"live_check": async_check}, f"is an async function: graceful calls it without awaiting; {LIVE}"),
    ({"final_frame": None}, f"final_frame: None is not callable; {FRAME}"),
    ({"final_frame": frame_without_argument}, f"cannot be called with one argument; {FRAME}"),
    (
        {"request_id_header": "x request id"},
        "request_id_header: 'x request id' is not a header name; use e.g. x-request-id",
    ),
    ({"request_id_header": 5}, "request_id_header: 5 is not a header name; use e.g. x-request-id"),
    ({"admin": "yes"}, "admin: expected True or False, got 'yes'"),
    ({"announce_drain": 1}, "announce_drain: expected True or False, got 1"),
    ({"on_drained": sync_hook}, f"is not an async function: graceful awaits what it returns; {HOOK}"),
    ({"on_drain_start": "hooks:start"}, f"on_drain_start: 'hooks:start' is not callable; {HOOK}"),
    ({"on_drained": hook_with_argument}, f"cannot be called with no arguments; {HOOK}"),
    ({"hook_timeout": "soon"}, f"hook_timeout: 'soon' is not a duration; {HELP}"),
    ({"unwind_timeout": -1}, "unwind_timeout: -1 is negative; use 0 or more, e.g. 10s"),
    ({"grace_period": -1}, "grace_period: -1 is negative; use 0 or more, e.g. 10s"),
    ({"grace_period": "-1"}, "grace_period: '-1' is negative; use 0 or more, e.g. 10s"),
    ({"grace_period": "-1s"}, "grace_period: '-1s' is negative; use 0 or more, e.g. 10s"),
    ({"grace_period": "-1m30s"}, "grace_period: '-1m30s' is negative; use 0 or more, e.g. 10s"),
    ({"grace_period": "--1s"}, f"grace_period: '--1s' is not a duration; {HELP}"),
    ({"grace_period": [30]}, f"grace_period: expected a duration, got [30]; {HELP}"),
    (
        {"grace_period": 0},
        "grace_period: 0 leaves no time to drain; set it to the pod's terminationGracePeriodSeconds (e.g. 30)",
    ),
    (
        {"reserve": 40},
        "reserve: 40 is not smaller than grace_period 30s; lower the reserve or raise the grace period",
    ),
    (
        {"propagation_wait": "60s"},
        "propagation_wait 60s is longer than the whole drain: grace_period 30s leaves the drain 20s after the "
        "reserve 10s; shorten propagation_wait or raise grace_period, the pod's terminationGracePeriodSeconds",
    ),
    ({"propagation_quiet": 0}, "propagation_quiet: 0 must be above 0;"),
    ({"drain_timeout": "soon"}, f"drain_timeout: 'soon' is not a duration; {HELP}"),
]


def shown(options: dict[str, Any]) -> str:
    """A test id that is the same in every process (pytest-xdist's workers must collect the same ids): a
    function by its name, not its address."""
    return repr({name: getattr(value, "__name__", value) for name, value in options.items()})


@pytest.mark.parametrize(("options", "message"), IN_CODE, ids=[shown(options) for options, _ in IN_CODE])
def test_a_bad_option_is_refused_when_built(options: dict[str, Any], message: str, a_file: str) -> None:
    long = "/tmp/" + "d" * MAX_PATH
    options = {
        name: value.format(file=a_file, long=long) if isinstance(value, str) else value
        for name, value in options.items()
    }
    message = message.format(file=a_file, long=long)
    with pytest.raises(ConfigError) as refused:
        make(**options)
    text = str(refused.value)
    assert message in text
    assert text.startswith(next(iter(options))) or "are both" in text, text  # the option as passed comes first
    assert "\n" not in text and not text.startswith("graceful:")  # the CLI and the lifespan add the prefix


# (variables set, the message: the variable as set, the value and the fix).
FROM_VARIABLES: list[tuple[dict[str, str], str]] = [
    (
        {"GRACEFUL_GRACE_PERIOD": "abc"},
        f"environment variable GRACEFUL_GRACE_PERIOD: 'abc' is not a duration; {HELP}",
    ),
    ({"GRACEFUL_GRACE_PERIOD": "-1"}, "environment variable GRACEFUL_GRACE_PERIOD: '-1' is negative; use 0 or more"),
    ({"GRACEFUL_GRACE_PERIOD": "-1s"}, "environment variable GRACEFUL_GRACE_PERIOD: '-1s' is negative; use 0 or more"),
    (
        {"GRACEFUL_GRACE_PERIOD": "0"},
        "environment variable GRACEFUL_GRACE_PERIOD: '0' leaves no time to drain; set it to the pod's "
        "terminationGracePeriodSeconds (e.g. 30)",
    ),
    (
        {"GRACEFUL_RESERVE": "40"},
        "environment variable GRACEFUL_RESERVE: '40' is not smaller than grace_period 30s; lower the reserve or "
        "raise the grace period",
    ),
    (
        {"GRACEFUL_RESERVE": "40", "GRACEFUL_GRACE_PERIOD": "30s"},
        "environment variable GRACEFUL_RESERVE: '40' is not smaller than grace_period (GRACEFUL_GRACE_PERIOD) 30s",
    ),
    (
        {"GRACEFUL_PROPAGATION_WAIT": "60s"},
        "propagation_wait (GRACEFUL_PROPAGATION_WAIT) 60s is longer than the whole drain: grace_period 30s leaves "
        "the drain 20s after the reserve 10s",
    ),
    (
        {"GRACEFUL_PROPAGATION_WAIT": "20s", "GRACEFUL_DRAIN_TIMEOUT": "10s"},
        "propagation_wait (GRACEFUL_PROPAGATION_WAIT) 20s is longer than the whole drain: drain_timeout "
        "(GRACEFUL_DRAIN_TIMEOUT) is 10s",
    ),
    (
        {"GRACEFUL_PROPAGATION_QUIET": "0"},
        "environment variable GRACEFUL_PROPAGATION_QUIET: '0' must be above 0",
    ),
    (
        {"GRACEFUL_PROPAGATION_QUIET": "5s", "GRACEFUL_PROPAGATION_WAIT": "2s"},
        "propagation_quiet (GRACEFUL_PROPAGATION_QUIET) 5s is longer than propagation_wait (GRACEFUL_PROPAGATION_WAIT) "
        "2s",
    ),
    ({"GRACEFUL_DRAIN_TIMEOUT": "soon"}, "environment variable GRACEFUL_DRAIN_TIMEOUT: 'soon' is not a duration"),
    ({"GRACEFUL_HOOK_TIMEOUT": "-1s"}, "environment variable GRACEFUL_HOOK_TIMEOUT: '-1s' is negative"),
    (
        {"GRACEFUL_ADMIT_DURING_PROPAGATION": "maybe"},
        "environment variable GRACEFUL_ADMIT_DURING_PROPAGATION: 'maybe' is not a boolean; use 1 or 0",
    ),
    (
        {"GRACEFUL_ON_DRAINED": "tests.asgi.test_bad_options:sync_hook"},
        "environment variable GRACEFUL_ON_DRAINED: 'tests.asgi.test_bad_options:sync_hook' is not an async "
        f"function: graceful awaits what it returns; {HOOK}",
    ),
    (
        {"GRACEFUL_ON_DRAIN_START": "nohook"},
        "environment variable GRACEFUL_ON_DRAIN_START: 'nohook' must be in format <module>:<attribute>",
    ),
    (
        {"GRACEFUL_LIVE_CHECK": "tests.asgi.test_bad_options:async_check"},
        "environment variable GRACEFUL_LIVE_CHECK: 'tests.asgi.test_bad_options:async_check' is an async "
        f"function: graceful calls it without awaiting; {LIVE}",
    ),
    (
        {"GRACEFUL_FINAL_FRAME": "tests.asgi.test_bad_options:frame_without_argument"},
        "environment variable GRACEFUL_FINAL_FRAME: 'tests.asgi.test_bad_options:frame_without_argument' cannot "
        f"be called with one argument; {FRAME}",
    ),
    ({"GRACEFUL_READY_PATH": "ready"}, f"environment variable GRACEFUL_READY_PATH: 'ready' {PATH}"),
    ({"GRACEFUL_EXEMPT_PATHS": "/ok,metrics"}, f"environment variable GRACEFUL_EXEMPT_PATHS: 'metrics' {PATH}"),
    ({"GRACEFUL_READY_PATH": "/live"}, "GRACEFUL_READY_PATH and live_path are both '/live'; give each its own path"),
    (
        {"GRACEFUL_RETRY_AFTER": "-1"},
        "environment variable GRACEFUL_RETRY_AFTER: '-1' is not a whole number of seconds; use e.g. 1",
    ),
    (
        {"GRACEFUL_MAX_IN_FLIGHT": "0"},
        "environment variable GRACEFUL_MAX_IN_FLIGHT: '0' is not a whole number of at least 1; use e.g. 64, or none",
    ),
    (
        {"GRACEFUL_REQUEST_ID_HEADER": "x id"},
        "environment variable GRACEFUL_REQUEST_ID_HEADER: 'x id' is not a header name; use e.g. x-request-id",
    ),
    (
        {"GRACEFUL_SOCKET_MODE": "777"},
        "environment variable GRACEFUL_SOCKET_MODE: '777' is not an allowed socket mode; use 0600 (owner only, the "
        "default) or 0660 (group)",
    ),
    (
        {"GRACEFUL_SOCKET_DIR": "{file}"},
        "environment variable GRACEFUL_SOCKET_DIR: '{file}' is a file, not a directory",
    ),
]


@pytest.mark.parametrize(("variables", "message"), FROM_VARIABLES, ids=[repr(v) for v, _ in FROM_VARIABLES])
def test_a_bad_variable_is_named_when_built(
    variables: dict[str, str], message: str, a_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value.format(file=a_file))
    with pytest.raises(ConfigError) as refused:
        make()
    text = str(refused.value)
    assert message.format(file=a_file) in text
    assert "GRACEFUL_" in text.split(";")[0]  # the variable, before the fix
    assert "\n" not in text and not text.startswith("graceful:")


def test_a_missing_socket_dir_is_made_at_startup(socket_dir: str) -> None:
    """Only what is known to be wrong is refused: a directory that does not exist yet is made later."""
    assert make(socket_dir=os.path.join(socket_dir, "later", "here")).options.socket_dir.endswith("/later/here")
    assert make(socket_dir=Path(socket_dir)).options.socket_dir == socket_dir  # a path object, as text


def test_a_bad_app_or_drain_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="app must be an ASGI application"):
        GracefulMiddleware(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="drain must be a Drain"):
        GracefulMiddleware(app, "drain")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="propagation_delay"):
        make(propagation_delay=3)
    with pytest.raises(TypeError, match="cannot reconfigure an existing Drain"):
        make(drain=Drain(), grace_period=10)


def test_under_a_server_the_error_takes_the_type_it_reports_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn prints an ImportFromStringError as one line and exits 3; the error stays a ConfigError."""
    from uvicorn.importer import ImportFromStringError

    monkeypatch.setenv("GRACEFUL_GRACE_PERIOD", "abc")
    with pytest.raises(ImportFromStringError) as refused:
        make()
    assert isinstance(refused.value, ConfigError) and isinstance(refused.value, ValueError)
    assert str(refused.value).startswith("environment variable GRACEFUL_GRACE_PERIOD: 'abc' is not a duration")
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
    # Its traceback ends in the constructor, at the line that built the app, not in graceful's parsers.
    assert refused.traceback[-1].name == "__init__" and refused.traceback[-2].name == "make"
    assert type(pickle.loads(pickle.dumps(refused.value))) is ConfigError
    # Drain(...), which FastAPI apps build at import (docs/middleware.md), reads the variables too.
    with pytest.raises(ImportFromStringError, match="GRACEFUL_GRACE_PERIOD: 'abc'"):
        Drain()


def test_without_such_a_server_it_is_the_plain_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("uvicorn.importer", "gunicorn.errors"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    error = ConfigError("x: 'y' is wrong; use z")
    assert reported(error) is error


@pytest.mark.parametrize("server", ["uvicorn", "gunicorn"])
def test_a_bad_variable_under_a_server_is_one_line_without_a_traceback(server: str, tmp_path: Path) -> None:
    """1. a module wraps its app in GracefulMiddleware  2. the server imports it with
    GRACEFUL_GRACE_PERIOD=abc  3. it stops with its own code, and the operator reads one line that
    names the variable, the value and the fix, with no traceback."""
    (tmp_path / "wrapped.py").write_text(
        "from graceful import GracefulMiddleware\n\n"
        "async def inner(scope, receive, send):\n    pass\n\n"
        "app = GracefulMiddleware(inner)\n"
    )
    if server == "uvicorn":
        command = [sys.executable, "-m", "uvicorn", "wrapped:app", "--port", "0"]
        code, line = 3, "ERROR:    Error loading ASGI app. environment variable GRACEFUL_GRACE_PERIOD: 'abc'"
    else:
        pytest.importorskip("uvicorn_worker")
        from gunicorn.config import KNOWN_SETTINGS

        worker = ["-k", "uvicorn_worker.UvicornWorker", "--bind", "127.0.0.1:0"]
        # gunicorn 27 opens a control socket under ~/.gunicorn unless told not to.
        quiet = ["--no-control-socket"] if any(s.name == "control_socket" for s in KNOWN_SETTINGS) else []
        command = [sys.executable, "-m", "gunicorn", *worker, *quiet, "wrapped:app"]
        code, line = 4, "environment variable GRACEFUL_GRACE_PERIOD: 'abc'"  # gunicorn's "App failed to load"
    env = {name: value for name, value in os.environ.items() if not name.startswith(PREFIX)}
    env.update(GRACEFUL_GRACE_PERIOD="abc", PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)]))
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [text for text in done.stderr.splitlines() if "GRACEFUL_GRACE_PERIOD" in text]
    assert len(lines) == 1 and lines[0].startswith(line) and lines[0].endswith(HELP), done.stderr


async def lifespan_app(scope: Any, receive: Any, send: Any) -> None:
    assert scope["type"] == "lifespan"
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        else:
            await send({"type": "lifespan.shutdown.complete"})
            return


@pytest.mark.anyio
async def test_a_startup_failure_names_its_cause_in_one_line(socket_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """1. the admin socket cannot be created at startup (the kernel refuses it)  2. the server is told
    why in one line, with the fix: not "unhandled errors in a TaskGroup (1 sub-exception)"."""

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(anyio, "create_unix_listener", refused)
    mw = GracefulMiddleware(lifespan_app, socket_dir=socket_dir, registry=CollectorRegistry())
    incoming = [{"type": "lifespan.startup"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "lifespan.shutdown"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with anyio.fail_after(5):
        await mw({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
    failed = [message["message"] for message in sent if message["type"] == "lifespan.startup.failed"]
    assert failed == [  # the directory named as the code gave it (issue 51)
        f"graceful: socket_dir: cannot create the admin socket in {socket_dir!r} (Permission denied); choose a "
        "directory of this user's, or turn the admin socket off (admin=False, GRACEFUL_ADMIN=0) and drain through "
        "SIGTERM"
    ]
