"""Two example-server replicas behind the rollout demo's balancer (HAProxy), for the resume tests.

The replicas run in this event loop under real uvicorn servers on sockets bound to
port 0 (no port race); the balancer is ``examples/rollout/balancer.py``.
"""

from __future__ import annotations

import contextlib
import socket
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
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    done = anyio.Event()

    async def serve() -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve)
        with anyio.fail_after(10):
            while app.drain.state is not State.SERVING:  # the app's own state: no probe polling
                if done.is_set():
                    raise RuntimeError(f"replica {name} failed to start")
                await anyio.sleep(0.01)
        try:
            yield Replica(name, app, port, server)
        finally:
            server.should_exit = True
            server.force_exit = True
            with anyio.move_on_after(5):
                await done.wait()
            tg.cancel_scope.cancel()
            sock.close()


@contextlib.asynccontextmanager
async def service(*replicas: Replica) -> AsyncIterator[HAProxy]:
    """HAProxy (the demo's balancer) in front of ``replicas``."""
    async with open_balancer("haproxy", slots=4) as balancer:
        assert isinstance(balancer, HAProxy)
        for one in replicas:
            await balancer.add(one.name, one.port)
        yield balancer
