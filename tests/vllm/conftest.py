"""A real vLLM on the CPU, with graceful loaded through ``--middleware``.

The vLLM comes from ``bash scripts/setup-vllm`` (``.vllm/venv``, which ``scripts/setup-tests``
makes); ``GRACEFUL_VLLM`` names another ``vllm`` command. The model is made by
``tests/vllm/make_model.py`` (random weights and a tokenizer trained here, no hub), once per
version of that script, under ``.vllm/``. Without a vLLM every test here skips, saying how to
get one.

Each server runs as ``vllm serve MODEL --middleware graceful.GracefulMiddleware`` with the
documented recipe's environment (docs/vllm.md): graceful configured by ``GRACEFUL_*``
variables, its log lines shown through ``VLLM_LOGGING_CONFIG_PATH=examples/vllm/logging.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.rollout.vllm import START_LIMIT, prepare
from examples.rollout.vllm import VLLM_ENV as CPU_ENV
from tests.docs.commands import command_with
from tests.servers import Launched
from tests.utils import ROOT

VENV = Path(ROOT) / ".vllm" / "venv"
VLLM = os.environ.get("GRACEFUL_VLLM") or str(VENV / "bin" / "vllm")


def _engine_core() -> str:
    """The core for this process's engines: the first this process may use, or the one at
    ``GRACEFUL_ENGINE_CORE_INDEX`` in that list (scripts/test gives the vllm tests it starts once the other
    tiers have ended the second core, beside the rest of the tier on the first). A
    ``VLLM_CPU_OMP_THREADS_BIND`` already set is kept."""
    given = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    if given:
        return given
    cores = sorted(os.sched_getaffinity(0))
    index = os.environ.get("GRACEFUL_ENGINE_CORE_INDEX", "0")
    return str(cores[int(index) % len(cores)] if index.isdigit() else cores[0])


# The CPU environment and the model cache are the rollout demo's (examples/rollout/vllm.py): the
# engine's OpenMP threads on this process's core, a 1 GiB KV cache, no hub, graceful's log lines shown.
ENGINE_CORE = _engine_core()
os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ENGINE_CORE  # for the demo's replicas (test_rollout_vllm.py)
VLLM_ENV = {**CPU_ENV, "VLLM_CPU_OMP_THREADS_BIND": ENGINE_CORE}
# docs/vllm.md's CPU recipe (docs_src/vllm/serve_cpu.sh): every server here starts with its `vllm serve`
# flags, the model and the address aside (tests/docs/test_vllm.py checks the rest of the recipe).
SERVE_FLAGS = command_with("docs_src/vllm/serve_cpu.sh", "vllm", "serve")[3:]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if Path(VLLM).exists():
        return
    skip = pytest.mark.skip(reason=f"no vLLM at {VLLM}: bash scripts/setup-vllm makes one (GRACEFUL_SKIP_VLLM=1 skips)")
    for item in items:
        if "tests/vllm/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The tiny model, made once per version of make_model.py and kept under .vllm/."""
    return prepare(VLLM).model


