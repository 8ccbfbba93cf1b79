"""The distribution a release publishes holds the package, its types and its command, and nothing else.

The wheel is ``GRACEFUL_WHEEL`` where set (scripts/check-dist sets it to the wheel ``python -m build``
made from the sdist, and ``GRACEFUL_SDIST`` to that sdist); otherwise ``pip wheel --no-deps`` builds one
from this clone here, as the README's Install section does.
"""

from __future__ import annotations

import configparser
import email
import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

import graceful
from tests.utils import ROOT

# pip builds the wheel in a process (tests/tiers.py).
pytestmark = [pytest.mark.servers, pytest.mark.timeout(300)]

PYPROJECT = tomllib.loads((Path(ROOT) / "pyproject.toml").read_text())["project"]
NAME, VERSION = "graceful_drain", graceful.__version__
DIST_INFO = f"{NAME}-{VERSION}.dist-info"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("GRACEFUL_WHEEL")
    if given:
        return Path(given)
    folder = tmp_path_factory.mktemp("wheels")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "--wheel-dir", folder, ROOT],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    [built] = folder.iterdir()
    return built


def package_files() -> set[str]:
    """What the clone's graceful/ holds, as the wheel names it (byte code aside)."""
    package = Path(ROOT) / "graceful"
    return {
        path.relative_to(ROOT).as_posix()
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def requirement(text: str) -> str:
    return "".join(text.split())


def test_the_wheel_holds_the_package_its_types_and_nothing_else(wheel: Path) -> None:
    assert wheel.name == f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {name.split("/")[0] for name in names} == {"graceful", DIST_INFO}, sorted(names)
    assert "graceful/py.typed" in names
    assert f"{DIST_INFO}/licenses/LICENSE" in names  # BSD-3-Clause asks for its text beside the code
    assert {name for name in names if not name.startswith(DIST_INFO)} == package_files()


def test_the_wheel_installs_the_command_and_says_what_it_is(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        entry_points = archive.read(f"{DIST_INFO}/entry_points.txt").decode()
        metadata = email.message_from_string(archive.read(f"{DIST_INFO}/METADATA").decode())
    scripts = configparser.ConfigParser()
    scripts.read_string(entry_points)
    assert dict(scripts["console_scripts"]) == PYPROJECT["scripts"]
    assert PYPROJECT["scripts"]["graceful"] == "graceful._cli._console:console_main"

    assert (metadata["Name"], metadata["Version"]) == ("graceful-drain", VERSION)
    assert metadata["Requires-Python"] == PYPROJECT["requires-python"]
    assert metadata["License-Expression"] == PYPROJECT["license"]
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload() == (Path(ROOT) / "README.md").read_text()
    always = {requirement(value) for value in metadata.get_all("Requires-Dist", []) if "extra ==" not in value}
    assert always == {requirement(value) for value in PYPROJECT["dependencies"]}


def test_the_sdist_is_the_source_of_that_wheel() -> None:
    sdist = os.environ.get("GRACEFUL_SDIST")
    if not sdist:
        pytest.skip("GRACEFUL_SDIST is not set: scripts/check-dist builds an sdist and checks it here")
    top = f"{NAME}-{VERSION}"
    assert Path(sdist).name == f"{top}.tar.gz"
    with tarfile.open(sdist) as archive:
        names = set(archive.getnames())
        info = archive.extractfile(f"{top}/PKG-INFO")
        assert info is not None
        metadata = email.message_from_string(info.read().decode())
    assert (metadata["Name"], metadata["Version"]) == ("graceful-drain", VERSION)
    assert {f"{top}/pyproject.toml", f"{top}/README.md"} <= names
    assert {f"{top}/{name}" for name in package_files()} <= names
