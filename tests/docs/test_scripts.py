"""The repository's scripts as README.md, docs/index.md and docs/testing.md run them.

The commands run verbatim, in bash, in a copy of the clone's scripts/ whose heavy steps are stand-ins
that record how they were called: the Python the scripts choose (``$PYTHON``), the set-up scripts,
apt-get, stress-ng and the balancers. So each line runs the script's own argument handling, and the
test holds what reached the real tools (pytest, the rollout demo's command line, mutmut) to what
those tools accept: a renamed script, flag or argument fails here, without a half-hour run.

1. the line runs in the copy with the stand-ins first on PATH, exit 0
2. the calls recorded are those the page promises (a fresh mutants/, pytest's arguments, three runs)
3. the arguments that reached a real tool parse with that tool's own parser
"""

from __future__ import annotations

import ast
import fnmatch
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from examples.rollout.cli import rollout_command
from tests.utils import ROOT

QUICK_START = Path(ROOT) / "docs_src/readme/quick_start.sh"
RUN_SUITE = Path(ROOT) / "docs_src/testing/run_suite.sh"
MUTATION = Path(ROOT) / "docs_src/testing/mutation.sh"
UNDER_LOAD = Path(ROOT) / "docs_src/testing/under_load.sh"

# Each stand-in appends one line to $CALLS: its name, then its arguments quoted as bash would read them.
# One write per call: scripts/test runs two lanes at once, and a call written in pieces interleaved
# with the other's (a call then went missing from the record).
RECORDER = """#!/usr/bin/env bash
line={name}; for arg in "$@"; do line+=$(printf ' %q' "$arg"); done
printf '%s\\n' "$line" >> "$CALLS"
{then}
"""
STAND_INS = {
    "python": 'if [ "${1:-}" = - ]; then cat >/dev/null; fi',  # a heredoc script: read it, succeed
    "apt-get": "",
    "haproxy": "",
    "nginx": "",
    "stress-ng": "exec sleep 60",  # a hog until the script's trap kills it
}
SET_UP = ["setup-tests", "setup-vllm", "setup-litellm"]


@dataclass
class Clone:
    root: Path
    env: dict[str, str]
    calls_file: Path

    def run(self, line: str) -> list[list[str]]:
        """Run one line of a page's block as written; the stand-ins' calls, each as an argv."""
        self.calls_file.write_text("")
        done = subprocess.run(
            ["bash", "-c", line], cwd=self.root, env=self.env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, f"{line!r} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        return [shlex.split(call) for call in self.calls_file.read_text().splitlines()]


@pytest.fixture
def clone(tmp_path: Path) -> Clone:
    root = tmp_path / "clone"
    shutil.copytree(Path(ROOT) / "scripts", root / "scripts")
    tools = tmp_path / "bin"
    tools.mkdir()
    for name, then in STAND_INS.items():
        (tools / name).write_text(RECORDER.format(name=name, then=then))
        (tools / name).chmod(0o755)
    for name in SET_UP:
        (root / "scripts" / name).write_text(RECORDER.format(name=name, then=""))
    calls = tmp_path / "calls"
    # Not what a CI run exports for its own scripts/test (.ci/run's second lane and its bash function).
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"VIRTUAL_ENV", "PYTHON", "GRACEFUL_BESIDE"} and not key.startswith("BASH_FUNC_")
    }
    env.update(PATH=f"{tools}{os.pathsep}{env['PATH']}", PYTHON=str(tools / "python"), CALLS=str(calls))
    return Clone(root, env, calls)


def lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


def python_calls(calls: list[list[str]], *start: str) -> list[list[str]]:
    """The arguments after ``start`` of every call of $PYTHON that begins with it."""
    return [
        call[1 + len(start) :] for call in calls if call[0] == "python" and tuple(call[1 : 1 + len(start)]) == start
    ]