def http_port(pid: int) -> int | None:
    """The port of vLLM's HTTP listener: of the TCP sockets ``pid`` itself listens on (the engine's
    ZMQ listeners live in its children, or come later), the one with the lowest descriptor, as
    vLLM binds it first (``setup_server``, before the engine starts)."""
    listening = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[1].startswith("0100007F:"):  # LISTEN on 127.0.0.1
            listening[fields[9]] = int(fields[1].split(":")[1], 16)
    try:
        descriptors = sorted(os.listdir(f"/proc/{pid}/fd"), key=int)
        for fd in descriptors:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:[") and target[8:-1] in listening:
                return listening[target[8:-1]]
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


class VllmServer(Launched):
    """One ``vllm serve`` process group on 127.0.0.1 with graceful inside, its log in a file.

    ``log``, ``url``, ``sockets``, ``wait_log`` and ``wait_exit`` are ``Launched``'s.
    """

    def __init__(self, model: str, args: tuple[str, ...], socket_dir: str, log: Path, env: dict[str, str]) -> None:
        self.name = "vllm"
        self.model = model
        self.socket_dir = socket_dir
        self.log_path = log
        self.port = 0
        environment = {**os.environ, **VLLM_ENV, "GRACEFUL_SOCKET_DIR": socket_dir, **env}
        environment.pop("PYTHONPATH", None)  # the vLLM venv has graceful installed (editable) itself
        command = [VLLM, "serve", model, *SERVE_FLAGS, "--host", "127.0.0.1", "--port", "0", *args]
        with open(log, "wb") as out:
            # A process group of its own (killed whole at teardown), but the test's session: with the
            # kernel's autogroup scheduling a new session is a scheduling group of its own, and the
            # CPU engine's busy-waiting core process then starved the tests and the hooks they start
            # for as long as a stream ran (seconds per request read).
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=environment, stdout=out, stderr=subprocess.STDOUT, process_group=0
            )

    def wait_ready(self, sockets: int = 1, limit: float = START_LIMIT) -> None:  # type: ignore[override]
        """Until the port is bound, ``sockets`` admin sockets exist and the middleware's /ready says 200."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"vllm exited with {self.process.returncode}:\n{self.log[-6000:]}"
            if not self.port:
                self.port = http_port(self.process.pid) or 0
            if self.port and len(self.sockets()) >= sockets:
                try:
                    if httpx.get(self.url("/ready"), timeout=2).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.25)
        raise AssertionError(f"vllm not ready after {limit}s:\n{self.log[-6000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        # The engine core and its workers are in the same process group; make sure they are gone.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def start_vllm(model_dir: str, socket_dir: str, tmp_path: Path) -> Iterator[Callable[..., VllmServer]]:
    """Start vLLM servers (``start_vllm(*args, **env)``); every one is killed at teardown."""
    started: list[VllmServer] = []

    def start(*args: str, socket_dir_: str | None = None, **env: str) -> VllmServer:
        server = VllmServer(model_dir, args, socket_dir_ or socket_dir, tmp_path / f"vllm-{len(started)}.log", env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


# The documented recipe's variables (docs/vllm.md): exempt from refusal the kubelet's and the engine
# hook's reads of vLLM's own pages.
SHARED_RECIPE = {"GRACEFUL_EXEMPT_PATHS": "/health,/metrics", "GRACEFUL_GRACE_PERIOD": "60"}


@pytest.fixture(scope="session")
def shared_replica(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """Replica B, started once for the whole vllm tier: the reference that answers uncut, the replica a
    stream continues on, and the one the tests of test_vllm.py drain and resume. The recipe's
    environment, and --enable-scale-out for vLLM's abort endpoint. A test that kills an engine core,
    SIGTERMs the server or needs its own variables starts a replica of its own (``start_vllm``)."""
    log = tmp_path_factory.mktemp("vllm") / "log"
    with long_lived(model_dir, ("--enable-scale-out",), log, SHARED_RECIPE) as server:
        yield server


@pytest.fixture(scope="session")
def handoff_replica(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """Replica A of the handoff tests, started once for the whole vllm tier: the recipe's environment and
    GRACEFUL_HANDOFF_STREAMS=1. A test drains it (the handoff) and leaves it drained; the next one's
    ``handing_off`` resumes it. A test that kills its engine starts a replica of its own."""
    log = tmp_path_factory.mktemp("vllm-a") / "log"
    with long_lived(model_dir, (), log, {**SHARED_RECIPE, "GRACEFUL_HANDOFF_STREAMS": "1"}) as server:
        yield server


@pytest.fixture
def handing_off(handoff_replica: VllmServer) -> VllmServer:
    """Replica A, serving (``serving``): the drain a test before left is resumed first."""
    return serving(handoff_replica)


@contextlib.contextmanager
def long_lived(model_dir: str, args: tuple[str, ...], log: Path, env: dict[str, str]) -> Iterator[VllmServer]:
    """A vLLM for fixtures wider than a test, ready, in a short socket directory of its own; stopped and
    its directory removed at the end."""
    socket_dir = "/tmp/" + os.urandom(4).hex()
    os.mkdir(socket_dir, 0o700)
    server = VllmServer(model_dir, args, socket_dir, log, env)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        for leftover in server.sockets():
            os.unlink(leftover)
        os.rmdir(socket_dir)


def serving(server: VllmServer) -> VllmServer:
    """``server``, serving: a drain an earlier test left behind (one that failed before its own resume) is
    resumed first, so that no test depends on how the one before it ended."""
    ready = server.url("/ready")
    if httpx.get(ready, timeout=10).status_code != 200:
        resume = [sys.executable, "-m", "graceful", "resume", "--socket-dir", server.socket_dir]
        done = subprocess.run(resume, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + 30
        while httpx.get(ready, timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the replica did not serve again within 30 s of graceful resume"
            time.sleep(0.2)
    return server


@pytest.fixture
def replica(shared_replica: VllmServer) -> VllmServer:
    """Replica B, serving (``serving``). A fixture of a wider scope takes ``shared_replica`` and calls
    ``serving`` itself."""
    return serving(shared_replica)


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any] | str]:
    """The ``data:`` payloads of an event stream: parsed JSON, or the raw text (``[DONE]``)."""
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            yield data if data.startswith("[") else json.loads(data)
