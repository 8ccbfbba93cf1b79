import httpx
import openai

import graceful

URL = "http://vllm.serving:8000/v1"  # the Service (or balancer) in front of the replicas

client = openai.OpenAI(base_url=URL, http_client=httpx.Client(transport=graceful.ResumingTransport()))
aclient = openai.AsyncOpenAI(base_url=URL, http_client=httpx.AsyncClient(transport=graceful.AsyncResumingTransport()))
