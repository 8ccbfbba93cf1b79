"""The stream rules both ends share (graceful/_stream/_rules.py), on their edges."""

from __future__ import annotations

from graceful._asgi._http import Call
from graceful._stream._ends import DONE, ended_early, next_sequence_number
from graceful._stream._rules import (
    engine_dead,
    engine_dead_body,
    engine_dead_exception,
    event_stream,
    media_type,
    server_failed,
)
from tests.asgi.test_engine_death import DEAD_BODY, GENERATION_ERROR, EngineDeadError


def test_a_dead_engines_body_is_told_from_other_bodies() -> None:
    assert engine_dead_body(DEAD_BODY)
    assert not engine_dead_body(GENERATION_ERROR)
    assert not engine_dead_body(b"Internal Server Error")  # not JSON
    assert not engine_dead_body(b"[1]")  # JSON, not an object
    assert not engine_dead({"code": 500, "message": 3})  # a message that is not text
    assert not server_failed({"type": "server_shutdown", "code": 503})  # graceful's own final event


def test_the_engines_death_is_found_along_an_exception_chain_and_a_loop_ends() -> None:
    dead = EngineDeadError("EngineCore encountered an issue.")
    wrapped = RuntimeError("response already started")
    wrapped.__cause__ = dead
    assert engine_dead_exception(wrapped) == "EngineDeadError: EngineCore encountered an issue."
    assert engine_dead_exception(ValueError("bad")) is None
    first, second = ValueError("a"), ValueError("b")
    first.__context__, second.__context__ = second, first  # a cycle: the search still ends
    assert engine_dead_exception(first) is None


def test_media_types_are_read_the_same_from_bytes_and_text() -> None:
    assert media_type(b"Text/Event-Stream; charset=utf-8") == media_type("text/event-stream") == "text/event-stream"


def test_an_event_stream_is_told_from_bytes_and_text() -> None:
    assert event_stream(b"text/event-stream; charset=utf-8") and event_stream("Text/Event-Stream")
    assert not event_stream(b"application/x-ndjson") and not event_stream("")


def test_the_middleware_looks_for_the_same_end_of_stream() -> None:
    """The middleware's send compares each frame with [DONE] written as a constant (the cheapest check
    per frame): it must be the one the stream rules name."""
    assert DONE in Call.send.__code__.co_consts


def test_an_error_event_that_is_not_json_or_not_a_failure_ends_nothing_early() -> None:
    assert ended_early(None, b'data: {"error" not json\n\n') is None
    assert ended_early(None, b'data: {"error": {"code": 400, "message": "bad"}}\n\n') is None
    assert ended_early(None, b'data: {"choices": []}\n\n') is None
    assert next_sequence_number(None, None) == 0
