"""Each benchmark script runs end to end at tiny sizes and prints its Markdown tables.

Timings are never asserted here (benchmarks are not tests); only that the scripts still
work against the current code and report every figure against its target.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
from typing import Any

import pytest

from benchmarks import _drive, drain_reaction, e2e, engine, idle_return, inprocess, peers, scale
from graceful._asgi._types import Message


def _tables(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("|")]


def test_inprocess(capsys: pytest.CaptureFixture[str]) -> None:
    inprocess.main(["--rounds", "2", "--requests", "50", "--streams", "5", "--frames", "10"])
    out = capsys.readouterr().out
    for variant in _drive.VARIANTS:
        assert f"| {variant} |" in out
    assert "added per frame / floor's" in out
    assert "<= 0.25 us" in out


def test_inprocess_cold(capsys: pytest.CaptureFixture[str]) -> None:
    """--evict times each request alone after the copy; a later run without it is warm again."""
    inprocess.main(["--rounds", "2", "--requests", "20", "--streams", "3", "--frames", "5", "--evict", "64"])
    assert "after a 64 KiB copy (--evict)" in capsys.readouterr().out
    inprocess.main(["--rounds", "2", "--requests", "20", "--streams", "3", "--frames", "5"])
    assert "--evict" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        inprocess.main(["--evict", "-1"])
    assert "--evict -1: give a size in KiB" in capsys.readouterr().err


def test_scale(capsys: pytest.CaptureFixture[str]) -> None:
    scale.main(["--streams", "50", "--repeat", "5", "--rounds", "2"])
    out = capsys.readouterr().out
    assert "(in flight seen by the Drain: 50)" in out
    assert "| memory added per in-flight request |" in out
    assert "| drained |" in out


def test_engine(capsys: pytest.CaptureFixture[str]) -> None:
    engine.main(["--engines", "1", "--rounds", "2"])
    out = capsys.readouterr().out
    assert "| whole poll, graceful |" in out
    assert "prometheus-client text parser: parse only" in out


def test_engine_parsers_agree() -> None:
    page = engine.vllm_page(3)
    # 3 engines x 3 running, 3 x 1 waiting; the *_by_reason look-alike must not count.
    expected = {"vllm:num_requests_running": 9.0, "vllm:num_requests_waiting": 3.0}
    assert engine.plain_parse(page, engine.NAMES) == expected
    assert engine.read_metrics(page, engine.NAMES) == expected


def test_drain_reaction(capsys: pytest.CaptureFixture[str]) -> None:
    drain_reaction.main(["--trials", "3", "--cli-trials", "0"])
    out = capsys.readouterr().out
    assert "| admin request sent -> /ready answers 503 | 3 |" in out
    assert "| admin request sent -> first new request rejected (503) | 3 |" in out


def test_idle_return(capsys: pytest.CaptureFixture[str]) -> None:
    idle_return.main(["--trials", "5", "--cli-trials", "0", "--run-trials", "1"])
    out = capsys.readouterr().out
    assert "| in process: last frame -> Drain.drain() returns | 5 |" in out
    assert "`graceful run` exits after SIGTERM | 1 |" in out


@pytest.mark.every_core  # scripts/test runs it with the vllm tier, not beside xdist's workers
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="e2e pins the server and wrk to 2 CPUs")
def test_e2e(capsys: pytest.CaptureFixture[str]) -> None:
    e2e.main(["--rounds", "1", "--duration", "1", "--paths", "short"])
    out = capsys.readouterr().out
    assert len(_tables(out)) == 6  # two tables: header, rule, one path
    assert out.count("| short |") == 2
    assert "no interval below 6 rounds" in out


def test_e2e_interval() -> None:
    """The sign-test interval for a median: the k-th lowest to the k-th highest, coverage >= 95%."""
    assert e2e.sign_rank(5) is None  # 1 - 2 / 2**5 = 93.75%
    assert e2e.sign_rank(6) == (1, 1 - 2 / 2**6)
    assert e2e.sign_rank(20) == (6, 1 - 2 * sum(math.comb(20, i) for i in range(6)) / 2**20)
    assert e2e.median_interval([float(i) for i in range(20, 0, -1)]) == (6.0, 15.0)


@pytest.mark.every_core
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="e2e_profile pins the server and its client to 2 CPUs")
def test_e2e_profile_without_callgrind(capsys: pytest.CaptureFixture[str]) -> None:
    """The profile and the timed collector run in seconds; the callgrind counts need valgrind and minutes."""
    from benchmarks import e2e_profile

    args = ["--no-callgrind", "--requests", "20", "--gc-requests", "40", "--variants", "bare,receive_too,wrapped"]
    e2e_profile.main([*args, "--paths", "stream"])
    out = capsys.readouterr().out
    assert "| `send (graceful/" in out  # Call.send, once per frame: only the wrapped server has it
    for variant in ("bare", "receive_too", "wrapped"):
        assert f"| {e2e_profile.VARIANTS[variant]} |" in out


def test_instructions_child_runs_every_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    """The callgrind script itself needs valgrind and minutes; its measured code runs here and
    sends every request whole: 5 requests of a start, 3 frames and the closing body."""
    from benchmarks import instructions

    for variant in [*list(_drive.VARIANTS)[:3], instructions.NO_REQUEST_ID]:
        sent: list[Any] = []

        async def record(message: Any) -> None:
            sent.append(message)

        monkeypatch.setattr(instructions, "sink", record)
        instructions.child(variant, 3, 5)
        kinds = [(m["type"], m.get("status"), m.get("more_body")) for m in sent]
        one = [("http.response.start", 200, None), *[("http.response.body", None, True)] * 3]
        assert kinds == [*one, ("http.response.body", None, False)] * 5, variant


def _peers_or_skip() -> None:
    missing = peers.missing_peers()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (pip install -e '.[peers]')")


def test_peers_time(capsys: pytest.CaptureFixture[str]) -> None:
    _peers_or_skip()
    peers.main(["--no-instructions", "--rounds", "2", "--round-ms", "1", "--frames", "5"])
    out = capsys.readouterr().out
    for variant in peers.VARIANTS:
        assert f"| {variant} |" in out
    assert "Instructions" not in out


def test_peers_do_their_job_on_the_benchmark_apps() -> None:
    """Each peer counts every benchmark request (in progress during it, done after), or echoes a fresh id.

    starlette-exporter drops requests that no route matched unless told not to; the raw apps have no router.
    """
    _peers_or_skip()
    from prometheus_client import REGISTRY

    exporter = peers.starlette_exporter(_drive.make_app(3))
    instrumentator = peers.instrumentator(_drive.make_app(3))
    correlation = peers.correlation_id(_drive.make_app(3))
    gauge = instrumentator.inprogress  # type: ignore[attr-defined]
    in_progress = {"method": "POST", "app_name": "starlette"}
    done = {**in_progress, "path": "/v1/chat/completions", "status_code": "200"}
    seen: list[tuple[float | None, float, dict[bytes, bytes]]] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            exported = REGISTRY.get_sample_value("starlette_requests_in_progress", in_progress)
            seen.append((exported, gauge.collect()[0].samples[0].value, dict(message["headers"])))

    async def drive() -> None:
        for app in (exporter, instrumentator, correlation):
            for _ in range(4):
                await app(dict(_drive.SCOPE), _drive.receive, send)

    before = REGISTRY.get_sample_value("starlette_requests_total", done) or 0.0
    asyncio.run(drive())
    assert REGISTRY.get_sample_value("starlette_requests_total", done) == before + 4
    assert [s[0] for s in seen[:4]] == [1, 1, 1, 1]
    assert REGISTRY.get_sample_value("starlette_requests_in_progress", in_progress) == 0
    labels = {"method": "POST", "status": "2xx", "handler": "none"}
    assert instrumentator.registry.get_sample_value("http_requests_total", labels) == 4  # type: ignore[attr-defined]
    assert [s[1] for s in seen[4:8]] == [1, 1, 1, 1]
    assert gauge.collect()[0].samples[0].value == 0
    ids = [s[2][b"x-request-id"] for s in seen[8:]]
    assert len(set(ids)) == 4 and all(len(i) == 32 for i in ids)  # a fresh uuid4 hex each: the scope is not shared


def test_peers_child_runs_every_variant() -> None:
    """The callgrind counts need valgrind and minutes; the code each child process runs is driven here."""
    _peers_or_skip()
    for variant in peers.VARIANTS:
        peers.child(variant, 3, 5)


def test_callgrind_differences(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per request: (N requests - none) / N. Per frame: ((N // 10 streams - none) / (N // 10) - a request) / FRAMES.

    The callgrind runs themselves need valgrind and minutes; the arithmetic over their counts runs here.
    """
    from benchmarks import _callgrind

    def fake(command: list[str], **_: object) -> int:
        frames, n = int(command[-2]), int(command[-1])
        return 1_000_000 + n * (700 + 30 * frames)

    monkeypatch.setattr(_callgrind, "collected", fake)
    got = _callgrind.per_request_and_frame("benchmarks.instructions", ["bare app"], 100, 10)
    assert got == {"bare app": {"request": 700.0, "frame": 30.0}}


def test_benchmark_modules_stay_small() -> None:
    """Issue 33: no benchmark module over 400 lines; shared machinery goes into a private module."""
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name)) as source:
                assert len(source.readlines()) <= 400, name
