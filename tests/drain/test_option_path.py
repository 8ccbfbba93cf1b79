"""The path of one option's value (issue 53, docs/architecture.md "The path of one option"), followed as the
program runs: Python's profiler (``sys.setprofile``) records every call of graceful's own code that receives
the value, or what a call made of it returns, as an argument. From a keyword argument or a ``GRACEFUL_*``
variable to the field that holds it, the value passes through two modules, ``_environ`` (taken, and named
on error) and ``_durations`` (its rule and the budget's), returns to none it left, and goes by a few names."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click
import pytest

from graceful import Budget, Drain
from graceful._cli._params import DURATION

Stop = tuple[str, str, str]  # (module, function, the parameter that holds the value)


def follow(option: str, value: object, run: Callable[[], object]) -> list[Stop]:
    """The calls of graceful's code that receive ``value`` while ``run`` runs, in order: as an argument, in a
    mapping under ``option``'s name, or as what a call that received it returned (its seconds, say)."""
    tracked = {id(value)}
    holding: set[int] = set()
    stops: list[Stop] = []

    def holds(item: object) -> bool:
        if isinstance(item, dict):
            return option in item and id(item[option]) in tracked
        return id(item) in tracked

    def profile(frame: Any, event: str, returned: Any) -> None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("graceful."):
            return
        code = frame.f_code
        if event == "call":
            count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
            for name in code.co_varnames[:count]:
                item = frame.f_locals.get(name)
                if holds(item) or (isinstance(item, tuple) and any(holds(part) for part in item)):
                    stops.append((module.removeprefix("graceful."), code.co_qualname, name))
                    holding.add(id(frame))
                    break
        elif event == "return" and id(frame) in holding:
            holding.discard(id(frame))
            if isinstance(returned, dict) and option in returned:
                tracked.add(id(returned[option]))
            elif isinstance(returned, (int, float, str)):
                tracked.add(id(returned))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return stops


def rooms(stops: list[Stop]) -> list[str]:
    """The modules the value stays in, in order, a stay of several calls counted once."""
    modules = [module for module, _, _ in stops]
    return [module for i, module in enumerate(modules) if i == 0 or modules[i - 1] != module]


def fresh() -> str:
    """ "5s" as an object of its own, so that no other value of the program is the one followed."""
    return "".join(["5", "s"])


@pytest.mark.parametrize(
    ("way", "entered"),
    [
        ("Budget.resolve(propagation_wait=...)", ["_drain._budget"]),
        ("GRACEFUL_PROPAGATION_WAIT", []),
        ("Drain(propagation_wait=...)", ["_drain._state", "_drain._options"]),
    ],
)
def test_a_value_goes_through_two_modules_to_its_field(
    way: str, entered: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    value = fresh()
    if way.startswith("GRACEFUL_"):
        stops = follow("propagation_wait", value, lambda: Budget.resolve(environ={way: value}))
    elif way.startswith("Drain"):
        monkeypatch.delenv("GRACEFUL_PROPAGATION_WAIT", raising=False)
        stops = follow("propagation_wait", value, lambda: Drain(propagation_wait=value))
    else:
        stops = follow("propagation_wait", value, lambda: Budget.resolve(propagation_wait=value))
    # It enters where it was given, goes through _environ and _durations, and lands in Budget's field.
    assert rooms(stops) == [*entered, "_drain._environ", "_drain._durations", "_drain._budget"], stops
    assert stops[-1][1].endswith("__init__") and stops[-1][2] == "propagation_wait"  # the dataclass's field
    names = {name for _, _, name in stops}
    assert len(names) <= 6, names


def test_a_flags_value_goes_from_its_click_type_to_its_rule() -> None:
    value = fresh()
    param = click.Option(["--propagation-wait", "propagation_wait"], type=DURATION)
    stops = follow("propagation_wait", value, lambda: DURATION.convert(value, param, None))
    assert rooms(stops) == ["_cli._params", "_drain._durations"], stops
