"""Engine drain: parsing real exposition pages, and polling a real HTTP server that follows a script."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import http.server
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from graceful import ConfigError
from graceful._cli._engine_drain import run_engine_drain
from graceful._engine._page import PageError
from graceful._engine._wait import REFUSED_READS
from graceful.engine import PRESETS, EngineConfig, EngineProgress, effective_wait, read_metrics, wait_idle
from tests.utils import refusing_port, run_uvicorn

pytestmark = pytest.mark.anyio

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
ENGINES = Path(__file__).parent / "fixtures" / "engines"
VLLM = PRESETS["vllm"].metrics
# Tests that count reads exactly poll slower, so a loaded machine cannot turn a read into a read timeout.
EXACT = 0.1


def fixture(name: str) -> str:
    return (FIXTURES / f"{name}.txt").read_text()


def vllm_page(running: tuple[str, str], waiting: tuple[str, str]) -> str:
    """The busy vLLM fixture with its two engines' running and waiting series set to these literals."""
    page = fixture("vllm_busy")
    for metric, (first, second) in (("running", running), ("waiting", waiting)):
        series = re.findall(rf"^vllm:num_requests_{metric}{{.*}} .*$", page, flags=re.M)
        assert len(series) == 2
        for line, value in zip(series, (first, second)):
            page = page.replace(line, line.rsplit(" ", 1)[0] + " " + value)
    return page


BUSY = vllm_page(("1.0", "0.0"), ("0.0", "0e+00"))
IDLE = vllm_page(("0.0", "-0"), ("0", "0e+00"))


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("name", "engine", "expected"),
    [
        ("vllm_busy", "vllm", (5.0, 1.0)),
        ("vllm_idle", "vllm", (0.0, 0.0)),
        ("sglang_busy", "sglang", (14.0, 2.0)),
        ("sglang_idle", "sglang", (0.0, 0.0)),
        ("tgi", "tgi", (3.0, 2.0)),
        ("triton", "triton", (3.0,)),
    ],
)
def test_presets_sum_every_series(name: str, engine: str, expected: tuple[float, ...]) -> None:
    """The required metrics of each preset (the optional ones are absent from these older pages)."""
    required = PRESETS[engine].required
    values = read_metrics(fixture(name), required)
    assert tuple(values.values()) == expected


@pytest.mark.parametrize(
    ("name", "sibling", "expected"),
    [
        ("vllm_idle", "vllm:num_requests_waiting_by_reason", 7.0),
        ("sglang_idle", "sglang:num_running_reqs_offline_batch", 10.0),
        ("tgi", "tgi_queue_size_tokens", 812.0),
    ],
)
def test_siblings_sharing_a_prefix_are_separate_metrics(name: str, sibling: str, expected: float) -> None:
    page = fixture(name)
    assert read_metrics(page, [sibling]) == {sibling: expected}
    assert sibling not in read_metrics(page, [sibling.rsplit("_", 2)[0]])


@pytest.mark.parametrize(
    ("literal", "expected"),
    [("0", 0.0), ("0.0", 0.0), ("0e+00", 0.0), ("-0", 0.0), ("1e3", 1000.0), ("2.5E-1", 0.25), ("+Inf", math.inf)],
)
def test_any_number_format(literal: str, expected: float) -> None:
    page = f'# TYPE q gauge\nq{{b="2",a="1"}} {literal}\nq{{a="3",b="4"}} 0\n'
    assert read_metrics(page, ["q"]) == {"q": expected}


def test_nan_and_absent_are_unknown() -> None:
    page = vllm_page(("0.0", "NaN"), ("0", "0"))
    values = read_metrics(page.replace("vllm:num_requests_waiting{", "vllm:num_requests_waiting_x{"), VLLM)
    assert math.isnan(values["vllm:num_requests_running"] or 0.0)
    assert values["vllm:num_requests_waiting"] is None


@pytest.mark.parametrize(
    ("name", "counter", "total"),
    [
        ("vllm_busy", "vllm:request_success", 82.0),  # the page writes ..._total
        ("triton", "nv_inference_request_success", 2406.0),  # the page writes no _total
        ("tgi", "tgi_request_count", 1204.0),
    ],
)
def test_counter_answers_with_and_without_total(name: str, counter: str, total: float) -> None:
    page = fixture(name)
    assert read_metrics(page, [counter]) == {counter: total}
    assert read_metrics(page, [counter + "_total"]) == {counter + "_total": total}


def test_histogram_parts_are_exact_names() -> None:
    page = fixture("vllm_busy")
    assert read_metrics(page, ["vllm:iteration_tokens_total"]) == {"vllm:iteration_tokens_total": None}
    assert read_metrics(page, ["vllm:iteration_tokens_total_count"]) == {"vllm:iteration_tokens_total_count": 807.0}
    assert read_metrics(page, ["vllm:time_to_first_token_seconds_bucket"]) == {
        "vllm:time_to_first_token_seconds_bucket": 214.0  # 0+0+2+11+29+40+44+44+44
    }


def _reference(page: str, names: list[str]) -> dict[str, float | None]:
    """The same matching rule over a full parse of the page, without the pre-filter."""
    sums: dict[str, float | None] = dict.fromkeys(names)
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            keys = {sample.name}
            if family.type == "counter" and sample.name == family.name + "_total":
                keys.add(family.name)
            for key in keys & sums.keys():
                sums[key] = (sums[key] or 0.0) + sample.value
    return sums


@pytest.mark.parametrize("name", sorted(path.stem for path in FIXTURES.glob("*.txt")))
def test_prefilter_agrees_with_a_full_parse(name: str) -> None:
    page = fixture(name)
    names = sorted(
        {sample.name for family in text_string_to_metric_families(page) for sample in family.samples}
        | {family.name for family in text_string_to_metric_families(page)}
    )
    assert len(names) > 10
    got, want = read_metrics(page, names), _reference(page, names)
    assert got.keys() == want.keys()
    for key in names:
        a, b = got[key], want[key]
        assert a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b)), key


def test_malformed_metric_line_is_a_page_error() -> None:
    with pytest.raises(PageError, match="malformed"):
        read_metrics('vllm:num_requests_running{engine="0"} zero\n', VLLM)


def test_html_and_unrelated_lines_are_ignored_not_errors() -> None:
    assert read_metrics("<html><body>502 Bad Gateway</body></html>", VLLM) == dict.fromkeys(VLLM)


