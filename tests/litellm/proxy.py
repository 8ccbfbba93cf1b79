"""A real LiteLLM proxy (``.litellm/venv``, scripts/setup-litellm) in front of graceful's replicas, and
callers that run none of graceful's code: ``curl -N`` and the openai SDK for Node.

The proxy runs as ``uvicorn litellm.proxy.proxy_server:app`` (or under ``graceful run`` for the
gateway's own drain) with its config written by the test, on a port it binds itself (port 0, read
back from its start-up line), with LiteLLM's shipped cost map (no network).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from examples.rollout.litellm import START_LIMIT
from tests.docs.commands import shell_commands, words
from tests.servers import Launched
from tests.utils import ROOT

PYTHON = Path(ROOT) / ".litellm" / "venv" / "bin" / "python"
NODE_CLIENT = Path(ROOT) / "tests" / "node" / "stream.mjs"
NODE_RESPONSES = Path(ROOT) / "tests" / "node" / "responses.mjs"
NODE_SDK = Path(ROOT) / "tests" / "node" / "node_modules" / "openai"
MASTER_KEY = "sk-graceful-test"
# docs/litellm.md's config and its command for the gateway's own drain: every proxy here takes the config's
# litellm_settings, and `graceful run`s the proxy with that command (tests/docs/test_litellm.py runs the rest).
DOCS_CONFIG = Path(ROOT) / "docs_src" / "litellm" / "config.yaml"
DOCS_RUN = "docs_src/litellm/run_proxy.sh"
PROMPT = "Count for me please"

needs_litellm = pytest.mark.skipif(
    not PYTHON.exists(), reason="no LiteLLM at .litellm/venv: bash scripts/setup-litellm makes one"
)


def deployment(name: str, model: str, api_base: str, *, resume: bool, **params: Any) -> dict[str, Any]:
    """One entry of the proxy's model_list; ``resume`` opts it in (``model_info: {graceful_resume: true}``)."""
    entry: dict[str, Any] = {"model_name": name, "litellm_params": {"model": model, "api_base": api_base, **params}}
    if "api_key" not in entry["litellm_params"]:
        entry["litellm_params"]["api_key"] = "unused"
    if resume:
        entry["model_info"] = {"graceful_resume": True}
    return entry


def write_config(path: Path, deployments: list[dict[str, Any]], *, usage_log: bool = True) -> Path:
    settings = yaml.safe_load(DOCS_CONFIG.read_text())["litellm_settings"]
    if usage_log:
        settings["callbacks"].append("tests.litellm.usage_log.recorder")
    config = {
        "model_list": deployments,
        "litellm_settings": settings,
        "general_settings": {"master_key": MASTER_KEY},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def documented_run() -> list[str]:
    """The page's `graceful run` of the proxy (``CONFIG_FILE_PATH`` is the test's, in the environment), on
    127.0.0.1 and a port the kernel picks: the one address a shared test machine allows."""
    (command,) = shell_commands(DOCS_RUN)
    env, argv = words(command)
    assert argv[:3] == ["graceful", "run", "litellm.proxy.proxy_server:app"] and "CONFIG_FILE_PATH" in env, command
    address = {"--host": "127.0.0.1", "--port": "0"}
    return [address.get(previous, word) for previous, word in zip(["", *argv], argv, strict=False)]


class LiteLLMProxy(Launched):
    """``uvicorn litellm.proxy.proxy_server:app`` (or ``graceful run`` it) in .litellm/venv, on 127.0.0.1."""

    def __init__(
        self,
        config: Path,
        log: Path,
        *,
        graceful_run: tuple[str, ...] | None = None,
        socket_dir: str = "",
        own_session: bool = True,
        **env: str,
    ) -> None:
        """``own_session=False`` keeps the proxy in the test's session, as tests/vllm/conftest.py keeps vLLM: with
        the kernel's autogroup scheduling, a proxy in a session of its own in front of a CPU vLLM got no CPU for
        seconds at a time while the engine generated (and its streams reached the caller only then)."""
        self.name = "litellm"
        self.socket_dir = socket_dir
        self.log_path = log
        self.port = 0
        self.usage_path = log.with_suffix(".usage.jsonl")
        environment = {
            **os.environ,
            "CONFIG_FILE_PATH": str(config),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_OFFLINE_MODE": "true",
            "GRACEFUL_TEST_USAGE_LOG": str(self.usage_path),
            "GRACEFUL_SOCKET_DIR": socket_dir,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": ROOT,
            **env,
        }
        environment.pop("VIRTUAL_ENV", None)
        app = "litellm.proxy.proxy_server:app"
        if graceful_run is None:
            command = [str(PYTHON), "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", "0"]
        else:
            command = [str(PYTHON), "-m", *documented_run(), *graceful_run]
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=environment, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=own_session, process_group=None if own_session else 0,
            )  # fmt: skip

    def wait_serving(self, limit: float = START_LIMIT) -> LiteLLMProxy:
        """Until the port is bound and LiteLLM's own liveness answers (its config and router are loaded).
        A proxy that never serves is stopped here: left running, it fails the next test of the worker
        (an unreaped process)."""
        try:
            deadline = time.monotonic() + limit
            self.wait_port(limit)
            while time.monotonic() < deadline:
                assert self.process.poll() is None, self.log[-6000:]
                try:
                    if httpx.get(self.url("/health/liveliness"), timeout=2).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            raise AssertionError(f"LiteLLM not serving after {limit}s:\n{self.log[-6000:]}")
        except BaseException:
            self.stop()
            raise

    def usage(self) -> list[dict[str, Any]]:
        if not self.usage_path.exists():
            return []
        return [json.loads(line) for line in self.usage_path.read_text().splitlines() if line]


