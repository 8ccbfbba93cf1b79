"""Every option from the environment (graceful/_drain/_environ.py): one table, one prefix, named errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from graceful import ConfigError, Drain, GracefulMiddleware
from graceful._asgi._options import DECLARED, MIDDLEWARE_DECLARED, environment_rows
from graceful._drain._environ import variable
from graceful._drain._options import DRAIN_OPTIONS
from tests.utils import ROOT

# Options that are Python objects made in code: no variable can name them.
NOT_FROM_ENVIRON = {"registry", "drain"}


async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover - never called
    pass


def hook() -> None:  # pragma: no cover - imported by name, never run here
    pass


async def async_hook() -> None:  # pragma: no cover - imported by name, never run here
    pass


def frame(content_type: bytes) -> bytes | None:  # pragma: no cover - imported by name, never run here
    return None


def make(**options: Any) -> GracefulMiddleware:
    return GracefulMiddleware(app, registry=CollectorRegistry(), **options)


def test_every_option_has_a_variable() -> None:
    middleware = set(GracefulMiddleware.__init__.__kwdefaults__ or {}) - NOT_FROM_ENVIRON - DRAIN_OPTIONS
    assert set(DECLARED) == DRAIN_OPTIONS | middleware
    assert set(MIDDLEWARE_DECLARED) == middleware


def test_the_documented_table_lists_every_variable() -> None:
    page = (Path(ROOT) / "docs" / "middleware.md").read_text()
    section = page.split("## From the environment", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(GRACEFUL_\w+)` \|", section, re.MULTILINE))
    assert documented == {variable(option) for option in DECLARED}


def test_the_documented_table_is_the_one_the_declarations_write() -> None:
    """One declaration per option (default, variable, value): the page's table is generated from it."""
    page = (Path(ROOT) / "docs" / "middleware.md").read_text()
    section = page.split("## From the environment", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `GRACEFUL_")]
    assert rows == environment_rows()


def test_variables_fill_what_the_code_leaves_at_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "GRACEFUL_GRACE_PERIOD": "120",
        "GRACEFUL_RESERVE": "20s",
        "GRACEFUL_DRAIN_TIMEOUT": "90s",
        "GRACEFUL_PROPAGATION_WAIT": "10s",
        "GRACEFUL_PROPAGATION_QUIET": "2s",
        "GRACEFUL_ADMIT_DURING_PROPAGATION": "0",
        "GRACEFUL_HANDOFF_STREAMS": "yes",
        "GRACEFUL_ADMISSION": "fits",
        "GRACEFUL_ON_DRAIN_START": "tests.drain.test_environ:async_hook",
        "GRACEFUL_ON_DRAINED": "tests.drain.test_environ:async_hook",
        "GRACEFUL_HOOK_TIMEOUT": "3s",
        "GRACEFUL_UNWIND_TIMEOUT": "500ms",
        "GRACEFUL_DRAIN_ON_SIGTERM": "off",
        "GRACEFUL_READY_PATH": "/health/ready",
        "GRACEFUL_LIVE_PATH": "/health/live",
        "GRACEFUL_STARTUP_PATH": "/health/startup",
        "GRACEFUL_EXEMPT_PATHS": "/version, /v1/models",
        "GRACEFUL_METRICS_PATH": "/graceful-metrics",
        "GRACEFUL_RETRY_AFTER": "3",
        "GRACEFUL_MAX_IN_FLIGHT": "64",
        "GRACEFUL_REJECT_OVER": "128",
        "GRACEFUL_LIVE_CHECK": "tests.drain.test_environ:hook",
        "GRACEFUL_FAIL_LIVENESS": "yes",
        "GRACEFUL_READY_ON_STARTUP": "false",
        "GRACEFUL_REQUEST_ID_HEADER": "X-Request-Id",
        "GRACEFUL_ADMIN": "0",
        "GRACEFUL_SOCKET_DIR": "/tmp/g-env",
        "GRACEFUL_SOCKET_MODE": "0660",
        "GRACEFUL_FINAL_FRAME": "tests.drain.test_environ:frame",
        "GRACEFUL_ANNOUNCE_DRAIN": "no",
    }
    assert set(env) == {variable(option) for option in DECLARED}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    mw = make()
    config = mw.drain.config
    assert (config.budget.grace_period, config.budget.reserve, config.budget.drain_timeout) == (120.0, 20.0, 90.0)
    assert (config.budget.propagation_wait, config.budget.propagation_quiet) == (10.0, 2.0)
    assert (config.admit_during_propagation, config.handoff_streams, config.drain_on_sigterm) == (False, True, False)
    assert config.admission == "fits"
    assert config.on_drain_start is async_hook and config.on_drained is async_hook
    assert (config.hook_timeout, config.unwind_timeout) == (3.0, 0.5)
    assert list(mw._special) == [
        "/version",
        "/v1/models",
        "/graceful-metrics",
        "/health/ready",
        "/health/live",
        "/health/startup",
    ]
    assert (mw.max_in_flight, mw.reject_over, mw.options.live_check, mw.options.fail_liveness) == (64, 128, hook, True)
    settings = mw.shared
    assert (settings.retry_after, settings.request_id_header, mw.options.ready_on_startup) == (
        b"3",
        b"x-request-id",
        False,
    )
    assert (mw.options.admin, mw.options.socket_dir, mw.options.socket_mode, settings.final_frame) == (
        False,
        "/tmp/g-env",
        0o660,
        frame,
    )
    assert mw.options.announce_drain is False
    # A value given in code wins over the variable.
    mine = make(ready_path="/r", max_in_flight=2, propagation_wait="5s", admin=True)
    assert "/r" in mine._special and "/health/ready" not in mine._special
    assert (mine.max_in_flight, mine.drain.config.budget.propagation_wait, mine.options.admin) == (2, 5.0, True)
    assert Drain(grace_period=60).config.budget.grace_period == 60.0


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "GRACEFUL_PROPAGATION_WAIT",
            "soon",
            "environment variable GRACEFUL_PROPAGATION_WAIT: 'soon' is not a duration",
        ),
        ("GRACEFUL_ADMIN", "maybe", "environment variable GRACEFUL_ADMIN: 'maybe' is not a boolean; use 1 or 0"),
        (
            "GRACEFUL_MAX_IN_FLIGHT",
            "0",
            "environment variable GRACEFUL_MAX_IN_FLIGHT: '0' is not a whole number of at least 1",
        ),
        ("GRACEFUL_READY_PATH", "ready", "environment variable GRACEFUL_READY_PATH: 'ready' is not a path"),
        (
            "GRACEFUL_SOCKET_MODE",
            "777",
            "environment variable GRACEFUL_SOCKET_MODE: '777' is not an allowed socket mode",
        ),
        (
            "GRACEFUL_ON_DRAINED",
            "nohook",
            "environment variable GRACEFUL_ON_DRAINED: 'nohook' must be in format <module>:<attribute>",
        ),
        (
            "GRACEFUL_LIVE_CHECK",
            "tests.drain.test_environ:absent",
            "environment variable GRACEFUL_LIVE_CHECK: cannot import",
        ),
        (
            "GRACEFUL_RETRY_AFTER",
            "-1",
            "environment variable GRACEFUL_RETRY_AFTER: '-1' is not a whole number of seconds",
        ),
    ],
)
def test_a_wrong_value_names_its_variable(name: str, value: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as refused:
        make()
    assert str(refused.value).startswith(message)


def test_empty_variables_are_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRACEFUL_READY_PATH", "  ")
    monkeypatch.setenv("GRACEFUL_DRAIN_TIMEOUT", "")
    mw = make()
    assert "/ready" in mw._special and mw.drain.config.budget.drain_timeout is None