def big_vllm_page(size: int = 500_000) -> str:
    """A vLLM page padded with histogram buckets to ``size`` bytes, the targets in the middle."""
    bounds = ["0.001", "0.005", "0.01", "0.02", "0.04", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "+Inf"]
    chunks: list[str] = []
    index = 0
    while sum(map(len, chunks)) < size:
        name = f"vllm:request_phase_{index}_seconds"
        chunks.append(f"# HELP {name} Histogram.\n# TYPE {name} histogram\n")
        for engine in ("0", "1"):
            model = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
            chunks += [f'{name}_bucket{{engine="{engine}",le="{le}",{model}}} 12.0\n' for le in bounds]
        index += 1
    middle = len(chunks) // 2
    return "".join(chunks[:middle]) + fixture("vllm_busy") + "".join(chunks[middle:])


def test_big_page_parses_to_the_right_values() -> None:
    """Its speed (5 ms or less) is a benchmark: `python -m benchmarks.engine`."""
    page = big_vllm_page()
    assert len(page) >= 500_000
    values = read_metrics(page, VLLM)
    assert values == {"vllm:num_requests_running": 5.0, "vllm:num_requests_waiting": 1.0}


# --------------------------------------------------------------------------- budget and usage


@pytest.mark.parametrize(
    ("timeout", "grace", "expected"),
    [(None, None, 21.0), (10.0, None, 10.0), (None, 100.0, 70.0), (10.0, 100.0, 10.0), (100.0, 10.0, 7.0)],
)
def test_effective_wait_is_min_of_timeout_and_70_percent_of_grace(
    timeout: float | None, grace: float | None, expected: float
) -> None:
    assert effective_wait(timeout, grace) == pytest.approx(expected)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("DRAIN_TIMEOUT", "GRACE_SECONDS", "GRACEFUL_GRACE_PERIOD"):
        monkeypatch.delenv(var, raising=False)


