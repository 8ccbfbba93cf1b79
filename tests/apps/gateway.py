"""A tiny app for the gateway tests (loaded by import string): it names the connection it answered on."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route


async def completions(request: Request) -> Response:
    await request.body()  # read it all, as an inference server does
    client = request.client
    return PlainTextResponse(str(client.port if client else 0))


app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
