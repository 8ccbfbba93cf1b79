"""The preStop hook's fast path (graceful/_cli/_prestop.py): what ``graceful drain`` imports before it talks to
a socket, the same hook from an install of byte-code only, and the package's lazy exports.

The servers go unready when the hook's request reaches them, and the hook's start-up counts against the
grace period: until its first socket call, the hook imports the standard library, its one fast-path
module, and the homes of the rules it shares with the servers, which import the standard library only.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import site
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from graceful._admin._wire import Event, Field, Param, Route, Value
from graceful._cli._prestop import _query
from tests.utils import ROOT

FAST_PATH = "graceful._cli._prestop"
ENTRY = "graceful._cli._console"  # the console script: the fast path for `drain`, else click
# The rules the hook shares with the servers, each in its one home: the durations and the budget rule, the
# variables' names, the admin protocol and the search for sockets.
SHARED = {
    "graceful._drain._durations",
    "graceful._drain._errors",
    "graceful._drain._names",
    "graceful._admin._wire",
    "graceful._admin._paths",
}
PACKAGES = {"graceful", "graceful._cli", "graceful._drain", "graceful._admin"}  # their __init__ holds a docstring

# Runs the console script as its entry point does, noting the modules imported by the time the first socket
# is made ("socket.__new__", an audit event). Nothing is imported here before ``before`` is taken, so that the
# hook's own imports all count.
PROBE = """
import sys
before = set(sys.modules)
report = sys.argv.pop(1)
noted = []
def note(event, args):
    if event == "socket.__new__" and not noted:
        noted.append(sorted(set(sys.modules) - before))
        with open(report, "w") as out:
            out.write("\\n".join(noted[0]))
sys.addaudithook(note)
from graceful._cli._console import console_main
console_main()
"""


class Recorder:
    """A worker's admin socket that records the request it gets and when, then answers a drain at once."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.request = b""
        self.received: float | None = None  # time.monotonic()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(1)
        self.listener.settimeout(60)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(30)
            while b"\r\n\r\n" not in self.request:
                data = conn.recv(4096)
                if not data:
                    return
                self.request += data
            self.received = time.monotonic()
            lines = [
                {Field.EVENT: Event.STATUS, Field.PID: 7, Field.IN_FLIGHT: 0, Field.DEADLINE: None},
                {Field.EVENT: Event.RESULT, Field.PID: 7, Field.RESULT: Value.DRAINED, Field.IN_FLIGHT: 0},
            ]
            body = "".join(json.dumps(line) + "\n" for line in lines).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n\r\n" + body)

    def close(self) -> None:
        if self.thread.is_alive() and self.received is None:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as nudge:  # ends a wait in accept()
                nudge.settimeout(5)
                try:
                    nudge.connect(self.path)
                except OSError:
                    pass
        self.thread.join(60)
        self.listener.close()


@pytest.fixture
def worker(socket_dir: str) -> Iterator[Recorder]:
    recorder = Recorder(os.path.join(socket_dir, "7.sock"))
    yield recorder
    recorder.close()


def run_hook(args: list[str], report: Path, *, path: list[str], **environment: str) -> subprocess.CompletedProcess[str]:
    # -S: no site module, so no .pth file of this interpreter imports anything before the probe looks.
    env = {name: value for name, value in os.environ.items() if name != "GRACEFUL_SOCKET_DIR"}
    env.update(PYTHONPATH=os.pathsep.join([*path, *site.getsitepackages()]), **environment)
    command = [sys.executable, "-S", "-c", PROBE, str(report), *args]
    # From the report's folder: -c puts the working directory first on sys.path.
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=report.parent)


def outside(modules: list[str]) -> list[str]:
    """The modules that are neither the standard library's nor the fast path's."""
    allowed = {ENTRY, FAST_PATH, *SHARED, *PACKAGES}
    return [name for name in modules if name.split(".")[0] not in sys.stdlib_module_names and name not in allowed]


@pytest.mark.servers
@pytest.mark.parametrize(
    "form",
    ["dir", "documented", "socket", "variable", "default-dir"],
)
def test_before_its_first_socket_call_the_hook_imports_only_the_standard_library_and_its_fast_path(
    form: str, worker: Recorder, socket_dir: str, tmp_path: Path
) -> None:
    """1. ``graceful drain`` in each common form, against a socket that records the request 2. at the first
    socket call, every module imported is the standard library's, the fast path or a shared rule's home
    3. the request reached the socket and the hook reports the drain (exit 0)."""
    environment: dict[str, str] = {}
    if form == "dir":
        args = ["drain", "--socket-dir", socket_dir]
    elif form == "documented":  # docs_src/cli/prestop.yaml's, with the flags the hook reads
        args = ["drain", "--propagation-wait=10s", "--grace-period=90", f"--socket-dir={socket_dir}", "-q", "--json"]
    elif form == "socket":
        args = ["drain", "--socket", worker.path, "--propagation-quiet", "1s", "--timeout", "30s"]
    elif form == "variable":
        args, environment = ["drain", "--propagation-wait", "0"], {"GRACEFUL_SOCKET_DIR": socket_dir}
    else:  # the default directory, <tempdir>/graceful-<uid>
        default = os.path.join(socket_dir, f"graceful-{os.getuid()}")
        os.mkdir(default, 0o700)
        worker.close()
        moved = Recorder(os.path.join(default, "7.sock"))
        try:
            done = run_hook(["drain"], tmp_path / "modules", path=[ROOT], TMPDIR=socket_dir)
        finally:
            moved.close()
        assert moved.request.startswith(b"POST /drain?reason=cli HTTP/1.1\r\n"), done.stderr
        check_imports(done, tmp_path / "modules")
        return
    done = run_hook(args, tmp_path / "modules", path=[ROOT], **environment)
    assert worker.request.startswith(f"POST {Route.DRAIN}?{Param.REASON}=cli".encode()), done.stderr
    check_imports(done, tmp_path / "modules")


