"""The admin protocol's names are declared once (``graceful._admin._wire``), and both ends keep to them.

The server writes every answer through ``Event`` and ``Field`` (the drain's own snapshots among
them); the client and the CLI read every answer through the same names. Here the real server
answers the real CLI, and every object the client parses records which keys were read.
"""

from __future__ import annotations

import inspect
import json
import types
from typing import Any, get_args

import pytest
from click.testing import CliRunner

import graceful._admin._client
from graceful import Drain, State
from graceful._admin._wire import (
    FAILURE_FIELDS,
    METHODS,
    OUTLOOK_FIELDS,
    RESULT_FIELDS,
    STATUS_FIELDS,
    Event,
    Field,
    Param,
    Route,
    Value,
)
from graceful._drain._observed import KINDS
from graceful._drain._status import DrainOutcome
from graceful.cli import cli
from tests.servers import Served


def declared(names: type) -> dict[str, str]:
    return {name: value for name, value in vars(names).items() if not name.startswith("_")}


@pytest.mark.parametrize("names", [Event, Field, Param, Value])
def test_each_name_is_its_value_in_capitals_and_declared_once(names: type) -> None:
    values = declared(names)
    assert values and all(name == value.upper() for name, value in values.items())
    assert len(set(values.values())) == len(values)


def test_each_route_takes_one_method_and_the_drains_query_its_own_options() -> None:
    assert set(METHODS) == set(declared(Route).values()) and set(METHODS.values()) <= {"GET", "POST"}
    assert all(route == "/" + name.lower() for name, route in declared(Route).items())
    # The query's durations are a drain's own options, as Drain.begin_drain names them.
    own = set(inspect.signature(Drain.begin_drain).parameters) - {"self"}
    assert set(declared(Param).values()) == own


def test_each_answer_declares_its_fields_once() -> None:
    for fields in (STATUS_FIELDS, RESULT_FIELDS, OUTLOOK_FIELDS, FAILURE_FIELDS):
        assert len(set(fields)) == len(fields) and set(fields) <= set(declared(Field).values())


def test_the_server_sends_each_answer_with_exactly_its_declared_fields(served: Served) -> None:
    """1. a worker's status, its resume and a drain's status and result events 2. each carries the fields
    its answer declares, and the snapshots' other keys (none today) stay off the wire."""
    directory = ("--socket-dir", served.socket_dir)
    status = json.loads(CliRunner().invoke(cli, ["status", "--json", *directory]).stdout)[0]
    assert list(status) == ["socket", *STATUS_FIELDS]
    drained = CliRunner().invoke(cli, ["drain", "--json", *directory])
    [worker] = json.loads(drained.stdout)["workers"]
    assert list(worker["result"]) == [Field.EVENT, Field.PID, *RESULT_FIELDS]


def test_the_values_are_the_drains_own() -> None:
    assert {Value.DRAINED, Value.TIMEOUT, Value.RESUMED} <= set(get_args(DrainOutcome))
    assert Value.FAILED == State.FAILED.value


class Recorder:
    """Stands in for the client's ``json``: every object it parses records the keys read off it."""

    def __init__(self) -> None:
        self.read: set[str] = set()
        self.answers: list[dict[str, Any]] = []
        recorder = self

        class Recorded(dict[str, Any]):
            def __getitem__(self, key: str) -> Any:
                recorder.read.add(key)
                return super().__getitem__(key)

            def get(self, key: str, default: Any = None) -> Any:
                recorder.read.add(key)
                return super().get(key, default)

            def __contains__(self, key: object) -> bool:
                recorder.read.add(str(key))
                return super().__contains__(key)

        self.recorded = Recorded

    def loads(self, text: str | bytes) -> Any:
        answer = json.loads(text, object_hook=self.recorded)
        self.answers.append(answer)
        durations = dict.get(answer, Field.DURATIONS) if isinstance(answer, dict) else None
        if isinstance(durations, dict):
            # Each kind's counts and sum are the drain's own format, read by the drain's own code
            # (Histogram.from_dict reads what Durations.as_dict wrote): not the protocol's names.
            for kind in set(KINDS) & durations.keys():
                dict.__setitem__(durations, kind, dict(dict.__getitem__(durations, kind)))
        counters = dict.get(answer, Field.COUNTERS) if isinstance(answer, dict) else None
        if isinstance(counters, dict):
            # The counters are the tally's own groups and reasons (Tally.as_dict): data, as the kinds are.
            dict.__setitem__(answer, Field.COUNTERS, {group: dict(value) for group, value in counters.items()})
        return answer

    def sent(self) -> set[str]:
        """The keys of every answer, and of the objects inside them that the protocol shapes."""
        keys: set[str] = set()
        for answer in self.answers:
            keys |= answer.keys()
            for inner in (Field.OUTLOOK, Field.FAILURE, Field.DURATIONS):
                value = dict.get(answer, inner)
                if isinstance(value, dict):
                    keys |= value.keys() - set(KINDS)  # the durations' kinds of request are data
        return keys


def test_every_name_the_server_sends_and_the_cli_reads_is_declared(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1. a drain the server refuses  2. a drain while a stream runs: status, progress (the 1.4 s
    stream outlasts the first second), result, the propagation phase ended by the quiet rule
    3. resume, status, advise  4. a FAILED worker's status and resume. Every key of every answer
    and every key the CLI read is declared, and every declared name was sent."""
    recorder = Recorder()
    monkeypatch.setattr(graceful._admin._client, "json", types.SimpleNamespace(loads=recorder.loads))
    directory = ("--socket-dir", served.socket_dir)

    def invoke(*args: str) -> str:
        result = CliRunner().invoke(cli, [*args, *directory])
        assert result.exception is None or isinstance(result.exception, SystemExit), result.output
        return result.output

    assert "propagation_quiet 5s is longer" in invoke("drain", "--propagation-quiet", "5s")  # the server's 400
    thread, _ = served.stream_in_background(frames=14)
    drained = invoke("drain", "--propagation-wait", "3s", "--propagation-quiet", "0.3s")
    thread.join(10)
    assert "in flight at the drain's start" in drained and "ended by the quiet rule" in drained
    assert "(resumed)" in invoke("resume")
    invoke("status")
    invoke("advise")
    served.mw.drain.mark_failed("engine_dead", "the engine is gone")
    assert "engine_dead: the engine is gone" in invoke("status")
    assert "has failed (engine_dead: the engine is gone)" in invoke("resume")

    names = set(declared(Field).values())
    events = {dict.get(answer, Field.EVENT) for answer in recorder.answers} - {None}
    assert events == set(declared(Event).values())
    assert recorder.sent() - names == set()
    assert recorder.read - set(KINDS) - names == set()
    assert names - recorder.sent() == set()
    assert {Field.LEFT, Field.SINCE_LAST_REQUEST, Field.RESUMED, Field.DETAIL, Field.BOUNDS} <= recorder.read
