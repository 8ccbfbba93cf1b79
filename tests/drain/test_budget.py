from __future__ import annotations

import logging
import os

import pytest

from graceful import Budget, ConfigError, Drain, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10s", 10.0),
        ("1.5s", 1.5),
        ("500ms", 0.5),
        ("2m", 120.0),
        ("1m30s", 90.0),
        ("1h", 3600.0),
        ("7", 7.0),
        ("0.25", 0.25),
        (" 3S ", 3.0),
        (3, 3.0),
        (2.5, 2.5),
        ("0", 0.0),
    ],
)
def test_parse_duration_accepts(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["10x", "", "abc", "s", "1s2", "10 s", "1.2.3s", "nan", "inf", "-1", "-5s", "1m-30s"])
def test_parse_duration_refuses_with_the_value_named(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(text, name="--timeout")
    message = str(info.value)
    assert "--timeout" in message
    assert repr(text) in message


def test_parse_duration_refuses_bool() -> None:
    with pytest.raises(ConfigError, match="True"):
        parse_duration(True)


def test_budget_defaults_follow_the_reserve_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRACEFUL_GRACE_PERIOD", raising=False)
    default = Budget.resolve(environ=os.environ)
    assert default.grace_period == 30.0
    assert default.reserve == 10.0  # 30% of 30 s is 9 s, but at least 10 s
    assert default.limit == 20.0
    long = Budget.resolve(environ=os.environ, grace_period=120)
    assert long.reserve == pytest.approx(36.0)
    assert long.limit == pytest.approx(84.0)
    # A short grace period still leaves half of itself to drain.
    assert Budget.resolve(environ=os.environ, grace_period="8s").limit == pytest.approx(4.0)


def test_budget_limit_is_min_of_timeout_and_room() -> None:
    assert Budget.resolve(grace_period=120, reserve=20, drain_timeout="80s").limit == 80.0
    assert Budget.resolve(grace_period=60, reserve=20, drain_timeout="80s").limit == 40.0


def test_budget_reads_grace_period_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRACEFUL_GRACE_PERIOD", "2m")
    assert Budget.resolve(environ=os.environ).grace_period == 120.0
    monkeypatch.setenv("GRACEFUL_GRACE_PERIOD", "soon")
    with pytest.raises(ConfigError, match="GRACEFUL_GRACE_PERIOD"):
        Budget.resolve(environ=os.environ)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"grace_period": 30, "reserve": 30}, "reserve"),
        ({"grace_period": 30, "reserve": "45s"}, "reserve"),
        ({"grace_period": 0}, "grace_period"),
        ({"grace_period": "-1"}, "negative"),
        ({"drain_timeout": "forever"}, "drain_timeout"),
        ({"propagation_wait": "-2s"}, "propagation_wait"),
    ],
)
def test_budget_refuses_invalid_values(options: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        Budget.resolve(**options)  # type: ignore[arg-type]


def test_propagation_wait_that_does_not_fit_is_refused_with_arithmetic() -> None:
    with pytest.raises(ConfigError) as caught:
        Drain(grace_period=30, reserve=10, propagation_wait="25s")
    assert "25s" in str(caught.value) and "30s" in str(caught.value) and "20s" in str(caught.value)


def test_a_given_reserve_below_the_default_leaves_the_wait_its_room() -> None:
    """A reserve of 5 s leaves a 30 s grace period 25 s: a 22 s wait fits, though the default reserve (10 s) would
    leave it 20 s. The rule judges the reserve given, not the default."""
    assert Budget.resolve(grace_period=30, reserve=5, propagation_wait="22s").limit == 25.0
    assert Drain(grace_period=30, reserve=5, propagation_wait="22s").budget.propagation_wait == 22.0


def test_fitting_budget_is_not_warned(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="graceful"):
        Drain(grace_period=30, reserve=10, propagation_wait="10s")
    assert not caplog.records


def test_admit_mode_covers_half_of_what_the_wait_leaves() -> None:
    """The admit-mode rule: grace >= propagation + 2 x longest request + reserve."""
    budget = Budget.resolve(grace_period=100, reserve=30, propagation_wait=10)
    assert budget.limit == 70
    assert budget.longest_covered(admit=True) == 30  # (70 - 10) / 2
    assert budget.longest_covered(admit=False) == 70
    assert "requests of up to 30s are covered" in budget.describe(admit=True)
    assert "propagation_wait + 2 x longest request + reserve" in budget.describe(admit=True)


def test_admit_mode_warns_when_the_wait_eats_the_drain_limit(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="graceful"):
        Drain(grace_period=60, reserve=10, drain_timeout="10s", propagation_wait="10s")
    [record] = [r for r in caplog.records if "admit mode" in r.getMessage()]
    message = record.getMessage()
    assert "propagation_wait 10s" in message and "drain limit 10s" in message
    assert "2 x longest request" in message and "admit_during_propagation=False" in message
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="graceful"):
        Drain(grace_period=60, reserve=10, drain_timeout="10s", propagation_wait="10s", admit_during_propagation=False)
    assert not caplog.records


