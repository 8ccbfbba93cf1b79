"""The rolling-update demo: balancer control, the kube-proxy fallback, and a reduced end-to-end run."""

from __future__ import annotations

import asyncio
import signal
import tempfile
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from click.testing import CliRunner

from examples.rollout.balancer import Forwarder, HAProxy, find_haproxy, open_balancer
from examples.rollout.cli import rollout_command
from examples.rollout.report import expectations, reload_losses, render, side_summary
from examples.rollout.scenarios import Options, SideResult, run_side
from graceful import ConfigError

pytestmark = pytest.mark.anyio

needs_haproxy = pytest.mark.skipif(find_haproxy() is None, reason="haproxy is not installed")


async def _backend(name: str) -> tuple[asyncio.Server, int]:
    """A line server that answers every line with its own name, so a client can tell who it reached."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline():
            writer.write(name.encode() + b"\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


async def _ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
    writer.write(b"who\n")
    await writer.drain()
    return (await asyncio.wait_for(reader.readline(), 5)).decode().strip()


async def _switch(kind: str) -> AsyncIterator[tuple[str, list[str], str]]:
    """1. only a is listed, a connection opens to it 2. b is added, a removed 3. new connections and the old one."""
    a, port_a = await _backend("a")
    b, port_b = await _backend("b")
    try:
        async with open_balancer(kind) as balancer:
            await balancer.add("a", port_a)
            reader, writer = await asyncio.open_connection("127.0.0.1", balancer.port)
            first = await _ask(reader, writer)
            await balancer.add("b", port_b)
            await balancer.remove("a")
            fresh = []
            for _ in range(4):
                r, w = await asyncio.open_connection("127.0.0.1", balancer.port)
                fresh.append(await _ask(r, w))
                w.close()
            again = await _ask(reader, writer)
            writer.close()
            yield first, fresh, again + "|" + balancer.name
    finally:
        a.close()
        b.close()


@needs_haproxy
async def test_haproxy_runtime_api_moves_new_connections_and_keeps_old_ones() -> None:
    async for first, fresh, again in _switch("haproxy"):
        assert first == "a"
        assert fresh == ["b"] * 4
        served, name = again.split("|")
        assert served == "a"  # maint: no new sessions, the established one untouched
        assert name.startswith("haproxy ")


async def test_forwarder_moves_new_connections_and_keeps_old_ones() -> None:
    async for first, fresh, again in _switch("forwarder"):
        assert (first, fresh, again) == ("a", ["b"] * 4, "a|asyncio forwarder")


async def test_forwarder_round_robin_and_dead_endpoint() -> None:
    """1. two endpoints listed 2. four connections alternate 3. a dead endpoint closes the client and is counted."""
    a, port_a = await _backend("a")
    b, port_b = await _backend("b")
    forwarder = Forwarder()
    await forwarder.start()
    try:
        await forwarder.add("a", port_a)
        await forwarder.add("b", port_b)
        seen = []
        for _ in range(4):
            reader, writer = await asyncio.open_connection("127.0.0.1", forwarder.port)
            seen.append(await _ask(reader, writer))
            writer.close()
        assert sorted(seen) == ["a", "a", "b", "b"]
        b.close()
        await b.wait_closed()
        await forwarder.remove("a")
        reader, writer = await asyncio.open_connection("127.0.0.1", forwarder.port)
        writer.write(b"who\n")
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        assert await forwarder.backend_connect_errors() == 1
    finally:
        a.close()
        await forwarder.close()


@needs_haproxy
async def test_haproxy_config_never_shuts_sessions_down() -> None:
    with tempfile.TemporaryDirectory(prefix="g-", dir="/tmp") as directory:
        config = HAProxy("/usr/sbin/haproxy", directory, slots=3).config()
    assert "mode tcp" in config and "retries 0" in config
    assert "shutdown-sessions" not in config and "redispatch" not in config
    assert config.count("disabled") == 3


def test_options_resolve_and_reject() -> None:
    quick = Options.resolve(quick=True)
    assert (quick.replicas, quick.updates, quick.retry) == (2, 1, "sdk")
    assert Options.resolve(scenario="strict-clients", quick=True).retry == "none"
    long = Options.resolve(scenario="long-streams", quick=True)
    assert long.longest_stream > long.grace_period
    delayed = Options.resolve(scenario="lb-delay-30s", lb_delay=4.0, quick=True)
    assert delayed.propagation_wait > delayed.lb_delay
    assert delayed.grace_period - (delayed.reserve or 0) > delayed.propagation_wait + delayed.longest_stream
    with pytest.raises(ConfigError, match="'nope' is not a scenario"):
        Options.resolve(scenario="nope")


def test_options_for_l7_balancers_and_observed_propagation() -> None:
    assert Options.resolve(quick=True).admit_during_propagation is True
    assert Options.resolve(quick=True, admit_during_propagation=False).admit_during_propagation is False
    observed = Options.resolve(scenario="observed-propagation", quick=True)
    assert (observed.propagation_wait, observed.propagation_quiet, observed.lb_delay) == (30.0, 2.0, 3.0)
    assert observed.grace_period - (observed.reserve or 0) > observed.propagation_wait + 2 * observed.longest_stream
    assert Options.resolve(balancer="nginx", gateway_retry=True).gateway_retry
    with pytest.raises(ConfigError, match="--balancer haproxy has no L7 retry"):
        Options.resolve(balancer="haproxy", gateway_retry=True)
    with pytest.raises(
        ConfigError, match="--propagation-quiet 5s must be above 0 and no longer than --propagation-wait 3s"
    ):
        Options.resolve(propagation_quiet=5.0)


@needs_haproxy
def test_haproxy_http_config_retries_only_with_gateway_retry() -> None:
    with tempfile.TemporaryDirectory(prefix="g-", dir="/tmp") as directory:
        plain = HAProxy("/usr/sbin/haproxy", directory, slots=2, mode="http").config()
        retry = HAProxy("/usr/sbin/haproxy", directory, slots=2, mode="http", gateway_retry=True).config()
    assert "mode http" in plain and "http-reuse safe" in plain
    assert "retry-on" not in plain and "redispatch" not in plain and "retries" not in plain
    for line in ("retry-on conn-failure 503", "option redispatch 1", "option http-buffer-request", "retries 3"):
        assert f"    {line}\n" in retry
    with pytest.raises(ValueError, match="needs mode http"):
        HAProxy("/usr/sbin/haproxy", directory, slots=2, gateway_retry=True)


def test_example_server_takes_an_explicit_false_for_admission() -> None:
    from examples.server._config import drain_options_from_env

    assert drain_options_from_env({"GRACEFUL_EXAMPLE_ADMIT_DURING_PROPAGATION": "false"}) == {
        "admit_during_propagation": False
    }
    assert drain_options_from_env({"GRACEFUL_EXAMPLE_ADMIT_DURING_PROPAGATION": "true"}) == {
        "admit_during_propagation": True
    }
    assert drain_options_from_env({}) == {}


def test_cli_gateway_retry_needs_an_l7_balancer() -> None:
    result = CliRunner().invoke(rollout_command, ["--balancer", "forwarder", "--gateway-retry"])
    assert result.exit_code == 2
    assert "--gateway-retry" in result.output and "--balancer nginx" in result.output
    assert "Traceback" not in result.output


def test_cli_bad_duration_is_one_line() -> None:
    result = CliRunner().invoke(rollout_command, ["--grace-period", "soon"])
    assert result.exit_code == 2
    assert "'soon' is not a duration" in result.output
    assert "Traceback" not in result.output


async def test_quick_rollout_graceful_loses_nothing() -> None:
    """1. baseline: plain uvicorn, no preStop 2. graceful: graceful run + preStop drain, same traffic
    3. the graceful side has no ambiguous, truncated or duplicated request and no SIGKILL
    4. the baseline ran through the same rollout and shows in the table."""
    options = Options.resolve(quick=True, seed=7)
    with tempfile.TemporaryDirectory(prefix="g-logs-") as logs:
        baseline = await run_side("baseline", options, log_dir=logs, log=lambda line: None)
        graceful = await run_side("graceful", options, log_dir=logs, log=lambda line: None)
    base, grace = side_summary(baseline, options), side_summary(graceful, options)
    assert grace["requests"] > 50 and grace["streams"] > 0
    assert grace["deletions"] == options.replicas * options.updates
    for reason in ("ambiguous", "truncated", "timeout", "http_error"):
        assert grace["by_reason"][reason] == 0, (reason, grace)
    assert grace["duplicates"] == 0 and grace["sigkills"] == 0
    assert grace["exit_max"] < options.grace_period
    assert grace["prestop_codes"] == [0] * grace["deletions"]
    assert expectations(grace, options) == []
    assert base["requests"] > 50 and base["deletions"] == grace["deletions"]
    assert base["prestop_codes"] == []
    table = render(base, grace, options)
    assert "baseline" in table and "graceful" in table and "SIGKILLed" in table


def test_losses_at_an_nginx_reload_are_told_apart() -> None:
    """A request lost without a response header while a reload's old workers exit counts as a
    reload loss; one lost later, or one that had its headers, does not; the promise is judged on the rest."""
    from graceful._soak._report import Attempt, RequestRecord, SoakReport

    def record(reason: str, end: float, *, headers: bool = False) -> RequestRecord:
        attempt = Attempt(reason=reason, start=end - 0.01, end=end, headers=headers)
        return RequestRecord("r", "k", "short", 2, start=end - 0.01, end=end, reason=reason, history=[attempt])

    records = [
        record("ok", 100.0),
        record("ambiguous", 100.2),  # while the old workers of the reload at 100.0 exit
        record("ambiguous", 103.0),  # long after it
        record("truncated", 100.3, headers=True),
    ]
    report = SoakReport(url="u", started=0.0, elapsed=1.0, records=records, settings={})
    side = SideResult(
        kind="graceful", balancer="nginx", report=report, terminations=[], budget_limit=8.0, connect_errors=0
    )
    side.reloads = [(100.0, 101.5)]
    assert reload_losses(side) == 1
    options = Options.resolve(scenario="strict-clients", quick=True, balancer="nginx")
    summary = side_summary(side, options)
    assert summary["reload_losses"] == 1
    broken = expectations(summary, options)
    assert "ambiguous=1 (not at a reload)" in broken and "truncated=1" in broken
    assert any(item.startswith("failed=2 ") for item in broken)
    assert "nginx reloads (endpoint changes)" in render(None, summary, options)
    side.reloads = []  # the Lua balancer: endpoint changes without a reload, and no reload rows
    assert reload_losses(side) == 0
    assert "nginx reloads" not in render(None, side_summary(side, options), options)


@pytest.mark.timeout(60)
async def test_the_baseline_is_uvicorn_without_a_drain() -> None:
    """1. a baseline replica (plain uvicorn, the example app, a 30 s propagation wait in its
    settings) is started and probed 2. SIGTERM with nothing in flight 3. it exits at once, as
    uvicorn does: the middleware inside the app did not take SIGTERM over to drain (which would
    keep it serving for the 30 s wait). The graceful side's replicas drain: see the rollouts."""
    from examples.rollout.replica import Replica, ReplicaSettings

    with tempfile.TemporaryDirectory(prefix="g-logs-") as logs:
        settings = ReplicaSettings(kind="baseline", grace_period=60, propagation_wait=30, log_dir=logs)
        assert settings.environment("b", logs)["GRACEFUL_DRAIN_ON_SIGTERM"] == "0"
        replica = Replica("b", settings)
        try:
            await replica.start()
            await replica.wait_started()
            replica.terminate()
            assert await replica.wait(15), "the baseline drained on SIGTERM instead of stopping"
            assert replica.returncode == -signal.SIGTERM  # uvicorn re-raises the signal once it has shut down
        finally:
            await replica.stop()


