"""The side-by-side table: baseline and graceful, per end reason, duplicates, retries, kills and exit times."""

from __future__ import annotations

from typing import Any

from graceful._soak._report import LOSSES, REASONS, RESUME_REASONS

from .balancer import L7_BALANCERS
from .drains import HANDOFF_EXIT_SLACK, drain_rows, late_exits, render_drains
from .litellm import MODEL
from .node import NODE_PREFIX
from .responses import RESPONSES_PREFIX
from .scenarios import Options, SideResult

__all__ = ["HANDOFF_EXIT_SLACK", "attribute_losses", "expectations", "reload_losses", "render", "side_summary"]


def attribute_losses(side: SideResult, window: float) -> dict[str, int]:
    """For node loss: losses whose answer came from a lost replica, or that ended within ``window`` s of a loss."""
    lost = [t for t in side.terminations if t.node_loss]
    names = {t.name for t in lost}
    counts = {"by served-by": 0, "by time": 0, "elsewhere": 0}
    for record in side.report.records:
        if record.reason not in LOSSES:
            continue
        attempt = record.history[-1] if record.history else None
        if record.served_by in names:
            counts["by served-by"] += 1
        elif attempt is not None and any(t.wall_t0 - 0.5 <= attempt.end <= t.wall_t0 + window for t in lost):
            counts["by time"] += 1
        else:
            counts["elsewhere"] += 1
    return counts


def reload_losses(side: SideResult) -> int:
    """Requests that ended ``ambiguous`` with no response header while an nginx reload's old workers exited.

    nginx sits between the client and the replica: when a replica fails, nginx answers
    (502, 504). A client connection that ends with no answer at all was closed by nginx
    itself, which its old workers do to every connection they hold while they exit.
    """
    count = 0
    for record in side.report.records:
        attempt = record.history[-1] if record.history else None
        if record.reason != "ambiguous" or attempt is None or attempt.headers:
            continue
        if any(start <= attempt.end <= end for start, end in side.reloads):
            count += 1
    return count


