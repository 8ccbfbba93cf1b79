# ruff: noqa: I001 (the README shows the part from the FastAPI import on)
"""README's FastAPI line, as a whole app: GracefulMiddleware added with add_middleware. The options its
code leaves unset come from graceful run's flags, else the GRACEFUL_* variables, else the defaults."""

import asyncio

from fastapi.responses import StreamingResponse

# --8<-- [start:add_middleware]
from fastapi import FastAPI

from graceful import GracefulMiddleware

app = FastAPI()
app.add_middleware(GracefulMiddleware, grace_period=90)
# --8<-- [end:add_middleware]


@app.post("/generate")
async def generate(tokens: int = 20):
    """Streams tokens as server-sent events, one every 0.1 s."""

    async def stream():
        for i in range(1, tokens + 1):
            await asyncio.sleep(0.1)
            yield f"data: token {i}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")