def cli_args(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "engine": "vllm",
        "metrics_url": None,
        "metrics": (),
        "interval": EXACT,
        "idle_reads": 2,
        "kv_buffer": 0.0,
        "propagation_wait": 0.0,
        "timeout": 5.0,
        "grace_period": None,
        "quiet": True,
        "json_output": True,
    }
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    ("overrides", "env", "message"),
    [
        ({"kv_buffer": 31.0}, {}, "kv-buffer: 31.0 is longer than 30s"),
        ({"engine": "ollama"}, {}, "unknown engine 'ollama'"),
        ({"engine": None}, {}, "no metrics to watch"),
        ({"engine": None, "metrics": ("x",)}, {}, "no metrics URL"),
        ({"metrics": ("vllm:num_requests_running{engine=0}",)}, {}, "'vllm:num_requests_running{engine=0}' has a mal"),
        ({"metrics": ('vllm:num_requests_running{engine="0"',)}, {}, "has an unclosed label selector"),
        ({"metrics": ("9lives",)}, {}, "'9lives' is not a Prometheus metric name; give NAME or NAME{label="),
        ({"metrics_url": "127.0.0.1:8000/metrics"}, {}, "not an http(s) URL"),
        ({"metrics_url": "http://[::1/metrics"}, {}, "not an http(s) URL"),
        ({"metrics_url": "http:///metrics"}, {}, "not an http(s) URL"),
        ({"idle_reads": 0}, {}, "idle-reads: 0"),
        ({"interval": 0.0}, {}, "interval: 0.0"),
        ({"timeout": None, "grace_period": -1.0}, {}, "grace-period: -1.0"),
        (
            {"propagation_wait": 5.0, "timeout": 3.0},
            {},
            "propagation-wait 5s is longer than the whole drain: the 3s budget",
        ),
        ({"timeout": None}, {"DRAIN_TIMEOUT": "soon"}, "environment variable DRAIN_TIMEOUT: 'soon'"),
        ({}, {"GRACE_SECONDS": "-5"}, "environment variable GRACE_SECONDS: '-5' is negative"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    overrides: dict[str, Any],
    env: dict[str, str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert run_engine_drain(**cli_args(**overrides)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and message in err, err


async def test_wait_idle_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="kv-buffer"):
        await wait_idle("vllm", kv_buffer=60)


def test_engine_config_resolves_the_preset_and_text_durations() -> None:
    config = EngineConfig("sglang", kv_buffer="5s", propagation_wait="2s", grace_period=60)
    assert config.preset is PRESETS["sglang"] and config.rules is PRESETS["sglang"]
    assert config.metrics == PRESETS["sglang"].metrics and config.metrics_url == PRESETS["sglang"].url
    assert (config.kv_buffer, config.propagation_wait, config.limit) == (5.0, 2.0, 42.0)
    custom = EngineConfig("sglang", metrics=("sglang:num_running_reqs",))
    assert custom.rules is None, "--metric replaces the preset's metrics, and with them its idle rules"
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.interval = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"engine": "vlm"}, "unknown engine 'vlm'"),
        ({"engine": "vllm", "metrics_url": "ftp://x/metrics"}, "not an http(s) URL"),
        ({"engine": "vllm", "idle_reads": 0}, "idle-reads: 0"),
        ({"engine": "vllm", "interval": float("nan")}, "interval: nan"),
        ({"engine": "vllm", "propagation_wait": "50s"}, "is longer than the whole drain"),
        ({"metrics_url": "http://127.0.0.1:9/metrics"}, "no metrics to watch"),
    ],
)
def test_engine_config_names_the_wrong_value(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        EngineConfig(**options)


async def test_wait_idle_takes_a_config_or_keywords_not_both(serve: Any) -> None:
    url = await serve(ScriptedEngine(IDLE))
    config = EngineConfig("vllm", metrics_url=url, interval=EXACT, timeout=5)
    result = await wait_idle(config=config)
    assert result.result == "idle" and result.url == url
    with pytest.raises(ConfigError, match="not both"):
        await wait_idle("vllm", config=config)


# --------------------------------------------------------------------------- against a real server


@dataclass(frozen=True)
class Reply:
    body: str
    status: int = 200
    delay: float = 0.0
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    raw: bytes | None = None  # sent as is instead of the encoded body


class ScriptedEngine:
    """An engine's /metrics endpoint: read N gets ``script[N]``, and the last entry repeats.

    Its /health answers 200, or health read N the status ``health[N]`` (the last repeats).
    """

    def __init__(self, *script: Reply | str, health: tuple[int, ...] = (200,)) -> None:
        self.script = [Reply(item) if isinstance(item, str) else item for item in script]
        self.read_times: list[float] = []
        self.health = health
        self.health_reads = 0

    @property
    def reads(self) -> int:
        return len(self.read_times)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/health":
            status = self.health[min(self.health_reads, len(self.health) - 1)]
            self.health_reads += 1
            await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        assert scope["type"] == "http" and scope["path"] == "/metrics"
        reply = self.script[min(self.reads, len(self.script) - 1)]
        self.read_times.append(anyio.current_time())
        await anyio.sleep(reply.delay)
        body = reply.body.encode() if reply.raw is None else reply.raw
        headers = [(b"content-type", reply.content_type.encode()), (b"content-length", str(len(body)).encode())]
        headers += [(name.encode(), value.encode()) for name, value in reply.headers]
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    servers: list[Any] = []

    async def start(engine: ScriptedEngine) -> str:
        context = run_uvicorn(engine, lifespan="off")
        server = await context.__aenter__()
        servers.append(context)
        return f"http://127.0.0.1:{server.port}/metrics"

    yield start
    for context in reversed(servers):
        await context.__aexit__(None, None, None)


async def drain_cli(**overrides: Any) -> int:
    """``run_engine_drain`` runs its own event loop, so it gets a thread; the server stays on this loop."""
    return await anyio.to_thread.run_sync(partial(run_engine_drain, **cli_args(**overrides)))


def json_result(capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    out, err = capsys.readouterr()
    return json.loads(out), err


async def test_idle_right_after_the_sum_reads_zero_on_consecutive_reads(serve: Any) -> None:
    """1. two busy reads 2. two zero reads 3. returns at once: no fifth read."""
    engine = ScriptedEngine(BUSY, BUSY, IDLE, IDLE, BUSY)
    result = await wait_idle("vllm", metrics_url=await serve(engine), interval=EXACT, timeout=5)
    assert result.result == "idle" and result.idle and result.exit_code == 0
    assert result.reads == 4 and engine.reads == 4
    assert result.values == {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}


async def test_one_read_zero_blip_is_ignored(serve: Any) -> None:
    """A lagging gauge reads 0 once while a request is still in flight; idle needs two zeros in a row."""
    engine = ScriptedEngine(BUSY, IDLE, BUSY, IDLE, BUSY, IDLE, IDLE)
    progress: list[EngineProgress] = []
    result = await wait_idle(
        "vllm", metrics_url=await serve(engine), interval=EXACT, timeout=5, on_progress=progress.append
    )
    assert result.result == "idle" and result.reads == 7
    assert [p.idle_streak for p in progress] == [0, 1, 0, 1, 0, 1, 2]


async def test_idle_reads_option_sets_the_streak(serve: Any) -> None:
    engine = ScriptedEngine(IDLE, IDLE, BUSY, IDLE, IDLE, IDLE)
    result = await wait_idle("vllm", metrics_url=await serve(engine), interval=EXACT, idle_reads=3, timeout=5)
    assert result.result == "idle" and result.reads == 6


async def test_absent_metric_never_reports_idle(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Waiting is absent (only its _by_reason sibling is there) and running reads 0: unknown, so exit 1."""
    page = IDLE.replace("vllm:num_requests_waiting{", "vllm:num_requests_waiting_by_engine{")
    engine = ScriptedEngine(page)
    assert await drain_cli(metrics_url=await serve(engine), timeout=0.5) == 1
    result, err = json_result(capsys)
    assert result["result"] == "timeout" and result["exit_code"] == 1
    assert result["values"] == {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": None}
    assert engine.reads >= 2
    assert err.count("warning:") == 1 and "'vllm:num_requests_waiting' is absent" in err
    assert "waiting=?" in err


async def test_nan_never_reports_idle_and_warns_once(serve: Any) -> None:
    engine = ScriptedEngine(vllm_page(("0.0", "NaN"), ("0", "0")))
    warnings: list[str] = []
    result = await wait_idle(
        "vllm", metrics_url=await serve(engine), interval=0.05, timeout=0.5, on_warning=warnings.append
    )
    assert result.result == "timeout" and result.exit_code == 1
    assert engine.reads >= 2
    assert len(warnings) == 1 and "NaN" in warnings[0]
    assert result.as_dict()["values"] == {"vllm:num_requests_running": "nan", "vllm:num_requests_waiting": 0.0}


async def test_budget_is_the_drains_rule(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """grace_period - reserve, as a graceful server's drain takes it (the default reserve of 0.5 s is half)."""
    engine = ScriptedEngine(BUSY)
    assert await drain_cli(metrics_url=await serve(engine), timeout=10.0, grace_period=0.5) == 1
    result, err = json_result(capsys)
    assert result["limit"] == pytest.approx(0.25)
    assert 0.25 <= result["duration"] < 2.5  # the budget, not the 10 s timeout; 10x safety bound
    assert "budget of 0.25s ran out with running=1 waiting=0" in err


@pytest.mark.parametrize("grace", [30.0, 10.0, 60.0, 300.0])
def test_engine_mode_and_the_drain_get_the_same_limit(grace: float) -> None:
    """One budget rule: engine mode's limit is the drain's, at every grace period (21 s against 20 s at 30 s before)."""
    from graceful import Drain

    drain = Drain(grace_period=grace)
    assert EngineConfig("vllm", grace_period=grace).limit == drain.budget.limit
    assert (
        EngineConfig("vllm", grace_period=grace, timeout=7).limit
        == Drain(grace_period=grace, drain_timeout=7).budget.limit
    )
    assert EngineConfig("vllm").limit == Drain().budget.limit == 20.0  # Kubernetes' default 30 s
    assert EngineConfig("vllm", grace_period=grace, grace_share=0.7).limit == pytest.approx(0.7 * grace)  # kthena's


@pytest.mark.parametrize(
    ("env", "overrides", "limit"),
    [
        ({"DRAIN_TIMEOUT": "300ms", "GRACE_SECONDS": "100"}, {}, 0.3),
        ({"GRACE_SECONDS": "0.5"}, {}, 0.35),
        ({"DRAIN_TIMEOUT": "1h", "GRACE_SECONDS": "0.4"}, {}, 0.28),
        ({"GRACEFUL_GRACE_PERIOD": "0.4s", "GRACE_SECONDS": "100"}, {}, 0.28),
        ({"DRAIN_TIMEOUT": "1h", "GRACE_SECONDS": "100"}, {"timeout": 0.3}, 0.3),
        ({"GRACE_SECONDS": "100"}, {"grace_period": 0.5}, 0.35),
    ],
)
async def test_env_names_of_the_kthena_hook(
    env: dict[str, str],
    overrides: dict[str, Any],
    limit: float,
    serve: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    args = {"timeout": None, **overrides}
    assert await drain_cli(metrics_url=await serve(ScriptedEngine(BUSY)), **args) == 1
    result, _ = json_result(capsys)
    assert result["limit"] == pytest.approx(limit)
    assert limit <= result["duration"] < 10 * limit  # 10x safety bound


async def test_propagation_wait_comes_first(serve: Any) -> None:
    engine = ScriptedEngine(IDLE)
    url = await serve(engine)
    start = anyio.current_time()
    result = await wait_idle("vllm", metrics_url=url, interval=0.05, propagation_wait=0.3, timeout=5)
    assert result.idle
    assert engine.read_times[0] - start >= 0.3


async def test_kv_buffer_is_held_after_idle_without_polling(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    engine = ScriptedEngine(IDLE)
    assert await drain_cli(metrics_url=await serve(engine), kv_buffer=0.3, quiet=False) == 0
    result, err = json_result(capsys)
    assert result["result"] == "idle" and result["reads"] == 2 and engine.reads == 2
    assert result["kv_buffer_held"] == pytest.approx(0.3)
    assert result["duration"] >= 0.3
    assert "then held the KV buffer 0.3s" in err


async def test_kv_buffer_never_outlasts_the_budget(serve: Any) -> None:
    engine = ScriptedEngine(IDLE)
    result = await wait_idle("vllm", metrics_url=await serve(engine), interval=0.05, kv_buffer=30, timeout=0.4)
    assert result.idle and result.kv_buffer_held < 0.4
    assert result.duration < 4.0  # the 0.4 s budget, not the 30 s buffer; 10x safety bound


def test_an_engine_never_reached_is_no_engine_at_its_url(capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listens on the port from the first read (a typo'd port): the hook never reached an
    engine, so it cannot pass as a drained one. Exit 3 at once, naming the URL; no second read."""
    with refusing_port() as port:
        url = f"http://127.0.0.1:{port}/metrics"
        assert run_engine_drain(**cli_args(metrics_url=url, quiet=False)) == 3
    result, err = json_result(capsys)
    assert result["result"] == "unreachable" and result["reads"] == 1 and result["exit_code"] == 3
    assert result["duration"] < 1.0  # not the budget, not three reads
    assert err.splitlines()[-1] == (
        f"graceful drain: no engine at {url} (connection refused); "
        "check --metrics-url (the engine's host, port and path) and that the engine is running"
    )


def test_no_such_host_is_no_engine_either(capsys: pytest.CaptureFixture[str]) -> None:
    """A host name that does not resolve cannot connect at all either: exit 3 on the first read."""
    url = "http://no-such-host.invalid:8000/metrics"
    assert run_engine_drain(**cli_args(metrics_url=url, interval=1.0)) == 3  # a lookup gets 0.9 s
    result, err = json_result(capsys)
    assert result["result"] == "unreachable" and result["reads"] == 1
    assert result["last_error"].startswith("cannot connect")
    assert f"graceful drain: no engine at {url} (cannot connect" in err


async def test_an_engine_that_answered_then_refuses_is_gone(capsys: pytest.CaptureFixture[str]) -> None:
    """1. the engine answers busy 2. it exits (its port refuses) 3. three refused reads: it is gone,
    nothing is left to protect (exit 0), as before issue 46."""
    engine = ScriptedEngine(BUSY)
    context = run_uvicorn(engine, lifespan="off")
    server = await context.__aenter__()
    url = f"http://127.0.0.1:{server.port}/metrics"

    async def stop_after_the_first_read() -> None:
        while engine.reads == 0:
            await anyio.sleep(0.005)
        server.should_exit = True

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_after_the_first_read)
            code = await drain_cli(metrics_url=url, timeout=5, quiet=False)
    finally:
        await context.__aexit__(None, None, None)
    assert code == 0
    result, err = json_result(capsys)
    assert result["result"] == "gone" and result["exit_code"] == 0 and engine.reads >= 1
    assert result["reads"] >= engine.reads + REFUSED_READS
    assert f"connection refused on {REFUSED_READS} reads in a row at {url}: the engine is gone" in err


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_refused_is_recognised_on_every_backend() -> None:
    """asyncio raises ConnectionRefusedError; trio wraps one per address in an ExceptionGroup."""
    with refusing_port() as port:
        result = await wait_idle("vllm", metrics_url=f"http://127.0.0.1:{port}/metrics", interval=0.05, timeout=5)
    assert result.result == "unreachable" and result.reads == 1 and result.last_error == "connection refused"


@contextlib.contextmanager
def threaded_engine(page: str) -> Iterator[str]:
    """A stdlib HTTP server in a thread, for calling the blocking ``run_engine_drain`` on the main thread."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
        finally:
            server.shutdown()
            thread.join(5)


@pytest.mark.parametrize(
    ("page", "code", "message"), [(IDLE, 0, "engine idle (running=0 waiting=0)"), (BUSY, 1, "ran out")]
)
def test_run_engine_drain_on_the_main_thread(
    page: str, code: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with threaded_engine(page) as url:
        assert run_engine_drain(**cli_args(metrics_url=url, timeout=0.5, quiet=False)) == code
    result, err = json_result(capsys)
    assert result["exit_code"] == code
    assert message in err


async def test_5xx_garbage_and_timeouts_keep_polling(serve: Any) -> None:
    """A busy or sick engine is not a gone engine: every kind of bad read resets the streak, none ends the wait."""
    engine = ScriptedEngine(
        Reply("overloaded", status=503),
        IDLE,
        Reply("<html><body>Internal Server Error</body></html>", status=500, content_type="text/html"),
        IDLE,
        Reply("<html><body>sign in</body></html>", content_type="text/html"),
        IDLE,
        Reply('vllm:num_requests_running{engine="0"} zero\n'),
        IDLE,
        Reply(IDLE, delay=0.3),  # answers after the per-read timeout
        IDLE,
        IDLE,
    )
    progress: list[EngineProgress] = []
    result = await wait_idle(
        "vllm", metrics_url=await serve(engine), interval=EXACT, timeout=5, on_progress=progress.append
    )
    assert result.result == "idle" and result.reads == 11
    errors = [p.error for p in progress]
    assert errors[0] == "HTTP 503" and errors[2] == "HTTP 500"
    assert errors[4] is not None and errors[4].startswith("garbage page: not Prometheus")
    assert errors[6] is not None and errors[6].startswith("garbage page: malformed")
    assert errors[8] is not None and errors[8].startswith("no answer within")
    assert [p.idle_streak for p in progress] == [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2]


async def test_engine_that_hangs_up_is_sick_not_gone() -> None:
    """The port accepts, then closes without an answer (an HTTP server shutting down): keep polling."""
    accepted = 0

    async def hang_up(stream: anyio.abc.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        await stream.aclose()

    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hang_up)
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        result = await wait_idle("vllm", metrics_url=f"http://127.0.0.1:{port}/metrics", interval=0.05, timeout=0.5)
        tg.cancel_scope.cancel()
    assert result.result == "timeout" and result.exit_code == 1
    assert result.last_error is not None and result.last_error.startswith("connection error")
    assert result.reads >= 2 and accepted >= 2


async def test_steady_5xx_runs_out_the_budget(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    engine = ScriptedEngine(Reply("", status=503))
    assert await drain_cli(metrics_url=await serve(engine), timeout=0.5) == 1
    result, err = json_result(capsys)
    assert result["result"] == "timeout" and result["last_error"] == "HTTP 503"
    assert engine.reads >= 2
    assert "last read: HTTP 503" in err


async def test_wrong_path_warns_once(serve: Any) -> None:
    engine = ScriptedEngine(Reply("Not Found", status=404))
    warnings: list[str] = []
    result = await wait_idle(
        "vllm", metrics_url=await serve(engine), interval=0.05, timeout=0.5, on_warning=warnings.append
    )
    assert result.result == "timeout" and engine.reads >= 2
    assert len(warnings) == 1 and "HTTP 404" in warnings[0] and "--metrics-url" in warnings[0]


async def test_metric_option_overrides_the_preset(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The idle page still has waiting_by_reason = 7: watching it instead of the preset never goes idle."""
    engine = ScriptedEngine(IDLE)
    metrics = ("vllm:num_requests_waiting_by_reason",)
    assert await drain_cli(metrics_url=await serve(engine), metrics=metrics, timeout=0.3) == 1
    result, err = json_result(capsys)
    assert result["values"] == {"vllm:num_requests_waiting_by_reason": 7.0}
    assert "vllm:num_requests_waiting_by_reason=7" in err


@pytest.mark.parametrize("engine_name", ["sglang", "tgi", "triton"])
async def test_other_presets_against_a_server(engine_name: str, serve: Any) -> None:
    busy = {"sglang": "sglang_busy", "tgi": "tgi", "triton": "triton"}[engine_name]
    idle_page = fixture(busy)
    for metric in PRESETS[engine_name].metrics:
        name = metric.split("{")[0]
        idle_page = re.sub(rf"^({re.escape(name)}(?:{{.*}})?) \S+$", r"\1 0", idle_page, flags=re.M)
    engine = ScriptedEngine(fixture(busy), idle_page)
    # SGLang's minimum idle span is for real engines; here the reads are 0.1 s apart.
    preset = dataclasses.replace(PRESETS[engine_name], min_idle_span=0.0)
    result = await wait_idle(preset, metrics_url=await serve(engine), interval=EXACT, timeout=5)
    assert result.idle and result.reads == 3
    assert set(result.values.values()) == {0.0}


async def test_progress_once_a_second_on_stderr(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    engine = ScriptedEngine(BUSY)
    assert await drain_cli(metrics_url=await serve(engine), timeout=1.6, quiet=False, json_output=False) == 1
    out, err = capsys.readouterr()
    assert out == ""
    progress = [line for line in err.splitlines() if "deadline in" in line]
    assert engine.reads > 3
    assert len(progress) == 2, err
    assert all("running=1 waiting=0" in line and "elapsed" in line for line in progress)


async def test_quiet_prints_no_progress(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    engine = ScriptedEngine(BUSY, IDLE)
    assert await drain_cli(metrics_url=await serve(engine), json_output=False) == 0
    assert capsys.readouterr() == ("", "")


def test_fixtures_hold_every_number_format() -> None:
    text = "\n".join(fixture(path.stem) for path in FIXTURES.glob("*.txt"))
    for literal in (" 0\n", " 0.0\n", " 0e+00\n", " 1e3\n", " +Inf\n", " NaN\n", " -0\n", 'le="+Inf"'):
        assert literal in text, literal


# --------------------------------------------------------------------------- issue 12: pages from upstream source


def engine_page(name: str) -> str:
    return (ENGINES / f"{name}.txt").read_text()


def set_series(page: str, line_start: str, value: str) -> str:
    """``page`` with the one sample line that starts with ``line_start`` set to ``value``."""
    lines = [line for line in page.splitlines() if line.startswith(line_start)]
    assert len(lines) == 1, line_start
    return page.replace(lines[0], lines[0].rsplit(" ", 1)[0] + " " + value)


def test_every_engine_fixture_names_its_upstream_source() -> None:
    pages = sorted(ENGINES.glob("*.txt"))
    assert len(pages) >= 6
    for path in pages:
        head = path.read_text().splitlines()[0]
        assert head.startswith("# Built from ") and "/" in head, path.name
        list(text_string_to_metric_families(path.read_text()))  # valid text exposition


def test_counter_family_exposed_as_total_answers_to_its_name() -> None:
    """OpenMetrics names the family X and the sample X_total; the text parser files them apart."""
    page = '# HELP jobs_started Jobs started.\n# TYPE jobs_started counter\njobs_started_total{q="a"} 4\n'
    assert read_metrics(page, ["jobs_started", "jobs_started_total"]) == {
        "jobs_started": 4.0,
        "jobs_started_total": 4.0,
    }


def test_exact_name_first_a_gauge_and_an_unrelated_counter() -> None:
    page = (
        '# TYPE inflight gauge\ninflight{w="0"} 0\ninflight{w="1"} 0\n'
        "# TYPE inflight_total counter\ninflight_total 57\n"
    )
    assert read_metrics(page, ["inflight", "inflight_total"]) == {"inflight": 0.0, "inflight_total": 57.0}


def test_sample_lines_with_leading_whitespace_are_parsed() -> None:
    page = BUSY.replace("vllm:num_requests_running{", "  vllm:num_requests_running{").replace(
        "# TYPE vllm:num_requests_waiting", " \t# TYPE vllm:num_requests_waiting"
    )
    page = page.replace("vllm:num_requests_waiting{", "\tvllm:num_requests_waiting{")
    assert page.count("\n  vllm:num_requests_running{") == 2 and page.count("\n\tvllm:num_requests_waiting{") == 2
    assert read_metrics(page, VLLM) == {"vllm:num_requests_running": 1.0, "vllm:num_requests_waiting": 0.0}


def test_label_selector_sums_only_matching_series() -> None:
    page = engine_page("triton_trtllm")
    name = "nv_trt_llm_request_metrics"
    got = read_metrics(
        page,
        [
            name,
            f'{name}{{request_type="active"}}',
            f'{name}{{request_type="max", model="tensorrt_llm"}}',
            f'{name}{{request_type="paused"}}',
            'nv_inference_pending_request_count{model="tensorrt_llm",version="1"}',
        ],
    )
    assert list(got.values()) == [77.0, 6.0, 64.0, None, 0.0]


def test_label_selector_values_may_hold_escapes() -> None:
    page = '# TYPE q gauge\nq{path="C:\\\\x",say="a \\"b\\", {c}"} 2\nq{path="y"} 3\n'
    assert read_metrics(page, ['q{say="a \\"b\\", {c}"}', 'q{path="C:\\\\x"}']) == {
        'q{say="a \\"b\\", {c}"}': 2.0,
        'q{path="C:\\\\x"}': 2.0,
    }


@pytest.mark.parametrize(
    ("metric", "message"),
    [
        ("q{a=1}", "'q{a=1}' has a malformed label selector"),
        ('q{a="1" b="2"}', "has a malformed label selector"),
        ('q{a="1"', "has an unclosed label selector"),
        ("q{}", "has an empty label selector"),
        ('q{a="1",a="2"}', "names label 'a' twice"),
    ],
)
def test_bad_selector_is_a_usage_error_naming_the_value_and_the_fix(
    metric: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_engine_drain(**cli_args(engine=None, metrics_url="http://127.0.0.1:9/metrics", metrics=(metric,))) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert message in err and """NAME{label="value",...}""" in err and "request_type=" in err


async def test_selector_from_the_command_line(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``max`` is the batcher's capacity (64): only the selector keeps it out of the sum."""
    page = set_series(
        engine_page("triton_trtllm"), 'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active"', "0"
    )
    metric = 'nv_trt_llm_request_metrics{request_type="active"}'
    url = await serve(ScriptedEngine(page))
    assert await drain_cli(engine=None, metrics_url=url, metrics=(metric,)) == 0
    result, _ = json_result(capsys)
    assert result["values"] == {metric: 0.0}
    assert await drain_cli(engine=None, metrics_url=url, metrics=("nv_trt_llm_request_metrics",), timeout=0.3) == 1
    result, _ = json_result(capsys)
    assert result["values"] == {"nv_trt_llm_request_metrics": 71.0}


# ---- budget as a hard limit, against a real slow server and the real CLI


class SlowEngine:
    """A raw TCP server on 127.0.0.1 that answers every GET the way ``mode`` says, slowly."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.first_accept: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)

    def serve(self) -> None:
        self.listener.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            if self.first_accept is None:
                self.first_accept = time.monotonic()
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                if self.mode == "pieces":  # a 500 KB page, 16 KiB every 0.4 s
                    body = big_vllm_page().encode()
                    conn.sendall(head + f"Content-Length: {len(body)}\r\n\r\n".encode())
                    for start in range(0, len(body), 16384):
                        if self.stop.wait(0.4):
                            return
                        conn.sendall(body[start : start + 16384])
                elif self.mode == "bytes":  # one byte every 0.2 s
                    body = BUSY.encode()
                    conn.sendall(head + f"Content-Length: {len(body)}\r\n\r\n".encode())
                    for index in range(len(body)):
                        if self.stop.wait(0.2):
                            return
                        conn.sendall(body[index : index + 1])
                else:  # headers, then nothing
                    conn.sendall(head + b"Content-Length: 1000\r\n\r\n")
                    self.stop.wait(30)
            except OSError:
                pass

    def __enter__(self) -> SlowEngine:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        self.listener.close()


@pytest.mark.parametrize(("mode", "interval"), [("pieces", "1s"), ("bytes", "10s"), ("hang", "10s")])
def test_slow_engine_ends_at_the_budget_within_half_a_second(mode: str, interval: str) -> None:
    """``graceful drain`` in a subprocess: exit 1 no later than budget + 0.5 s after the hook's first read began."""
    budget = 2.0
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent.parent)}
    for var in ("DRAIN_TIMEOUT", "GRACE_SECONDS", "GRACEFUL_GRACE_PERIOD"):
        env.pop(var, None)
    with SlowEngine(mode) as engine:
        command = [sys.executable, "-m", "graceful", "drain", "--engine", "vllm", "--json", "--timeout", f"{budget}s"]
        command += ["--metrics-url", f"http://127.0.0.1:{engine.port}/metrics", "--interval", interval]
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
        ended = time.monotonic()
    assert engine.first_accept is not None, proc.stderr
    elapsed = ended - engine.first_accept
    assert proc.returncode == 1, proc.stderr
    assert elapsed <= budget + 0.5, f"{elapsed:.2f}s"
    result = json.loads(proc.stdout)
    assert result["result"] == "timeout" and result["last_error"].startswith("no answer within")
    assert f"budget of {budget:g}s ran out" in proc.stderr and "Traceback" not in proc.stderr


# ---- no response crashes the hook


def gzip_reply(body: bytes) -> Reply:
    return Reply("", raw=body, headers=(("content-encoding", "gzip"),))


async def test_broken_gzip_keeps_polling_then_idle(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A body marked gzip that is not gzip: three unreadable reads, one warning, then two good idle reads."""
    broken = gzip_reply(b"this is not gzip at all")
    engine = ScriptedEngine(broken, broken, broken, gzip_reply(gzip.compress(IDLE.encode())), IDLE)
    assert await drain_cli(metrics_url=await serve(engine), quiet=False) == 0
    result, err = json_result(capsys)
    assert result["result"] == "idle" and result["reads"] == 5 and engine.reads == 5
    assert err.count("warning:") == 1 and "cannot be read" in err and "bad Content-Encoding" in err
    assert "Traceback" not in err


async def test_broken_gzip_all_along_ends_at_the_budget(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    engine = ScriptedEngine(gzip_reply(b"plain text, not gzip"))
    assert await drain_cli(metrics_url=await serve(engine), timeout=0.5) == 1
    result, err = json_result(capsys)
    assert engine.reads >= 3 and result["last_error"].startswith("unreadable page: bad Content-Encoding")
    assert "last read: unreadable page" in err and err.count("warning:") == 1


async def test_bad_utf8_is_an_unreadable_read(serve: Any) -> None:
    engine = ScriptedEngine(Reply("", raw=IDLE.encode() + b"\n# \xff\xfe\n"), IDLE, IDLE)
    progress: list[EngineProgress] = []
    warnings: list[str] = []
    result = await wait_idle(
        "vllm",
        metrics_url=await serve(engine),
        interval=EXACT,
        timeout=5,
        on_progress=progress.append,
        on_warning=warnings.append,
    )
    assert result.idle and result.reads == 3
    assert progress[0].error is not None and progress[0].error.startswith("unreadable page: not utf-8 text")
    assert len(warnings) == 1


# ---- presets that see all the work


async def test_triton_trtllm_page_with_active_requests_keeps_waiting(
    serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pending reads 0 in every model, 6 requests execute in TensorRT-LLM: not idle."""
    engine = ScriptedEngine(engine_page("triton_trtllm"))
    assert await drain_cli(engine="triton", metrics_url=await serve(engine), timeout=0.5) == 1
    result, err = json_result(capsys)
    assert result["values"]['nv_trt_llm_request_metrics{request_type="active"}'] == 6.0
    assert result["values"]["nv_inference_pending_request_count"] == 0.0
    assert "ran out with running=6 waiting=0" in err and "warning" not in err


async def test_triton_trtllm_idle_once_active_reads_zero(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The vLLM backend's gauges are absent from a TensorRT-LLM page: not this backend, they count 0."""
    busy = engine_page("triton_trtllm")
    idle = set_series(busy, 'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active"', "0")
    engine = ScriptedEngine(busy, idle)
    assert await drain_cli(engine="triton", metrics_url=await serve(engine), quiet=False) == 0
    result, err = json_result(capsys)
    # Busy once, then idle: at least 3 reads (a loaded machine can take one more before idle is confirmed).
    assert result["reads"] >= 3 and set(result["values"].values()) == {0.0}
    assert "engine idle (running=0 waiting=0)" in err and "warning" not in err


async def test_triton_trtllm_requests_queued_in_the_executor_keep_waiting(serve: Any) -> None:
    """Newer TensorRT-LLM backends also report requests queued in the executor (``request_type="waiting"``)."""
    active = 'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active"'
    waiting = 'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting"'
    queued = set_series(set_series(engine_page("triton_trtllm"), active, "0"), waiting, "2")
    idle = set_series(queued, waiting, "0")
    engine = ScriptedEngine(queued, queued, idle)
    result = await wait_idle("triton", metrics_url=await serve(engine), interval=EXACT, timeout=5)
    assert result.idle and result.reads == 4


async def test_triton_vllm_backend_running_requests_keep_waiting(serve: Any) -> None:
    busy = engine_page("triton_vllm_backend")
    idle = set_series(set_series(busy, "vllm:num_requests_running{", "0"), "vllm:num_requests_waiting{", "0")
    engine = ScriptedEngine(busy, busy, idle)
    result = await wait_idle("triton", metrics_url=await serve(engine), interval=EXACT, timeout=5)
    assert result.idle and result.reads == 4


async def test_triton_without_its_own_pending_metric_is_unknown(serve: Any) -> None:
    """Backend gauges are optional; Triton's own pending count is required."""
    page = engine_page("triton_vllm_backend").replace("nv_inference_pending_request_count{", "nv_other{")
    page = set_series(set_series(page, "vllm:num_requests_running{", "0"), "vllm:num_requests_waiting{", "0")
    warnings: list[str] = []
    result = await wait_idle(
        "triton",
        metrics_url=await serve(ScriptedEngine(page)),
        interval=0.05,
        timeout=0.4,
        on_warning=warnings.append,
    )
    assert result.result == "timeout" and result.values["nv_inference_pending_request_count"] is None
    assert len(warnings) == 1 and "'nv_inference_pending_request_count' is absent from the page" in warnings[0]


SGLANG_NOW = dataclasses.replace(PRESETS["sglang"], min_idle_span=0.0)


async def test_sglang_prefill_with_bootstrap_and_transfer_requests_keeps_waiting(
    serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/engines.md's prefill worker: 0 running, 0 queued, 3 in bootstrap, 2 sending KV."""
    engine = ScriptedEngine(engine_page("sglang_prefill"))
    assert await drain_cli(engine="sglang", metrics_url=await serve(engine), timeout=0.5) == 1
    result, err = json_result(capsys)
    assert result["values"]["sglang:num_prefill_prealloc_queue_reqs"] == 3.0
    assert result["values"]["sglang:num_prefill_inflight_queue_reqs"] == 2.0
    assert "ran out with running=2 waiting=3" in err


async def test_sglang_decode_transfer_queue_keeps_waiting_and_old_pages_still_drain(serve: Any) -> None:
    page = engine_page("sglang_prefill")
    for name in ("prealloc", "inflight"):
        page = set_series(page, f"sglang:num_prefill_{name}_queue_reqs{{", "0")
    decode = set_series(page, "sglang:num_decode_transfer_queue_reqs{", "4")
    older = "\n".join(line for line in page.splitlines() if "_queue_reqs" not in line or "num_queue_reqs" in line)
    engine = ScriptedEngine(decode, decode, older)
    result = await wait_idle(SGLANG_NOW, metrics_url=await serve(engine), interval=EXACT, timeout=5)
    assert result.idle and result.reads == 4  # the PD gauges are absent from the older page: 0
    assert result.values["sglang:num_decode_transfer_queue_reqs"] == 0.0


def sglang_idle(finished: int) -> str:
    page = engine_page("sglang_prefill")
    for name in ("prealloc", "inflight"):
        page = set_series(page, f"sglang:num_prefill_{name}_queue_reqs{{", "0")
    return set_series(page, "sglang:num_requests_total{", f"{finished}.0")


async def test_sglang_zero_gauges_while_requests_move_is_not_idle(serve: Any) -> None:
    """SGLang logs a new request's own prefill batch as 0 running, 0 queued: counters that move say otherwise."""
    engine = ScriptedEngine(sglang_idle(1211), sglang_idle(1212), sglang_idle(1213), sglang_idle(1213))
    progress: list[EngineProgress] = []
    result = await wait_idle(
        SGLANG_NOW, metrics_url=await serve(engine), interval=EXACT, timeout=5, on_progress=progress.append
    )
    assert result.idle and result.reads == 5
    assert [p.idle_streak for p in progress] == [1, 0, 0, 1, 2]


async def test_sglang_counter_that_appears_counts_as_movement(serve: Any) -> None:
    """A fresh SGLang has no request counter until its first request finishes: the counter appearing is work."""
    before = "\n".join(line for line in sglang_idle(1).splitlines() if "num_requests_total" not in line)
    engine = ScriptedEngine(before, sglang_idle(1), sglang_idle(1))
    progress: list[EngineProgress] = []
    result = await wait_idle(
        SGLANG_NOW, metrics_url=await serve(engine), interval=EXACT, timeout=5, on_progress=progress.append
    )
    assert result.idle and [p.idle_streak for p in progress] == [1, 0, 1, 2]


async def test_sglang_zero_reads_must_span_the_minimum_time(serve: Any) -> None:
    """Two zero reads 0.1 s apart are not enough when the preset asks for 0.5 s of zeros."""
    preset = dataclasses.replace(PRESETS["sglang"], min_idle_span=0.5)
    engine = ScriptedEngine(sglang_idle(5))
    reads: list[EngineProgress] = []  # each read, timed on the drain's own clock
    result = await wait_idle(
        preset, metrics_url=await serve(engine), interval=EXACT, timeout=5, on_progress=reads.append
    )
    assert result.idle and result.reads == len(reads) >= 3
    # The streak starts at the first zero read and the drain stops at the first read that makes
    # it span 0.5 s, not one read earlier.
    first_zero = next(read for read in reads if read.idle_streak == 1)
    assert reads[-1].elapsed - first_zero.elapsed >= 0.5
    assert reads[-2].elapsed - first_zero.elapsed < 0.5


def test_sglang_preset_holds_zero_for_five_seconds() -> None:
    assert PRESETS["sglang"].min_idle_span == 5.0
    assert set(PRESETS["sglang"].optional) >= {
        "sglang:num_prefill_prealloc_queue_reqs",
        "sglang:num_prefill_inflight_queue_reqs",
        "sglang:num_decode_prealloc_queue_reqs",
        "sglang:num_decode_transfer_queue_reqs",
    }
    assert PRESETS["sglang"].required == ("sglang:num_running_reqs", "sglang:num_queue_reqs")


async def test_fresh_tgi_replica_ends_idle(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    engine = ScriptedEngine(engine_page("tgi_fresh"), "")
    assert await drain_cli(engine="tgi", metrics_url=await serve(engine), quiet=False) == 0
    result, err = json_result(capsys)
    assert result["result"] == "idle" and result["reads"] == 2
    assert result["values"] == {"tgi_batch_current_size": 0.0, "tgi_queue_size": 0.0}
    assert "has not served a request since it started" in err and err.count("warning:") == 1


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(lambda: engine_page("tgi_served_renamed"), id="served-with-renamed-gauges"),
        pytest.param(lambda: fixture("vllm_idle"), id="another-engine-on-the-port"),
    ],
)
async def test_tgi_page_with_other_samples_is_unknown_not_fresh(page: Any, serve: Any) -> None:
    warnings: list[str] = []
    result = await wait_idle(
        "tgi",
        metrics_url=await serve(ScriptedEngine(page())),
        interval=0.05,
        timeout=0.4,
        on_warning=warnings.append,
    )
    assert result.result == "timeout" and result.values == {"tgi_batch_current_size": None, "tgi_queue_size": None}
    assert len(warnings) == 1 and "are absent from the page" in warnings[0]


async def test_vllm_disable_log_stats_is_named_on_the_first_read(
    serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = ScriptedEngine(engine_page("vllm_disable_log_stats"))
    assert await drain_cli(metrics_url=await serve(engine), timeout=0.5, quiet=False, json_output=False) == 1
    _, err = capsys.readouterr()
    lines = err.splitlines()
    assert "warning:" in lines[1], err  # right after the start line: the first read
    assert "absent from the page: is the engine started with --disable-log-stats?" in lines[1]
    assert err.count("warning:") == 1 and "running=? waiting=?" in err


async def test_a_dead_engine_is_dead_not_idle(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM with a dead engine core: /metrics keeps its last values (busy) and /health answers 503
    (vllm/entrypoints/serve/instrumentator/health.py). Two failed health reads in a row: dead, exit 1,
    long before the budget."""
    engine = ScriptedEngine(BUSY, health=(200, 503))
    code = await drain_cli(metrics_url=await serve(engine), timeout=30.0)
    result, err = json_result(capsys)
    assert code == 1 and result["result"] == "dead" and result["exit_code"] == 1
    assert result["duration"] < 5 and engine.health_reads == 3
    assert "the engine is dead (http://127.0.0.1:" in err and "/health answered HTTP 503)" in err
    assert "its work in flight is lost" in err


async def test_one_failed_health_read_or_an_idle_page_is_not_death(serve: Any) -> None:
    """One 503 between healthy reads is a blip; an idle page is idle whatever its health check says."""
    blip = ScriptedEngine(BUSY, BUSY, BUSY, IDLE, health=(200, 503, 200))
    result = await wait_idle("vllm", metrics_url=await serve(blip), interval=EXACT, timeout=10)
    assert result.result == "idle"
    idle = ScriptedEngine(IDLE, health=(503,))
    result = await wait_idle("vllm", metrics_url=await serve(idle), interval=EXACT, timeout=10)
    assert result.result == "idle" and idle.health_reads == 0


async def test_a_failed_health_check_then_refusals_is_dead_not_gone(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM shuts itself down within seconds of its engine's death: the health check failed, then the
    port refuses. The work in flight is lost: dead (exit 1), not gone (exit 0)."""
    engine = ScriptedEngine(BUSY, health=(503, 200))
    context = run_uvicorn(engine, lifespan="off")
    server = await context.__aenter__()
    url = f"http://127.0.0.1:{server.port}/metrics"
    stopped = False

    def progress(update: EngineProgress) -> None:
        nonlocal stopped
        if engine.health_reads and not stopped:
            stopped = True
            server.should_exit = True  # the engine goes away after one failed health read

    config = EngineConfig("vllm", metrics_url=url, interval=EXACT, timeout=10)
    from graceful._engine._wait import poll

    try:
        result = await poll(config, progress, lambda text: None)
    finally:
        await context.__aexit__(None, None, None)
    assert result.result == "dead" and result.exit_code == 1
    assert "connections were refused" in (result.last_error or "")
