"""``--gateway litellm``: a real LiteLLM proxy between the demo's clients and its balancer.

The proxy is the one ``bash scripts/setup-litellm`` makes (``.litellm/venv``), run as
``uvicorn litellm.proxy.proxy_server:app`` on 127.0.0.1 with a config the demo writes: one
deployment, ``openai/graceful-example`` at the balancer, opted in to graceful's resume
(``model_info: {graceful_resume: true}``, with ``graceful.integrations.litellm.handler`` in its
callbacks; docs/litellm.md). A stream a draining replica hands off, or its deadline ends, is
continued on another replica inside the proxy: the clients read one stream and run none of
graceful's code. LiteLLM refuses to start without a master key, so each proxy gets a fresh one,
which the clients send. It reads its shipped cost map (no network) and binds port 0; the port is
read back from uvicorn's ``running on`` line, as tests/litellm/proxy.py does.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import re
import secrets
import time
from collections.abc import AsyncIterator

import httpx

from graceful import ConfigError

from ..server import Config
from .processes import stop_group

__all__ = ["GATEWAYS", "GATEWAY_SCENARIOS", "MODEL", "LiteLLM", "check_gateway", "find_litellm", "open_gateway"]

GATEWAYS = ("litellm",)
# What --gateway runs: the scenarios whose clients need nothing but the gateway's API.
GATEWAY_SCENARIOS = ("default", "strict-clients")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = os.path.join(ROOT, ".litellm", "venv", "bin", "python")
MODEL = Config.model  # the example server's model name: the deployment's and the clients' ``model``
# The proxy loads its config and router in about 7 s on two cores, its import alone took 17 s beside the
# vllm tier, and one start in a fresh-clone CI run printed nothing for 90 s: a bound for a hang only.
START_LIMIT = 180.0
_RUNNING = re.compile(rb"running on http://127\.0\.0\.1:(\d+)")


def find_litellm() -> str:
    """The Python of ``.litellm/venv``; ConfigError naming the set-up script when it is missing."""
    if not os.access(PYTHON, os.X_OK):
        raise ConfigError(f"--gateway litellm: no LiteLLM at {PYTHON}; run bash scripts/setup-litellm")
    return PYTHON


def check_gateway(gateway: str, *, scenario: str, vllm: bool) -> None:
    """A gateway the demo cannot run is a usage error (ConfigError), before anything starts."""
    if gateway not in GATEWAYS:
        raise ConfigError(f"--gateway: {gateway!r} is not a gateway; use {' or '.join(GATEWAYS)}")
    if vllm:
        raise ConfigError(f"--gateway {gateway} runs in front of the example server's replicas; drop --vllm")
    if scenario not in GATEWAY_SCENARIOS:
        raise ConfigError(
            f"--gateway {gateway}: --scenario {scenario} needs the demo's own clients; "
            f"use --scenario {' or '.join(GATEWAY_SCENARIOS)} with --gateway, or drop --gateway"
        )
    find_litellm()


class LiteLLM:
    """One LiteLLM proxy process whose single deployment is the example model at ``api_base``."""

    def __init__(self, python: str, *, api_base: str, log_path: str) -> None:
        self.python = python
        self.api_base = api_base
        self.log_path = log_path
        self.config_path = os.path.splitext(log_path)[0] + ".config.yaml"
        self.key = f"sk-rollout-{secrets.token_hex(24)}"
        self.port = 0
        self.name = f"LiteLLM {_version(python)} proxy"
        self._process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """What every client sends: the proxy's master key."""
        return {"authorization": f"Bearer {self.key}"}

    def config(self) -> dict[str, object]:
        deployment = {
            "model_name": MODEL,
            "litellm_params": {"model": f"openai/{MODEL}", "api_base": self.api_base, "api_key": "unused"},
            "model_info": {"graceful_resume": True},
        }
        return {
            "model_list": [deployment],
            "litellm_settings": {"callbacks": ["graceful.integrations.litellm.handler"]},
        }

    async def start(self, limit: float = START_LIMIT) -> None:
        """Start the proxy and wait, at most ``limit`` seconds, until its liveness answers."""
        with open(self.config_path, "w", encoding="utf-8") as out:
            json.dump(self.config(), out, indent=2)  # JSON is YAML: LiteLLM reads it as its config.yaml
        env = {
            **os.environ,
            "CONFIG_FILE_PATH": self.config_path,
            "LITELLM_MASTER_KEY": self.key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_OFFLINE_MODE": "true",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("VIRTUAL_ENV", None)
        env.pop("PYTHONPATH", None)  # the venv has graceful installed (editable) itself
        argv = [self.python, "-m", "uvicorn", "litellm.proxy.proxy_server:app", "--host", "127.0.0.1", "--port", "0"]
        with open(self.log_path, "ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                *argv, "--no-access-log", cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + limit
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self._process.returncode is not None:
                    raise RuntimeError(f"the LiteLLM proxy exited with {self._process.returncode}; see {self.log_path}")
                if not self.port:
                    self.port = self._bound_port()
                else:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await client.get(f"{self.url}/health/liveliness")).status_code == 200:
                            return
                await asyncio.sleep(0.1)
        raise RuntimeError(f"the LiteLLM proxy was not serving after {limit:g}s; see {self.log_path}")

    def _bound_port(self) -> int:
        with open(self.log_path, "rb") as log:
            found = _RUNNING.search(log.read())
        return int(found.group(1)) if found else 0

    async def close(self) -> None:
        await stop_group(self._process, timeout=10.0)


@contextlib.asynccontextmanager
async def open_gateway(
    kind: str | None, *, balancer_port: int, log_dir: str, side: str
) -> AsyncIterator[LiteLLM | None]:
    """The gateway ``kind`` names in front of the balancer on ``balancer_port``, serving; None for none.

    Its log and config go to ``log_dir`` as ``litellm-<side>.log`` and ``litellm-<side>.config.yaml``.
    """
    if kind is None:
        yield None
        return
    if kind not in GATEWAYS:
        raise RuntimeError(f"gateway {kind!r} is unknown; use one of {', '.join(GATEWAYS)}")
    try:
        python = find_litellm()
    except ConfigError as exc:  # Options.resolve has checked it; the venv went away since
        raise RuntimeError(str(exc)) from None
    log_path = os.path.join(log_dir, f"{kind}-{side}.log")
    gateway = LiteLLM(python, api_base=f"http://127.0.0.1:{balancer_port}/v1", log_path=log_path)
    try:
        await gateway.start()
        yield gateway
    finally:
        await gateway.close()


def _version(python: str) -> str:
    """LiteLLM's version, from its installed metadata in the venv of ``python``."""
    venv = os.path.dirname(os.path.dirname(python))
    found = glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "litellm-*.dist-info"))
    return os.path.basename(found[0]).removeprefix("litellm-").removesuffix(".dist-info") if found else "?"
