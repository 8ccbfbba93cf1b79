"""Resume inside LiteLLM's proxy: every caller of an opted-in deployment reads one unbroken stream.

In the proxy's ``config.yaml``::

    litellm_settings:
      callbacks: ["graceful.integrations.litellm.handler"]
    model_list:
      - model_name: llama
        litellm_params: {model: hosted_vllm/llama, api_base: http://vllm.serving:8000/v1}
        model_info: {graceful_resume: true}

For a deployment whose ``model_info`` says ``graceful_resume: true``, each streamed chat, completion
or Responses request goes out through ``AsyncResumingTransport`` wrapped around the transport LiteLLM
itself would have built for it (its aiohttp transport over the proxy's shared session, or httpx's
where LiteLLM is set so): the request is marked ``x-graceful-resumable: 1``, and a stream a replica
cuts (a drain's handoff or deadline, a crash, an engine that died) is continued on another replica
before LiteLLM sees anything but one stream. Every other deployment's traffic is left to LiteLLM
as it is. A Responses call that LiteLLM sends to the deployment's own ``/v1/responses`` (its native
path) is continued as a Responses stream; one it bridges to a chat call (``use_chat_completions_api``)
comes through here again as that chat call. docs/litellm.md says what it covers and how LiteLLM's
timeouts apply.

The seam is LiteLLM's ``async_pre_call_deployment_hook``, awaited for every attempt after the router
has picked a deployment (retries and fallbacks included, each for its own deployment): the hook
hands LiteLLM the client to use through the call's own ``client`` argument. It never replaces a
client someone else chose.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import Any

import httpx
import litellm
import openai
from litellm.integrations.custom_logger import CustomLogger
from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler, get_ssl_configuration, http2_enabled
from litellm.llms.openai.workload_identity import openai_static_api_key
from litellm.secret_managers.main import get_secret_bool, get_secret_str

from .._resume._transport import AsyncResumingTransport

__all__ = ["OPT_IN", "ResumeHandler", "handler", "opted_in"]

# The key of a deployment's model_info that turns resume on for it.
OPT_IN = "graceful_resume"
# The calls that stream chat or completions (LiteLLM's CallTypes values).
_STREAMING_CALLS = frozenset({"acompletion", "atext_completion"})
# A Responses call: resumed here where LiteLLM sends it to the deployment's own /v1/responses. Where it
# bridges it to a chat call, that chat call comes through this hook itself, as "acompletion".
_RESPONSES = "aresponses"
# How a deployment asks LiteLLM for its Responses-to-chat bridge: the flag in its litellm_params, or this
# prefix on its model (litellm/responses/main.py).
_BRIDGE_FLAG = "use_chat_completions_api"
_BRIDGE_PREFIX = "openai/chat_completions/"
# Where LiteLLM's own OpenAI client goes when a deployment names no api_base (litellm/main.py).
_OPENAI_BASE = "https://api.openai.com/v1"


def opted_in(model_info: object) -> bool:
    """Whether a deployment's ``model_info`` turns graceful's resume on (``graceful_resume: true``)."""
    return isinstance(model_info, dict) and model_info.get(OPT_IN) is True


class ResumeHandler(CustomLogger):  # type: ignore[misc]  # LiteLLM is not typed for mypy here
    """LiteLLM's callback that sends an opted-in deployment's streams through graceful's resuming transport.

    One client per event loop, provider, endpoint, key and TLS setting is made on first use and
    kept, as LiteLLM keeps its own.
    """

    def __init__(self) -> None:
        super().__init__()
        self._clients: dict[tuple[object, ...], Any] = {}

    async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any) -> dict[str, Any] | None:
        if (
            not opted_in(kwargs.get("model_info"))
            or kwargs.get("client") is not None
            or kwargs.get("stream") is not True
        ):
            return None
        call = getattr(call_type, "value", call_type)
        if call not in _STREAMING_CALLS and not (call == _RESPONSES and not _bridged(kwargs)):
            return None
        client = self._client_for(kwargs, call)
        if client is None:
            return None
        kwargs["client"] = client
        return kwargs

    def _client_for(self, kwargs: dict[str, Any], call: str) -> Any:
        """A client like the one LiteLLM would make for this call, its transport wrapped; None to leave it."""
        _, provider, _, found_base = litellm.get_llm_provider(
            model=kwargs["model"],
            custom_llm_provider=kwargs.get("custom_llm_provider"),
            api_base=kwargs.get("api_base"),
        )
        if provider not in ("hosted_vllm", "openai"):
            return None
        ssl_verify = kwargs.get("ssl_verify")
        session = kwargs.get("shared_session")
        if call == "atext_completion" or (
            call == "acompletion"
            and provider == "openai"
            and not get_secret_bool("EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER")
        ):
            # These calls go through the openai SDK, which takes its endpoint and key from the client it is
            # given: openai/'s chat calls (litellm/llms/openai/openai.py) and every text completion, of
            # hosted_vllm/ too (litellm/main.py sends openai_text_completion_compatible_providers' to
            # litellm/llms/openai/completion/handler.py).
            api_base = (
                kwargs.get("api_base")
                or found_base
                or litellm.api_base
                or get_secret_str("OPENAI_BASE_URL")
                or get_secret_str("OPENAI_API_BASE")
                or _OPENAI_BASE
            )
            api_key = openai_static_api_key(kwargs.get("api_key"))
            organization = kwargs.get("organization")
            retries = kwargs.get("max_retries")
            retries = (
                retries if isinstance(retries, int) and not isinstance(retries, bool) else openai.DEFAULT_MAX_RETRIES
            )
            # Keyed as LiteLLM keys its own clients (litellm/llms/openai/common_utils.py): it may set
            # max_retries on the client it is given, so a client serves one setting.
            key = _key(provider, api_base, api_key, organization, retries, ssl_verify)
            if key not in self._clients:
                transport = AsyncResumingTransport(_inner(ssl_verify, session))
                http = httpx.AsyncClient(transport=transport, follow_redirects=True)
                self._clients[key] = openai.AsyncOpenAI(  # the SDK takes an httpx client as well as httpx2's
                    api_key=api_key,
                    base_url=api_base,
                    organization=organization,
                    max_retries=retries,
                    http_client=http,  # type: ignore[arg-type]
                )
            return self._clients[key]
        # LiteLLM's own HTTP handler (litellm/llms/custom_httpx/llm_http_handler.py) takes a handler as the
        # call's client and sends to the deployment's api_base itself: hosted_vllm/'s chat calls (and
        # openai/'s under EXPERIMENTAL_OPENAI_BASE_LLM_HTTP_HANDLER), and every native Responses call
        # (async_response_api_handler, which litellm/responses/main.py hands the call's client).
        key = _key(provider, ssl_verify)
        if key not in self._clients:
            self._clients[key] = AsyncHTTPHandler(transport=AsyncResumingTransport(_inner(ssl_verify, session)))
        return self._clients[key]


def _bridged(kwargs: dict[str, Any]) -> bool:
    """Whether LiteLLM bridges this Responses call to a chat call (which this hook then sees as one)."""
    model = kwargs.get("model")
    return bool(kwargs.get(_BRIDGE_FLAG)) or (isinstance(model, str) and model.startswith(_BRIDGE_PREFIX))


def _inner(ssl_verify: Any, session: Any) -> httpx.AsyncBaseTransport:
    """The transport LiteLLM's own factory builds for a call with these settings (by default its aiohttp
    transport over the proxy's shared session, which it does not own and never closes), with the TLS,
    client certificate and HTTP/2 settings LiteLLM's ``AsyncHTTPHandler.create_client`` reads."""
    http2 = http2_enabled()
    ssl = get_ssl_configuration(ssl_verify, http2=http2)
    cert = os.getenv("SSL_CERTIFICATE", litellm.ssl_certificate)  # LiteLLM's own setting, read as it reads it
    transport = AsyncHTTPHandler.create_async_transport(
        ssl_context=None if isinstance(ssl, (bool, str)) else ssl,
        ssl_verify=ssl if isinstance(ssl, bool) else None,
        shared_session=session,
        http2=http2,
        cert=cert,
    )
    return transport if transport is not None else httpx.AsyncHTTPTransport(verify=ssl, cert=cert, http2=http2)


def _key(*parts: object) -> tuple[object, ...]:
    """A cache key of the running loop and ``parts``, with secrets hashed rather than kept."""
    digest = tuple(hashlib.sha256(repr(part).encode()).hexdigest()[:16] for part in parts)
    return (id(asyncio.get_running_loop()), *digest)


# What litellm_settings.callbacks names: LiteLLM imports this module and takes this instance.
handler = ResumeHandler()
