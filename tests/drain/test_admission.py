"""The estimate admission="fits" judges a request by (issue 54), and the admission option's bad values."""

from __future__ import annotations

import json

import pytest

from graceful import ConfigError, Drain
from graceful._cli._advise import report
from graceful._cli._main import main
from graceful._drain._admission import HIGH, SAMPLES, Pace, expected_run, token_limit
from graceful._drain._advice import Evidence, admitting, advise
from graceful._drain._budget import Budget
from graceful._drain._observed import BOUNDS, Histogram


def histogram(**seconds: int) -> Histogram:
    """Counts by bucket upper bound: ``histogram(**{"40": 10})``."""
    counts = [0] * (len(BOUNDS) + 1)
    for bound, count in seconds.items():
        counts[BOUNDS.index(float(bound))] = count
    return Histogram(BOUNDS, tuple(counts))


SEEN_BY_KIND = {"stream": histogram(**{"40": 10}), "plain": histogram(**{"1": 190})}


def seen() -> dict[str, Histogram]:  # the durations, as the estimate asks for them
    return SEEN_BY_KIND


def paced(first: float = 0.5, per_token: float = 0.1) -> Pace:
    pace = Pace()
    pace.record(first, per_token)
    return pace


def body(**fields: object) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


def test_the_limit_and_one_frame_times_the_pace_plus_the_first_frame() -> None:
    assert expected_run(body(max_tokens=100), paced(), seen) == pytest.approx(10.6)
    assert expected_run(body(max_completion_tokens=10), paced(), seen) == pytest.approx(1.6)
    assert expected_run(body(max_output_tokens=10), paced(first=0), seen) == pytest.approx(1.1)


def test_without_a_limit_or_a_pace_the_durations_of_its_kind_at_the_high_percentile() -> None:
    assert expected_run(body(stream=True), paced(), seen) == 40.0
    assert expected_run(body(), paced(), seen) == 1.0
    assert expected_run(body(stream=True, max_tokens=5), Pace(), seen) == 40.0
    # Not JSON, not an object, or not read whole (None): everything seen (p95 of 200 is a plain one).
    for raw in (b"\xff\xfe not json", b"[1, 2]", None, b""):
        assert expected_run(raw, paced(), seen) == 1.0
    assert expected_run(body(stream=True), Pace(), lambda: {"stream": Histogram.empty()}) is None


def test_a_limit_is_a_whole_number_of_at_least_one() -> None:
    assert token_limit({"max_tokens": True}) is None
    assert token_limit({"max_tokens": 0, "max_completion_tokens": 7}) == 7
    assert token_limit({"max_tokens": "12"}) is None
    assert token_limit({"max_tokens": 2.5}) is None
    assert token_limit(["max_tokens"]) is None


def test_the_pace_is_the_high_percentile_of_the_newest_samples() -> None:
    pace = Pace()
    assert pace.time_per_token() is None and pace.first_token() == 0.0
    for i in range(SAMPLES + 20):
        pace.record(None, 1.0 if i < 20 else 0.01 * (i - 19))
    # The oldest 20 (1 s a token) have left; of the 64 kept (0.01 to 0.64 s), p95 is the 61st.
    assert len(pace.per_token) == SAMPLES
    assert pace.time_per_token() == pytest.approx(0.01 * 61)
    assert HIGH == 0.95
    pace.record(-1.0, -1.0)  # a clock that went back records nothing
    assert len(pace.per_token) == SAMPLES and not pace.first


def test_bad_values_are_one_line_naming_the_value_and_the_choices(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError) as given:
        Drain(admission="maybe")  # type: ignore[arg-type]
    assert str(given.value) == "admission: 'maybe' is not an admission mode; use 'all' or 'fits'"
    monkeypatch.setenv("GRACEFUL_ADMISSION", "sometimes")
    with pytest.raises(ConfigError) as variable:
        Drain()
    assert str(variable.value) == (
        "environment variable GRACEFUL_ADMISSION: 'sometimes' is not an admission mode; use all or fits"
    )
    monkeypatch.setenv("GRACEFUL_ADMISSION", " FITS ")
    assert Drain().config.admission == "fits"
    monkeypatch.delenv("GRACEFUL_ADMISSION")
    assert Drain().config.admission == "fits"  # the default (docs/budget.md, "The default")
    assert main(["run", "example:app", "--admission", "maybe"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "graceful run: Invalid value for '--admission': 'maybe' is not one of 'all', 'fits' (see graceful run --help)"
    ]


def test_advise_says_what_each_admission_mode_does_with_the_requests_of_the_wait() -> None:
    """A wait of 10 s and 25 s to the deadline: a request arriving during the wait has 15 to 25 s left. Ten
    streams of 30 to 40 s cannot finish whenever they come; four of 15 to 20 s finish unless they come late
    (up to half of them by their upper bound, none by their lower); 190 plain ones of up to 1 s always do."""
    seen = {"stream": histogram(**{"40": 10, "20": 4}), "plain": histogram(**{"1": 190})}  # by kind
    figures = admitting(seen, wait=10, limit=25)
    assert figures is not None
    assert (figures.requests, figures.refused, figures.cut) == (204, 12.0, 10.0)
    assert admitting(seen, wait=0, limit=25) is None
    budget = Budget(grace_period=30, reserve=5, drain_timeout=None, propagation_wait=10)
    advice = advise(Evidence(seen), budget, admit=True)
    assert advice.admitting == figures
    assert advice.as_dict()["admitting"] == {
        "wait": 10,
        "limit": 25,
        "requests": 204,
        "refused_with_fits": 12.0,
        "cut_with_all": 10.0,
    }
    (line,) = [line for line in report(advice, 0.0) if "propagation wait (" in line]
    assert line == (
        "  arriving during the 10 s propagation wait (15 s to the deadline at its end): --admission fits would "
        "refuse up to 12 of the 204 requests seen (5.88%); --admission all would leave at least 10 to be cut (4.90%)"
    )
    # Refusing during the wait, nothing is admitted then: no such line.
    assert advise(Evidence(seen), budget, admit=False).admitting is None


def test_the_first_frame_is_the_median_of_those_seen() -> None:
    """A replica that has just started answers its first requests slowest: one slow first frame among
    five does not move the figure, as a 95th percentile of five would (it is their largest)."""
    pace = Pace()
    for first in (0.1, 0.12, 2.0, 0.11, 0.13):
        pace.record(first, 0.1)
    assert pace.first_token() == pytest.approx(0.12)


def test_the_durations_are_asked_for_only_when_the_limit_and_the_pace_do_not_say() -> None:
    asked: list[bool] = []

    def durations() -> dict[str, Histogram]:
        asked.append(True)
        return SEEN_BY_KIND

    assert expected_run(body(max_tokens=100), paced(), durations) == pytest.approx(10.6) and not asked
    assert expected_run(body(stream=True), paced(), durations) == 40.0 and asked == [True]
