"""A clean virtual environment with this repository installed, to run the preStop hook as a container runs it.

A container image runs the console script of a plain install: ``<venv>/bin/graceful``, whose
shebang is the venv's own interpreter. A development machine often puts other things in front
of it: a version manager's shim on PATH (a shell script that picks the interpreter), or ``.pth``
files in the base interpreter's site-packages that run at every start-up. Neither is part of the
hook's cost in production, so the hook benchmarks build (once, under ``.bench-venv/`` in the
repository root, ignored by git) a fresh ``python -m venv`` with ``pip install .`` (not
editable) and time that venv's ``bin/graceful``. The venv is rebuilt when the package's source
or ``pyproject.toml`` changes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from ._live import root

__all__ = ["CleanVenv", "clean_venv"]


@dataclass(frozen=True)
class CleanVenv:
    path: str

    @property
    def python(self) -> str:
        return os.path.join(self.path, "bin", "python")

    @property
    def graceful(self) -> str:
        """The console script ``pip install`` wrote: what a container's preStop hook executes."""
        return os.path.join(self.path, "bin", "graceful")


def _source_digest(repo: str) -> str:
    digest = hashlib.sha256()
    names = ["pyproject.toml"]
    for folder, _dirs, files in os.walk(os.path.join(repo, "graceful")):
        names += [os.path.relpath(os.path.join(folder, f), repo) for f in files if f.endswith((".py", ".typed"))]
    for name in sorted(names):
        digest.update(name.encode())
        with open(os.path.join(repo, name), "rb") as source:
            digest.update(source.read())
    return digest.hexdigest()


def clean_venv() -> CleanVenv:
    """The clean venv, built or refreshed first if this repository's source has changed since."""
    repo = root()
    venv = CleanVenv(os.path.join(repo, ".bench-venv"))
    stamp = os.path.join(venv.path, "graceful-source.sha256")
    wanted = _source_digest(repo)
    try:
        with open(stamp) as current:
            if current.read().strip() == wanted and os.path.exists(venv.graceful):
                return venv
    except OSError:
        pass
    print(f"building {venv.path} (python -m venv; pip install .) ...", file=sys.stderr, flush=True)
    shutil.rmtree(venv.path, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", venv.path], check=True, timeout=300)
    done = subprocess.run(
        [venv.python, "-m", "pip", "install", "-q", "--disable-pip-version-check", repo],
        capture_output=True,
        text=True,
        timeout=600,
        cwd="/",
    )
    if done.returncode != 0:
        raise RuntimeError(f"pip install {repo} into {venv.path} failed:\n{done.stdout}{done.stderr}")
    with open(stamp, "w") as out:
        out.write(wanted + "\n")
    return venv
