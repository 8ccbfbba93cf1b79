"""The compatibility app's endpoints built with FastAPI and ``app.add_middleware(GracefulMiddleware, ...)``."""

from __future__ import annotations

import os

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from graceful import GracefulMiddleware

from .compat import DRAIN, tokens

app = FastAPI()


@app.post("/stream")
async def stream() -> StreamingResponse:
    return StreamingResponse(tokens(), media_type="text/event-stream")


@app.post("/short")
async def short() -> dict[str, int]:
    return {"pid": os.getpid()}


# A Drain passed in keeps a handle on it: FastAPI builds the middleware stack lazily.
app.add_middleware(GracefulMiddleware, drain=DRAIN, metrics_path="/metrics")
