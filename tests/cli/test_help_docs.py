"""``--help`` and the documentation agree (issue 46): every option a command has is documented in its
section, every option a section names exists, and every variable an option reads is named in both."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from graceful._cli._main import cli
from graceful._cli._params import FromEnv
from tests.utils import ROOT

DOCS = Path(ROOT) / "docs"
# Where each command is documented: the page and the heading of its section (up to the next heading
# of the same level or above).
SECTIONS = {
    "drain": ("cli.md", "### `graceful drain`"),
    "status": ("cli.md", "### `graceful status` and `graceful resume`"),
    "resume": ("cli.md", "### `graceful status` and `graceful resume`"),
    "run": ("cli.md", "## `graceful run APP`"),
    "advise": ("budget.md", "## `graceful advise`"),
    "soak": ("soak.md", "## `graceful soak`"),
}
FLAG = re.compile(r"`(--?[a-z][a-z-]*)")


def section(page: str, heading: str) -> str:
    text = (DOCS / page).read_text()
    level = heading.split(" ", 1)[0]
    start = text.index(heading + "\n")
    rest = text[start + len(heading) :]
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", rest, re.MULTILINE)]
    return rest[: ends[0]] if ends else rest


def command(name: str) -> click.Command:
    found = cli.get_command(click.Context(cli), name)
    assert found is not None, name
    return found


def flags(cmd: click.Command) -> set[str]:
    return {
        flag
        for param in cmd.params
        if isinstance(param, click.Option)
        for flag in (*param.opts, *param.secondary_opts)
        if flag not in ("--help", "-h")
    }


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_every_option_is_documented_in_its_section(name: str) -> None:
    documented = set(FLAG.findall(section(*SECTIONS[name])))
    missing = {flag for flag in flags(command(name)) if flag.startswith("--")} - documented
    assert missing == set(), f"{name}: options --help lists and {SECTIONS[name][0]} does not"


@pytest.mark.parametrize("name", ["drain", "run", "advise"])
def test_every_option_a_section_names_exists(name: str) -> None:
    """The sections whose tables list their command's options name no option it lacks."""
    text = section(*SECTIONS[name])
    rows = [line for line in text.splitlines() if line.startswith("| `-")]
    named = {flag for row in rows for flag in FLAG.findall(row.split("|")[1])}
    assert rows and named - flags(command(name)) == set()


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_the_variables_an_option_reads_are_named_in_both(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cmd = command(name)
    text = section(*SECTIONS[name]) + (DOCS / "cli.md").read_text().split("## The `graceful` CLI", 1)[0]
    for param in cmd.params:
        if isinstance(param, FromEnv):
            for variable in param.variables:
                monkeypatch.delenv(variable, raising=False)
            record = param.get_help_record(click.Context(cmd))
            assert record is not None
            for variable in param.variables:
                assert variable in record[1], (name, param.name)
                assert variable in text, f"{name} {param.opts[0]}: {variable} is not in {SECTIONS[name][0]}"


def test_help_says_the_value_in_force_and_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    run = command("run")
    wait = next(p for p in run.params if p.name == "propagation_wait")
    assert isinstance(wait, FromEnv)
    monkeypatch.delenv("GRACEFUL_PROPAGATION_WAIT", raising=False)
    assert wait.in_force() == "[default: 0; env GRACEFUL_PROPAGATION_WAIT]"
    monkeypatch.setenv("GRACEFUL_PROPAGATION_WAIT", "5s")
    assert wait.in_force() == "[in force: 5s, from GRACEFUL_PROPAGATION_WAIT]"
    record = wait.get_help_record(click.Context(run))
    assert record is not None and record[1].endswith("[in force: 5s, from GRACEFUL_PROPAGATION_WAIT]")


# Options that take a duration, whatever parses them (click's type, or the command itself).
DURATIONS = {
    "duration",
    "drain_timeout",
    "grace_period",
    "interval",
    "kv_buffer",
    "max_grace_period",
    "propagation_quiet",
    "propagation_wait",
    "reserve",
    "timeout",
}


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_a_duration_says_so_in_help(name: str) -> None:
    cmd = command(name)
    ctx = click.Context(cmd)
    seen = {param.name for param in cmd.params if param.name in DURATIONS}
    assert seen or name in ("status", "resume")
    for param in cmd.params:
        if isinstance(param, click.Option) and param.name in DURATIONS:
            assert param.make_metavar(ctx) == "DURATION", (name, param.name)
