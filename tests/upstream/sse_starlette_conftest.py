"""Fixtures for sse-starlette's own tests, which its sdist ships without their ``conftest.py``.

``scripts/upstream-suites`` copies this file to ``tests/conftest.py`` in the extracted sdist before
both runs, plain and wrapped alike. The sdist ships only ``tests/test_*.py``: the repository's
manifest is named ``Manifest.in``, which setuptools does not read. Written here from what those
test files ask of their fixtures (sse-starlette 3.7.1's ``tests/test_sse.py``,
``tests/test_issue167.py`` and the tests that reset its shutdown state):

- ``app``: a Starlette app with a lifespan, ``/`` answering ``Hello, world!`` and ``/endless``
  streaming an event every 0.3 s until the client leaves, which it logs ("Disconnected from
  client");
- ``httpx_client``: an ``httpx2.AsyncClient`` on that app (the suite's own HTTP client);
- ``anyio_backend``: asyncio only;
- an autouse reset of sse-starlette's process-wide shutdown state (``AppStatus`` and the
  per-thread watcher), before and after each test, without which state leaks between tests.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
import httpx2
import pytest
from asgi_lifespan import LifespanManager
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

_log = logging.getLogger(__name__)


def _reset_sse_shutdown_state(should_exit: bool) -> None:
    from sse_starlette.sse import AppStatus, _thread_state

    AppStatus.should_exit = should_exit
    AppStatus.enable_automatic_graceful_drain = True
    if hasattr(_thread_state, "shutdown_state"):
        del _thread_state.shutdown_state


@pytest.fixture(autouse=True)
def fresh_sse_shutdown_state() -> Iterator[None]:
    _reset_sse_shutdown_state(False)
    yield
    _reset_sse_shutdown_state(True)  # a watcher still running stops


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def app() -> AsyncIterator[Starlette]:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield

    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("Hello, world!")

    async def endless(request: Request) -> EventSourceResponse:
        async def numbers() -> AsyncIterator[dict[str, int]]:
            try:
                for number in itertools.count(1):
                    yield {"data": number}
                    await anyio.sleep(0.3)
            except anyio.get_cancelled_exc_class():
                # test_disconnect_whenClientDisconnects_thenHandlesGracefully looks for this line.
                _log.info("Disconnected from client %s", request.client)
                raise

        return EventSourceResponse(numbers())

    served = Starlette(routes=[Route("/", hello), Route("/endless", endless)], lifespan=lifespan)
    async with LifespanManager(served):
        yield served


@pytest.fixture
async def httpx_client(app: Starlette) -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://localhost:8000") as client:
        yield client