def check_imports(done: subprocess.CompletedProcess[str], report: Path) -> None:
    assert done.returncode == 0, done.stderr
    modules = report.read_text().split()
    assert FAST_PATH in modules
    assert outside(modules) == []


def test_the_check_fails_on_a_module_off_the_fast_path() -> None:
    assert outside(["json", "graceful._cli._prestop", "graceful._admin._client", "click"]) == [
        "graceful._admin._client",
        "click",
    ]


def stdlib_or_shared(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names or module in SHARED or module == "__future__"


@pytest.mark.parametrize("home", sorted(SHARED))
def test_each_shared_rules_home_imports_the_standard_library_only(home: str) -> None:
    """What the fast path imports from the package imports nothing outside the standard library and the other
    homes: a heavier import there would land on the hook's start-up."""
    path = Path(ROOT, *home.split(".")).with_suffix(".py")
    base = home.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            target = base.rsplit(".", node.level - 1)[0] + "." + (node.module or "") if node.level else node.module
            assert stdlib_or_shared(target or ""), (home, target)
        elif isinstance(node, ast.Import):
            assert all(stdlib_or_shared(alias.name) for alias in node.names), home


def test_the_hooks_tricks_live_in_the_fast_path_alone() -> None:
    """``TYPE_CHECKING`` shadowed, ``os._exit`` and a module reading its own text are the fast path's alone."""
    found = set()
    for path in Path(ROOT, "graceful").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            shadow = isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "TYPE_CHECKING" for t in node.targets)
            trick = isinstance(node, ast.Attribute) and node.attr in ("_exit", "get_data", "get_source")
            if shadow or trick:
                found.add(str(path.relative_to(ROOT)))
    assert found == {os.path.join("graceful", "_cli", "_prestop.py")}


@given(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4))
def test_the_hooks_query_encoding_is_urllibs(params: dict[str, str]) -> None:
    assert _query(params) == urllib.parse.urlencode(params)


def sourceless(tmp_path: Path) -> Path:
    """The package as an install of byte-code only: each module's .pyc where its .py was, no .py left."""
    where = tmp_path / "sourceless"
    shutil.copytree(Path(ROOT, "graceful"), where / "graceful", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-b", str(where / "graceful")], check=True, timeout=120)
    for source in (where / "graceful").rglob("*.py"):
        source.unlink()
    assert not list((where / "graceful").rglob("*.py")) and (where / "graceful" / "__init__.pyc").exists()
    return where


@pytest.mark.servers
def test_the_hook_drains_from_an_install_without_sources(worker: Recorder, socket_dir: str, tmp_path: Path) -> None:
    """1. the package compiled, its sources removed 2. ``graceful drain`` with the documented flags 3. the
    request reaches the socket with the budget judged (grace 90 s leaves the drain 63 s) and the hook exits 0."""
    where = sourceless(tmp_path)
    args = ["drain", "--propagation-wait=10s", "--grace-period=90", f"--socket-dir={socket_dir}"]
    done = run_hook(args, tmp_path / "modules", path=[str(where)])
    assert done.returncode == 0, done.stderr
    assert worker.request.startswith(b"POST /drain?reason=cli&propagation_wait=10.0s&timeout=63.0s HTTP/1.1\r\n")
    assert "drained 1 of 1 worker" in done.stderr
    imported = subprocess.run(
        [sys.executable, "-S", "-c", "import graceful._cli._prestop as c; print(c.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(where), *site.getsitepackages()])},
        cwd=tmp_path,
    )
    assert imported.stdout.strip() == str(where / "graceful" / "_cli" / "_prestop.pyc"), imported.stderr


# The public names as ``import graceful`` offers them, and what that import costs: read in a fresh interpreter.
EXPORTS = """
import json, sys
before = set(sys.modules)
import graceful
loaded = sorted(name for name in set(sys.modules) - before if name.startswith("graceful."))
names = sorted(graceful.__all__)
listed = set(names) <= set(dir(graceful))
homes = {name: getattr(graceful, name).__module__ for name in names}
print(json.dumps({"loaded": loaded, "all": names, "listed": listed, "homes": homes, "file": graceful.__file__}))
"""


def exports(path: list[str], cwd: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, *site.getsitepackages()])}
    command = [sys.executable, "-S", "-c", EXPORTS]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.mark.servers
def test_the_package_exports_its_names_lazily_with_sources_and_all_at_once_without(tmp_path: Path) -> None:
    """With its sources, ``import graceful`` imports no public name's module (the names are read off its
    ``TYPE_CHECKING`` block with ``ast`` on first use); without them it imports every one at once. Either
    way ``__all__``, ``dir()`` and each name are the same."""
    lazy = exports([ROOT], tmp_path)
    assert lazy["loaded"] == ["graceful._cli", "graceful._cli._prestop"]
    compiled = exports([str(sourceless(tmp_path))], tmp_path)
    assert str(compiled["file"]).endswith("__init__.pyc")
    assert "graceful._drain._state" in compiled["loaded"]  # type: ignore[operator]
    for seen in (lazy, compiled):
        assert seen["listed"] is True
    assert compiled["all"] == lazy["all"] and compiled["homes"] == lazy["homes"]
    assert lazy["all"] and all(str(home).startswith("graceful.") for home in lazy["homes"].values())  # type: ignore[attr-defined]