def pytest_accepts(args: list[str]) -> None:
    """pytest's own parser takes these arguments: a collection of one small module with them."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args, __file__],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (0, 5), f"pytest refused {args}:\n{done.stdout}{done.stderr}"  # 5: none selected


def test_the_quick_start_runs_the_demo_and_the_suite(clone: Clone) -> None:
    """README's and the index's Quick start: ``bash scripts/demo`` installs the project with the demo's
    extras and runs the rollout demo; ``bash scripts/test`` sets up, then runs pytest under coverage."""
    demo, suite = lines(QUICK_START)
    calls = clone.run(demo)
    assert python_calls(calls, "-m", "pip") == [
        ["install", "-q", "--disable-pip-version-check", "-e", ".[examples,plot]"]
    ]
    assert python_calls(calls, "-m", "examples.rollout") == [[]]
    # The demo's arguments reach examples.rollout's parser: the README's `bash scripts/demo --quick` too.
    calls = clone.run(demo.split("#")[0].strip() + " --quick")
    (args,) = python_calls(calls, "-m", "examples.rollout")
    assert args == ["--quick"]
    with rollout_command.make_context("rollout", args) as ctx:
        assert ctx.params["quick"] is True

    calls = clone.run(suite)
    assert calls[0] == ["setup-tests"]
    runs = python_calls(calls, "-m", "coverage", "run", "-m", "pytest")
    assert sorted(runs) == sorted(LANES), runs
    assert python_calls(calls, "-m", "coverage")[-2:] == [["combine", "-q"], ["report"]]
    for args in runs:
        pytest_accepts(args)


# scripts/test without arguments: the vllm tier, the other tiers beside it on two workers, the vllm tests
# started late once those have ended, then the benchmarks' smoke runs alone (docs/testing.md, "Tiers").
LANES = [
    ["-m", "vllm and not vllm_late"],
    ["-m", "not (vllm or every_core)", "-n", "2", "--dist", "loadfile"],
    ["-m", "vllm and vllm_late"],
    ["-m", "every_core"],
]


def test_the_suite_takes_pytests_arguments(clone: Clone) -> None:
    """docs/testing.md, "Running the suite": arguments after ``bash scripts/test`` go to pytest."""
    plain, narrowed = lines(RUN_SUITE)
    assert sorted(python_calls(clone.run(plain), "-m", "coverage", "run", "-m", "pytest")) == sorted(LANES)
    (args,) = python_calls(clone.run(narrowed), "-m", "coverage", "run", "-m", "pytest")
    assert args == ["-x", "-k", "run"]
    pytest_accepts(args)


def mutant_names() -> list[str]:
    """One mutant name per function of every module that ``[tool.mutmut]`` mutates, as mutmut 3 names
    them: ``graceful._drain._run.x_name__mutmut_1``, and ``...xǁClassǁmethod__mutmut_1`` for methods."""
    settings = tomllib.loads((Path(ROOT) / "pyproject.toml").read_text())["tool"]["mutmut"]
    names = []
    for path in settings["only_mutate"]:
        module = path.removesuffix(".py").replace("/", ".")
        tree = ast.parse((Path(ROOT) / path).read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.append(f"{module}.x_{node.name}__mutmut_1")
            elif isinstance(node, ast.ClassDef):
                names += [
                    f"{module}.xǁ{node.name}ǁ{item.name}__mutmut_1"
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
    return names


def test_the_mutation_runs_as_the_page_says(clone: Clone) -> None:
    """docs/testing.md, "Mutation testing": a full run starts from a fresh mutants/; a run naming
    mutants, and ``--keep``, keep the results there; the names given are mutants that exist."""
    full, some, keep, show = lines(MUTATION)
    past = clone.root / "mutants" / "past-result"

    def mutmut_run(line: str) -> list[str]:
        past.parent.mkdir(exist_ok=True)
        past.write_text("a past run's result")
        calls = clone.run(line)
        (run,) = [call[call.index("run") + 1 :] for call in python_calls(calls, "-c") if "run" in call]
        assert run[:2] == ["--max-children", "1"]
        return run[2:]

    assert mutmut_run(full) == [] and not past.exists()
    (pattern,) = mutmut_run(some)
    assert past.exists()
    assert fnmatch.filter(mutant_names(), pattern), f"{pattern!r} names no mutant of [tool.mutmut]'s modules"
    assert mutmut_run(keep) == [] and past.exists()

    # `mutmut show NAME`: the command the script installs (the `mutation` extra), with that subcommand.
    command, subcommand, _ = shlex.split(show, comments=True)
    extras = tomllib.loads((Path(ROOT) / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert command == "mutmut" and any(dep.startswith("mutmut>=3") for dep in extras["mutation"])
    try:
        from mutmut.__main__ import cli as mutmut_cli  # type: ignore[import-not-found]
    except ImportError:
        return  # not installed here: the extra above is what scripts/mutation installs
    assert isinstance(mutmut_cli, click.Group) and subcommand in mutmut_cli.commands


def test_the_suite_under_load_runs_it_three_times_beside_a_hog(clone: Clone) -> None:
    """docs/testing.md, "Under load": RUNS runs of the suite, beside ``stress-ng --cpu 4``."""
    (line,) = lines(UNDER_LOAD)
    calls = clone.run(line)
    assert [call for call in calls if call[0] == "stress-ng"] == [
        ["stress-ng", "--cpu", "4", "--quiet", "--timeout", "6h"]
    ]
    assert sorted(python_calls(calls, "-m", "coverage", "run", "-m", "pytest")) == sorted(LANES * 3)