@dataclass
class Answer:
    """What one caller read: its text, finish reasons, [DONE]s, usage, ids and any error."""

    text: str = ""
    finishes: list[str] = field(default_factory=list)
    done: int = 0
    usage: dict[str, Any] | None = None
    ids: set[str] = field(default_factory=set)
    error: str | None = None
    chunks: int = 0
    token_ids: list[int] = field(default_factory=list)

    def assert_whole(self, expected: str, tokens: int, *, done: bool = True) -> None:
        assert self.error is None, self.error
        assert self.text == expected, (self.text[:80], expected[:80])
        assert self.finishes == ["length"], self.finishes
        assert len(self.ids) == 1, self.ids
        if done:
            assert self.done == 1
        assert self.usage is not None and self.usage["completion_tokens"] == tokens, self.usage


@dataclass
class ResponsesAnswer:
    """What one caller read of a Responses stream: the response ids and item ids its events named, their
    sequence numbers, the text of its deltas, and the final response (``response.completed``'s, or
    ``response.incomplete``'s where LiteLLM's bridge ends so: the event, its id, status, whole text and usage);
    ``error`` where it read ``response.failed`` or ``error``, or its client failed."""

    ids: set[str] = field(default_factory=set)
    items: set[str] = field(default_factory=set)
    sequence: list[int] = field(default_factory=list)
    text: str = ""
    final: dict[str, Any] | None = None
    error: str | None = None

    def assert_like(self, uncut: ResponsesAnswer) -> None:
        """One response, equal to the uncut one: one id, one run of sequence numbers as long as the uncut
        run's, its text, and the same final event with the whole text, the status and the usage."""
        assert self.error is None, self.error
        assert uncut.error is None and uncut.final is not None, uncut
        assert len(self.ids) == 1 and len(self.items) <= 1, (self.ids, self.items)
        assert self.sequence == list(range(len(uncut.sequence))), (self.sequence, len(uncut.sequence))
        assert self.text == uncut.text, (self.text[:80], uncut.text[:80])
        assert self.final is not None and self.final["id"] in self.ids, self.final
        assert self.final["text"] == uncut.final["text"] == uncut.text, self.final["text"][:80]
        assert (self.final["event"], self.final["status"]) == (uncut.final["event"], uncut.final["status"]), self.final
        counts = ("input_tokens", "output_tokens", "total_tokens")
        usage, want = self.final["usage"], uncut.final["usage"]
        assert {name: usage[name] for name in counts} == {name: want[name] for name in counts}, (usage, want)


API_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses"}


def request_body(
    model: str, max_tokens: int, extra: dict[str, Any] | None = None, *, api: str = "chat"
) -> dict[str, Any]:
    """The request every caller of ``api`` sends; ``extra`` adds fields (vLLM's ``return_token_ids``, sampling)."""
    if api == "responses":
        return {"model": model, "input": PROMPT, "max_output_tokens": max_tokens, "stream": True, **(extra or {})}
    asked: dict[str, Any] = (
        {"prompt": PROMPT} if api == "completions" else {"messages": [{"role": "user", "content": PROMPT}]}
    )
    return {
        "model": model,
        **asked,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }


def node_available() -> bool:
    return shutil.which("node") is not None and NODE_SDK.exists()


