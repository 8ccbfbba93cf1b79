"""The drain's opening line judges work in flight by its age against the durations seen (issue 51):
a request older than every request seen is said to be so, never forecast to be cut."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable

import httpx
import pytest

from graceful._admin._client import WorkerDrain
from graceful._admin._wire import Field
from graceful._cli._drain_client import _outlook_line
from tests.servers import Launched
from tests.utils import ROOT

RATE = 50  # tokens per second of the example server
EXAMPLE = {"GRACEFUL_EXAMPLE_TOKENS_PER_SECOND": str(RATE), "GRACEFUL_EXAMPLE_LOAD_DELAY": "0"}


def worker(in_flight: int, at_risk: int, expected: float, seen: int, older: int | None) -> WorkerDrain:
    drained = WorkerDrain("w.sock", pid=7)
    ahead = {Field.IN_FLIGHT: in_flight, Field.LEFT: 42.0, Field.AT_RISK: at_risk, Field.EXPECTED: expected}
    drained.outlook = {**ahead, Field.SEEN: seen, **({} if older is None else {Field.OLDER: older})}
    return drained


START = "worker 7: {} in flight at the drain's start, 42 s to the deadline"


@pytest.mark.parametrize(
    ("outlook", "line", "alarm"),
    [
        ((1, 0, 0.0, 12, 1), "1 is older than every one of the 12 requests seen (nothing to judge it by)", 0),
        ((2, 0, 0.0, 12, 2), "2 are older than every one of the 12 requests seen (nothing to judge them by)", 0),
        (
            (3, 0, 0.0, 12, 1),
            "by the 12 requests seen, none should outlast it; "
            "1 is older than every request seen (nothing to judge it by)",
            0,
        ),
        (
            (3, 1, 0.6, 12, 2),
            "by the 12 requests seen, 1 may outlast it (about 0.6 expected to be cut; graceful advise says which "
            "grace period holds them); 2 are older than every request seen (nothing to judge them by)",
            1,
        ),
        ((1, 0, 0.0, 12, 0), "by the 12 requests seen, none should outlast it", 0),
        ((1, 0, 0.0, 12, None), "by the 12 requests seen, none should outlast it", 0),  # a server before issue 51
        ((1, 0, 0.0, 0, 0), "no finished request seen yet to judge them by", 0),
    ],
)
def test_the_opening_line_says_what_the_durations_seen_can_judge(
    outlook: tuple[int, int, float, int, int | None], line: str, alarm: int
) -> None:
    assert _outlook_line(worker(*outlook)) == (f"{START.format(outlook[0])}; {line}", alarm)


def send(server: Launched, client: httpx.Client, tokens: int) -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": tokens, "stream": True}
    answer = client.post(server.url("/v1/completions"), json=body)
    assert answer.status_code == 200, answer.text


@pytest.mark.servers
@pytest.mark.timeout(60)
def test_a_stream_older_than_every_one_seen_raises_no_alarm(launch: Callable[..., Launched]) -> None:
    """1. the example server under graceful run serves four streams of 0.5 s 2. a stream of 4 s has run
    2 s (older than every one seen, well within the time left) 3. graceful drain --timeout 5s. Its
    first line says the stream is older than every request seen; nothing "may outlast" the drain, no
    "expected to be cut"; the stream ends whole and the drain drains."""
    example = launch(app="examples.server:app", **EXAMPLE)
    example.wait_ready()
    limits = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(timeout=30, limits=limits) as client:
        for _ in range(4):
            send(example, client, RATE // 2)
        streaming = threading.Event()
        ended: list[str] = []

        def long_stream() -> None:
            body = {"model": "m", "prompt": "hi", "max_tokens": 4 * RATE, "stream": True}
            with client.stream("POST", example.url("/v1/completions"), json=body) as answer:
                for chunk in answer.iter_text():
                    streaming.set()
                    ended.append(chunk)

        thread = threading.Thread(target=long_stream)
        thread.start()
        assert streaming.wait(10), "the stream never began"
        # Its age is what is judged: past every seen stream's bucket (0.5 s streams land at 0.8 s at most).
        threading.Event().wait(2.0)
        hook = subprocess.run(
            [sys.executable, "-m", "graceful", "drain", "--socket-dir", example.socket_dir, "--timeout", "5s"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=30,
        )
        thread.join(30)
    assert not thread.is_alive()
    first = hook.stderr.splitlines()[0]
    assert "1 in flight at the drain's start" in first, hook.stderr
    assert "1 is older than every one of the 4 requests seen (nothing to judge it by)" in first, hook.stderr
    assert "may outlast" not in hook.stderr and "expected to be cut" not in hook.stderr, hook.stderr
    assert hook.returncode == 0 and "drained 1 of 1 worker" in hook.stderr, hook.stderr
    assert "data: [DONE]" in "".join(ended)
