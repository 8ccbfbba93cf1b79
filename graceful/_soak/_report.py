"""What a soak run saw: one record per request, the verdict, the summary table, the JSON report and the timeline."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .._drain._errors import ConfigError

__all__ = ["CLASSES", "LOSSES", "REASONS", "RESUME_REASONS", "Attempt", "RequestRecord", "SoakReport", "write_plot"]

CLASSES = ("short", "long", "stream")
REASONS = (
    "ok",
    "resumed",
    "rejected_retryable",
    "refused",
    "ambiguous",
    "truncated",
    "token_mismatch",
    "ended_by_server",
    "http_error",
    "timeout",
)
# Only a run with resume on (graceful soak --resume) can end a request with these.
RESUME_REASONS = ("resumed", "token_mismatch")
# Outcomes the client cannot explain: the work may have run, half-run or been lost.
# rejected_retryable, refused and ended_by_server are explicit and safe to retry;
# token_mismatch is an answer whose text is wrong.
LOSSES = ("ambiguous", "truncated", "token_mismatch", "timeout", "http_error")


@dataclass
class Attempt:
    """One HTTP exchange of a request; a request has several when the retry policy retries."""

    reason: str
    start: float
    end: float = 0.0
    status: int | None = None
    served_by: str | None = None
    headers: bool = False  # whether response headers arrived
    not_started: bool = False  # the server said it never started the request
    replay: bool = False  # the server replayed a stored result for the idempotency key
    bytes: int = 0
    error: str | None = None
    resumes: int = 0  # continuations the resuming transport spliced into this attempt's stream

    @property
    def executed(self) -> bool:
        """The server certainly ran the request for this attempt."""
        return self.headers and self.status is not None and 200 <= self.status < 300 and not self.replay

    @property
    def maybe_executed(self) -> bool:
        """The server may have run the request: a retry after this is blind."""
        if self.executed or self.reason == "ambiguous":
            return True
        if self.reason == "timeout" and not self.headers:
            return True
        return self.status is not None and self.status >= 500 and not self.not_started and not self.replay


@dataclass
class RequestRecord:
    """One logical request, from its first attempt to its final answer."""

    request_id: str
    idempotency_key: str
    cls: str
    expected_tokens: int
    start: float
    end: float = 0.0
    reason: str = "timeout"
    status: int | None = None
    served_by: str | None = None
    bytes: int = 0
    tokens: int = 0
    replay: bool = False
    error: str | None = None
    resumes: int = 0
    history: list[Attempt] = field(default_factory=list)

    @property
    def attempts(self) -> int:
        return len(self.history)

    @property
    def blind_retries(self) -> int:
        """Retries sent after an attempt that may already have executed the request."""
        return sum(1 for attempt in self.history[:-1] if attempt.maybe_executed)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["class"] = data.pop("cls")
        history = data.pop("history")
        data["attempts"] = len(history)
        data["attempt_reasons"] = [attempt["reason"] for attempt in history]
        data["blind_retries"] = self.blind_retries
        data["history"] = history
        return data


@dataclass(frozen=True)
class SoakReport:
    """The records of a soak run, with the counts and the verdict derived from them.

    ``executions`` holds execution counts per idempotency key read from the servers
    (``--executions-url``); None when no such source was given or readable.
    """

    url: str
    started: float
    elapsed: float
    records: Sequence[RequestRecord]
    settings: Mapping[str, Any]
    executions: Mapping[str, int] | None = None
    notes: Sequence[str] = ()

    def by_reason(self) -> dict[str, int]:
        counts = Counter(record.reason for record in self.records)
        return {reason: counts[reason] for reason in REASONS}

    def by_class(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for cls in CLASSES:
            counts = Counter(record.reason for record in self.records if record.cls == cls)
            table[cls] = {reason: counts[reason] for reason in REASONS}
        return table

    def attempt_reasons(self) -> dict[str, int]:
        counts = Counter(attempt.reason for record in self.records for attempt in record.history)
        return {reason: counts[reason] for reason in REASONS}

    def served_by(self) -> dict[str, int]:
        return dict(sorted(Counter(record.served_by or "-" for record in self.records).items()))

    def duplicates(self) -> list[str]:
        """Idempotency keys executed more than once, by the server's counts or by fresh 2xx answers.

        A continuation carries its stream's key and runs only the rest of the answer: each
        resume adds one expected execution of the key (on another replica).
        """
        keys = []
        for record in self.records:
            seen = sum(1 for attempt in record.history if attempt.executed)
            runs = sum(1 + attempt.resumes for attempt in record.history if attempt.executed)
            counted = self.executions.get(record.idempotency_key, 0) if self.executions is not None else 0
            if seen > 1 or counted > max(1, runs):
                keys.append(record.idempotency_key)
        return keys

    def possible_duplicates(self) -> list[str]:
        """Keys sent twice where each send may have run, and no server count settles it."""
        if self.executions is not None:
            return []
        keys = []
        for record in self.records:
            maybe = sum(1 for attempt in record.history if attempt.maybe_executed)
            certain = sum(1 for attempt in record.history if attempt.executed)
            if maybe > 1 and certain <= 1:
                keys.append(record.idempotency_key)
        return keys

    def losses(self) -> dict[str, int]:
        """Every count that makes the run fail; empty when nothing was lost."""
        reasons = self.by_reason()
        found = {reason: reasons[reason] for reason in LOSSES if reasons[reason]}
        if duplicates := len(self.duplicates()):
            found["duplicates"] = duplicates
        if possible := len(self.possible_duplicates()):
            found["possible_duplicates"] = possible
        return found

    @property
    def exit_code(self) -> int:
        return 1 if self.losses() else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "started": self.started,
            "elapsed": round(self.elapsed, 3),
            "settings": dict(self.settings),
            "requests": len(self.records),
            "by_reason": self.by_reason(),
            "by_class": self.by_class(),
            "attempts": sum(record.attempts for record in self.records),
            "attempt_reasons": self.attempt_reasons(),
            "retries": sum(record.attempts - 1 for record in self.records),
            "blind_retries": sum(record.blind_retries for record in self.records),
            "replays": sum(1 for record in self.records for attempt in record.history if attempt.replay),
            "duplicates": len(self.duplicates()),
            "duplicate_keys": self.duplicates(),
            "possible_duplicates": len(self.possible_duplicates()),
            "executions_source": self.executions is not None,
            "served_by": self.served_by(),
            "losses": self.losses(),
            "exit_code": self.exit_code,
            "notes": list(self.notes),
        }

    def render(self) -> str:
        """The summary table printed at the end of ``graceful soak``."""
        data = self.to_json()
        short = {"rejected_retryable": "rejected", "ended_by_server": "ended", "token_mismatch": "mismatch"}
        shown = [r for r in REASONS if r not in RESUME_REASONS or self.settings.get("resume")]
        widths = [8, 8, *(max(len(short.get(reason, reason)), 6) for reason in shown)]
        header = ["class", "requests", *(short.get(reason, reason) for reason in shown)]
        rows = [header]
        for cls, counts in data["by_class"].items():
            rows.append([cls, str(sum(counts.values())), *(str(counts[reason]) for reason in shown)])
        rows.append(["total", str(data["requests"]), *(str(data["by_reason"][reason]) for reason in shown)])
        rows.append(["attempts", str(data["attempts"]), *(str(data["attempt_reasons"][reason]) for reason in shown)])
        lines = [
            "  ".join(cell.rjust(width) if i else cell.ljust(width) for i, (cell, width) in enumerate(zip(row, widths)))
            for row in rows
        ]
        source = "server counts + headers" if data["executions_source"] else "headers only"
        lines += [
            "",
            f"retries: {data['retries']}, blind retries of possibly-executed POSTs: {data['blind_retries']}, "
            f"idempotent replays: {data['replays']}",
            f"duplicates: {data['duplicates']}, possible duplicates: {data['possible_duplicates']} ({source})",
            "served by: " + ", ".join(f"{name}={count}" for name, count in data["served_by"].items()),
            *(f"note: {note}" for note in self.notes),
        ]
        if data["losses"]:
            lines.append(
                "verdict: LOSS (" + ", ".join(f"{name}={count}" for name, count in data["losses"].items()) + ")"
            )
        else:
            lines.append(f"verdict: no unexplained loss in {data['requests']} requests over {self.elapsed:.1f}s")
        return "\n".join(lines)


COLOURS = {
    "ok": "#2ca02c",
    "resumed": "#bcbd22",
    "token_mismatch": "#e377c2",
    "rejected_retryable": "#1f77b4",
    "refused": "#9467bd",
    "ambiguous": "#d62728",
    "truncated": "#ff7f0e",
    "ended_by_server": "#17becf",
    "http_error": "#8c564b",
    "timeout": "#7f7f7f",
}


def check_plotting() -> None:
    """Fail before a long run, not after it, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib, which is not installed; run: pip install 'graceful-drain[plot]'"
        ) from None


