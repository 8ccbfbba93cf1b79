"""``graceful drain``'s progress lines tell the truth at the moment they are printed (issue 46).

The server measures the time since the last new request when it sends a progress event, about
once a second; the hook prints on its own clock, up to a second later. Each line's "ago" must be
the age at the moment the line is printed, not at the moment the server sent its figure.
"""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest

import graceful._cli._servers as servers
from graceful import State
from tests.servers import Served

AGO = re.compile(r"last new request (\d+\.\d) s ago")


@pytest.mark.timeout(30)
def test_each_line_says_how_long_ago_the_last_request_came_as_it_is_printed(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. graceful drain --propagation-wait 3.5s against a real server 2. one request 0.43 s after
    the drain began 3. the hook prints a line a second until the wait ends. Every line printed after
    the request that speaks of it says its age within 0.2 s of the truth; none says no request came."""
    printed: list[tuple[float, str]] = []
    monkeypatch.setattr(servers, "_say", lambda line, out=False: printed.append((time.monotonic(), line)))
    codes: list[int] = []
    options = {"propagation_quiet": None, "timeout": None, "grace_period": None, "json_output": False}
    hook = threading.Thread(
        target=lambda: codes.append(
            servers.run_drain(socket_dir=served.socket_dir, socket=None, propagation_wait=3.5, quiet=False, **options)
        )
    )
    hook.start()
    deadline = time.monotonic() + 5
    while served.mw.drain.state is not State.DRAINING:
        assert time.monotonic() < deadline, "the drain never began"
        time.sleep(0.005)
    began = time.monotonic()
    time.sleep(max(0.0, began + 0.43 - time.monotonic()))
    sent = time.monotonic()
    answer = httpx.get(f"http://127.0.0.1:{served.port}/hello", timeout=5)
    answered = time.monotonic()
    assert answer.status_code == 200 and answered - sent < 0.1  # admitted during the wait, at a known time
    arrival = (sent + answered) / 2
    hook.join(15)
    assert not hook.is_alive() and codes == [0], printed

    after = [(at, line) for at, line in printed if at > answered and line.startswith("draining")]
    told = [(at, float(found.group(1))) for at, line in after if (found := AGO.search(line))]
    assert len(told) >= 2, printed  # the lines at about 2 s and 3 s at least
    for at, ago in told:
        assert abs(ago - (at - arrival)) <= 0.2, (ago, at - arrival, printed)
    assert not any("no new request since the drain began" in line for _, line in after), printed
