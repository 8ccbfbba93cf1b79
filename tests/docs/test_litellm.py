"""docs/litellm.md's examples, as a reader runs them.

- ``docs_src/litellm/config.yaml``: without LiteLLM, the handler it names is graceful's, as a list entry, and
  one deployment of two opts in; with LiteLLM (``.litellm/venv``), the config itself runs in a real proxy,
  its two ``api_base`` addresses this test's upstream: the opted-in deployment's stream is marked and
  continued, the other's passes as LiteLLM's own. Every proxy tests/litellm starts takes its
  ``litellm_settings`` (tests/litellm/proxy.py).
- ``docs_src/litellm/run_proxy.sh``: the command parses as ``graceful run`` options; tests/litellm's drain
  tests (``test_the_gateway_drains_under_graceful``) run the proxy with it, on 127.0.0.1 and port 0.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import click
import pytest
import yaml  # type: ignore[import-untyped]

from tests.docs.commands import read, shell_commands, words
from tests.litellm.proxy import DOCS_CONFIG, DOCS_RUN, MASTER_KEY, LiteLLMProxy, documented_run, needs_litellm
from tests.litellm.test_litellm import Recorder, one_answer
from tests.utils import ROOT, run_uvicorn

pytestmark = pytest.mark.anyio

PAGE = "docs/litellm.md"
CONFIG = "docs_src/litellm/config.yaml"
RUN = "docs_src/litellm/run_proxy.sh"
HANDLER = "graceful.integrations.litellm.handler"


def test_the_tests_proxies_read_the_pages_files() -> None:
    assert (DOCS_CONFIG, DOCS_RUN) == (Path(ROOT) / CONFIG, RUN)
    for name in (CONFIG, RUN):
        assert f'--8<-- "{name}"' in read(PAGE)


def test_the_config_adds_gracefuls_handler_and_opts_in_one_deployment() -> None:
    """The handler is a list entry (a string would replace LiteLLM's own callbacks), it names a module-level
    ``handler`` of graceful's LiteLLM module (read without importing it: LiteLLM is not installed here),
    and ``graceful_resume`` opts in the first deployment only."""
    config = yaml.safe_load(read(CONFIG))
    assert config["litellm_settings"]["callbacks"] == [HANDLER]
    module, _, name = HANDLER.rpartition(".")
    source = ast.parse(read(module.replace(".", "/") + ".py"))
    assigned = {
        target.id
        for node in source.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    assert name in assigned
    opted = {entry["model_name"]: entry.get("model_info", {}).get("graceful_resume") for entry in config["model_list"]}
    assert opted == {"llama": True, "gpt-4o": None}


def test_the_proxy_command_parses_as_graceful_run() -> None:
    import graceful.cli

    (command,) = shell_commands(RUN)
    env, argv = words(command)
    assert set(env) == {"CONFIG_FILE_PATH"} and argv[:2] == ["graceful", "run"]
    run = graceful.cli.cli.get_command(click.Context(graceful.cli.cli), "run")
    assert run is not None
    with run.make_context("run", argv[2:]) as ctx:
        assert ctx.params["app"] == "litellm.proxy.proxy_server:app"
        assert (ctx.params["host"], ctx.params["port"]) == ("0.0.0.0", 4000)
    assert documented_run() == [*argv[:3], "--host", "127.0.0.1", "--port", "0"]


@needs_litellm
@pytest.mark.timeout(240)
async def test_the_config_runs_in_a_real_proxy(tmp_path: Path) -> None:
    """1. the page's config, each deployment's api_base this test's upstream (and a key for gpt-4o's), the
    proxy's own key in LITELLM_MASTER_KEY, where the config reads it
    2. the upstream cuts every first stream with graceful's final event
    3. "llama" (opted in): marked x-graceful-resumable, continued, one whole answer
    4. "gpt-4o": no mark, no continuation: the caller gets the cut as an error."""
    config: dict[str, Any] = yaml.safe_load(read(CONFIG))
    recorder = Recorder()
    async with run_uvicorn(recorder, lifespan="off") as server:
        for entry in config["model_list"]:
            entry["litellm_params"].update(api_base=f"http://127.0.0.1:{server.port}/v1", api_key="unused")
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        proxy = LiteLLMProxy(path, tmp_path / "litellm.log", LITELLM_MASTER_KEY=MASTER_KEY)
        try:
            await anyio.to_thread.run_sync(proxy.wait_serving)
            resumed = await one_answer(proxy, "llama", 20)
            marked = list(recorder.requests)
            recorder.requests.clear()
            plain = await one_answer(proxy, "gpt-4o", 20)
        finally:
            proxy.stop()
    assert [headers.get("x-graceful-resumable") for headers, _ in marked] == ["1", "1"], proxy.log[-3000:]
    assert resumed.error is None and resumed.text == "one two three four" and resumed.done == 1
    assert [headers.get("x-graceful-resumable") for headers, _ in recorder.requests] == [None]
    assert plain.error is not None and plain.text == "one two three "
