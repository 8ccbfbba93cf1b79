# ruff: noqa: E402 (the page shows the part from the graceful import on)
"""docs/middleware.md's FastAPI example: the Drain made at import and passed to add_middleware."""

from fastapi import FastAPI

app = FastAPI()


@app.post("/generate")
async def generate():
    return {"text": "tokens"}


# fmt: off
# --8<-- [start:drain]
from graceful import Drain, GracefulMiddleware

drain = Drain(grace_period=120, propagation_wait="10s")   # the drain options
app.add_middleware(GracefulMiddleware, drain=drain, metrics_path="/metrics")   # the middleware's own
# --8<-- [end:drain]
# fmt: on
