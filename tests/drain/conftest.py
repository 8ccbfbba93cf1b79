"""The drain's own clock, still until a test moves it: the ``clock`` fixture of every test here that
pins an instant (a bound reached exactly, the drain's first instant)."""

from __future__ import annotations

import pytest

import graceful._drain._core
import graceful._drain._run
import graceful._drain._state


class FakeTime:
    """Stands in for ``time`` in graceful._drain._state, _core and _run only (the event loop keeps
    real time)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_700_000_000.0 + self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(graceful._drain._state, "time", fake)
    monkeypatch.setattr(graceful._drain._core, "time", fake)
    monkeypatch.setattr(graceful._drain._run, "time", fake)
    return fake
