# ruff: noqa: E402 (the README shows the part from the graceful import on)
"""README's "Use it in your server", whole: a small inference app that streams tokens, wrapped in
GracefulMiddleware. Saved as myapp.py, it is the app of the README's "Run it" line (run.sh)."""

import asyncio

from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route


async def generate(request):
    """POST /generate streams tokens as server-sent events, one every 0.1 s (20, or ?tokens=N)."""
    count = int(request.query_params.get("tokens", "20"))

    async def tokens():
        for i in range(1, count + 1):
            await asyncio.sleep(0.1)
            yield f"data: token {i}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(tokens(), media_type="text/event-stream")


inference_app = Starlette(routes=[Route("/generate", generate, methods=["POST"])])

# fmt: off
# --8<-- [start:wrap]
from graceful import GracefulMiddleware

app = GracefulMiddleware(
    inference_app,            # any ASGI app: Starlette, FastAPI, a vLLM-style server
    grace_period=90,          # the pod's terminationGracePeriodSeconds
    propagation_wait="10s",   # how long load balancers take to forget this endpoint
)
# --8<-- [end:wrap]
# fmt: on
