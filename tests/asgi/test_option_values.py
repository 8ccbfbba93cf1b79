"""Good values of the options in the forms docs/middleware.md ("Options", "From the environment") allows,
each honoured: ``none`` in a variable, the group socket mode, a builtin check, and one more bad value."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry

from graceful import ConfigError, GracefulMiddleware
from graceful._asgi._types import Receive, Scope, Send
from graceful._drain._environ import PREFIX

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def no_graceful_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(PREFIX):
            monkeypatch.delenv(name)


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            done = "startup" if message["type"] == "lifespan.startup" else "shutdown"
            await send({"type": f"lifespan.{done}.complete"})
            if done == "shutdown":
                return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def get(mw: GracefulMiddleware, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw), base_url="http://app") as client:
        return await client.get(path)


async def test_none_in_the_request_id_variable_echoes_no_header(monkeypatch: pytest.MonkeyPatch) -> None:
    """GRACEFUL_REQUEST_ID_HEADER=none: no header is echoed or generated, on a response or a refusal."""
    monkeypatch.setenv("GRACEFUL_REQUEST_ID_HEADER", "none")
    mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False)
    mw.drain.mark_serving()
    served = await get(mw, "/v1/models")
    mw.drain.begin_drain("test", propagation_wait=0)
    refused = await get(mw, "/v1/models")
    assert (served.status_code, refused.status_code) == (200, 503)
    for response in (served, refused):
        assert "none" not in response.headers and "x-request-id" not in response.headers


@pytest.mark.parametrize("variable", ["GRACEFUL_MAX_IN_FLIGHT", "GRACEFUL_REJECT_OVER"])
async def test_none_in_a_limit_variable_is_no_limit(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(variable, "none")
    mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False)
    mw.drain.mark_serving()
    async with mw.drain.track():
        assert (await get(mw, "/ready")).status_code == 200
        assert (await get(mw, "/v1/models")).status_code == 200


async def test_the_group_socket_mode_given_in_code_is_the_admin_sockets_mode(socket_dir: str) -> None:
    mw = GracefulMiddleware(app, registry=CollectorRegistry(), socket_dir=socket_dir, socket_mode=0o660)
    async with LifespanManager(mw):
        (sock,) = [path for path in Path(socket_dir).iterdir() if path.suffix == ".sock"]
        assert stat.S_IMODE(sock.stat().st_mode) == 0o660


async def test_a_builtin_check_without_a_signature_is_taken_on_trust() -> None:
    """live_check is a plain function of no arguments; a builtin whose signature cannot be read
    (time.monotonic) is taken as one, and /live follows what it returns."""
    mw = GracefulMiddleware(app, registry=CollectorRegistry(), admin=False, live_check=time.monotonic)
    assert (await get(mw, "/live")).status_code == 200


def test_a_variable_naming_something_that_is_not_a_function_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRACEFUL_LIVE_CHECK", "os:sep")
    with pytest.raises(ConfigError) as refused:
        GracefulMiddleware(app, registry=CollectorRegistry(), admin=False)
    # One line: the variable, the value as set, and the fix.
    said = str(refused.value)
    assert said.startswith("environment variable GRACEFUL_LIVE_CHECK: 'os:sep' is not callable; ") and "\n" not in said
