"""``graceful advise`` takes its evidence from one source, counts input given twice once, and its
verdict follows the limits the user set (issue 46). Statuses come from a real server in this process."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result

from graceful.cli import cli
from tests.servers import Served


def advise(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["advise", *args], env=env)


@pytest.fixture
def saved(served: Served, tmp_path: Path) -> Path:
    """A status file written by graceful status --json, after 3 plain requests and a 0.6 s stream."""
    with httpx.Client(timeout=10) as client:
        for _ in range(3):
            assert client.get(f"http://127.0.0.1:{served.port}/hello").status_code == 200
        assert client.get(f"http://127.0.0.1:{served.port}/stream", params={"frames": 6, "interval": 0.1}).is_success
    status = CliRunner().invoke(cli, ["status", "--socket-dir", served.socket_dir, "--json"])
    assert status.exit_code == 0, status.output
    path = tmp_path / "status.json"
    path.write_text(status.stdout)
    return path


@pytest.mark.parametrize(
    "sources",
    [
        (("--engine", "vllm"), ("--from", "status.json")),
        (("--socket-dir", "/run/graceful"), ("--from", "status.json")),
        (("--socket", "/run/graceful/7.sock"), ("--engine", "vllm")),
        (("--socket-dir", "/run/graceful"), ("--metrics-url", "http://127.0.0.1:8000/metrics")),
        (("--from", "status.json"), ("--histogram", "vllm:e2e_request_latency_seconds")),
    ],
)
def test_two_sources_of_evidence_are_refused_naming_both(sources: tuple[tuple[str, str], ...]) -> None:
    """Each pair is refused before anything is read or asked: exit 2, one line, both as typed."""
    result = advise(*(word for source in sources for word in source))
    assert result.exit_code == 2, result.output
    [line] = result.output.splitlines()
    assert line.startswith("graceful advise: use ") and line.endswith("not both: each is a source of evidence")
    for flag, value in sources:
        assert f"{flag} {value}" in line


def test_three_sources_are_refused_naming_each() -> None:
    result = advise("--socket-dir", "/run/g", "--from", "s.json", "--engine", "tgi")
    assert result.exit_code == 2
    assert result.output == (
        "graceful advise: use --socket-dir /run/g, --from s.json or --engine tgi, not more than one: "
        "each is a source of evidence\n"
    )


def test_the_socket_dir_variable_is_where_servers_are_not_a_second_source(saved: Path, served: Served) -> None:
    """GRACEFUL_SOCKET_DIR set in the pod and --from given: the file is the evidence, nothing is refused."""
    result = advise("--from", str(saved), "--json", env={"GRACEFUL_SOCKET_DIR": served.socket_dir})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["source"] == "1 worker"


def test_a_file_or_a_worker_given_twice_counts_once(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. the same file by three paths (relative, absolute, a symlink) 2. a copy of it, which is the same
    worker's status again 3. one worker, its requests counted once."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link.json").symlink_to(saved)
    (tmp_path / "copy.json").write_text(saved.read_text())
    once = json.loads(advise("--from", str(saved), "--json").stdout)
    result = advise(
        "--from", "status.json", "--from", str(saved), "--from", "link.json", "--from", "copy.json", "--json"
    )
    assert result.exit_code == 0, result.output
    advice = json.loads(result.stdout)
    assert advice["source"] == "1 worker" and advice["requests"] == once["requests"] == 4


def test_of_two_statuses_of_one_worker_the_later_counts(saved: Path, served: Served, tmp_path: Path) -> None:
    """A worker saved before and after more traffic: its counts grow, so only the later status counts."""
    assert httpx.get(f"http://127.0.0.1:{served.port}/hello", timeout=10).status_code == 200
    later = tmp_path / "later.json"
    later.write_text(CliRunner().invoke(cli, ["status", "--socket-dir", served.socket_dir, "--json"]).stdout)
    for order in ((saved, later), (later, saved)):
        advice = json.loads(advise(*(w for path in order for w in ("--from", str(path))), "--json").stdout)
        assert advice["source"] == "1 worker" and advice["requests"] == 5


@pytest.mark.parametrize("content", ['{"foo": 1}', '[{"state": "SERVING"}]', "[1, 2]", '"status"'])
def test_a_file_that_is_not_a_worker_status_says_so(content: str, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.json"
    wrong.write_text(content)
    result = advise("--from", str(wrong))
    assert result.exit_code == 2
    assert result.output == (
        f"graceful advise: --from {wrong}: not a worker status written by graceful status --json; "
        f"save one with graceful status --json > {wrong}\n"
    )


def test_a_status_without_durations_is_an_older_graceful(tmp_path: Path) -> None:
    """A worker status (pid, state) from a graceful that counted no durations: upgrade it."""
    old = tmp_path / "old.json"
    old.write_text(json.dumps([{"pid": 7, "state": "SERVING", "in_flight": 0, "since": 1.0}]))
    result = advise("--from", str(old))
    assert result.exit_code == 2
    assert (
        result.output == f"graceful advise: --from {old}: worker 7 reports no request durations: upgrade its graceful\n"
    )


def test_the_verdict_follows_the_longest_grace_period_allowed(saved: Path) -> None:
    """The budget in force (grace period 6 s, reserve 1 s) covers the 0.6 s stream. A platform that
    allows one second less than the grace period the traffic needs: the verdict is "over the limit",
    exit 1, naming --max-grace-period as typed; one that allows exactly that: it holds, exit 0."""
    needed = json.loads(advise("--from", str(saved), "--json").stdout)["recommended"]["grace_period"]
    assert needed is not None and needed > 1
    short = f"{needed - 1:g}"
    over = advise("--from", str(saved), "--max-grace-period", short)
    assert over.exit_code == 1, over.output
    assert over.output.splitlines()[-1] == (
        f"verdict: over the limit: the traffic seen needs a grace period of {needed:g} s, "
        f"more than --max-grace-period {short} allows (at risk 0.00%; allowed none)"
    )
    judged = json.loads(advise("--from", str(saved), "--max-grace-period", short, "--json").stdout)
    assert judged["verdict"] == "over the limit" and judged["max_grace_period"] == needed - 1
    enough = advise("--from", str(saved), "--max-grace-period", f"{needed:g}s")
    assert enough.exit_code == 0, enough.output
    assert enough.output.splitlines()[-1] == "verdict: the budget in force holds (at risk 0.00%; allowed none)"


def test_cuts_stays_cuts_under_a_limit(saved: Path) -> None:
    """A budget that cuts is judged "cuts" whatever the limit: exit 1 either way."""
    result = advise("--from", str(saved), "--grace-period", "1s", "--reserve", "0.5s", "--max-grace-period", "1")
    assert result.exit_code == 1 and "verdict: the budget in force cuts" in result.output, result.output
