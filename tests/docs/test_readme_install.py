"""README's Install section, run as written: each command installs graceful into a fresh virtualenv.

1. a folder that holds the clone, named ``graceful``; a fresh virtualenv, active (``PATH``, ``VIRTUAL_ENV``)
2. the install file, in bash as typed, from that folder
3. the virtualenv's ``graceful`` is its own copy, and ``graceful --version`` prints graceful/__init__.py's version
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import graceful
from tests.docs.test_readme_quickstart import check_installed, outside_world
from tests.utils import ROOT

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the install commands are POSIX shell"),
    # A fresh virtualenv and a pip install: about 7 s with a warm pip cache, more without one.
    pytest.mark.timeout(400),
]

INSTALL_CLONE = "docs_src/readme/install_clone.sh"
INSTALL_WHEEL = "docs_src/readme/install_wheel.sh"


@pytest.mark.parametrize("script", [INSTALL_CLONE, INSTALL_WHEEL])
def test_the_install_command_installs_graceful(script: str, tmp_path: Path) -> None:
    start = tmp_path / "start"
    start.mkdir()
    (start / "graceful").symlink_to(ROOT, target_is_directory=True)
    env, path = outside_world(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run(["python3", "-m", "venv", str(venv)], env=env, check=True, timeout=120)
    active = {**env, "PATH": os.pathsep.join([str(venv / "bin"), path]), "VIRTUAL_ENV": str(venv)}

    done = subprocess.run(
        ["bash", "-e", str(Path(ROOT) / script)], cwd=start, env=active, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    installed = re.search(r"^Successfully installed (.*)$", done.stdout, re.M)
    assert installed and f"graceful-drain-{graceful.__version__}" in installed[1].split(), done.stdout
    check_installed(venv, env, tmp_path)
    if script == INSTALL_WHEEL:
        wheels = [wheel.name for wheel in (start / "wheels").iterdir()]
        assert wheels == [f"graceful_drain-{graceful.__version__}-py3-none-any.whl"], wheels
