"""The drain states and the frozen snapshots read from a drain (like anyio's ``EventStatistics``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

from ._admission import Pace
from ._observed import RequestHistograms

__all__ = ["OUTCOMES", "DrainOutcome", "DrainResult", "DrainStatus", "Failure", "State", "Tally"]

DrainOutcome = Literal["drained", "timeout", "resumed", "stopped"]
# Request outcomes: Tally.outcomes is indexed by the constants of the same order in _ledger.
# handed_off: a resumable stream ended early on purpose for its client to continue it elsewhere.
OUTCOMES = ("completed", "client_disconnected", "error", "cancelled", "handed_off")


class State(str, enum.Enum):  # noqa: UP042 (a StrEnum would change str(State.SERVING), which users may log or compare)
    STARTING = "STARTING"
    SERVING = "SERVING"
    DRAINING = "DRAINING"
    STOPPED = "STOPPED"
    # The engine behind the server has died (docs/middleware.md, "When the engine dies"): nothing is
    # admitted, and nothing leads back to SERVING but a new lifecycle.
    FAILED = "FAILED"


# Module-level names for the hot path: reading a global is cheaper than an attribute of the enum class.
SERVING, DRAINING, STOPPED, FAILED = State.SERVING, State.DRAINING, State.STOPPED, State.FAILED


@dataclass(frozen=True)
class DrainResult:
    """What one drain did: ``result`` is ``drained`` when in-flight work reached zero in time."""

    result: DrainOutcome
    in_flight: int
    duration: float
    reason: str
    started_at: float
    deadline: float
    truncated: int = 0
    leftover: tuple[str, ...] = ()
    handed_off: int = 0  # resumable streams ended for their clients to continue elsewhere
    # Seconds from drain start: when the propagation phase ended (None if it had not), and
    # when its last new request arrived (None if none did).
    propagation: float | None = None
    last_request: float | None = None
    # Why the propagation phase ended ("quiet": no new request for propagation_quiet; or
    # "propagation_wait"), and when the first response announced the drain to the balancers
    # (``announce_drain``; seconds from drain start, None if none did).
    propagation_ended_by: str | None = None
    announced: float | None = None

    @property
    def drained(self) -> bool:
        return self.result == "drained"

    def as_dict(self) -> dict[str, object]:
        return {
            "result": self.result,
            "drained": self.drained,
            "in_flight": self.in_flight,
            "duration": round(self.duration, 6),
            "reason": self.reason,
            "started_at": self.started_at,
            "deadline": self.deadline,
            "truncated": self.truncated,
            "handed_off": self.handed_off,
            "leftover": list(self.leftover),
            "propagation": None if self.propagation is None else round(self.propagation, 6),
            "last_request": None if self.last_request is None else round(self.last_request, 6),
            "propagation_ended_by": self.propagation_ended_by,
            "announced": None if self.announced is None else round(self.announced, 6),
        }


@dataclass(frozen=True)
class Failure:
    """Why the server entered FAILED: a short ``reason`` (a metric label, e.g. ``engine_dead``), what was
    seen (``detail``) and when (wall-clock ``at``)."""

    reason: str
    detail: str
    at: float

    def as_dict(self) -> dict[str, object]:
        return {"reason": self.reason, "detail": self.detail, "at": self.at}


@dataclass(frozen=True)
class DrainStatus:
    """A read-only snapshot for ``/status`` and ``graceful status``."""

    state: State
    in_flight: int
    pid: int
    since: float
    # Wall-clock times of the current (or last) drain; None before any drain.
    drain_started: float | None = None
    deadline: float | None = None
    propagation_until: float | None = None
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    # Wall-clock time of the last new request of this drain's propagation phase, if any.
    last_request: float | None = None
    # What the server has seen, for ``graceful advise``: the budget in force, the durations of
    # finished work (``RequestHistograms.as_dict``) and each drain's propagation figure.
    budget: dict[str, object] = field(default_factory=dict)
    durations: dict[str, object] = field(default_factory=dict)
    # The streams' pace admission="fits" judges by (``_admission.Pace.as_dict``).
    pace: dict[str, object] = field(default_factory=dict)
    propagation: tuple[float, ...] = ()
    # Why the server is FAILED (None while it is not).
    failure: Failure | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "state": self.state.value,
            "failure": None if self.failure is None else self.failure.as_dict(),
            "in_flight": self.in_flight,
            "pid": self.pid,
            "since": self.since,
            "drain_started": self.drain_started,
            "deadline": self.deadline,
            "propagation_until": self.propagation_until,
            "last_request": self.last_request,
            "counters": self.counters,
            "budget": self.budget,
            "durations": self.durations,
            "pace": self.pace,
            "propagation": [round(p, 6) for p in self.propagation],
        }


class Tally:
    """What a drain counts for metrics and ``/status``, from process start."""

    __slots__ = (
        "outcomes",
        "rejected",
        "drains",
        "truncated",
        "drain_seconds",
        "propagation_seconds",
        "histograms",
        "pace",
        "failures",
    )

    def __init__(self) -> None:
        self.outcomes = [0] * len(OUTCOMES)  # finished requests and jobs, by outcome index
        self.rejected: dict[str, int] = {}  # refusals by reason
        self.drains: dict[str, int] = {}  # drains by result (drained or timeout)
        self.truncated: dict[str, int] = {}  # work ended by the deadline, by reason
        self.failures: dict[str, int] = {}  # entries into FAILED, by reason
        self.drain_seconds: list[float] = []
        # Per drain: seconds from drain start to the last new request of the propagation phase.
        self.propagation_seconds: list[float] = []
        # How long finished work took, plain and streamed apart (``_observed``; the ledger's count_durations counts it).
        self.histograms = RequestHistograms()
        # How fast the streams sampled went, for admission="fits" (``_admission``; the middleware's lifespan samples).
        self.pace = Pace()

    @staticmethod
    def add(group: dict[str, int], key: str) -> None:
        group[key] = group.get(key, 0) + 1

    def samples(self) -> dict[str, list[float]]:
        """The histogram samples, by name."""
        return {"drain_seconds": self.drain_seconds, "propagation_seconds": self.propagation_seconds}

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {
            "requests": dict(zip(OUTCOMES, self.outcomes)),
            "rejected": dict(self.rejected),
            "drains": dict(self.drains),
            "truncated": dict(self.truncated),
            "failures": dict(self.failures),
        }
