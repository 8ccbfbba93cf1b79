"""The Kubernetes termination sequence, replica by replica, as a Deployment with maxSurge 1, maxUnavailable 0.

For each old replica: the new one starts and passes its startup probe, joins the
balancer, and only then is the old one deleted (T0). From T0, at the same time:
the endpoint leaves the balancer after ``lb_delay``, and the preStop hook runs; when
the hook returns the kubelet sends SIGTERM; at T0 + grace it sends SIGKILL. A hook
still running at the grace period gets SIGTERM and a one-time 2 s extension, as the
kubelet gives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graceful import Budget

from .balancer import Balancer
from .replica import Replica, ReplicaSettings

__all__ = ["Plan", "Rollout", "Termination"]

HOOK_EXTENSION = 2.0  # kubelet: "grace period override" after a preStop hook overruns


@dataclass(frozen=True)
class Plan:
    """How a rollout deletes its old replicas."""

    replicas: int
    updates: int
    lb_delay: float
    step_pause: float
    prestop: bool  # run `graceful drain` as the preStop hook
    prestop_hang: bool = False  # the hook never returns by itself
    node_loss: bool = False  # old replicas are SIGKILLed at T0 without warning
    # Read each old replica's execution counts before SIGTERM and SIGKILL (behind a gateway that sends no
    # idempotency keys they count nothing of the clients', and the read would only put SIGTERM off).
    executions: bool = True


@dataclass
class Termination:
    """What happened to one old replica from T0 on; times are seconds after T0."""

    name: str
    t0: float
    lb_removed: float | None = None
    prestop_code: int | None = None
    prestop_seconds: float | None = None
    propagation_end: float | None = None  # when the drain's propagation phase ended
    drain_start: float | None = None  # when the preStop hook's drain began on the replica
    drain_end: float | None = None  # when it ended (its last worker's)
    handed_off: int = 0  # resumable streams its drain handed off
    sigterm: float | None = None
    sigkill: bool = False
    node_loss: bool = False
    exit_seconds: float | None = None
    exit_code: int | None = None
    executions: dict[str, int] | None = None
    wall_t0: float = field(default_factory=time.time)
    port: int = 0
    # Behind Envoy (its access log): when the replica's first response announcing its drain
    # reached Envoy, when Envoy last sent it a request, and how many requests it sent more
    # than 1.5 s after that announcement.
    announced: float | None = None
    last_sent: float | None = None
    sent_after_announcement: int = 0
    # The graceful side: each worker's admin status once its preStop drain has ended (its request
    # durations and the drain's propagation figure); ``graceful advise --from`` reads them.
    observed: list[dict[str, Any]] = field(default_factory=list)

    def set_drain_results(self, results: list[dict[str, Any]]) -> None:
        """Take the figures of each worker's ``graceful drain --json`` result: the first drain's start,
        the last propagation phase's end, the last drain's end, the streams handed off."""
        started = [r for r in results if r.get("started_at") is not None]
        if started:
            self.drain_start = min(float(r["started_at"]) for r in started) - self.wall_t0
        ends = [float(r["started_at"]) + float(r["propagation"]) for r in started if r.get("propagation") is not None]
        if ends:
            self.propagation_end = max(ends) - self.wall_t0
        done = [float(r["started_at"]) + float(r["duration"]) for r in started if r.get("duration") is not None]
        if done:
            self.drain_end = max(done) - self.wall_t0
        self.handed_off = sum(int(r.get("handed_off") or 0) for r in results)


class Rollout:
    """Runs the replicas of one side (graceful or baseline) behind ``balancer``."""

    def __init__(
        self, balancer: Balancer, settings: ReplicaSettings, plan: Plan, log: Callable[[str], None] = print
    ) -> None:
        self.balancer = balancer
        self.settings = settings
        self.plan = plan
        self.log = log
        self.current: list[Replica] = []
        self.everyone: list[Replica] = []
        self.terminations: list[Termination] = []
        self.budget = Budget.resolve(
            grace_period=settings.grace_period,
            reserve=settings.reserve,
            propagation_wait=settings.propagation_wait,
        )

    async def _launch(self, name: str) -> Replica:
        replica = Replica(name, self.settings)
        self.everyone.append(replica)
        await replica.start()
        await replica.wait_started()
        await self.balancer.add(name, replica.port)
        return replica

    async def start(self) -> None:
        """Version 0: every replica started, probed and added."""
        self.current = list(
            await asyncio.gather(*(self._launch(f"{self.settings.kind}-v0-{i}") for i in range(self.plan.replicas)))
        )

    async def roll(self) -> None:
        """``updates`` rolling updates; returns once every old replica has exited."""
        pending: list[asyncio.Task[Termination]] = []
        try:
            for version in range(1, self.plan.updates + 1):
                for index in range(self.plan.replicas):
                    new = await self._launch(f"{self.settings.kind}-v{version}-{index}")
                    old, self.current[index] = self.current[index], new
                    pending.append(asyncio.create_task(self.delete(old)))
                    await asyncio.sleep(self.plan.step_pause)
            for done in await asyncio.gather(*pending):
                self.terminations.append(done)
        finally:
            for task in pending:
                task.cancel()

    async def delete(self, replica: Replica) -> Termination:
        """The termination sequence for one replica; never takes longer than grace + the hook extension."""
        plan, grace = self.plan, self.settings.grace_period
        t0 = time.monotonic()
        record = Termination(replica.name, t0, port=replica.port)
        self.log(f"  T0 delete {replica.name}")

        async def unlist() -> None:
            await asyncio.sleep(plan.lb_delay)
            await self.balancer.remove(replica.name)
            record.lb_removed = time.monotonic() - t0

        unlisting = asyncio.create_task(unlist())
        try:
            if plan.node_loss:
                record.node_loss = True
                replica.kill()
                await replica.wait(5)
            else:
                await self._hook_then_term(replica, record, t0)
                overran = record.sigterm is not None and record.sigterm >= grace
                end = t0 + grace + (HOOK_EXTENSION if overran else 0.0)
                if not await replica.wait(end - time.monotonic()):
                    if plan.executions:
                        await _snapshot(replica, record)
                    record.sigkill = True
                    self.log(f"  SIGKILL {replica.name} at the grace period ({grace:g}s)")
                    replica.kill()
                    await replica.wait(5)
            record.exit_seconds = (replica.exited or time.monotonic()) - t0
            record.exit_code = replica.returncode
            await unlisting
        finally:
            unlisting.cancel()
            await replica.stop()
        return record

    async def _hook_then_term(self, replica: Replica, record: Termination, t0: float) -> None:
        grace = self.settings.grace_period
        if self.plan.prestop or self.plan.prestop_hang:

            async def hook() -> int | None:
                code = None
                if self.plan.prestop:
                    code, results = await replica.pre_stop(
                        propagation_wait=self.settings.propagation_wait,
                        propagation_quiet=self.settings.propagation_quiet,
                        timeout=self.budget.limit,
                    )
                    record.set_drain_results(results)
                    # Before SIGTERM the drained replica still answers: its durations now hold every
                    # request it served, those its deadline ended too, and its drain's propagation figure.
                    record.observed = await replica.statuses()
                record.prestop_code = code
                if self.plan.prestop_hang:
                    await asyncio.Event().wait()  # a stuck hook: only the grace period ends it
                return code

            task = asyncio.create_task(hook())
            try:
                await asyncio.wait_for(asyncio.shield(task), grace)
            except TimeoutError:
                self.log(f"  preStop of {replica.name} still running at the grace period: SIGTERM")
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            record.prestop_seconds = time.monotonic() - t0
        # What the app saw of its budget before TERM: the executions it ran are final now.
        if self.plan.executions:
            await _snapshot(replica, record)
        record.sigterm = time.monotonic() - t0
        replica.terminate()

    async def executions(self) -> dict[str, int] | None:
        """Execution counts of the replicas still running (the final versions)."""
        merged: dict[str, int] = {}
        for replica in self.current:
            counts = await replica.executions()
            if counts is None:
                return None
            for key, count in counts.items():
                merged[key] = merged.get(key, 0) + count
        return merged

    async def close(self) -> None:
        for replica in self.everyone:
            await replica.stop()


async def _snapshot(replica: Replica, record: Termination) -> None:
    """Merge the replica's execution counts into the record (the counts only grow)."""
    counts = await replica.executions()
    if counts is None:
        return
    merged = dict(record.executions or {})
    for key, count in counts.items():
        merged[key] = max(merged.get(key, 0), count)
    record.executions = merged
