"""Two example-server replicas behind the rollout demo's balancer (HAProxy), for the resume tests.

The replicas run in this event loop under real uvicorn servers on sockets bound to
port 0 (no port race); the balancer is ``examples/rollout/balancer.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import uvicorn
from prometheus_client import CollectorRegistry

from examples.rollout.balancer import HAProxy, open_balancer
from examples.server import Config, ExampleServer, create_app
from examples.server._openai import token_text
from graceful import State
from tests.utils import run_uvicorn

TOKENS_PER_SECOND = 40.0


def expected_text(count: int, start: int = 0) -> str:
    """What the example server's deterministic "model" says in ``count`` tokens."""
    return "".join(token_text(i) for i in range(start, start + count))


@dataclass
class Replica:
    name: str
    app: ExampleServer
    port: int
    server: uvicorn.Server


@contextlib.asynccontextmanager
async def replica(name: str, *, token_word: str = "tok", slots: int = 32, **options: Any) -> AsyncIterator[Replica]:
    """One example server under uvicorn on 127.0.0.1, SERVING when yielded; ``options`` go to the middleware.

    ``slots`` is the example engine's concurrency: requests past it queue before their response starts.
    """
    options.setdefault("grace_period", 30)
    options.setdefault("propagation_wait", 0.2)
    config = Config(tokens_per_second=TOKENS_PER_SECOND, load_delay=0.0, slots=slots, token_word=token_word)
    app = create_app(config, registry=CollectorRegistry(), name=name, admin=False, **options)
    async with run_uvicorn(app, lifespan="on") as server:
        with anyio.fail_after(10):
            while app.drain.state is not State.SERVING:  # the app's own state (its model loads): no probe
                await anyio.sleep(0.01)
        try:
            yield Replica(name, app, server.port, server)
        finally:
            server.force_exit = True  # streams still open end with the replica, as a killed pod's do


@contextlib.asynccontextmanager
async def service(*replicas: Replica) -> AsyncIterator[HAProxy]:
    """HAProxy (the demo's balancer) in front of ``replicas``."""
    async with open_balancer("haproxy", slots=4) as balancer:
        assert isinstance(balancer, HAProxy)
        for one in replicas:
            await balancer.add(one.name, one.port)
        yield balancer
