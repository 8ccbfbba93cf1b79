"""The multi-process mirror: workers' plain counters reach prometheus-client's shared files.

Each worker is a real process (prometheus-client picks its multi-process value class at
import, from PROMETHEUS_MULTIPROC_DIR, so this cannot run in the test process).
"""

from __future__ import annotations

import os
import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

WORKER = """
import anyio, json, sys
from graceful import Drain
from graceful._asgi._metrics import MultiprocessMirror
from graceful._drain._state import core

drain = Drain(grace_period=10, reserve=2)
mirror = MultiprocessMirror(drain)
drain.mark_serving()

async def main():
    for _ in range(int(sys.argv[1])):
        async with drain.track():
            pass
    core(drain).count_rejected("server_draining")
    if sys.argv[2] == "drain":
        await drain.drain(timeout=1)
    mirror.sync()
    mirror.sync()  # a second push must not double-count

anyio.run(main)
"""

RENDER = """
from graceful._asgi._metrics import render
import os
body, content_type = render(None, os.environ["PROMETHEUS_MULTIPROC_DIR"])
print(content_type)
print(body.decode())
"""


def run(code: str, *args: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_counters_add_up_and_gauges_sum_live_workers(socket_dir: str) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": socket_dir}
    run(WORKER, "3", "serve", env=env)
    run(WORKER, "5", "drain", env=env)
    content_type, page = run(RENDER, env=env).split("\n", 1)
    assert content_type.startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }
    assert samples[("graceful_requests_total", (("outcome", "completed"),))] == 8.0
    assert samples[("graceful_rejected_total", (("reason", "server_draining"),))] == 2.0
    assert samples[("graceful_drains_total", (("result", "drained"),))] == 1.0
    assert samples[("graceful_drain_duration_seconds_count", ())] == 1.0
    # The drain's propagation phase (0 s wait, no new request) ended once: one sample of 0 s.
    assert samples[("graceful_propagation_seconds_count", ())] == 1.0
    assert samples[("graceful_propagation_seconds_bucket", (("le", "0.0"),))] == 1.0
    # livesum: one worker ended SERVING, the other DRAINING (no mark_process_dead was called).
    assert samples[("graceful_state", (("state", "SERVING"),))] == 1.0
    assert samples[("graceful_state", (("state", "DRAINING"),))] == 1.0
    assert samples[("graceful_in_flight", ())] == 0.0
    assert any(name.startswith("gauge_livesum") for name in os.listdir(socket_dir))


LIFESPAN_WORKER = """
import anyio
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from graceful import GracefulMiddleware
from graceful._asgi._metrics import render
from graceful._drain._state import core

async def app(scope, receive, send):
    while True:
        message = await receive()
        await send({"type": message["type"] + ".complete"})
        if message["type"] == "lifespan.shutdown":
            return

async def main():
    mw = GracefulMiddleware(app, admin=False, registry=CollectorRegistry(), grace_period=10, reserve=2)
    async with LifespanManager(mw):
        async with mw.drain.track():
            pass
        # Nobody calls sync(): the lifespan's mirror loop pushes within a second.
        with anyio.fail_after(5):
            while b'graceful_requests_total{outcome="completed"} 1.0' not in render(None, mw.multiprocess_dir)[0]:
                await anyio.sleep(0.1)
    print("pushed")

anyio.run(main)
"""


def test_the_lifespan_pushes_once_a_second_without_a_scrape(socket_dir: str) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": socket_dir}
    assert run(LIFESPAN_WORKER, env=env).strip() == "pushed"
