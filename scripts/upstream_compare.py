"""Compare the plain and the wrapped run of upstream test suites (run by scripts/upstream-suites).

    python scripts/upstream_compare.py RESULTS_DIR SUITE [SUITE ...]

For each SUITE it reads ``RESULTS_DIR/SUITE-unwrapped.xml`` and ``RESULTS_DIR/SUITE-wrapped.xml``
(pytest's ``--junitxml`` with ``junit_family=xunit1``, which records each test's file) and, when
present, ``RESULTS_DIR/SUITE-wrapped.rc`` (the wrapped run's exit code). A *new failure* is a test
that passed in the plain run and, in the wrapped run, failed, errored, was skipped or did not run.

It prints one table row per suite and each new failure's node id with the first line of its error,
then the new failures grouped by cause, and writes the same per suite to
``RESULTS_DIR/SUITE-new-failures.txt``. Exit code: 0 with no new failure in any suite, 1 with one or
more (or a wrapped run that did not finish), 2 when a plain run's results are missing or unreadable.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
WIDTH = len("sse-starlette")  # of the table's suite column


@dataclass
class Result:
    status: str  # passed, failed, error, skipped
    message: str = ""  # the first line of the error
    text: str = ""  # the whole failure or error text
    refused: str = ""  # the wrapped app's refusals during the test (wrap_plugin's property), e.g. server_starting=2


def node_id(case: ET.Element) -> str:
    """The pytest node id that junitxml mangled into ``classname`` and ``name``."""
    classname, name, path = case.get("classname", ""), case.get("name", ""), case.get("file", "")
    if not classname:  # a collection error: name is the module, dotted
        return path or name
    module = path[:-3].replace("/", ".") if path.endswith(".py") else ""
    if path and (classname == module or classname.startswith(module + ".")):
        rest = classname[len(module) + 1 :]
        return "::".join([path, *(rest.split(".") if rest else []), name])
    # ``file`` names where the function is defined, which is not the test module when the module
    # imports its tests (FastAPI's tests of docs_src): split classname at its first Test* class.
    parts = classname.split(".")
    cut = next((i for i, part in enumerate(parts) if part.startswith("Test")), len(parts))
    return "::".join(["/".join(parts[:cut]) + ".py", *parts[cut:], name])


def first_line(message: str, text: str) -> str:
    for line in message.splitlines():
        if line.strip():
            return line.strip()
    for line in text.splitlines():
        if line.startswith("E "):
            return line[2:].strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def read(path: Path) -> dict[str, Result]:
    results: dict[str, Result] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        result = Result("passed")
        for child in case:
            status = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(child.tag)
            if status and RANK[status] > RANK[result.status]:
                text = child.text or ""
                result = Result(status, first_line(child.get("message", ""), text), text)
        for prop in case.iter("property"):
            if prop.get("name") == "graceful_refusals":
                result.refused = prop.get("value", "")
        key = node_id(case)
        # A test can be reported twice (a failure in the call and an error in its teardown): keep the worse.
        if key not in results or RANK[result.status] > RANK[results[key].status]:
            result.refused = result.refused or (results[key].refused if key in results else "")
            results[key] = result
        else:
            results[key].refused = results[key].refused or result.refused
    return results


def counts(results: dict[str, Result]) -> tuple[int, int]:
    tally = Counter(r.status for r in results.values())
    return tally["passed"], tally["failed"] + tally["error"]


REFUSAL = re.compile(r"server_(starting|stopped|draining|shutdown|overloaded)")


def cause(result: Result) -> str:
    """A key that groups failures with one cause: the refusal, else the error's first line, normalized.

    A test during which the wrapped app refused a request (wrap_plugin's property) is grouped by the
    refusal's reason, whatever its assertion says: the app never saw that request.
    """
    if result.refused:
        reasons = ", ".join(part.split("=")[0] for part in result.refused.split(","))
        return f"refused by graceful ({reasons})"
    found = REFUSAL.search(result.message) or REFUSAL.search(result.text)
    if found:
        return f"503 {found.group(0)}"
    line = result.message
    if re.search(r"\b503\b", line):
        return "503 (refusal; reason not shown)"
    line = re.sub(r"0x[0-9a-fA-F]+", "0x…", line)
    return line[:160] or "(no message)"


def compare(results_dir: Path, suite: str) -> tuple[list[str], list[str], bool] | None:
    plain_xml, wrapped_xml = results_dir / f"{suite}-unwrapped.xml", results_dir / f"{suite}-wrapped.xml"
    try:
        plain = read(plain_xml)
    except (OSError, ET.ParseError) as exc:
        print(f"upstream: {suite}: cannot read the plain run's results {plain_xml}: {exc}", file=sys.stderr)
        return None
    rc_file = results_dir / f"{suite}-wrapped.rc"
    rc = rc_file.read_text().strip() if rc_file.exists() else "0"
    try:
        wrapped = read(wrapped_xml)
        finished = rc in ("0", "1")
    except (OSError, ET.ParseError):
        wrapped, finished = {}, False
    collection_errors = {key: r for key, r in wrapped.items() if key not in plain and r.status == "error"}

    new: dict[str, Result] = {}
    for key, result in plain.items():
        if result.status != "passed":
            continue
        other = wrapped.get(key)
        if other is None:
            path = key.split("::")[0]
            why = collection_errors.get(path)
            detail = f"collection error in {path}: {why.message}" if why else "not in the wrapped run's results"
            new[key] = Result("missing", f"did not run ({detail})", why.text if why else "")
        elif other.status != "passed":
            new[key] = other

    p_pass, p_fail = counts(plain)
    w_pass, w_fail = counts(wrapped)
    note = "" if finished else f"  (wrapped run did not finish: exit code {rc})"
    row = f"{suite:<{WIDTH}} {p_pass:>8} {p_fail:>7}   {w_pass:>8} {w_fail:>7}   {len(new):>6}{note}"
    listing = [
        f"{key}  [{r.status}] {r.message}" + (f"  (refused: {r.refused})" if r.refused else "")
        for key, r in new.items()
    ]
    baseline = [f"{key}  [{r.status}] {r.message}" for key, r in plain.items() if r.status in ("failed", "error")]
    groups: dict[str, list[str]] = defaultdict(list)
    for key, r in new.items():
        groups[cause(r)].append(key)
    grouped = []
    for name, keys in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        grouped.append(f"{len(keys):>6}  {name}")
        grouped.extend(f"          {key}" for key in keys)
    text = [f"# {suite}: {len(new)} new failures", *listing, "", f"# {suite}: by cause", *grouped, ""]
    text += [f"# {suite}: failing in the plain run (not counted)", *baseline, ""]
    (results_dir / f"{suite}-new-failures.txt").write_text("\n".join(text))
    # Causes for the terminal: each with its count and up to three examples.
    short = []
    for name, keys in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])):
        short.append(f"{len(keys):>6}  {name}")
        short.extend(f"          e.g. {key}" for key in keys[:3])
    if baseline:
        short += ["", f"failing in the plain run too (not counted): {len(baseline)}", *baseline[:20]]
        if len(baseline) > 20:
            short.append(f"... and {len(baseline) - 20} more")
    return [row], listing + ([""] if listing else []) + short, not new and finished


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    results_dir, suites = Path(argv[0]), argv[1:]
    rows, details, ok, broken = [], [], True, False
    for suite in suites:
        outcome = compare(results_dir, suite)
        if outcome is None:
            broken = True
            continue
        row, detail, clean = outcome
        rows += row
        ok = ok and clean
        if detail:
            details += [f"== {suite}: new failures in the wrapped run", *detail, ""]
    print("\n".join(details))
    print(f"{'':<{WIDTH}} {'unwrapped':>16}   {'wrapped':>16}")
    print(f"{'suite':<{WIDTH}} {'passed':>8} {'failed':>7}   {'passed':>8} {'failed':>7}   {'new failures':>6}")
    print("\n".join(rows))
    print(f"(full lists: {results_dir}/<suite>-new-failures.txt)")
    if broken:
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
