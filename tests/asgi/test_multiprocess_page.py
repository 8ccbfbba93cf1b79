"""Multi-process mode in this process (docs/metrics.md, "Multi-process mode").

prometheus-client picks its multi-process value class once, at import, from
``PROMETHEUS_MULTIPROC_DIR``: each test sets the variable and picks the class again as that import
would (``prometheus_client.values.get_value_class``), so this process writes the shared files as a
worker does. tests/asgi/test_multiprocess_metrics.py adds up several real worker processes.
"""

from __future__ import annotations

import gc
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry, generate_latest, multiprocess, values
from prometheus_client.parser import text_string_to_metric_families

from graceful import GracefulMiddleware
from graceful._asgi._types import Receive, Scope, Send

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def shared_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A multi-process directory, and prometheus-client writing to it as under PROMETHEUS_MULTIPROC_DIR."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.get_value_class())
    yield tmp_path
    monkeypatch.undo()
    # The shared files stay open in the metrics made here until they are collected: close them now.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            done = "startup" if message["type"] == "lifespan.startup" else "shutdown"
            await send({"type": f"lifespan.{done}.complete"})
            if done == "shutdown":
                return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def samples_of(page: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }


async def test_the_metrics_path_serves_the_page_merged_from_the_shared_files(shared_files: Path) -> None:
    """1. a worker in multi-process mode serves 3 requests 2. a drain, and a request refused during it
    3. its metrics_path serves prometheus-client's merged page: the counts, the drain and the state,
    scraped twice without counting twice 4. an app's own MultiProcessCollector reads the same values."""
    mw = GracefulMiddleware(
        app, registry=CollectorRegistry(), admin=False, metrics_path="/metrics", grace_period=30, reserve=5
    )
    async with LifespanManager(mw):
        transport = httpx.ASGITransport(app=mw)
        async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
            for _ in range(3):
                assert (await client.get("/v1/models")).status_code == 200
            with anyio.fail_after(10):
                result = await mw.drain.drain(propagation_wait=0)
            assert result.drained
            assert (await client.get("/v1/models")).status_code == 503
            first = await client.get("/metrics")
            second = await client.get("/metrics")
    assert first.headers["content-type"].startswith("text/plain")
    assert any(name.startswith("gauge_livesum") for name in os.listdir(shared_files))
    for page in (first.text, second.text):
        samples = samples_of(page)
        assert samples[("graceful_requests_total", (("outcome", "completed"),))] == 3.0
        assert samples[("graceful_rejected_total", (("reason", "server_draining"),))] == 1.0
        assert samples[("graceful_drains_total", (("result", "drained"),))] == 1.0
        assert samples[("graceful_drain_duration_seconds_count", ())] == 1.0
        assert samples[("graceful_state", (("state", "DRAINING"),))] == 1.0
        assert samples[("graceful_state", (("state", "SERVING"),))] == 0.0
        assert samples[("graceful_in_flight", ())] == 0.0
    # The app's own page, as prometheus-client documents for this mode: graceful's values through the files.
    own = CollectorRegistry()
    multiprocess.MultiProcessCollector(own)  # type: ignore[no-untyped-call]
    samples = samples_of(generate_latest(own).decode())
    assert samples[("graceful_requests_total", (("outcome", "completed"),))] == 3.0
    # After the shutdown the worker counts as STOPPED.
    assert samples[("graceful_state", (("state", "STOPPED"),))] == 1.0


async def test_the_request_durations_stay_out_of_the_shared_files(shared_files: Path) -> None:
    """graceful_request_duration_seconds is not copied (its counts are per bucket): the merged page has
    none, while the worker's own registry has them."""
    registry = CollectorRegistry()
    mw = GracefulMiddleware(app, registry=registry, admin=False, metrics_path="/metrics", grace_period=30, reserve=5)
    mw.drain.mark_serving()
    transport = httpx.ASGITransport(app=mw)
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
        assert (await client.get("/v1/models")).status_code == 200
        page = (await client.get("/metrics")).text
    assert "graceful_requests_total" in page
    assert "graceful_request_duration_seconds" not in page
    assert "graceful_request_duration_seconds" in generate_latest(registry).decode()
