"""docs/release.md: the build-and-check command is CI's, and the publish command refuses what it must.

Publishing itself needs an account and the network, so no test publishes. Every run here is fenced off
from the index anyway: ``PYTHON`` names no interpreter (nothing can be built or installed), pip may use
no index, and twine's upload address is a closed local port.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.utils import ROOT

CHECK = "docs_src/release/check.sh"
PUBLISH = "docs_src/release/publish.sh"
FENCED = {"PYTHON": "/nonexistent/python", "PIP_NO_INDEX": "1", "TWINE_REPOSITORY_URL": "http://127.0.0.1:9/"}


def publish(cwd: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {key: value for key, value in os.environ.items() if key not in {"CI", "TWINE_PASSWORD"}}
    return subprocess.run(
        ["bash", script], cwd=cwd, env={**base, **FENCED, **env}, capture_output=True, text=True, timeout=60
    )


def test_ci_runs_the_check_the_page_shows() -> None:
    """.ci/run runs the page's command as a line of its own (in the tests' second lane, where a failure is
    counted: ``|| status=1``)."""
    ci = [line.strip().split(" || ")[0] for line in (Path(ROOT) / ".ci/run").read_text().splitlines()]
    [command] = (Path(ROOT) / CHECK).read_text().splitlines()
    assert command in ci


@pytest.mark.parametrize("token", [None, ""])
def test_publish_refuses_without_a_token(token: str | None) -> None:
    """1. the page's publish command, with no TWINE_PASSWORD (or an empty one) 2. one line, exit 2."""
    done = publish(Path(ROOT), PUBLISH, **({} if token is None else {"TWINE_PASSWORD": token}))
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr == (
        "publish: no token: set TWINE_PASSWORD to the project's PyPI API token (pypi-...), then run "
        "bash scripts/publish again (docs/release.md)\n"
    )


def test_publish_refuses_in_ci() -> None:
    done = publish(Path(ROOT), PUBLISH, CI="true", TWINE_PASSWORD="pypi-not-a-token")
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr == "publish: refusing to run in CI (CI=true): a release is published by hand (docs/release.md)\n"


def test_publish_refuses_a_version_without_its_changelog_section_then_a_dirty_tree(tmp_path: Path) -> None:
    """In a small committed tree of its own, so the clone's state (its version, its changelog, what is not
    committed yet) does not matter: 1. version 9.9.9 and a changelog with only Unreleased 2. the section
    added and committed, and a stray file 3. each is one line, exit 2."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(Path(ROOT) / "scripts/publish", tmp_path / "scripts/publish")
    (tmp_path / "graceful").mkdir()
    (tmp_path / "graceful/__init__.py").write_text('__version__ = "9.9.9"\n')
    (tmp_path / "CHANGELOG.md").write_text("# Changelog\n\n## Unreleased\n\n## 9.9.90 (a longer version)\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]

    def commit() -> None:
        subprocess.run([*git, "add", "."], cwd=tmp_path, check=True, timeout=30)
        subprocess.run([*git, "commit", "-q", "-m", "x"], cwd=tmp_path, check=True, timeout=30)

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True, timeout=30)
    commit()

    done = publish(tmp_path, "scripts/publish", TWINE_PASSWORD="pypi-not-a-token")
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr == (
        "publish: CHANGELOG.md has no '## 9.9.9' section; rename '## Unreleased' to '## 9.9.9 (date)' "
        "and commit it (docs/release.md)\n"
    )

    (tmp_path / "CHANGELOG.md").write_text("# Changelog\n\n## Unreleased\n\n## 9.9.9 (2026-12-07)\n")
    commit()
    (tmp_path / "stray.txt").write_text("not committed\n")
    done = publish(tmp_path, "scripts/publish", TWINE_PASSWORD="pypi-not-a-token")
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr == (
        "publish: the working tree has uncommitted changes (git status); commit them first: the sdist would ship them\n"
    )
