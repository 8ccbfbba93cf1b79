"""Behind ``--gateway litellm``, some streams come from the openai SDK for Node: callers running none of our code.

Each stream is one ``node tests/node/stream.mjs BASE_URL MODEL MAX_TOKENS API_KEY`` process
(the SDK with ``maxRetries: 0``, in a process group of its own, killed at its timeout), started
one after another by each caller, as a closed loop. Its lines are judged as the demo judges its
own streams: whole when it read the example server's exact count ``tok0 ... tokN-1`` with one
finish reason ``length``, one completion id and usage counting every token; ``token_mismatch``
when the text or usage is wrong; ``truncated`` when the SDK raised after the stream began,
``http_error`` when it raised before. Records are ``RequestRecord`` s with ids ``node-...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable
from typing import Any

import anyio

from graceful._soak._attempt import count_mismatch
from graceful.soak import Attempt, RequestRecord

__all__ = ["NODE_PREFIX", "Judge", "missing_node", "node_streams", "run_client"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLIENT = os.path.join(ROOT, "tests", "node", "stream.mjs")
SDK = os.path.join(ROOT, "tests", "node", "node_modules", "openai")
NODE_PREFIX = "node-"  # the request id of every Node SDK stream begins so


def missing_node() -> str | None:
    """Why the Node SDK callers cannot run here; None when they can."""
    if shutil.which("node") is None:
        return "node is not on PATH"
    if not os.path.isdir(SDK):
        return f"no openai SDK for Node at {SDK} (cd tests/node && npm install)"
    return None


async def node_streams(
    base: str,
    *,
    model: str,
    tokens: int,
    api_key: str,
    callers: int,
    timeout: float,
    stop: anyio.Event,
    keep: Callable[[RequestRecord], None],
) -> None:
    """``callers`` Node SDK callers streaming ``tokens`` tokens each, back to back, until ``stop``."""
    run = secrets.token_hex(4)
    issued = 0

    async def caller() -> None:
        nonlocal issued
        while not stop.is_set():
            issued += 1
            argv = ["node", CLIENT, f"{base}/v1", model, str(tokens), api_key]
            keep(await run_client(f"{NODE_PREFIX}{run}-{issued:06d}", argv, tokens, timeout, _judge))

    async with anyio.create_task_group() as tg:
        for _ in range(callers):
            tg.start_soon(caller)


# Reads a client's output lines into its attempt (its reason, an error saying what was wrong); the tokens read.
Judge = Callable[[list[str], Attempt, int], int]


async def run_client(request_id: str, argv: list[str], tokens: int, timeout: float, judge: Judge) -> RequestRecord:
    """One client process (its own process group, killed at ``timeout``) streaming ``tokens`` tokens, its output
    lines judged by ``judge``: the record of its one attempt."""
    record = RequestRecord(request_id, f"idem-{request_id}", "stream", tokens, start=time.time())
    attempt = Attempt(reason="timeout", start=record.start)
    record.history.append(attempt)
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=os.path.dirname(CLIENT), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
        record.tokens = judge(out.decode(errors="replace").splitlines(), attempt, tokens)
        if attempt.reason == "timeout":  # no end and no error line: the process died
            attempt.reason = "truncated" if attempt.headers else "ambiguous"
            attempt.error = f"{argv[0]} exited {process.returncode}: {err.decode(errors='replace')[-200:]!r}"
    except TimeoutError:
        attempt.error = f"no complete answer within {timeout:g}s"
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with anyio.CancelScope(shield=True):
                await process.wait()
    attempt.end = time.time()
    record.end, record.reason, record.status, record.error = attempt.end, attempt.reason, attempt.status, attempt.error
    return record


def _judge(lines: list[str], attempt: Attempt, tokens: int) -> int:
    """Read stream.mjs's lines into ``attempt`` (its reason, an error saying what was wrong); the tokens read."""
    chunks = 0
    for line in lines:
        try:
            data: dict[str, Any] = json.loads(line)
        except ValueError:
            continue
        if data.get("chunk"):
            chunks += 1
            attempt.headers, attempt.status = True, 200
        elif "error" in data:
            attempt.reason = "truncated" if chunks else "http_error"
            attempt.error = f"the SDK raised: {str(data['error'])[:200]}"
        elif "end" in data:
            attempt.headers, attempt.status = True, 200
            end = data["end"]
            usage = end.get("usage") or {}
            if end.get("finishes") != ["length"] or len(end.get("ids") or ()) != 1:
                attempt.reason = "truncated"
                attempt.error = f"finish reasons {end.get('finishes')!r}, completion ids {end.get('ids')!r}"
            elif usage.get("completion_tokens") != tokens or not str(end.get("text")).startswith("tok0"):
                attempt.reason = "token_mismatch"
                attempt.error = f"usage {usage!r} for {tokens} tokens asked, text {str(end.get('text'))[:40]!r}"
            else:
                attempt.error = count_mismatch(str(end["text"]), chunks, usage, tokens)
                attempt.reason = "token_mismatch" if attempt.error else "ok"
    return chunks
