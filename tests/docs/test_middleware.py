"""docs/middleware.md's examples, run: the wrapped app and the FastAPI app under a real server with the
preStop drain, the queue consumer a drain waits for, and the Python API listing."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from graceful import Drain, DrainResult, State
from tests.servers import Launched
from tests.utils import ROOT

QUEUE_CONSUMER = Path(ROOT) / "docs_src/middleware/queue_consumer.py"
PYTHON_API = Path(ROOT) / "docs_src/middleware/python_api.py"
APPS = {"wrap": "docs_src/middleware/wrap.py", "fastapi_drain": "docs_src/middleware/fastapi_drain.py"}


def graceful(*args: str, socket_dir: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GRACEFUL_SOCKET_DIR": socket_dir}
    return subprocess.run(
        [sys.executable, "-m", "graceful", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("name", "server"), [("wrap", "uvicorn"), ("wrap", "graceful-run"), ("fastapi_drain", "uvicorn")]
)
def test_the_app_serves_and_the_prestop_drain_refuses_after_it(
    name: str, server: str, socket_dir: str, tmp_path: Path
) -> None:
    """1. the page's app under a real server (``uvicorn module:app``, ``graceful run module:app``)
    2. it serves, and its graceful_* metrics at ``/metrics`` 3. ``graceful status --json``: the
    budget in force is the code's, grace 120 s and a 10 s wait 4. the preStop ``graceful drain``
    (its own wait shortened to 0 s here) exits 0 5. a new request gets the not-started 503."""
    folder = str(Path(APPS[name]).parent)
    launched = Launched(server, f"{name}:app", ("--app-dir", folder), socket_dir, tmp_path / "server.log")
    try:
        launched.wait_ready()
        assert httpx.post(launched.url("/generate"), timeout=10).status_code == 200
        metrics = httpx.get(launched.url("/metrics"), timeout=10)
        assert metrics.status_code == 200 and "graceful_requests_total" in metrics.text, metrics.text[:300]

        status = graceful("status", "--json", socket_dir=socket_dir)
        assert status.returncode == 0, status.stderr
        (worker,) = json.loads(status.stdout)
        budget = worker["budget"]
        assert (budget["grace_period"], budget["propagation_wait"]) == (120.0, 10.0)

        drained = graceful("drain", "--propagation-wait", "0s", socket_dir=socket_dir)
        assert drained.returncode == 0, drained.stderr
        refused = httpx.post(launched.url("/generate"), timeout=10)
        assert (refused.status_code, refused.headers.get("x-graceful-not-started")) == (503, "1")
    finally:
        launched.stop()


def load(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.anyio
async def test_the_queue_consumer_finishes_its_job_and_takes_no_more() -> None:
    """1. the consumer takes a job 2. a drain begins while it runs 3. the job ends: the drain reports
    drained, and the consumer stops without taking the next job."""
    module = load(QUEUE_CONSUMER)
    started, finish = anyio.Event(), anyio.Event()

    async def run(job: float) -> None:  # the page's run(), held until the test lets it end
        started.set()
        await finish.wait()

    module.run = run
    drain = Drain(grace_period=30)
    drain.mark_serving()
    queue: asyncio.Queue[float] = asyncio.Queue()
    for job in (1, 2):
        queue.put_nowait(job)
    result: list[DrainResult] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(module.consumer, queue, drain)
            await started.wait()
            assert drain.in_flight == 1

            async def drained() -> None:
                result.append(await drain.drain())

            tg.start_soon(drained)
            await anyio.wait_all_tasks_blocked()
            assert drain.state is State.DRAINING and not drain.accepting and not result
            finish.set()
    assert result[0].result == "drained" and result[0].in_flight == 0
    assert queue.qsize() == 1, "the consumer took a job after the drain began"


@pytest.mark.anyio
async def test_a_tracked_job_is_cut_at_the_deadline_and_counted() -> None:
    """At the deadline a tracked block is cancelled and counted as truncated (the page's sentence)."""
    module = load(QUEUE_CONSUMER)
    drain = Drain(grace_period=2, reserve=1)  # a drain limit of 1 s
    drain.mark_serving()
    queue: asyncio.Queue[float] = asyncio.Queue()
    queue.put_nowait(60)  # a job of a minute
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(module.consumer, queue, drain)
            while drain.in_flight == 0:
                await anyio.sleep(0)  # until the consumer has taken the job: a few loop turns
            result = await drain.drain()
    assert result.result == "timeout"
    assert sum(drain.counters()["truncated"].values()) == 1, drain.counters()


@pytest.mark.anyio
async def test_the_python_api_listing_runs_call_after_call() -> None:
    """The listing runs top to bottom, as ``python -m asyncio`` runs it: the drain it awaits ends
    drained by the quiet rule, the listener hears every change, and it ends STOPPED after FAILED."""
    code = compile(PYTHON_API.read_text(), str(PYTHON_API), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace: dict[str, Any] = {"__name__": "python_api"}
    with anyio.fail_after(10):
        await eval(code, namespace)  # a coroutine: the file awaits at top level
    app, result = namespace["app"], namespace["result"]
    assert result.result == "drained" and result.propagation_ended_by == "quiet"
    # mark_serving, the drain's start and its result, resume, begin_drain, mark_failed, mark_stopped
    D, S = State.DRAINING, State.SERVING
    assert namespace["changes"] == [S, D, D, S, D, State.FAILED, State.STOPPED]
    assert app.drain.state is State.STOPPED and app.drain.failure.reason == "engine_dead"
    assert app.drain.counters()["failures"] == {"engine_dead": 1}