class Caller:
    """One client process streaming one answer through the proxy, its output read in a thread.

    ``kind`` is ``curl`` (``curl -N``: the raw event stream, as any client in any language reads it, of any
    ``api``: ``chat``, ``completions`` or ``responses``), ``node`` (the openai SDK for Node streaming a chat
    completion, tests/node/stream.mjs), or ``node-create`` and ``node-stream`` (its ``responses.create({stream:
    true})`` and ``responses.stream()``, tests/node/responses.mjs). ``reading`` is set once 5 lines have come.
    ``extra`` adds fields to the request body (curl's, and responses.mjs's; stream.mjs sends its own).
    """

    def __init__(
        self,
        kind: str,
        base: str,
        model: str,
        max_tokens: int,
        *,
        extra: dict[str, Any] | None = None,
        api: str = "chat",
    ) -> None:
        if extra and kind == "node":
            raise ValueError("extra request fields are sent by curl and the Responses callers only, not by 'node'")
        if kind != "curl" and api != ("responses" if kind.startswith("node-") else "chat"):
            raise ValueError(f"{kind!r} does not call {api!r}")
        self.kind = kind
        self.api = api
        if kind == "curl":
            command = [
                "curl", "-sS", "-N", "--max-time", "120", base + API_PATHS[api],
                "-H", "content-type: application/json", "-H", f"authorization: Bearer {MASTER_KEY}",
                "-d", json.dumps(request_body(model, max_tokens, extra, api=api)),
            ]  # fmt: skip
        elif kind == "node":
            command = ["node", str(NODE_CLIENT), base + "/v1", model, str(max_tokens), MASTER_KEY]
        else:
            how = kind.removeprefix("node-")
            command = ["node", str(NODE_RESPONSES), base + "/v1", model, str(max_tokens), MASTER_KEY, how]
            command += [json.dumps(extra)] if extra else []
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=NODE_CLIENT.parent, text=True
        )
        self.lines: list[str] = []
        self.reading = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip():
                self.lines.append(line.rstrip("\n"))
            if len(self.lines) >= 5:
                self.reading.set()
        self.reading.set()

    def text_so_far(self) -> str:
        """The text of the Responses deltas read so far (the caller still reads)."""
        if self.kind == "curl":
            return parse_responses(list(self.lines)).text
        return "".join(json.loads(line).get("delta") or "" for line in list(self.lines) if '"event"' in line)

    def answer(self, limit: float = 150) -> Answer:
        """Wait for the client of a chat or completion to end (bounded), then what it read."""
        answer = self.ended(limit)
        assert isinstance(answer, Answer), answer
        return answer

    def responses_answer(self, limit: float = 150) -> ResponsesAnswer:
        """Wait for the client of a Responses stream to end (bounded), then what it read."""
        answer = self.ended(limit)
        assert isinstance(answer, ResponsesAnswer), answer
        return answer

    def ended(self, limit: float = 150) -> Answer | ResponsesAnswer:
        """Wait for the client to end (bounded), then what it read, of whichever API it called."""
        self.thread.join(limit)
        assert not self.thread.is_alive(), f"{self.kind} still reading after {limit}s"
        code = self.process.wait(10)
        assert self.process.stdout is not None and self.process.stderr is not None
        err = self.process.stderr.read()
        self.process.stdout.close()
        self.process.stderr.close()
        answer: Answer | ResponsesAnswer
        if self.api == "responses":
            answer = parse_responses(self.lines) if self.kind == "curl" else parse_node_responses(self.lines)
        else:
            answer = parse_curl(self.lines) if self.kind == "curl" else parse_node(self.lines)
        if code:
            answer.error = f"{self.kind} exited {code}: {err}"
        return answer


def parse_curl(lines: list[str]) -> Answer:
    answer = Answer()
    for line in lines:
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            answer.done += 1
            continue
        event = json.loads(data)
        if "error" in event:
            answer.error = json.dumps(event["error"])
            continue
        answer.chunks += 1
        answer.ids.add(event["id"])
        for choice in event.get("choices") or []:
            answer.text += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            answer.token_ids += choice.get("token_ids") or []
            if choice.get("finish_reason"):
                answer.finishes.append(choice["finish_reason"])
        if event.get("usage"):
            answer.usage = event["usage"]
    return answer


def parse_node(lines: list[str]) -> Answer:
    answer = Answer(done=-1)  # the SDK consumes [DONE] itself
    for line in lines:
        record = json.loads(line)
        if "chunk" in record:
            answer.chunks += 1
        elif "end" in record:
            end = record["end"]
            answer.text, answer.finishes, answer.usage = end["text"], end["finishes"], end["usage"]
            answer.ids = set(end["ids"])
        elif "error" in record:
            answer.error, answer.text = record["error"], record["text"]
    return answer


def parse_responses(lines: list[str]) -> ResponsesAnswer:
    """What ``curl -N`` read of a Responses stream (``event:`` and ``data:`` lines)."""
    answer = ResponsesAnswer()
    for line in lines:
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        kind = event.get("type")
        answer.sequence.append(event.get("sequence_number"))
        response = event.get("response") or {}
        if response.get("id"):
            answer.ids.add(response["id"])
        item = event.get("item_id") or (event.get("item") or {}).get("id")
        if item:
            answer.items.add(item)
        if kind == "response.output_text.delta":
            answer.text += event["delta"]
        elif kind in ("response.completed", "response.incomplete"):
            text = "".join(
                part.get("text") or "" for out in response.get("output") or [] for part in out.get("content") or []
            )
            answer.final = {"event": kind, "id": response.get("id"), "status": response.get("status"), "text": text,
                            "usage": response.get("usage")}  # fmt: skip
        elif kind in ("response.failed", "error"):
            answer.error = json.dumps(event)[:2000]
    return answer


def parse_node_responses(lines: list[str]) -> ResponsesAnswer:
    """What tests/node/responses.mjs read: its last line says it all."""
    answer = ResponsesAnswer()
    for line in lines:
        record = json.loads(line)
        if "end" in record:
            end = record["end"]
            answer.ids, answer.sequence, answer.text, answer.final = (
                set(end["ids"]),
                end["sequence"],
                end["text"],
                end["final"],
            )
        elif "error" in record:
            answer.error, answer.text = record["error"], record["text"]
    return answer