def side_summary(side: SideResult, options: Options) -> dict[str, Any]:
    data = side.report.to_json()
    streams = sum(1 for record in side.report.records if record.cls == "stream")
    exits = [t.exit_seconds for t in side.terminations if t.exit_seconds is not None]
    summary: dict[str, Any] = {
        "kind": _label(side, options),
        "balancer": side.balancer,
        "requests": data["requests"],
        "streams": streams,
        "by_reason": data["by_reason"],
        "attempts": data["attempts"],
        "retries": data["retries"],
        "blind_retries": data["blind_retries"],
        "replays": data["replays"],
        "duplicates": data["duplicates"],
        "possible_duplicates": data["possible_duplicates"],
        "sigkills": sum(1 for t in side.terminations if t.sigkill),
        "node_losses": sum(1 for t in side.terminations if t.node_loss),
        "deletions": len(side.terminations),
        "exit_max": max(exits) if exits else None,
        "exit_median": sorted(exits)[len(exits) // 2] if exits else None,
        "grace_period": options.grace_period,
        "drain_limit": side.budget_limit,
        "prestop_max": max((t.prestop_seconds or 0.0 for t in side.terminations), default=0.0),
        "term_to_exit_max": max(
            (t.exit_seconds - t.sigterm for t in side.terminations if t.exit_seconds is not None and t.sigterm),
            default=0.0,
        ),
        "prestop_codes": [t.prestop_code for t in side.terminations if t.prestop_code is not None],
        "propagation_ends": [round(t.propagation_end, 2) for t in side.terminations if t.propagation_end is not None],
        # Behind Envoy: when each old replica's first announcing response reached Envoy, when
        # Envoy last sent it a request (seconds after its T0), and the requests sent later than
        # 1.5 s after the announcement.
        "announced": [None if t.announced is None else round(t.announced, 2) for t in side.terminations],
        "last_sent": [None if t.last_sent is None else round(t.last_sent, 2) for t in side.terminations],
        "sent_after_announcement": sum(t.sent_after_announcement for t in side.terminations),
        "connect_errors": side.connect_errors,
        "reloads": len(side.reloads),
        "reload_losses": reload_losses(side),
        "walkaways": side.walkaways,
        "elapsed": round(side.report.elapsed, 1),
        "served_by": data["served_by"],
        "notes": side.notes,
        "gateway": side.gateway,
    }
    if options.gateway is not None:
        node = [record for record in side.report.records if record.request_id.startswith(NODE_PREFIX)]
        summary["node_streams"] = len(node)
        summary["node_failed"] = sum(1 for record in node if record.reason != "ok")
        responses = [record for record in side.report.records if record.request_id.startswith(RESPONSES_PREFIX)]
        summary["responses_streams"] = len(responses)
        summary["responses_failed"] = sum(1 for record in responses if record.reason != "ok")
        summary["drains"] = drain_rows(side, options)
    if options.scenario == "node-loss":
        summary["loss_attribution"] = attribute_losses(side, options.lb_delay + 2.0)
    return summary


def _label(side: SideResult, options: Options) -> str:
    """The column's name: the side, or in long-streams-handoff the scenario each graceful side stands for."""
    if options.scenario == "long-streams-handoff":
        return "long-streams-handoff" if side.handoff_streams else "long-streams"
    if options.scenario == "short-grace" and side.kind != "baseline":
        return f"admission {side.admission or 'fits'}"
    if options.handoff_streams:  # the first column is the graceful side without handoff
        return "graceful, handoff" if side.handoff_streams else "graceful, no handoff"
    return side.kind


def expectations(graceful: dict[str, Any], options: Options) -> list[str]:
    """What the graceful side promised in this scenario and did not keep; empty when it held."""
    broken = []
    reasons = graceful["by_reason"]
    zeros = ["ambiguous", "truncated", "timeout", "http_error"]
    if options.scenario == "node-loss":
        zeros = []  # a lost node loses what it ran; duplicates are the promise here
    if options.scenario == "long-streams-handoff":
        zeros = [*zeros, "ended_by_server", "token_mismatch"]
        bound = options.propagation_wait + HANDOFF_EXIT_SLACK
        median = graceful["exit_median"]
        if median is None or median > bound:
            broken.append(f"old-replica exit median {median} s after T0 (bound: propagation wait + 5 s = {bound:g} s)")
        if not reasons["resumed"]:
            broken.append("resumed=0 (no stream continued on another replica)")
    if options.gateway is not None:
        zeros = [*zeros, "token_mismatch"]  # the gateway's splice, checked by the count
        if options.handoff_streams:
            broken.extend(late_exits(graceful, options))
    for reason in zeros:
        if reasons[reason]:
            broken.append(f"{reason}={reasons[reason]}")
    if graceful["duplicates"]:
        broken.append(f"duplicates={graceful['duplicates']}")
    if graceful["sigkills"] and options.scenario != "ignore-term":
        broken.append(f"sigkills={graceful['sigkills']}")
    if options.scenario == "ignore-term" and graceful["sigkills"] != graceful["deletions"]:
        broken.append(f"sigkills={graceful['sigkills']} (expected one per deletion: {graceful['deletions']})")
    # Losses at an nginx reload are the emulation's (ingress-nginx changes endpoints without
    # one): the table shows them for both sides, the promise is about the rest.
    failed = sum(reasons[r] for r in REASONS if r not in ("ok", "resumed")) - graceful["reload_losses"]
    if graceful["reload_losses"] and "ambiguous" in zeros:
        broken = [b for b in broken if not b.startswith("ambiguous=")]
        if reasons["ambiguous"] > graceful["reload_losses"]:
            broken.insert(0, f"ambiguous={reasons['ambiguous'] - graceful['reload_losses']} (not at a reload)")
    if options.scenario == "default" and options.retry == "sdk" and failed:
        broken.append(f"failed={failed} with --retry sdk")
    # Admitting during the wait, a request on a connection busy at the drain's start is served
    # after the wait too: graceful run pins every open connection, the middleware inside vLLM the
    # connections of the requests in flight (docs/middleware.md, "Pinned connections").
    pinned = options.admit_during_propagation
    lossless = pinned or options.retries_refusals
    if lossless and options.scenario in ("default", "strict-clients") and failed:
        mode = "admitting during propagation" if pinned else "with the balancer retrying refusals"
        broken.append(f"failed={failed} {mode}")
    if options.scenario == "strict-clients" and not lossless:
        other = failed - reasons["rejected_retryable"]
        if other:
            broken.append(f"{other} failure(s) other than explicit retryable 503s")
    if options.active_hc and options.announce_drain and options.scenario != "node-loss":  # a lost node never drains
        # Push: an Envoy that health-checks the replicas takes each out at its first response
        # announcing the drain (plus its update_merge_window, 1 s).
        if graceful["sent_after_announcement"]:
            broken.append(
                f"{graceful['sent_after_announcement']} request(s) sent more than 1.5 s after the announcement"
            )
        if None in graceful["announced"]:
            broken.append("an old replica's drain was never announced in Envoy's access log")
        if options.propagation_quiet is not None and graceful["exit_max"] is not None:
            # Traffic stops about 1 s after the drain's start, the wait one quiet period later;
            # then the streams in flight end. 4 s covers the hook's start and the exit.
            bound = 4.0 + options.propagation_quiet - 1.0 + options.longest_stream
            if graceful["exit_max"] > bound:
                broken.append(
                    f"old replica exit {graceful['exit_max']:.1f} s after T0 (bound with the announcement: "
                    f"4 s + quiet beyond 1 s + longest stream = {bound:.1f} s)"
                )
    if options.scenario == "observed-propagation":
        if failed:
            broken.append(f"failed={failed}")
        # The quiet rule's promise: the wait ends one quiet period after the balancer forgot
        # the endpoint, plus 1 s for the hook's start and the last requests in flight.
        bound = options.lb_delay + (options.propagation_quiet or 0.0) + 1.0
        ends = graceful["propagation_ends"]
        late = [end for end in ends if end > bound]
        if late or len(ends) != graceful["deletions"]:
            broken.append(f"propagation ended at {ends} s after T0 (bound {bound:g} s, {graceful['deletions']} drains)")
    return broken


def _fmt_exit(summary: dict[str, Any]) -> str:
    if summary["exit_max"] is None:
        return "-"
    return f"{summary['exit_median']:.1f} / {summary['exit_max']:.1f} s"


def render(baseline: dict[str, Any] | None, graceful: dict[str, Any], options: Options) -> str:
    """The table; a missing baseline shows as ``-``."""
    sides = [s for s in (baseline, graceful) if s is not None]
    rows: list[tuple[str, ...]] = [("", *(s["kind"] for s in sides))]

    def row(label: str, key: Any) -> None:
        rows.append((label, *(str(key(s)) for s in sides)))

    row("requests", lambda s: s["requests"])
    row("  of which streams", lambda s: f"{s['streams']} ({100 * s['streams'] / max(1, s['requests']):.0f}%)")
    if options.gateway is not None:
        row("    Node openai SDK streams, failed", lambda s: f"{s['node_streams']}, {s['node_failed']}")
        row(
            "    Responses streams (Node SDK, curl), failed",
            lambda s: f"{s['responses_streams']}, {s['responses_failed']}",
        )
    for reason in REASONS:
        # Behind the gateway a client cannot tell a resumed stream; the count still checks its text.
        shown = options.resume or (options.gateway is not None and reason == "token_mismatch")
        if reason in RESUME_REASONS and not shown:
            continue
        row(f"  {reason}", lambda s, r=reason: s["by_reason"][r])
    row("duplicates (executed twice)", lambda s: s["duplicates"])
    row("retries", lambda s: s["retries"])
    row("  blind retries (maybe executed)", lambda s: s["blind_retries"])
    row("  idempotent replays", lambda s: s["replays"])
    row("old replicas deleted", lambda s: s["deletions"])
    row("SIGKILLed at the grace period", lambda s: s["sigkills"])
    if options.scenario == "node-loss":
        row("lost without warning (node loss)", lambda s: s["node_losses"])
        for part in ("by served-by", "by time", "elsewhere"):
            row(f"  losses attributed {part}", lambda s, p=part: s["loss_attribution"][p])
    row("old replica exit after T0, median / max", _fmt_exit)
    row("  budget (grace period)", lambda s: f"{s['grace_period']:g} s")
    row("  longest preStop / SIGTERM to exit", lambda s: f"{s['prestop_max']:.1f} / {s['term_to_exit_max']:.1f} s")
    row("preStop drain exit codes", lambda s: _codes(s["prestop_codes"]))
    if options.propagation_quiet is not None:
        row("  propagation ended after T0, max", lambda s: _max_seconds(s["propagation_ends"]))
    if options.balancer == "envoy":
        row(
            "envoy: drain announced after T0, max", lambda s: _max_seconds([a for a in s["announced"] if a is not None])
        )
        row("  last request sent after T0, max", lambda s: _max_seconds([a for a in s["last_sent"] if a is not None]))
        row("  requests sent > 1.5 s after it", lambda s: s["sent_after_announcement"] if any(s["announced"]) else "-")
    row("balancer: failed backend connects", lambda s: s["connect_errors"])
    if options.balancer == "nginx" and any(s["reloads"] for s in sides):  # the fallback without Lua
        row("nginx reloads (endpoint changes)", lambda s: s["reloads"])
        row("  requests lost at a reload (client side)", lambda s: s["reload_losses"])
    if options.scenario == "client-disconnect":
        row("clients that walked away mid-stream", lambda s: s["walkaways"])
    row("run time", lambda s: f"{s['elapsed']} s")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        f"scenario {options.scenario}: {options.replicas} replicas, {options.updates} rolling update(s), "
        f"retry {options.retry}, grace {options.grace_period:g}s, propagation wait {options.propagation_wait:g}s, "
        f"balancer delay {options.lb_delay:g}s"
        + (f", propagation quiet {options.propagation_quiet:g}s" if options.propagation_quiet is not None else "")
        + (", admit during propagation" if options.admit_during_propagation else ", refuse during propagation"),
        f"balancer: {graceful['balancer']}",
        *(
            [
                f"gateway: {graceful['gateway']} (openai/{MODEL}, graceful_resume: true) resumes the streams; "
                "clients run no graceful code: raw SSE over httpx, the Node openai SDK, and curl -N on /v1/responses"
            ]
            if graceful["gateway"]
            else []
        ),
        *(["replicas: vllm serve (CPU, the tiny random model of tests/vllm/make_model.py)"] if options.vllm else []),
        "",
    ]
    for r in rows:
        lines.append("  ".join(cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(r)))
    lines.append("")
    if baseline is not None and baseline["kind"] == "baseline":
        base_failed = sum(baseline["by_reason"][r] for r in REASONS if r != "ok")
        if base_failed == 0 and not baseline["duplicates"]:
            lines.append("baseline: no failed request in this configuration.")
        else:
            lines.append(f"baseline: {base_failed} request(s) did not end ok.")
        if baseline["blind_retries"]:
            lines.append(
                f"baseline: {baseline['blind_retries']} retr{'y was' if baseline['blind_retries'] == 1 else 'ies were'}"
                " blind: sent after an attempt that may already have run."
            )
    if options.gateway is not None:
        for side in sides:
            lines.extend([*render_drains(side, options), ""])
    for side in sides:
        lines.extend(f"{side['kind']}: note: {note}" for note in side["notes"])
    if options.vllm:
        lines.append(
            "note: vLLM keeps no execution count per idempotency key: duplicates are keys with two fresh 2xx answers; "
            "answers are judged by their length (ignore_eos: finish_reason length with every token asked for)."
        )
    l7 = options.balancer in L7_BALANCERS
    if not l7 and (graceful["connect_errors"] or (baseline and baseline["connect_errors"])):
        lines.append(
            "note: an L4 balancer accepts the client's connection before it connects to the replica, so a request sent "
            "to a replica that no longer listens ends as 'ambiguous' here, where kube-proxy would show 'refused'."
        )
    if any(side["reload_losses"] for side in sides):
        lines.append(
            "note: an nginx reload closes the old workers' idle client connections; a request sent on one at that "
            "instant ends 'ambiguous' whatever the replicas do (ingress-nginx changes endpoints without a reload)."
        )
    if l7 and (graceful["connect_errors"] or (baseline and baseline["connect_errors"])):
        lines.append(
            "note: an L7 balancer connects to the replica for each request it cannot send on an idle connection; "
            "a refused connect is retried or answered by the balancer itself (its own 502/503: http_error here)."
        )
    return "\n".join(lines)


def _max_seconds(values: list[float]) -> str:
    return f"{max(values):.1f} s" if values else "-"


def _codes(codes: list[int]) -> str:
    if not codes:
        return "-"
    names = {0: "drained", 1: "deadline", 3: "no server"}
    counts: dict[str, int] = {}
    for code in codes:
        name = names.get(code, f"exit {code}")
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{name} {count}" for name, count in counts.items())
