import httpx

import graceful

upstream = httpx.AsyncClient(
    base_url="http://vllm.serving:8000",
    transport=graceful.AsyncResumingTransport(httpx.AsyncHTTPTransport(retries=0)),
    timeout=httpx.Timeout(connect=5, read=60, write=10, pool=5),
)
