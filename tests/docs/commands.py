"""Reading the docs' files as the tests run them: the commands of a shell file, the words of a command,
and the ``graceful drain`` command lines a page quotes in its text (shown output is tests/docs/shown.py's).

The tests run each command with bash, as a reader pastes it, changing only what must differ on a shared
test machine (ports, addresses, waits); this module says nothing about how, only what a file holds.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.servers import Launched
from tests.utils import ROOT


def read(name: str) -> str:
    """A file of the repository by its path from the root, as the pages name it."""
    return (Path(ROOT) / name).read_text()


def section(name: str, part: str) -> str:
    """A ``# --8<-- [start:part]`` ... ``# --8<-- [end:part]`` section of a file, as a page shows it."""
    text = read(name)
    start, end = f"# --8<-- [start:{part}]\n", f"# --8<-- [end:{part}]"
    assert start in text and end in text, f"{name} has no section {part!r}"
    lines = text.split(start, 1)[1].split(end, 1)[0].splitlines()
    return "\n".join(lines[:-1] if lines and not lines[-1].strip() else lines) + "\n"


def shell_commands(name: str) -> list[str]:
    """The commands of a shell file as bash reads them: a line continued with a backslash joined to the
    next, blank lines and lines that are only a comment left out."""
    joined = re.sub(r"\\\n[ \t]*", " ", read(name))
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def words(command: str) -> tuple[dict[str, str], list[str]]:
    """A command's leading ``NAME=value`` assignments and its words, comments dropped (shlex, as POSIX)."""
    parts = shlex.split(command, comments=True)
    env: dict[str, str] = {}
    while parts and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", parts[0]):
        key, _, value = parts.pop(0).partition("=")
        env[key] = value
    return env, parts


def exports(name: str) -> dict[str, str]:
    """Every ``export NAME=value ...`` of a shell file."""
    found: dict[str, str] = {}
    for command in shell_commands(name):
        _, parts = words(command)
        if parts[:1] == ["export"]:
            for part in parts[1:]:
                key, _, value = part.partition("=")
                found[key] = value
    return found


def command_with(name: str, *first: str) -> list[str]:
    """The one command of a shell file whose first words are ``first`` (its words, assignments left out)."""
    found = [parts for _, parts in map(words, shell_commands(name)) if parts[: len(first)] == list(first)]
    assert len(found) == 1, f"{name}: {len(found)} commands start with {' '.join(first)!r}, expected one"
    return found[0]


def quoted_commands(page: str, start: str) -> list[str]:
    """The inline code spans of a page that are command lines starting with ``start`` (``graceful drain``);
    a span that only names one flag (``graceful drain --engine``, the mode) is no command line."""
    spans = re.findall(r"`([^`\n]+)`", read(page))
    return [span for span in spans if span.startswith(start + " ") and len(span[len(start) :].split()) > 1]


def terminal_env(**extra: str) -> dict[str, str]:
    """A terminal's environment in which ``python`` and ``graceful`` are this test run's (its virtualenv
    first on PATH), with no ``GRACEFUL_*`` variable of the caller's."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GRACEFUL_")}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class Typed(Launched):
    """A server command typed in a terminal: bash runs it (from the clone, or ``cwd``) in a process group of
    its own, with ``terminal_env``, a private ``GRACEFUL_SOCKET_DIR`` and ``env``; its output goes to ``log``.
    The port comes from its "running on" line (``Launched.wait_port``)."""

    def __init__(self, command: str, socket_dir: str, log: Path, *, cwd: str = ROOT, **env: str) -> None:
        self.name, self.socket_dir, self.log_path, self.port = command.split()[0], socket_dir, log, 0
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                ["bash", "-c", "exec " + command], cwd=cwd, env=terminal_env(GRACEFUL_SOCKET_DIR=socket_dir, **env),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
