"""A simulated LLM engine: batch slots, a FIFO waiting queue and a steady token rate.

Like vLLM's scheduler, a request holds one of ``slots`` while it generates and
waits in line when all are taken. The gauges it exposes read like vLLM's, so
``graceful drain --engine vllm`` can be tried against this server.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator, Iterator
from types import TracebackType

import anyio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from graceful import Drain, NotAccepting

__all__ = ["Engine", "EngineCollector", "QueueFull", "Ticket", "selftest_loop"]

logger = logging.getLogger("graceful.example")


class QueueFull(RuntimeError):
    """Every slot is busy and the waiting queue is at its limit."""


class Engine:
    """Slots, a waiting queue and a token clock; state is read by the metrics collector."""

    def __init__(self, *, slots: int, queue_size: int, tokens_per_second: float) -> None:
        self.slots = slots
        self.queue_size = queue_size
        self.token_interval = 1.0 / tokens_per_second
        self.running = 0
        self._waiters: deque[anyio.Event] = deque()
        self.generated_tokens = 0
        self.selftests = 0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def admit(self) -> Ticket:
        """Take a slot or a place in line now, synchronously, so a full queue is known before any reply."""
        if self.running < self.slots and not self._waiters:
            self.running += 1
            return Ticket(self, None)
        if len(self._waiters) >= self.queue_size:
            raise QueueFull(f"all {self.slots} slots are busy and {self.waiting} requests are waiting")
        event = anyio.Event()
        self._waiters.append(event)
        return Ticket(self, event)

    def _release(self) -> None:
        # A freed slot passes straight to the first in line, so running never dips
        # between two requests and the gauges never show a false idle.
        if self._waiters:
            self._waiters.popleft().set()
        else:
            self.running -= 1

    async def tokens(self, count: int) -> AsyncIterator[int]:
        """Yield token indexes at the configured rate, on a fixed clock so delays do not add up."""
        start = anyio.current_time()
        for index in range(count):
            await anyio.sleep_until(start + (index + 1) * self.token_interval)
            self.generated_tokens += 1
            yield index


class Ticket:
    """One request's claim on a slot: ``async with ticket`` waits in line, then holds the slot."""

    __slots__ = ("_engine", "_event", "_held")

    def __init__(self, engine: Engine, event: anyio.Event | None) -> None:
        self._engine = engine
        self._event = event
        self._held = event is None

    async def __aenter__(self) -> Ticket:
        event = self._event
        if event is not None and not self._held:
            try:
                await event.wait()
            except BaseException:
                if event.is_set():  # the slot was handed over just as we were cancelled
                    self._engine._release()
                else:
                    self._engine._waiters.remove(event)
                self._event = None
                raise
            self._held = True
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def release(self) -> None:
        """Give the slot back, or leave the line; safe to call more than once."""
        if self._held:
            self._held = False
            self._engine._release()
        elif self._event is not None and not self._event.is_set():
            self._engine._waiters.remove(self._event)
        elif self._event is not None:  # granted but never entered
            self._engine._release()
        self._event = None


class EngineCollector(Collector):
    """vLLM-compatible gauges, read from the engine at scrape time."""

    def __init__(self, engine: Engine, model: str, engine_label: str = "0") -> None:
        self.engine = engine
        self.labels = [model, engine_label]

    def collect(self) -> Iterator[Metric]:
        names = ["model_name", "engine"]
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Number of requests in model execution batches.", labels=names
        )
        running.add_metric(self.labels, float(self.engine.running))
        yield running
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels=names
        )
        waiting.add_metric(self.labels, float(self.engine.waiting))
        yield waiting
        tokens = CounterMetricFamily("vllm:generation_tokens", "Number of generation tokens processed.", labels=names)
        tokens.add_metric(self.labels, float(self.engine.generated_tokens))
        yield tokens


async def selftest_loop(drain: Drain, engine: Engine, interval: float) -> None:
    """Internal canary work: the queue-consumer pattern for work that does not come over HTTP.

    The middleware only guards HTTP. Work a process gives itself must check
    ``drain.accepting`` before it starts and run inside ``drain.track()``, so a
    drain refuses new jobs but waits for the one already running.
    """
    while True:
        await anyio.sleep(interval)
        if not drain.accepting:  # still loading, or draining: take no new work
            continue
        try:
            async with drain.track("selftest"):
                async with engine.admit():
                    async for _ in engine.tokens(1):
                        pass
                engine.selftests += 1
        except NotAccepting:  # the drain began between the check and track()
            continue
        except QueueFull:
            logger.warning("selftest skipped: the engine queue is full")
