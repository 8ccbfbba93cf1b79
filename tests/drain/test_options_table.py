"""The drain options are defined once (``DrainConfig``); the documented option table follows them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from graceful import Drain, GracefulMiddleware
from graceful._drain._budget import Budget
from graceful._drain._environ import shown_default
from graceful._drain._options import DRAIN_DECLARED, DRAIN_OPTIONS, DrainConfig
from tests.utils import ROOT

REPO = Path(ROOT)
ROW = re.compile(r"^\|(?P<names>[^|]*)\|(?P<default>[^|]*)\|(?P<meaning>.*)\|\s*$")


def documented_rows() -> dict[str, tuple[str, str]]:
    """Option name -> (default, meaning), from the Markdown page whose table lists ``grace_period``."""
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        if not path.exists():
            continue
        rows: dict[str, tuple[str, str]] = {}
        for line in path.read_text().splitlines():
            match = ROW.match(line)
            if match is None:
                continue
            for name in re.findall(r"`(\w+)`", match["names"]):
                rows[name] = (match["default"].strip(), match["meaning"].strip())
        if "grace_period" in rows and "unwind_timeout" in rows:
            return rows
    raise AssertionError("no Markdown page has the option table (a row for `grace_period` and `unwind_timeout`)")


def test_the_option_table_matches_the_config() -> None:
    rows = documented_rows()
    for name, (default, env) in DRAIN_DECLARED.items():
        assert rows.get(name) == (shown_default(default, env), env.meaning), name


def test_the_options_are_the_config_fields() -> None:
    # budget holds the budget's options; in_code names the options given in code: neither is an option
    assert DRAIN_OPTIONS == (set(Budget.__dataclass_fields__) | set(DrainConfig.__dataclass_fields__)) - {
        "budget",
        "in_code",
    }
    assert "grace_period" in DRAIN_OPTIONS and "unwind_timeout" in DRAIN_OPTIONS


def test_unknown_options_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"unknown drain option\(s\) \['grace'\]"):
        Drain(grace=30)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['grace'\]") as refused:
        GracefulMiddleware(lambda *a: None, registry=CollectorRegistry(), admin=False, grace=30)  # type: ignore[arg-type,return-value]
    # The error points at the page that holds the option tables, and that page exists.
    assert str(refused.value).endswith("see the option tables in docs/middleware.md")
    assert "| `grace_period` |" in (REPO / "docs" / "middleware.md").read_text()


def test_drain_reads_its_config() -> None:
    drain = Drain(grace_period="40s", reserve=10, propagation_wait=5, hook_timeout="1s", admit_during_propagation=False)
    config = drain.config
    assert (config.budget.grace_period, config.budget.reserve, config.budget.propagation_wait) == (40.0, 10.0, 5.0)
    assert (config.hook_timeout, config.unwind_timeout) == (1.0, 2.0)
    assert drain.budget.limit == 30.0
    assert drain.config.admit_during_propagation is False