def write_plot(report: SoakReport, path: str) -> None:
    """A timeline: one horizontal band per replica, one line per request attempt, coloured by end reason."""
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")  # no display needed, and never a GUI window from a CLI
    import matplotlib.pyplot as plt

    attempts = [attempt for record in report.records for attempt in record.history]
    replicas = sorted({attempt.served_by or "(none)" for attempt in attempts}) or ["(none)"]
    band = {name: index for index, name in enumerate(replicas)}
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.9 * len(replicas)))
    per_band: Counter[str] = Counter()
    for attempt in sorted(attempts, key=lambda a: a.start):
        name = attempt.served_by or "(none)"
        # Spread a replica's requests across its band so overlapping ones stay visible.
        y = band[name] + 0.8 * ((per_band[name] * 0.618) % 1.0) - 0.4
        per_band[name] += 1
        start, end = attempt.start - report.started, max(attempt.end, attempt.start) - report.started
        ax.plot([start, end], [y, y], color=COLOURS[attempt.reason], linewidth=1.2, solid_capstyle="butt")
    for reason in REASONS:
        ax.plot([], [], color=COLOURS[reason], linewidth=3, label=reason)
    ax.set_yticks(range(len(replicas)), replicas)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("served by")
    ax.set_title(f"graceful soak {report.url}: {len(report.records)} requests")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
