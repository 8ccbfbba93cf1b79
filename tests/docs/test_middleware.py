"""docs/middleware.md's examples, run: the queue consumer a drain waits for, and the Python API listing."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import types
from pathlib import Path
from typing import Any

import anyio
import pytest

from graceful import Drain, DrainResult, State
from tests.utils import ROOT

pytestmark = pytest.mark.anyio

QUEUE_CONSUMER = Path(ROOT) / "docs_src/middleware/queue_consumer.py"
PYTHON_API = Path(ROOT) / "docs_src/middleware/python_api.py"


def load(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
