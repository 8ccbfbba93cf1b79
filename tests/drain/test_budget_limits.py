"""Values no pod can have are refused wherever they are given (issue 51): a grace period over a year and a
zero drain timeout, as Python options, as variables and (tests/cli/test_bad_input.py) as flags, by one rule
(``_durations.check_option``); the edge that took the value names it as the user gave it."""

from __future__ import annotations

import click
import pytest

from graceful import ConfigError, Drain
from graceful._cli._params import DURATION
from graceful._drain._budget import BUDGET_DECLARED, Budget
from graceful._drain._durations import MAX_GRACE_PERIOD, RULES, check_option, reserve_seconds, seconds

YEAR = "is longer than a year, the longest accepted; set it to the pod's terminationGracePeriodSeconds (e.g. 30)"
ZERO = "leaves no time to drain; give the longest the drain may take (e.g. 60s), or leave it unset"


@pytest.mark.parametrize(
    ("given", "environ", "message"),
    [
        ({"grace_period": 1e20}, {}, f"grace_period: 1e+20 {YEAR}"),
        (
            {},
            {"GRACEFUL_GRACE_PERIOD": "99999999999999999999"},
            f"GRACEFUL_GRACE_PERIOD: '99999999999999999999' {YEAR}",
        ),
        ({"drain_timeout": 0}, {}, f"drain_timeout: 0 {ZERO}"),
        ({"drain_timeout": "0s"}, {}, f"drain_timeout: '0s' {ZERO}"),
        ({}, {"GRACEFUL_DRAIN_TIMEOUT": "0"}, f"environment variable GRACEFUL_DRAIN_TIMEOUT: '0' {ZERO}"),
    ],
)
def test_a_budget_no_pod_can_have_is_refused(given: dict[str, object], environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Budget.resolve(environ=environ, **given)
    assert message in str(refused.value)


def test_the_bounds_themselves_are_accepted() -> None:
    assert Budget.resolve(grace_period=MAX_GRACE_PERIOD).grace_period == MAX_GRACE_PERIOD
    assert Budget.resolve(grace_period="8760h").grace_period == MAX_GRACE_PERIOD
    assert Budget.resolve(drain_timeout="1ms").drain_timeout == 0.001
    assert Budget.resolve(environ={"GRACEFUL_DRAIN_TIMEOUT": "none"}).drain_timeout is None


def test_the_constructor_refuses_them_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^drain_timeout: 0 leaves no time to drain"):
        Drain(drain_timeout=0)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("grace_period", "0", "'0' leaves no time to drain"),
        ("grace_period", "1e20", f"'1e20' {YEAR}"),
        ("drain_timeout", "0", f"'0' {ZERO}"),
        ("propagation_quiet", "0", "'0' must be above 0"),
        ("timeout", "soon", "'soon' is not a duration"),
    ],
)
def test_a_flag_is_held_to_its_options_rule_with_its_name_and_the_value_as_typed(
    option: str, value: str, message: str
) -> None:
    """The rule says the value and the fix; the flag's edge (click's DURATION) names the flag."""
    flag = "--" + option.replace("_", "-")
    command = click.Command("x", params=[click.Option([flag, option], type=DURATION)])
    with pytest.raises(click.BadParameter) as refused:
        command.make_context("x", [flag, value])
    assert refused.value.format_message().startswith(f"Invalid value for {flag!r}: {message}")


def test_a_value_that_holds_its_rule_is_its_seconds() -> None:
    assert check_option("grace_period", "1m30s") == 90.0
    assert check_option("timeout", "90s") == 90.0


@pytest.mark.parametrize("option", ["drain_timeout", "timeout"])
def test_a_drain_timeout_of_0_is_refused_with_the_fix(option: str) -> None:
    """0 would end every request at the drain's start (many tools read it as no limit): the server's drain
    timeout and one drain's own are refused alike, naming unset as the way to the grace period's limit."""
    with pytest.raises(ConfigError, match=r"'0' leaves no time to drain; .*leave it unset"):
        check_option(option, "0")


def test_a_flag_holds_the_rule_its_field_declares() -> None:
    """One rule per option: the flags' (``RULES``, by option) are the budget fields' (the reserve's needs the
    grace period, so it is judged once both are known)."""
    rules = {name: env.kind.seconds for name, (_, env) in BUDGET_DECLARED.items()}
    assert rules.pop("reserve") is reserve_seconds
    assert rules == {name: RULES.get(name, seconds) for name in rules}
