"""``graceful advise --from FILE`` reads a worker's saved status (docs/budget.md, "Exit codes"): a status
with no finished request is no evidence (exit 0), and one whose request durations are malformed is an
unreadable file (exit 2, one line naming the worker and what is wrong). The statuses are a real
``Drain``'s, as ``graceful status --json`` writes them, edited where a test needs them broken."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from graceful import Drain
from graceful.cli import cli


def saved(tmp_path: Path, edit: Any = None) -> Path:
    status = Drain(grace_period=30, reserve=5).status().as_dict()
    if edit is not None:
        edit(status["durations"])
    path = tmp_path / "status.json"
    path.write_text(json.dumps([status]))
    return path


def test_a_status_with_no_finished_request_is_no_evidence(tmp_path: Path) -> None:
    path = saved(tmp_path)
    result = CliRunner().invoke(cli, ["advise", "--from", str(path), "--json"])
    assert result.exit_code == 0, result.output
    advice = json.loads(result.stdout)
    assert advice["verdict"] == "no evidence" and advice["requests"] == 0
    assert advice["percentiles"] == {}
    said = CliRunner().invoke(cli, ["advise", "--from", str(path)])
    assert said.exit_code == 0
    assert "no finished request seen yet" in said.output


def _kind_not_an_object(durations: dict[str, Any]) -> None:
    durations["stream"] = [1, 2]


def _counts_not_integers(durations: dict[str, Any]) -> None:
    durations["plain"]["counts"] = ["1"] * len(durations["plain"]["counts"])


def _sum_not_a_number(durations: dict[str, Any]) -> None:
    durations["plain"]["sum"] = "1.5"


@pytest.mark.parametrize(
    ("edit", "wrong"),
    [
        (_kind_not_an_object, "a kind's durations must be an object with counts and sum"),
        (_counts_not_integers, "counts must be a list of integers"),
        (_sum_not_a_number, "sum must be a number"),
    ],
    ids=["kind", "counts", "sum"],
)
def test_malformed_durations_are_an_unreadable_file_in_one_line(edit: Any, wrong: str, tmp_path: Path) -> None:
    path = saved(tmp_path, edit)
    result = CliRunner().invoke(cli, ["advise", "--from", str(path)])
    assert result.exit_code == 2
    (line,) = result.output.splitlines()
    assert line.startswith(f"graceful advise: --from {path}: worker ")
    assert line.endswith(f": unreadable durations ({wrong})")
