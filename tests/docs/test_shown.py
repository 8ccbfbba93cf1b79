"""tests/docs/shown.py, able to fail: what a shown output matches and what it does not."""

from __future__ import annotations

import pytest

from tests.docs.shown import console, unmatched

PRINTED = """INFO:     Started server process [6938]
INFO:     budget: drain limit 20s
worker 6938: drained in 8.0 s

drained 1 of 1 worker in 8.0 s
"""


def test_numbers_vary_text_does_not() -> None:
    assert unmatched("worker 1234: drained in 5.4 s", PRINTED) == []
    assert unmatched("worker 1234: timed out in 5.4 s", PRINTED) == ["worker 1234: timed out in 5.4 s"]
    assert unmatched("worker 1234: drained in 5.4 s", PRINTED, varies=None) == ["worker 1234: drained in 5.4 s"]


def test_consecutive_lines_stay_consecutive_unless_cut() -> None:
    assert unmatched("INFO:     budget: drain limit 20s\nworker 1: drained in 1.0 s", PRINTED) == []
    together = "INFO:     Started server process [1]\nworker 1: drained in 1.0 s"
    assert unmatched(together, PRINTED) == together.splitlines()
    assert unmatched(together.replace("\n", "\n...\n"), PRINTED) == []
    assert unmatched("drained 1 of 1 worker in 1 s\n...\nINFO:     budget: ...", PRINTED) == [
        "INFO:     budget: ..."
    ], "a later line may not come first"


def test_dots_inside_a_line_stand_for_any_text() -> None:
    assert unmatched("INFO:     budget: ...", PRINTED) == []
    assert unmatched("INFO:     budget: ...covered", PRINTED) == ["INFO:     budget: ...covered"]


def test_a_console_block_splits_into_commands_and_their_output() -> None:
    assert console("$ curl -N \\\n  localhost:8000\ndata: 1\n\n$ graceful drain\ndrained\n") == [
        ("curl -N \\\n  localhost:8000", "data: 1\n"),
        ("graceful drain", "drained"),
    ]
    with pytest.raises(ValueError, match="starts with output"):
        console("output first\n$ cmd\n")
