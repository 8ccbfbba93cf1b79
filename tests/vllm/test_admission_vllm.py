"""admission="fits" inside a real vLLM (issue 54): during the propagation wait, a request whose max_tokens
cannot finish before the deadline is refused with the not-started 503 before the engine sees it, by vLLM's
own metrics, while a short one is admitted and finishes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from tests.utils import ROOT
from tests.vllm.conftest import VllmServer
from tests.vllm.test_vllm import CLIENT, PROMPT, Stream, graceful_cli, status_of, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_late, pytest.mark.timeout(600)]

GRACE, RESERVE, WAIT = 24, 2, 18  # the drain's deadline 22 s after its start; new requests admitted for 18 s
# vLLM's own count of the requests its engine took: prompt tokens prefilled, requests finished, and in it now.
ENGINE_COUNTS = ("vllm:prompt_tokens_total", "vllm:request_success_total", "vllm:num_requests_running")


def engine_counts(server: VllmServer) -> dict[str, float]:
    """Each of ``ENGINE_COUNTS``, summed over its series, from vLLM's /metrics (exempt from refusal)."""
    page = status_of(server, "/metrics").text
    counts = dict.fromkeys(ENGINE_COUNTS, 0.0)
    for line in page.splitlines():
        found = re.match(r"([\w:]+)(?:\{[^}]*\})? (\S+)$", line)
        if found and found.group(1) in counts:
            counts[found.group(1)] += float(found.group(2))
    return counts


def pace(server: VllmServer) -> dict[str, float]:
    """The pace the middleware judges by (``graceful status --json``), once a stream has been sampled."""
    done = graceful_cli("status", "--json", "--socket-dir", server.socket_dir)
    assert done.returncode == 0, done.stderr
    (worker,) = json.loads(done.stdout)
    return worker["pace"]  # type: ignore[no-any-return]


def test_a_request_that_cannot_finish_is_refused_before_the_engine_sees_it(
    start_vllm: Callable[..., VllmServer],
) -> None:
    """1. vLLM with admission fits, a grace period of 24 s and a reserve of 2 s (22 s to the deadline)
    2. one 128-token stream: the middleware samples its pace
    3. the preStop hook: graceful drain --propagation-wait 18s
    4. during the wait, a chat completion whose max_tokens needs three times the budget: the not-started
       503 (would_not_finish) at once, and vLLM's metrics count no new request
    5. a short stream during the wait is admitted and ends whole; vLLM counts it
    6. graceful status counts the refusal; the hook exits 0"""
    server = start_vllm(
        GRACEFUL_ADMISSION="fits",
        GRACEFUL_GRACE_PERIOD=str(GRACE),
        GRACEFUL_RESERVE=str(RESERVE),
        GRACEFUL_EXEMPT_PATHS="/health,/metrics",
    )
    server.wait_ready()
    Stream("chat", 128).run(server).wait(120).assert_whole()
    wait_for(lambda: pace(server)["streams"] >= 1, 30, "a stream's pace sampled")
    per_token = pace(server)["time_per_token"]
    limit = GRACE - RESERVE
    # Three times the budget, inside the server's --max-model-len of 16384.
    tokens = min(12000, int(3 * limit / max(per_token, 1e-6)))
    assert (tokens + 1) * per_token > limit, f"at {per_token:.5f} s a token, {tokens} tokens fit the budget"

    started = time.monotonic()
    # The server's budget applies (its reserve of 2 s): the hook names no grace period of its own.
    hook = subprocess.Popen(
        [sys.executable, "-m", "graceful", "drain", "--socket-dir", server.socket_dir, "--propagation-wait",
         f"{WAIT}s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        # The hook's start-up is the interpreter's: seconds on a loaded machine.
        while status_of(server, "/ready").status_code != 503:
            assert hook.poll() is None, hook.communicate()
            assert time.monotonic() - started < 30, "/ready still 200 30 s after the hook started"
            time.sleep(0.05)
        before = engine_counts(server)
        refused = CLIENT.post(
            server.url("/v1/chat/completions"),
            json={
                "model": server.model,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": tokens,
                "stream": True,
            },
        )
        # Judged, not refused by the drain's later rule (server_draining): it came during the wait.
        assert refused.status_code == 503, refused.text
        assert refused.headers["x-graceful-not-started"] == "1" and refused.headers["retry-after"]
        assert refused.json()["error"]["type"] == "would_not_finish"
        assert engine_counts(server) == before  # no prompt prefilled, none finished, none running

        # Admitted (after the wait it would get the 503 server_draining) and whole; vLLM counts it.
        Stream("chat", 8).run(server).wait(60).assert_whole()
        success = before["vllm:request_success_total"] + 1
        wait_for(lambda: engine_counts(server)["vllm:request_success_total"] == success, 10, "vLLM counts it")
        assert engine_counts(server)["vllm:prompt_tokens_total"] > before["vllm:prompt_tokens_total"]

        status = json.loads(graceful_cli("status", "--json", "--socket-dir", server.socket_dir).stdout)
        assert status[0]["counters"]["rejected"] == {"would_not_finish": 1}
        out, err = hook.communicate(timeout=60)
        assert hook.returncode == 0, (out, err)
    finally:
        if hook.poll() is None:
            hook.kill()
            hook.wait(10)
