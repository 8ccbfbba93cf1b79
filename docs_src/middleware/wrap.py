# ruff: noqa: E402 (the page shows the part from the graceful import on)
"""docs/middleware.md's first example: an app wrapped in GracefulMiddleware, served by any ASGI server."""

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route


async def generate(request):
    return PlainTextResponse("tokens")


inference_app = Starlette(routes=[Route("/generate", generate, methods=["POST"])])

# fmt: off
# --8<-- [start:wrap]
from graceful import GracefulMiddleware

app = GracefulMiddleware(
    inference_app,            # any ASGI app: Starlette, FastAPI, a vLLM-style server
    grace_period=120,         # the pod's terminationGracePeriodSeconds (or env GRACEFUL_GRACE_PERIOD)
    propagation_wait="10s",   # how long load balancers take to forget this endpoint
    metrics_path="/metrics",  # serve graceful_* metrics here (off unless set)
)
# --8<-- [end:wrap]
# fmt: on
