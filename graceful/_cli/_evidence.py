"""Where ``graceful advise`` reads its evidence: every worker's admin status, the statuses ``graceful status
--json`` saved, or an engine's request-duration histogram; and the one source it may read at once."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import anyio

from .._admin._client import NoServer, discover, request_all
from .._admin._wire import Field, Route
from .._drain._advice import Evidence
from .._drain._observed import KINDS, Histogram, ObservationError
from ._drain_client import EXIT_NO_SERVER, EXIT_USAGE

__all__ = [
    "Problem",
    "as_typed",
    "engine_evidence",
    "evidence_from",
    "one_source",
    "saved_evidence",
    "server_evidence",
]


class Problem(Exception):
    """What keeps ``advise`` from advising, with the exit code it means."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def server_evidence(socket_dir: str | None, socket: str | None) -> tuple[Evidence, dict[str, Any]]:
    """Every worker's durations, merged, and the budget in force (the first worker's); raises Problem."""
    try:
        paths = discover(socket_dir, socket)
        answers = request_all(paths, "GET", Route.STATUS)
    except NoServer as exc:
        raise Problem(str(exc), EXIT_NO_SERVER) from None
    live = [body for body in answers.values() if body is not None]
    if not live:
        raise Problem("no graceful server found: nothing is listening on " + ", ".join(paths), EXIT_NO_SERVER)
    return evidence_from(live)


def saved_evidence(files: tuple[str, ...]) -> tuple[Evidence, dict[str, Any]]:
    """The workers' statuses saved by ``graceful status --json`` (a list per file), merged; raises Problem.

    Input given twice counts once: a file named twice (by any path) is read once, and a worker saved
    twice (the same process: its pid and when its counts began) counts by its latest status only.
    """
    read: set[str] = set()
    workers: dict[tuple[object, ...], tuple[str, dict[str, Any]]] = {}
    for name in files:
        path = os.path.realpath(name)
        if path in read:
            continue
        read.add(path)
        try:
            with open(name, encoding="utf-8") as saved:
                content = json.load(saved)
        except OSError as exc:
            raise Problem(f"--from {name}: {exc.strerror}; give a file written by graceful status --json") from None
        except ValueError as exc:
            raise Problem(f"--from {name}: not JSON ({exc}); give a file written by graceful status --json") from None
        for index, body in enumerate(content if isinstance(content, list) else [content]):
            if not isinstance(body, dict) or Field.PID not in body or Field.STATE not in body:
                raise Problem(
                    f"--from {name}: not a worker status written by graceful status --json; "
                    f"save one with graceful status --json > {name}"
                )
            key = _worker(body) or (path, index)
            kept = workers.get(key)
            if kept is None or _until(body) > _until(kept[1]):
                workers[key] = (f"--from {name}", body)
    if not workers:
        given = " ".join(f"--from {name}" for name in files)
        where = "it" if len(files) == 1 else "them"
        raise Problem(f"{given}: no worker status in {where}; give files written by graceful status --json")
    origins, bodies = zip(*workers.values(), strict=True)
    return evidence_from(list(bodies), list(origins))


def _worker(body: dict[str, Any]) -> tuple[object, ...] | None:
    """Which process a saved status is (its pid and when its counts began), or None when it does not say."""
    durations = body.get(Field.DURATIONS)
    began = durations.get(Field.SINCE) if isinstance(durations, dict) else None
    return None if began is None else (str(body.get(Field.PID)), str(began))


def _until(body: dict[str, Any]) -> float:
    """When a saved status's counts end (0 when it does not say): of two of one worker, the later holds more."""
    durations = body.get(Field.DURATIONS)
    until = durations.get(Field.UNTIL) if isinstance(durations, dict) else None
    return float(until) if isinstance(until, (int, float)) else 0.0


def evidence_from(bodies: list[dict[str, Any]], origins: list[str] | None = None) -> tuple[Evidence, dict[str, Any]]:
    """Merge workers' statuses (``/status`` answers) and take the first one's budget; raises Problem.

    ``origins`` says where each came from (``--from FILE``), for the messages."""
    histograms: dict[str, Histogram] = {}
    now = time.time()
    since, until, propagation = now, 0.0, list[float]()
    for position, body in enumerate(bodies):
        where = f"{origins[position]}: " if origins else ""
        worker = f"{where}worker {body.get(Field.PID, '?')}"
        durations = body.get(Field.DURATIONS)
        if not isinstance(durations, dict) or Field.BOUNDS not in durations:
            raise Problem(f"{worker} reports no request durations: upgrade its graceful")
        try:
            for kind in KINDS:
                seen = Histogram.from_dict(durations[Field.BOUNDS], durations.get(kind) or {})
                histograms[kind] = histograms[kind].merged(seen) if kind in histograms else seen
            since = min(since, float(durations.get(Field.SINCE) or since))
            until = max(until, float(durations.get(Field.UNTIL) or now))
            propagation.extend(float(p) for p in body.get(Field.PROPAGATION) or ())
        except (ObservationError, AttributeError, TypeError, ValueError) as exc:
            raise Problem(f"{worker}: unreadable durations ({exc})") from None
    workers = f"{len(bodies)} worker{'s' if len(bodies) != 1 else ''}"
    return Evidence(histograms, until - since, tuple(propagation), workers), dict(bodies[0].get(Field.BUDGET) or {})


def engine_evidence(engine: str | None, metrics_url: str | None, histogram: str | None) -> Evidence:
    """The engine's request-duration histogram, read once off its page; raises Problem."""
    from .._engine._histogram import EvidenceError, fetch_histogram
    from .._engine._presets import PRESETS

    preset = PRESETS[engine] if engine is not None else None
    name = histogram or (preset.histogram if preset is not None else "")
    if not name:
        if preset is not None:
            raise Problem(
                f"--engine {engine}: it publishes no request-duration histogram; name one with --histogram NAME"
            )
        raise Problem("--metrics-url needs --engine (vllm, sglang, tgi) or --histogram NAME to know what to read")
    url = metrics_url or (preset.url if preset is not None else "")
    if not url:
        raise Problem(f"--histogram {name} needs --metrics-url (the engine's metrics page) or --engine")
    try:
        seen = anyio.run(fetch_histogram, url, name)
    except EvidenceError as exc:
        raise Problem(str(exc), EXIT_NO_SERVER if exc.unreachable else EXIT_USAGE) from None
    return Evidence({"all requests": seen}, None, (), f"{name} at {url}", sees_drains=False)


def one_source(*sources: str) -> None:
    """Refuse two sources of evidence at once (running servers, saved statuses, an engine's page);
    raises Problem (exit 2). Each source is as the command line gave it (``--from status.json``),
    or "" when not given: ``as_typed`` makes one."""
    named = [source for source in sources if source]
    if len(named) > 1:
        listed = f"{', '.join(named[:-1])} or {named[-1]}"
        raise Problem(
            f"use {listed}, not {'both' if len(named) == 2 else 'more than one'}: each is a source of evidence"
        )


def as_typed(*options: tuple[str, str | None]) -> str:
    """The first option of one source that the command line gave, as typed (``--engine vllm``), else ""."""
    return next((f"{flag} {value}" for flag, value in options if value), "")
