"""What every spliced stream keeps across its attempts, whatever its framing: the sans-IO base of
``Splice`` (Chat Completions and Completions) and ``ResponsesSplice`` (the Responses API).

It splits the bytes of each attempt into events, holds graceful's final event back, counts the
continuations against ``max_resumes``, paces the ones that brought nothing, bounds the tokens by the
request's limit, and decides what the caller sees when the stream ends without resuming. A subclass
reads and rewrites the events of its framing (``_event``), says why its answer cannot be continued
(``_framing_verdict``) and carries what the caller has into the continuation request (``_carry``).
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import httpx

from .._stream._rules import final_event, json_object

__all__ = ["RETRY_ATTEMPTS", "Attempts", "event_data", "streamed_body"]

logger = logging.getLogger("graceful")

# A continuation the balancer sends to a replica that refuses it (still draining, or
# gone) is sent again: up to this many times in a row (see also _transport.RETRY_WINDOW).
RETRY_ATTEMPTS = 16
_EVENT_END = (b"\r\n\r\n", b"\n\n", b"\r\r")


class Attempts:
    """The state of one resumable stream across its attempts that does not depend on its framing."""

    # The request's fields that bound the tokens to generate, in the order the server reads them.
    LIMITS: tuple[str, ...] = ()

    def __init__(self, payload: dict[str, Any], max_resumes: int) -> None:
        self.payload = payload
        self.max_resumes = max_resumes
        self.resumes = 0  # continuations sent
        # Continuations that brought events count against max_resumes. One ended before its
        # first event (it reached a replica that handed it off at once) is retried like a
        # refused one instead: after a pause, at most RETRY_ATTEMPTS times in a row.
        self.charged = 0
        self.idle = 0
        self.events_at_resume = 0
        self.buffer = b""
        self.bytes_out = 0
        self.events = 0  # complete answer events across all attempts
        self.tokens = 0  # completion tokens received
        self.carried_tokens = 0  # tokens carried into the current attempt
        self.first: dict[str, Any] | None = None  # what names the answer (its id) to the caller
        self.done = False  # the answer's own end seen
        self.shutdown: bytes | None = None  # graceful's final event, held back
        self.blocked: str | None = None  # why this stream must not resume
        # The cut a continuation was sent for (the held events and the final event), shown to the
        # caller if no continuation answers: the stream then ends as the server ended it.
        self.unanswered = b""

    # -- what a framing supplies -----------------------------------------------------------

    def _event(self, event: dict[str, Any], raw: bytes) -> bytes:
        """One event of the answer in (its JSON object, and as it came); what the caller gets of it out."""
        raise NotImplementedError

    def _marker(self, data: bytes, raw: bytes) -> bytes | None:
        """What the caller gets of an event whose data is the framing's end marker, not JSON (``[DONE]``);
        None for any other event (the Responses framing has none)."""
        return None

    def _framing_verdict(self) -> str | None:
        """Once an attempt has ended: why the framing's answer so far cannot be continued (None: it can)."""
        return None

    def _carry(self, body: dict[str, Any]) -> None:
        """Put what the caller has of the answer into the next request's body (a copy of the first's)."""
        raise NotImplementedError

    def _release(self) -> bytes:
        """Events held from the caller that the stream's end shows after all (none by default)."""
        return b""

    def _rewind(self) -> None:
        """At a cut, before the continuation is built: take back from the counts what was received
        but is not carried over (none by default). Once per cut, however often it is called."""

    def _new_attempt(self) -> None:
        """Forget what belongs to the attempt that ended (its held events)."""

    # -- shared ----------------------------------------------------------------------------------

    def feed(self, data: bytes) -> bytes:
        self.buffer += data
        out: list[bytes] = []
        while True:
            cut = _event_end(self.buffer)
            if cut is None:
                break
            end, size = cut
            raw = self.buffer[: end + size]
            self.buffer = self.buffer[end + size :]
            emitted = self._take(raw)
            if emitted:
                out.append(emitted)
        result = b"".join(out)
        self.bytes_out += len(result)
        return result

    def _take(self, raw: bytes) -> bytes:
        """One whole event of the current attempt in; what the caller gets of it out."""
        data = event_data(raw)
        if data is None:
            return raw  # a comment or keep-alive: pass it on
        if self.done:
            return b""  # nothing after the answer's end
        marker = self._marker(data, raw)
        if marker is not None:
            return marker
        event = self.parsed(data)
        if event is None:
            return raw
        if final_event(event.get("error")):
            self.shutdown = raw  # handed back only if the stream does not resume
            return b""
        return self._event(event, raw)

    def verdict(self) -> str | None:
        """Once an attempt has ended: why not to resume (None: resume)."""
        if self.done:
            return "complete"
        if self.shutdown is None and self.events == 0:
            return "cut before any complete event"
        if self.blocked is not None:
            return self.blocked
        why = self._framing_verdict() or self.progress_verdict()
        if why is not None:
            return why
        left = self.remaining()
        if left is not None and left <= 0:
            return "no tokens left to generate"
        return None

    def remaining(self) -> int | None:
        """The tokens the request's limit (the first of ``LIMITS`` it sets) leaves, or None without one."""
        for name in self.LIMITS:
            value = self.payload.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                return value - self.tokens
        return None

    def continuation(self) -> bytes:
        """The next request's body: the first's, with what the caller has and its limits lowered by the
        tokens received."""
        self._rewind()
        body = copy.deepcopy(self.payload)
        self._carry(body)
        for name in self.LIMITS:
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                body[name] = max(1, value - self.tokens)
        return json.dumps(body, separators=(",", ":")).encode()

    def resume_reason(self, error: BaseException | None) -> str | None:
        """Once an attempt has ended (``error``: how its read failed, if it did): why to resume, or
        None not to. A cut or shut-down stream that is not resumed is logged with the reason."""
        why = self.verdict()
        if why is None:
            return "shutdown event" if self.shutdown else f"cut: {error or 'closed'}"
        if why != "complete" and (error is not None or self.shutdown):
            logger.info("stream %s ends without resuming: %s", (self.first or {}).get("id", "?"), why)
        return None

    def progress_verdict(self) -> str | None:
        """The bounds every framing shares: max_resumes for continuations that brought events, and
        RETRY_ATTEMPTS in a row for those that brought none."""
        progress = self.events > self.events_at_resume or not self.resumes
        if progress and self.charged >= self.max_resumes:
            return f"max_resumes={self.max_resumes} reached"
        if not progress and self.idle >= RETRY_ATTEMPTS:
            return f"{RETRY_ATTEMPTS} continuations in a row ended before their first event"
        return None

    def begin_resume(self, reason: str, url: httpx.URL) -> bytes:
        self._rewind()
        if self.events > self.events_at_resume or not self.resumes:
            self.charged += 1
            self.idle = 0
        else:
            self.idle += 1
        self.events_at_resume = self.events
        self.resumes += 1
        self.carried_tokens = self.tokens
        self.unanswered = self._held() + (self.shutdown or b"")
        self.buffer = b""
        self.shutdown = None
        self._new_attempt()
        logger.info(
            "resuming stream %s (%s) at %s: %d bytes and %d tokens carried over (resume %d of at most %d)",
            (self.first or {}).get("id", "?"),
            reason,
            url,
            self.bytes_out,
            self.tokens,
            self.charged,
            self.max_resumes,
        )
        return self.continuation()

    def _held(self) -> bytes:
        """The events held from the caller now, without releasing them."""
        return b""

    def parsed(self, data: bytes) -> dict[str, Any] | None:
        """An event's JSON object, or None to pass the event on as it came (an event that is not JSON
        also stops the stream from resuming: its framing is not understood)."""
        try:
            event = json.loads(data)
        except (UnicodeDecodeError, ValueError):
            self.blocked = "an event that is not JSON"
            return None
        return event if isinstance(event, dict) else None

    def pause(self) -> float:
        """How long to wait before this continuation: none after progress, backing off after none."""
        return 0.0 if not self.idle else min(0.05 * 2**self.idle, 0.5)

    def resumed(self) -> None:
        """A continuation has answered: the cut it continues is never shown."""
        self.unanswered = b""

    def surfaced(self) -> bytes:
        """What to hand the caller when the stream ends without resuming: the held events and the final
        event, or, where no continuation answered, those of the cut it was sent for."""
        final, self.shutdown = self.shutdown, None
        unanswered, self.unanswered = self.unanswered, b""
        return unanswered + self._release() + (final or b"")


def _event_end(buffer: bytes) -> tuple[int, int] | None:
    best: tuple[int, int] | None = None
    for sep in _EVENT_END:
        at = buffer.find(sep)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, len(sep))
    return best


def streamed_body(body: bytes) -> dict[str, Any] | None:
    """A request body's JSON object when it asks for a stream (``"stream": true``), else None."""
    payload = json_object(body)
    return payload if payload is not None and payload.get("stream") is True else None


def event_data(raw: bytes) -> bytes | None:
    """The joined ``data:`` lines of one SSE event, or None when it has none."""
    lines = [line for line in raw.replace(b"\r\n", b"\n").split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[6:] if line.startswith(b"data: ") else line[5:] for line in lines)
