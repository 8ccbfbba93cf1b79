"""The budget's and the budget rule's messages, word for word: which bound a refusal names when two
bounds tie, the words of the preStop hook's flags, a hook without a grace period, the default reserve
of a budget built directly, negative durations with units, and the variable a value came from."""

from __future__ import annotations

import math

import pytest

from graceful import Budget, ConfigError, Drain
from graceful._drain._durations import check_wait, grace_seconds, judge_drain, reserve_seconds
from graceful._drain._environ import parse_duration
from graceful._drain._options import Overrides


def flag(option: str) -> str:
    """How the preStop hook names an option: its flag."""
    return "--" + option.replace("_", "-")


def test_a_wait_as_long_as_the_limit_fits() -> None:
    check_wait(5.0, 5.0, bound="{timeout} is 5s", fix="raise {timeout}")
    with pytest.raises(ConfigError) as refused:
        check_wait(5.5, 5.0, bound="{timeout} is 5s", fix="raise {timeout}")
    assert str(refused.value.named("", flag)) == (
        "--propagation-wait 5.5s is longer than the whole drain: --timeout is 5s; shorten --propagation-wait "
        "or raise --timeout"
    )


def test_without_a_grace_period_only_the_timeouts_bound_the_drain() -> None:
    """The preStop hook without --grace-period: no room is known, the timeouts alone make the limit."""
    assert judge_drain(5, grace=None, reserve=0.0, drain_timeout=None, timeout=10) == 10
    assert judge_drain(5, grace=None, reserve=0.0, drain_timeout=8, timeout=None) == 8
    assert judge_drain(5, grace=None, reserve=0.0, drain_timeout=None, timeout=None) == math.inf


def test_a_drains_own_timeout_is_named_when_it_ties_with_the_configured_one() -> None:
    config = Drain(grace_period=30, reserve=5, drain_timeout=10).config
    with pytest.raises(ConfigError) as refused:
        Overrides(config, propagation_wait=12, timeout=10)
    assert str(refused.value) == (
        "propagation_wait 12s is longer than the whole drain: this drain's timeout is 10s; "
        "shorten propagation_wait or raise this drain's timeout"
    )


def test_the_configured_timeout_is_named_when_it_ties_with_the_grace_periods_room() -> None:
    budget = Budget(grace_period=30, reserve=5, drain_timeout=25)
    with pytest.raises(ConfigError) as refused:
        budget.judge(30)
    assert str(refused.value) == (
        "propagation_wait 30s is longer than the whole drain: drain_timeout is 25s; "
        "shorten propagation_wait or raise drain_timeout"
    )


def test_the_configured_timeout_from_its_variable_is_named_with_it() -> None:
    with pytest.raises(ConfigError) as refused:
        Budget.resolve(environ={"GRACEFUL_DRAIN_TIMEOUT": "10"}, propagation_wait=12)
    assert str(refused.value) == (
        "propagation_wait 12s is longer than the whole drain: drain_timeout (GRACEFUL_DRAIN_TIMEOUT) is 10s; "
        "shorten propagation_wait or raise drain_timeout (GRACEFUL_DRAIN_TIMEOUT)"
    )


def test_the_prestop_hooks_words_are_its_flags() -> None:
    with pytest.raises(ConfigError) as refused:
        judge_drain(30, grace=30, reserve=5, drain_timeout=None, timeout=None)
    assert str(refused.value.named("", flag)) == (
        "--propagation-wait 30s is longer than the whole drain: --grace-period 30s leaves the drain 25s after "
        "the reserve 5s; shorten --propagation-wait or raise --grace-period, the pod's terminationGracePeriodSeconds"
    )


def test_a_budget_built_directly_takes_the_default_reserve() -> None:
    assert Budget(grace_period=30).reserve == 10.0  # at least 10 s
    assert Budget(grace_period=100).reserve == 30.0  # 30% of the grace period
    assert Budget(grace_period=12).reserve == 6.0  # never more than half of a short grace period
    assert Budget(grace_period=30).limit == 20.0
    assert Budget(grace_period=30, reserve=2).reserve == 2  # given: kept


def test_an_unknown_budget_option_is_refused_by_name() -> None:
    with pytest.raises(TypeError) as refused:
        Budget.resolve(grace=30)
    assert str(refused.value) == (
        "unknown budget option(s) ['grace']; the options are "
        "['drain_timeout', 'grace_period', 'propagation_quiet', 'propagation_wait', 'reserve']"
    )


def test_a_negative_duration_with_units_is_refused_as_negative() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_duration("-1s", name="reserve")
    assert str(refused.value) == "reserve: '-1s' is negative; use 0 or more, e.g. 10s"
    with pytest.raises(ConfigError) as refused:
        parse_duration(" -1.5M ")
    assert str(refused.value) == "duration: ' -1.5M ' is negative; use 0 or more, e.g. 10s"


def test_a_negative_sign_before_no_duration_is_not_a_duration() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_duration("-1x", name="reserve")
    assert str(refused.value) == (
        "reserve: '-1x' is not a duration; use a number of seconds or a duration such as 10s, 1.5s, 500ms, 2m or 1m30s"
    )


def test_the_grace_period_and_reserve_rules_say_the_value_and_the_fix() -> None:
    """The rules name no option of their own: the edge that took the value puts its name first."""
    with pytest.raises(ConfigError) as refused:
        grace_seconds(0)
    assert (
        str(refused.value) == "0 leaves no time to drain; set it to the pod's terminationGracePeriodSeconds (e.g. 30)"
    )
    with pytest.raises(ConfigError) as refused:
        reserve_seconds(40, 30)
    assert str(refused.value) == "40 is not smaller than grace_period 30s; lower the reserve or raise the grace period"
    assert str(refused.value.named("--reserve", flag)) == (
        "--reserve: 40 is not smaller than --grace-period 30s; lower the reserve or raise the grace period"
    )


@pytest.mark.parametrize(
    ("environ", "given", "message"),
    [
        (
            {"GRACEFUL_GRACE_PERIOD": "0"},
            {},
            "environment variable GRACEFUL_GRACE_PERIOD: '0' leaves no time to drain; "
            "set it to the pod's terminationGracePeriodSeconds (e.g. 30)",
        ),
        (
            {"GRACEFUL_RESERVE": "40"},
            {"grace_period": 30},
            "environment variable GRACEFUL_RESERVE: '40' is not smaller than grace_period 30s; "
            "lower the reserve or raise the grace period",
        ),
        (
            {"GRACEFUL_GRACE_PERIOD": "30"},
            {"reserve": 40},
            "reserve: 40 is not smaller than grace_period (GRACEFUL_GRACE_PERIOD) 30s; "
            "lower the reserve or raise the grace period",
        ),
        (
            {"GRACEFUL_PROPAGATION_WAIT": "2"},
            {"propagation_quiet": 5},
            "propagation_quiet 5s is longer than propagation_wait (GRACEFUL_PROPAGATION_WAIT) 2s, its upper bound; "
            "raise propagation_wait (GRACEFUL_PROPAGATION_WAIT) to at least 5s or shorten propagation_quiet",
        ),
    ],
)
def test_a_value_from_a_variable_is_named_by_it(
    environ: dict[str, str], given: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        Budget.resolve(environ=environ, **given)
    assert str(refused.value) == message
