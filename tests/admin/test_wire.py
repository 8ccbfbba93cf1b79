"""The admin protocol's names are declared once (``graceful._admin._wire``), and both ends keep to them.

The server writes every answer through ``Event`` and ``Field`` (the drain's own snapshots among
them); the client and the CLI read every answer through the same names. Here the real server
answers the real CLI, and every object the client parses records which keys were read.
"""

from __future__ import annotations

import json
import types
from typing import Any, get_args

import pytest
from click.testing import CliRunner

import graceful._admin._client
from graceful import State
from graceful._admin._wire import Event, Field, Value
from graceful._drain._observed import KINDS
from graceful._drain._status import DrainOutcome
from graceful.cli import cli
from tests.servers import Served


def declared(names: type) -> dict[str, str]:
    return {name: value for name, value in vars(names).items() if not name.startswith("_")}


@pytest.mark.parametrize("names", [Event, Field, Value])
def test_each_name_is_its_value_in_capitals_and_declared_once(names: type) -> None:
    values = declared(names)
    assert values and all(name == value.upper() for name, value in values.items())
    assert len(set(values.values())) == len(values)


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
