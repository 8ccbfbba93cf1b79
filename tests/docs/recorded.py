"""Run a page's shell file with stand-ins for the long programs it starts, and check what they were given.

The rollout demo's and ``graceful soak``'s command lines on docs/soak.md and docs/rollout-results.md
start runs of minutes. ``recorded`` runs the file with bash as a reader would, in a scratch folder
where ``python``, ``scripts/demo`` and ``scripts/setup-*`` are stand-ins that write down their
arguments; ``check_rollout`` then hands each command line to the demo's own command, which parses and
resolves it (a renamed flag, scenario or balancer, or a combination the demo refuses, fails) and
stops where the run would begin.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from examples.rollout import cli, litellm
from examples.rollout.cli import rollout_command
from tests.docs.shown import console
from tests.utils import ROOT

SEPARATOR, END = "\x1f", "\x1e"
# A stand-in program: its own name (as started) and arguments, appended to $RECORDED.
STAND_IN = f'#!/bin/sh\n{{ printf \'%s{SEPARATOR}\' "$0" "$@"; printf \'{END}\'; }} >> "$RECORDED"\n'
STAND_INS = ("bin/python", "scripts/demo", "scripts/setup-vllm", "scripts/setup-litellm")


def recorded(path: str, scratch: Path) -> list[tuple[str, list[str]]]:
    """The programs the file at ``path`` started, in order: ``(name, arguments)``, name one of
    ``python``, ``scripts/demo``, ``scripts/setup-vllm``, ``scripts/setup-litellm``.

    A ``.console`` file runs its ``$ `` lines, a ``.sh`` file runs as it is; bash stops at the
    first command that fails."""
    text = (Path(ROOT) / path).read_text()
    script = "\n".join(command for command, _ in console(text)) if path.endswith(".console") else text
    for name in STAND_INS:
        stand_in = scratch / name
        stand_in.parent.mkdir(parents=True, exist_ok=True)
        stand_in.write_text(STAND_IN)
        stand_in.chmod(0o755)
    record = scratch / "recorded"
    record.write_text("")
    environment = {**os.environ, "PATH": f"{scratch / 'bin'}{os.pathsep}{os.environ['PATH']}", "RECORDED": str(record)}
    ran = subprocess.run(
        ["bash", "-e", "-c", script], cwd=scratch, env=environment, capture_output=True, text=True, timeout=30
    )
    assert ran.returncode == 0, f"{path}: bash exited {ran.returncode}: {ran.stderr}"
    started = []
    for entry in record.read_text().split(END)[:-1]:
        program, *arguments = entry.split(SEPARATOR)[:-1]
        name = os.path.relpath(os.path.join(scratch, program), scratch)
        started.append(("python" if name == "bin/python" else name, arguments))
    return started


class Resolved(Exception):
    """The demo's command parsed and resolved its options; the run would begin here."""


def check_rollout(arguments: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's own command takes ``arguments``: parsed, checked and resolved as for a run.

    The vLLM and LiteLLM set-ups are files a machine may lack; stand-ins take their place here."""
    fake = str(Path(ROOT) / "scripts" / "demo")  # any executable file
    monkeypatch.setenv("GRACEFUL_VLLM", fake)
    monkeypatch.setattr(litellm, "PYTHON", fake)

    async def resolved(*_: object) -> None:
        raise Resolved

    monkeypatch.setattr(cli, "_run", resolved)
    result = CliRunner().invoke(rollout_command, arguments)
    assert isinstance(result.exception, Resolved), (arguments, result.output)


def check_started(started: list[tuple[str, list[str]]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``python -m examples.rollout`` and ``scripts/demo`` line (whose arguments go to it), checked
    by the demo's command; a set-up script the file starts exists."""
    demo = (Path(ROOT) / "scripts" / "demo").read_text()
    assert demo.rstrip().endswith('-m examples.rollout "$@"'), "scripts/demo no longer hands its arguments on"
    for name, arguments in started:
        if name == "python":
            assert arguments[:2] == ["-m", "examples.rollout"], arguments
            check_rollout(arguments[2:], monkeypatch)
        elif name == "scripts/demo":
            check_rollout(arguments, monkeypatch)
        else:
            assert (Path(ROOT) / name).is_file() and not arguments, (name, arguments)