def test_vllm_options_replicas_and_traffic(monkeypatch: pytest.MonkeyPatch) -> None:
    """--vllm: the sizes for two cores (what the user sets wins), vllm serve for both sides (the
    middleware and graceful's environment on the graceful side only), exact-length traffic, and a
    one-line error for a scenario or a vLLM it cannot run with."""
    import sys

    from examples.rollout.vllm import MODEL_NAME, VllmSetup

    monkeypatch.setenv("GRACEFUL_VLLM", sys.executable)
    quick = Options.resolve(quick=True, vllm=True)
    assert (quick.replicas, quick.updates, quick.concurrency, quick.stream_tokens) == (1, 1, 6, (256, 1024))
    assert (quick.grace_period, quick.reserve, quick.propagation_wait) == (30.0, 5.0, 1.0)
    full = Options.resolve(vllm=True)
    assert (full.replicas, full.updates, full.concurrency, full.grace_period) == (2, 1, 12, 120.0)
    assert Options.resolve(quick=True, vllm=True, replicas=2, grace_period=40.0).replicas == 2
    assert all(c.model == MODEL_NAME and c.exact_length for c in quick.traffic("http://127.0.0.1:1"))
    assert not any(c.exact_length for c in Options.resolve(quick=True).traffic("http://127.0.0.1:1"))

    setup = VllmSetup(command="/opt/vllm/bin/vllm", model="/models/tiny")
    graceful = replace(quick, vllm_setup=setup).settings("graceful", "/tmp")
    baseline = replace(quick, vllm_setup=setup).settings("baseline", "/tmp")
    command = graceful.command(8000, "/tmp/sockets")
    assert command[:3] == ["/opt/vllm/bin/vllm", "serve", "/models/tiny"]
    assert command[-2:] == ["--middleware", "graceful.GracefulMiddleware"]
    assert "--middleware" not in baseline.command(8000, "/tmp/sockets")
    env = graceful.environment("g", "/tmp/sockets")
    assert (env["GRACEFUL_SOCKET_DIR"], env["GRACEFUL_GRACE_PERIOD"], env["GRACEFUL_RESERVE"]) == (
        "/tmp/sockets",
        "30",
        "5",
    )
    assert env["GRACEFUL_EXEMPT_PATHS"] == "/health,/metrics" and env["VLLM_TARGET_DEVICE"] == "cpu"
    assert "PYTHONPATH" not in env and "GRACEFUL_SOCKET_DIR" not in baseline.environment("b", "/tmp/s")
    assert (graceful.startup_path, baseline.startup_path) == ("/startup", "/health")

    with pytest.raises(ConfigError, match="--vllm: --scenario node-loss runs with the example server only"):
        Options.resolve(scenario="node-loss", vllm=True)
    monkeypatch.setenv("GRACEFUL_VLLM", "/nonexistent/vllm")
    with pytest.raises(ConfigError, match="no vllm command at /nonexistent/vllm; run bash scripts/setup-vllm"):
        Options.resolve(vllm=True)
    result = CliRunner().invoke(rollout_command, ["--vllm", "--quick"])
    assert result.exit_code == 2 and "no vllm command at /nonexistent/vllm" in result.output
    assert "Traceback" not in result.output


