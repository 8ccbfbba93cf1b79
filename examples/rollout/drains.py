"""Per old replica: when its preStop drain began and ended, when SIGTERM came and it exited, and what was streaming.

Behind ``--gateway litellm`` with ``--handoff-streams`` the promise is per replica: each old replica
exits within the propagation wait + ``HANDOFF_EXIT_SLACK`` of its drain's start, while streams of
the longest length (30 s) are in flight, which the gateway continues on the replicas that stay.
Times are seconds after the replica's T0 (its deletion); the drain's start comes from the
preStop hook's ``graceful drain --json`` result, the exit from the replica's process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .scenarios import Options, SideResult

__all__ = ["HANDOFF_EXIT_SLACK", "drain_rows", "late_exits", "render_drains"]

# The old replica exits within the propagation wait plus this (long-streams-handoff: the median does).
HANDOFF_EXIT_SLACK = 5.0


def drain_rows(side: SideResult, options: Options) -> list[dict[str, Any]]:
    """One row per old replica: drain start and end, SIGTERM, exit, drain start to exit, the streams its drain
    handed off, and the streams of the longest length in flight at its drain's start that had begun on it (as
    the clients saw them: by the replica name their answer carried, and not yet ended)."""
    longest = max(options.stream_tokens)
    streams = [r for r in side.report.records if r.cls == "stream" and r.expected_tokens == longest]
    rows = []
    for t in side.terminations:
        at = None if t.drain_start is None else t.wall_t0 + t.drain_start
        apart = None if t.drain_start is None or t.exit_seconds is None else t.exit_seconds - t.drain_start
        on_it = [r for r in streams if r.served_by == t.name]
        rows.append(
            {
                "replica": t.name,
                "drain_start": _rounded(t.drain_start),
                "drain_end": _rounded(t.drain_end),
                "sigterm": _rounded(t.sigterm),
                "exit": _rounded(t.exit_seconds),
                "drain_to_exit": _rounded(apart),
                "handed_off": t.handed_off,
                "longest_in_flight": None if at is None else sum(1 for r in on_it if r.start <= at <= r.end),
            }
        )
    return rows


def late_exits(summary: dict[str, Any], options: Options) -> list[str]:
    """The broken promise of a handoff behind the gateway, if any: replicas that exited late or never
    drained, and a run in which no drain handed a stream off."""
    bound = options.propagation_wait + HANDOFF_EXIT_SLACK
    rows = summary["drains"]
    late = [r["replica"] for r in rows if r["drain_to_exit"] is None or r["drain_to_exit"] > bound]
    broken = []
    if late:
        broken.append(
            f"{', '.join(late)} exited more than {bound:g} s after the drain's start (propagation wait + 5 s)"
        )
    if not any(r["handed_off"] for r in rows):
        broken.append("handed_off=0 (no drain handed a stream off)")
    return broken


def render_drains(summary: dict[str, Any], options: Options) -> list[str]:
    """The rows as lines under the table."""
    longest = max(options.stream_tokens) / options.tokens_per_second
    bound = options.propagation_wait + HANDOFF_EXIT_SLACK
    header = (
        "old replica",
        "drain start",
        "drained",
        "SIGTERM",
        "exit",
        "drain start to exit",
        "streams handed off",
        f"{longest:g} s streams on it then",
    )
    rows = [header]
    for r in summary["drains"]:
        rows.append(
            (
                r["replica"],
                _seconds(r["drain_start"]),
                _seconds(r["drain_end"]),
                _seconds(r["sigterm"]),
                _seconds(r["exit"]),
                _seconds(r["drain_to_exit"]),
                str(r["handed_off"]),
                "-" if r["longest_in_flight"] is None else str(r["longest_in_flight"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    promise = f"; bound with handoff: propagation wait + 5 s = {bound:g} s" if options.handoff_streams else ""
    lines = [f"{summary['kind']}: each old replica's drain, seconds after its T0{promise}"]
    for row in rows:
        lines.append("  " + "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)))
    return lines


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"
