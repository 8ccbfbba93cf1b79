"""Admit only what can finish: the ``admission`` option and the estimate it judges a request by (issue 54).

With ``admission="fits"``, a request that arrives while DRAINING, and that the drain would admit,
is admitted only when its expected run ends before this replica ends it (the drain's deadline; with
``handoff_streams``, a resumable stream's handoff at the end of the propagation wait). Otherwise
it gets the not-started 503 (``would_not_finish``), which a retrying client or balancer sends
elsewhere. Nothing here runs while SERVING: the middleware asks only during a drain.

The expected run, from what this server has seen (docs/budget.md, "Admission during a drain"):

- the body's token limit (``max_tokens``, ``max_completion_tokens`` or ``max_output_tokens``), plus one,
  times the time per token, plus the time to the first frame, as ``Pace`` observed them for streams;
- without a limit, a pace, or a JSON body: the durations seen of its kind (a stream when the body asks
  for one, plain when it does not, either when it is not JSON) at ``HIGH``;
- nothing seen yet: no estimate, and the request is admitted, as with ``admission="all"``.

Knows nothing of ASGI: the middleware hands it the body's bytes.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Literal

from ._errors import ConfigError
from ._observed import Histogram, merge_all

__all__ = [
    "ALL",
    "FITS",
    "Admission",
    "HIGH",
    "LIMIT_KEYS",
    "MODES",
    "WOULD_NOT_FINISH",
    "Pace",
    "check_mode",
    "expected_run",
    "read_mode",
]

Admission = Literal["all", "fits"]
ALL: Admission = "all"
FITS: Admission = "fits"
MODES: tuple[Admission, ...] = (ALL, FITS)
# The refusal's reason: graceful_rejected_total{reason="would_not_finish"} and the 503 body's type.
WOULD_NOT_FINISH = "would_not_finish"
# The OpenAI-style token limits: Chat Completions (both names) and Completions, and the Responses API.
LIMIT_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# The percentile of what was seen that stands for what a request will take: the durations and the time per
# token (the time to the first frame is the median of those seen). High, so that a request is refused rather
# than cut.
HIGH = 0.95
# How many streams' pace is kept: the newest, so the figure follows the load.
SAMPLES = 64
_MODES_TEXT = " or ".join(MODES)


def read_mode(raw: str) -> Admission:
    """``GRACEFUL_ADMISSION``'s value (the error is named where the variable is read: ``_environ.Given``)."""
    mode = raw.strip().lower()
    if mode not in MODES:
        raise ConfigError(f"{raw!r} is not an admission mode; use {_MODES_TEXT}")
    return mode


def check_mode(value: object) -> Admission:
    """``admission=`` as given in code."""
    if value not in MODES:
        raise ConfigError(f"{value!r} is not an admission mode; use {' or '.join(map(repr, MODES))}")
    return value


class Pace:
    """How fast this server's streams went: per stream sampled, the time from admission to its first body
    frame and the time per frame after it (a token, on an OpenAI-style stream), the newest ``SAMPLES``.

    The middleware's lifespan samples a few streams at a time (``graceful/_asgi/_admission.py``);
    ``record`` is all it calls.
    """

    __slots__ = ("_first_token", "_time_per_token", "first", "per_token")

    def __init__(self) -> None:
        self.first: deque[float] = deque(maxlen=SAMPLES)
        self.per_token: deque[float] = deque(maxlen=SAMPLES)
        # The figures, worked out when a sample comes (every few seconds), read by every judged request.
        self._time_per_token: float | None = None
        self._first_token = 0.0

    def record(self, first: float | None, per_token: float | None) -> None:
        if first is not None and first >= 0:
            self.first.append(first)
            self._first_token = _percentile(self.first, 0.5) or 0.0
        if per_token is not None and per_token >= 0:
            self.per_token.append(per_token)
            self._time_per_token = _percentile(self.per_token)

    def time_per_token(self) -> float | None:
        """The time per token at ``HIGH``, or None before any stream was sampled."""
        return self._time_per_token

    def first_token(self) -> float:
        """The time to the first frame, the median of those seen (0 before any): it is the queue's and the
        prefill's of the moment, and the few a replica that has just started sees are its slowest."""
        return self._first_token

    def as_dict(self) -> dict[str, object]:
        per_token = self.time_per_token()
        return {
            "streams": len(self.per_token),
            "time_per_token": None if per_token is None else round(per_token, 6),
            "first_token": round(self.first_token(), 6),
        }


def _percentile(values: deque[float], share: float = HIGH) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def token_limit(request: object) -> int | None:
    """The body's token limit: the first of ``LIMIT_KEYS`` it sets to a whole number of at least 1."""
    if not isinstance(request, dict):
        return None
    for key in LIMIT_KEYS:
        value = request.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _kind(request: object) -> str | None:
    """Which durations a request is judged by: ``stream`` when the body asks for one, else ``plain``;
    None (all of them) when the body is not a JSON object."""
    if not isinstance(request, dict):
        return None
    return "stream" if request.get("stream") is True else "plain"


def parse_body(body: bytes | None) -> object:
    """The body as JSON, or None when there is none, it was not read whole, or it is not JSON."""
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:  # not JSON, or not UTF-8 (UnicodeDecodeError is a ValueError)
        return None


def expected_run(body: bytes | None, pace: Pace, durations: Callable[[], Mapping[str, Histogram]]) -> float | None:
    """How long a request with this body is expected to run here, in seconds; None when nothing seen
    says (admit it). ``body`` is the whole body, or None when it was not read whole; ``durations`` gives
    the durations seen by kind, asked for only when the body's limit and the pace do not say."""
    request = parse_body(body)
    limit = token_limit(request)
    per_token = pace.time_per_token()
    if limit is not None and per_token is not None:
        # One frame more than the limit: the first frame timed may carry no token (an OpenAI chat
        # stream's role chunk), and the first token then comes a frame after it.
        return pace.first_token() + (limit + 1) * per_token
    kind = _kind(request)
    by_kind = durations()
    seen = by_kind.get(kind) if kind is not None else merge_all(by_kind.values())
    if seen is None or seen.count == 0:
        return None
    return seen.quantile(HIGH)