def test_vllm_strict_clients_promise_is_the_example_servers() -> None:
    """Inside vLLM the middleware pins the connections busy at the drain's start itself: strict
    clients admitting during the wait keep the example server's promise, 0 failed; refusing
    during it, explicit retryable 503s only."""
    from graceful._soak._report import Attempt, RequestRecord, SoakReport

    def side(*reasons: str) -> SideResult:
        records = []
        for reason in reasons:
            attempt = Attempt(reason=reason, start=1.0, end=2.0, headers=True, status=503)
            records.append(RequestRecord("r", "k", "short", 8, start=1.0, end=2.0, reason=reason, history=[attempt]))
        report = SoakReport(url="u", started=0.0, elapsed=1.0, records=records, settings={})
        return SideResult(
            kind="graceful", balancer="b", report=report, terminations=[], budget_limit=8, connect_errors=0
        )

    example = Options.resolve(scenario="strict-clients", quick=True)
    vllm = replace(example, vllm=True)
    refused = side("ok", "rejected_retryable")
    for options in (example, vllm):
        assert expectations(side_summary(refused, options), options) == ["failed=1 admitting during propagation"]
        refusing = replace(options, admit_during_propagation=False)
        assert expectations(side_summary(refused, refusing), refusing) == []
    broken = expectations(side_summary(side("ok", "rejected_retryable", "ambiguous"), vllm), vllm)
    assert broken == ["ambiguous=1", "failed=2 admitting during propagation"]


