import asyncio

from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from graceful import GracefulMiddleware


async def tokens():
    for i in range(1, 21):
        await asyncio.sleep(0.5)
        yield f"data: token {i}\n\n"
    yield "data: [DONE]\n\n"


async def generate(request):
    return StreamingResponse(tokens(), media_type="text/event-stream")


app = GracefulMiddleware(
    Starlette(routes=[Route("/generate", generate, methods=["POST"])]),
    propagation_wait="2s",  # keep serving new requests for 2 s after the drain starts
)
