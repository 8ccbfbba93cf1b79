"""Every drain flag is generated from the field that declares its option (issue 53): ``graceful drain``,
``graceful run`` and ``graceful advise`` spell it as they always did, and its help is the documentation's
meaning of the option, one text per option; ``graceful advise`` judges "this" option instead of the
server's, in the same words."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from graceful._cli._main import cli
from graceful._drain._environ import help_text
from graceful._drain._options import DRAIN_DECLARED
from tests.utils import ROOT

# The flag of each option where its spelling is not --option-name: the hook's own timeout, which bounds
# the drain as drain_timeout does (``graceful drain`` and ``graceful advise``).
SPELLED = {"drain": {"drain_timeout": "--timeout"}, "advise": {"drain_timeout": "--timeout"}, "run": {}}
# The options each command takes as flags.
TAKES = {
    "drain": {"propagation_wait", "propagation_quiet", "drain_timeout", "grace_period"},
    "run": {
        "grace_period",
        "propagation_wait",
        "propagation_quiet",
        "drain_timeout",
        "reserve",
        "admit_during_propagation",
        "handoff_streams",
        "admission",
    },
    "advise": {
        "grace_period",
        "reserve",
        "propagation_wait",
        "propagation_quiet",
        "drain_timeout",
        "admit_during_propagation",
    },
}


def command(name: str) -> click.Command:
    found = cli.get_command(click.Context(cli), name)
    assert found is not None, name
    return found


def flag_help(name: str, option: str) -> str:
    """The help of ``option``'s flag in command ``name``, without the bracket of the value in force."""
    cmd = command(name)
    spelled = SPELLED[name].get(option, "--" + option.replace("_", "-"))
    (param,) = [p for p in cmd.params if isinstance(p, click.Option) and spelled in p.opts]
    record = param.get_help_record(click.Context(cmd))
    assert record is not None
    return record[1].split(" [", 1)[0]


@pytest.mark.parametrize("name", sorted(TAKES))
def test_each_drain_flag_is_its_options_field(name: str) -> None:
    for option in TAKES[name]:
        text = help_text(DRAIN_DECLARED[option][1])
        if name == "advise":
            assert flag_help(name, option).startswith("Judge this "), option
            assert flag_help(name, option).endswith(text[:1].lower() + text[1:]), option
        else:
            assert flag_help(name, option) == text, (name, option)


def test_drain_and_run_show_one_help_text_per_option() -> None:
    for option in TAKES["drain"]:
        assert flag_help("drain", option) == flag_help("run", option), option


def test_the_help_is_the_documentations_meaning_in_plain_words() -> None:
    """A sentence without the page's Markdown and its pointers into the page."""
    for option, (_, env) in DRAIN_DECLARED.items():
        text = help_text(env)
        assert text[0].isupper() and text.endswith("."), option
        assert "`" not in text and "](" not in text and "(see " not in text, option


def test_the_drain_commands_table_says_each_flags_meaning() -> None:
    """docs/cli.md's table of ``graceful drain``'s options: each flag's meaning is its field's, as --help says
    it (what the table adds follows it)."""
    page = (Path(ROOT) / "docs" / "cli.md").read_text()
    section = page.split("### `graceful drain`", 1)[1].split("\n#", 1)[0]
    rows = {
        line.split("`")[1].split()[0]: line.split("|")[3].strip()
        for line in section.splitlines()
        if line.startswith("| `--")
    }
    for option in TAKES["drain"]:
        spelled = SPELLED["drain"].get(option, "--" + option.replace("_", "-"))
        assert rows[spelled].startswith(DRAIN_DECLARED[option][1].meaning.removesuffix(" (see below)")), spelled