def test_admit_during_propagation_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="'yes'"):
        Drain(admit_during_propagation="yes")  # type: ignore[arg-type]


# The messages are part of the promise: each names the wrong value and the fix.
HELP = "use a number of seconds or a duration such as 10s, 1.5s, 500ms, 2m or 1m30s"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"grace_period": 0},
            "grace_period: 0 leaves no time to drain; set it to the pod's terminationGracePeriodSeconds (e.g. 30)",
        ),
        (
            {"grace_period": 30, "reserve": "45s"},
            "reserve: '45s' is not smaller than grace_period 30s; lower the reserve or raise the grace period",
        ),
        ({"grace_period": "x"}, f"grace_period: 'x' is not a duration; {HELP}"),
        ({"reserve": "x"}, f"reserve: 'x' is not a duration; {HELP}"),
        ({"drain_timeout": "x"}, f"drain_timeout: 'x' is not a duration; {HELP}"),
        ({"propagation_wait": "x"}, f"propagation_wait: 'x' is not a duration; {HELP}"),
        ({"propagation_quiet": "x"}, f"propagation_quiet: 'x' is not a duration; {HELP}"),
        (
            {"propagation_quiet": "0s"},
            "propagation_quiet: '0s' must be above 0; use the time without a new request after which the "
            "balancers are taken to have stopped sending, e.g. 2s",
        ),
        (
            {"propagation_wait": 2, "propagation_quiet": "3s"},
            "propagation_quiet 3s is longer than propagation_wait 2s, its upper bound; raise propagation_wait to "
            "at least 3s or shorten propagation_quiet",
        ),
        (
            {"propagation_wait": 1, "propagation_quiet": 2},
            "propagation_quiet 2s is longer than propagation_wait 1s, its upper bound; raise propagation_wait to "
            "at least 2s or shorten propagation_quiet",
        ),
    ],
)
def test_budget_errors_word_for_word(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Budget.resolve(**options)  # type: ignore[arg-type]
    assert str(info.value) == message
    # The error comes alone: no ValueError from float() chained above it in a server's log.
    assert info.value.__context__ is None and info.value.__cause__ is None


def test_quiet_period_from_the_environment_is_named_in_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRACEFUL_PROPAGATION_QUIET", "5s")
    with pytest.raises(ConfigError) as info:
        Budget.resolve(environ=os.environ, propagation_wait=2)
    assert str(info.value) == (
        "propagation_quiet (GRACEFUL_PROPAGATION_QUIET) 5s is longer than propagation_wait 2s, its upper bound; "
        "raise propagation_wait to at least 5s or shorten propagation_quiet (GRACEFUL_PROPAGATION_QUIET)"
    )
    monkeypatch.setenv("GRACEFUL_PROPAGATION_QUIET", "0")
    with pytest.raises(ConfigError) as info:
        Budget.resolve(environ=os.environ, propagation_wait=2)
    assert str(info.value).startswith("environment variable GRACEFUL_PROPAGATION_QUIET: '0' must be above 0;")
    monkeypatch.setenv("GRACEFUL_PROPAGATION_QUIET", "1s")
    assert Budget.resolve(environ=os.environ, propagation_wait=2).propagation_quiet == 1.0
    monkeypatch.setenv("GRACEFUL_PROPAGATION_QUIET", "  ")  # blank: unset
    assert Budget.resolve(environ=os.environ, propagation_wait=2).propagation_quiet is None


def test_blank_grace_period_variable_means_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRACEFUL_GRACE_PERIOD", "")
    assert Budget.resolve(environ=os.environ).grace_period == 30.0
    monkeypatch.setenv("GRACEFUL_GRACE_PERIOD", "2m")
    assert Budget.resolve(environ=os.environ, grace_period=50).grace_period == 50.0  # the option wins over the variable


def test_budget_keeps_what_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRACEFUL_PROPAGATION_QUIET", raising=False)
    assert Budget.resolve(environ=os.environ, grace_period=0.5, reserve=0.1) == Budget(0.5, 0.1, None, 0.0, None)
    # Without a propagation wait here, a quiet period waits for a drain request that brings one.
    assert Budget.resolve(environ=os.environ, propagation_quiet="5s") == Budget(30.0, 10.0, None, 0.0, 5.0)
    assert Budget.resolve(environ=os.environ, propagation_wait=0.5, propagation_quiet=0.5).propagation_quiet == 0.5


def test_default_name_in_a_duration_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration("soon")
    assert str(info.value) == f"duration: 'soon' is not a duration; {HELP}"


def test_longest_covered_is_never_negative() -> None:
    budget = Budget.resolve(grace_period=30, reserve=10, drain_timeout=5, propagation_wait=5)
    assert budget.longest_covered(admit=True) == 0.0


def test_problems_word_for_word() -> None:
    assert Budget.resolve(grace_period=30, reserve=10, propagation_wait=20).problems() == []  # fits exactly
    with pytest.raises(ConfigError) as caught:
        Budget.resolve(grace_period=30, reserve=10, propagation_wait=25)
    assert str(caught.value) == (
        "propagation_wait 25s is longer than the whole drain: grace_period 30s leaves the drain 20s after the "
        "reserve 10s; shorten propagation_wait or raise grace_period, the pod's terminationGracePeriodSeconds"
    )
    # No wait in admit mode: nothing to warn about, even with no drain time at all.
    # (A zero drain_timeout is refused by resolve since issue 51: the budget is built as it stands.)
    assert Budget(grace_period=30.0, reserve=10.0, drain_timeout=0.0).problems(admit=True) == []
    assert Budget.resolve(grace_period=30, reserve=10, drain_timeout=0.5, propagation_wait=0.5).problems(
        admit=True
    ) == [
        "admit mode: propagation_wait 0.5s leaves nothing of the drain limit 0.5s for the requests admitted "
        "during it; size the budget as grace_period >= propagation_wait + 2 x longest request + reserve and "
        "drain_timeout >= propagation_wait + 2 x longest request, or refuse during the wait "
        "(admit_during_propagation=False)"
    ]


def test_describe_word_for_word() -> None:
    budget = Budget.resolve(grace_period=100, reserve=30, propagation_wait=10)
    assert budget.describe(admit=False) == (
        "drain limit 70s (grace_period 100s - reserve 30s); refusing during the propagation wait: "
        "requests of up to 70s are covered"
    )
    timed = Budget.resolve(grace_period=100, reserve=30, drain_timeout=50, propagation_wait=10)
    assert timed.describe(admit=False) == (
        "drain limit 50s (grace_period 100s - reserve 30s, drain_timeout 50s); refusing during the propagation "
        "wait: requests of up to 50s are covered"
    )
    assert budget.describe(admit=True) == (
        "drain limit 70s, admitting during the 10s propagation wait: requests of up to 30s are covered "
        "(limit - propagation_wait, halved for a second request on a connection busy at drain start); for longer "
        "ones raise terminationGracePeriodSeconds to propagation_wait + 2 x longest request + reserve"
    )