def test_envoy_options_need_envoy_and_agree_with_gateway_retry() -> None:
    """--envoy-retry and --active-hc configure Envoy only; --gateway-retry is Envoy's not-started
    profile, and a different --envoy-retry beside it is refused; which profiles retry refusals."""
    with pytest.raises(ConfigError, match="--envoy-retry configures Envoy; add --balancer envoy"):
        Options.resolve(balancer="nginx", envoy_retry="istio")
    with pytest.raises(ConfigError, match="--active-hc configures Envoy"):
        Options.resolve(active_hc=True)
    with pytest.raises(ConfigError, match="--gateway-retry is --envoy-retry not-started with Envoy, not istio"):
        Options.resolve(balancer="envoy", gateway_retry=True, envoy_retry="istio")
    retrying = {
        profile: Options.resolve(balancer="envoy", envoy_retry=profile).retries_refusals
        for profile in ("none", "istio", "istio-503", "not-started")
    }
    assert retrying == {"none": False, "istio": False, "istio-503": True, "not-started": True}
    assert Options.resolve(balancer="envoy", gateway_retry=True).retries_refusals


def test_cli_envoy_retry_without_envoy_is_a_usage_error() -> None:
    result = CliRunner().invoke(rollout_command, ["--envoy-retry", "istio"])
    assert result.exit_code == 2 and "add --balancer envoy" in result.output
