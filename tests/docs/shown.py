"""Output a page shows, held against what a command printed (docs/testing.md, "Docs examples").

A page shows output as a reader will see it, with the parts that vary from run to run (process ids,
times, ports) as one run printed them. ``unmatched`` says which shown lines the printed text lacks:

- blank lines are skipped on both sides;
- a line that is only ``...`` is a cut: the lines around it need not be adjacent;
- other consecutive shown lines match consecutive printed lines, in order;
- inside a line, ``...`` stands for any text and, by default, every number for any number.

``console`` splits a ``console`` block (``$ command`` lines, each followed by its output) into its
commands and their shown outputs.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?")


def line_pattern(line: str, varies: re.Pattern[str] | None = NUMBER) -> re.Pattern[str]:
    """A shown line as a pattern: ``...`` matches anything, and what ``varies`` matches, any number."""
    parts = []
    for part in line.split("..."):
        if varies is None:
            parts.append(re.escape(part))
            continue
        pieces, last = [], 0
        for found in varies.finditer(part):
            pieces += [re.escape(part[last : found.start()]), NUMBER.pattern]
            last = found.end()
        parts.append("".join([*pieces, re.escape(part[last:])]))
    return re.compile(".*".join(parts))


def unmatched(shown: str, printed: str, varies: re.Pattern[str] | None = NUMBER) -> list[str]:
    """The shown lines that the printed text does not hold, in the rules above; [] when all match."""
    lines = [line.rstrip() for line in printed.splitlines() if line.strip()]
    runs: list[list[str]] = [[]]
    for line in shown.splitlines():
        line = line.rstrip()
        if line.strip() == "...":
            runs.append([])
        elif line.strip():
            runs[-1].append(line)
    position = 0
    for run in runs:
        if not run:
            continue
        patterns = [line_pattern(line, varies) for line in run]
        for start in range(position, len(lines) - len(run) + 1):
            if all(p.fullmatch(lines[start + i]) for i, p in enumerate(patterns)):
                position = start + len(run)
                break
        else:
            return run  # this run, and what follows it, is not there
    return []


def console(text: str) -> list[tuple[str, str]]:
    """``$ command`` lines (a trailing backslash continues one) and the output shown after each."""
    session: list[tuple[str, list[str]]] = []
    continued = False
    for line in text.splitlines():
        if continued:
            session[-1] = (session[-1][0] + "\n" + line, session[-1][1])
        elif line.startswith("$ "):
            session.append((line[2:], []))
        elif session:
            session[-1][1].append(line)
        else:
            raise ValueError(f"a console block starts with output, not a '$ ' command: {line!r}")
        continued = line.endswith("\\") and not session[-1][1]
    return [(command, "\n".join(output)) for command, output in session]
