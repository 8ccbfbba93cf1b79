"""``graceful drain`` read without click (the console script's fast path) means what click reads.

The preStop hook reads its common command lines itself, so that it does not pay for importing
click (graceful/_cli/_prestop.py). These tests hold that reader to the click command: the same
options, and for any command line either the same values or "let click read it".
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from typing import Any

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graceful._cli._main import DURATION, drain_command
from graceful._cli._prestop import OPTIONS, read_args

ENGINE_OPTIONS = {"engine", "metrics_url", "metrics", "interval", "idle_reads", "kv_buffer", "help"}
KEYS = (
    "socket_dir",
    "socket",
    "propagation_wait",
    "propagation_quiet",
    "timeout",
    "grace_period",
    "quiet",
    "json_output",
)


def test_the_reader_knows_exactly_the_click_commands_drain_options() -> None:
    declared: dict[str, bool | None] = {}
    for param in drain_command.params:
        if param.name in ENGINE_OPTIONS:
            continue
        assert isinstance(param, click.Option)
        kind = None if param.is_flag else param.type is DURATION
        assert kind is None or param.type is DURATION or isinstance(param.type, click.Path), param.name
        for name in (*param.opts, *param.secondary_opts):
            declared[name] = kind
    assert declared == OPTIONS


def test_the_readers_duration_flags_are_the_drain_options_the_hook_judges_or_sends() -> None:
    """Each duration flag the hook reads fills the option of its name: the budget's grace period and propagation
    options (the drain's option fields) and a drain's own timeout (``Drain.begin_drain``'s)."""
    from graceful._drain._options import DRAIN_OPTIONS
    from graceful._drain._state import Drain

    durations = {flag.removeprefix("--").replace("-", "_") for flag, kind in OPTIONS.items() if kind}
    own = set(inspect.signature(Drain.begin_drain).parameters) - {"self", "reason"}
    assert durations == own | {"grace_period"}
    assert durations - {"timeout"} <= DRAIN_OPTIONS


def clicks_reading(argv: list[str], environ: dict[str, str]) -> dict[str, Any] | None:
    """What click's drain command reads from ``argv`` (None: a usage error)."""
    old = os.environ.get("GRACEFUL_SOCKET_DIR")
    try:
        if "GRACEFUL_SOCKET_DIR" in environ:
            os.environ["GRACEFUL_SOCKET_DIR"] = environ["GRACEFUL_SOCKET_DIR"]
        else:
            os.environ.pop("GRACEFUL_SOCKET_DIR", None)
        with drain_command.make_context("drain", list(argv)) as ctx:
            return {key: ctx.params[key] for key in KEYS}
    except click.exceptions.Exit:
        return None
    except click.UsageError:
        return None
    finally:
        if old is None:
            os.environ.pop("GRACEFUL_SOCKET_DIR", None)
        else:
            os.environ["GRACEFUL_SOCKET_DIR"] = old


def plain(argv: list[str]) -> bool:
    """Whether ``argv`` is written only in the forms the fast path promises to read: the options in
    ``OPTIONS``, flags bare, values as ``--name value`` or ``--name=value``, none empty or starting with -."""
    words = iter(argv)
    for word in words:
        name, equals, value = word.partition("=")
        if name not in OPTIONS:
            return False
        if OPTIONS[name] is None:
            if equals:
                return False
            continue
        if not equals:
            value = next(words, "")
        if not value or value.startswith("-"):
            return False
    return True


def check(argv: list[str], environ: dict[str, str]) -> None:
    """Read as click reads it, or left to click: and left to click only where click refuses the line or
    the line is not in a form the fast path promises to read (so a reader that declines too much fails)."""
    ours = read_args(argv, environ)
    theirs = clicks_reading(argv, environ)
    if ours is not None:
        assert ours == theirs, (argv, environ)
    elif theirs is not None:
        assert not plain(argv), ("a plain command line click reads was left to click", argv, environ)


@pytest.mark.parametrize(
    ("argv", "environ", "read"),
    [
        (["--socket-dir", "/run/g", "--propagation-wait", "10s", "--timeout=80s", "-q"], {}, True),
        (["--grace-period", "90", "--json", "--quiet", "--propagation-quiet=2s"], {"GRACEFUL_SOCKET_DIR": "/e"}, True),
        (["--socket", "/run/g/1.sock", "--timeout", "1m30s", "--timeout", "5s"], {}, True),
        ([], {}, True),
        (["--timeout", "later"], {}, False),
        (["--timeout"], {}, False),
        (["--json=1"], {}, False),
        (["--engine", "vllm"], {}, False),
        (["--help"], {}, False),
        (["-qq"], {}, False),
        (["--socket-dir="], {}, False),
        (["extra"], {}, False),
        (["--", "--json"], {}, False),
        ([], {"GRACEFUL_SOCKET_DIR": ""}, True),
    ],
)
def test_a_command_line_is_read_as_click_reads_it_or_left_to_click(
    argv: list[str], environ: dict[str, str], read: bool
) -> None:
    assert (read_args(argv, environ) is not None) == read
    check(argv, environ)


WORDS = st.sampled_from(
    [*OPTIONS, "--engine", "--interval", "--help", "-x", "--nope", "5s", "1.5", "0", "-1s", "later", "", "/tmp/g", "="]
)


@settings(max_examples=300, deadline=None)
@given(
    words=st.lists(st.one_of(WORDS, st.builds(lambda a, b: f"{a}={b}", WORDS, WORDS)), max_size=6),
    socket_dir=st.sampled_from([None, "", "/env/dir"]),
)
def test_any_command_line_is_read_as_click_reads_it_or_left_to_click(words: list[str], socket_dir: str | None) -> None:
    check(words, {} if socket_dir is None else {"GRACEFUL_SOCKET_DIR": socket_dir})


def run_hook(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "graceful", "drain", *args], capture_output=True, text=True, timeout=30
    )


def test_a_usage_problem_found_without_click_is_told_by_click(tmp_path: Any) -> None:
    """1. a command line the fast path reads, but which makes no drain 2. nothing is contacted
    3. click reads it again: the same message and exit code as through the click CLI."""
    both = run_hook("--socket-dir", str(tmp_path), "--socket", str(tmp_path / "1.sock"))
    assert both.returncode == 2
    assert both.stderr.strip() == "graceful drain: use --socket-dir or --socket, not both"
    quiet = run_hook("--socket-dir", str(tmp_path), "--propagation-wait", "1s", "--propagation-quiet", "2s")
    assert quiet.returncode == 2 and "--propagation-quiet 2s" in quiet.stderr and "Traceback" not in quiet.stderr
