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

import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.utils import ROOT

VENV = Path(ROOT) / ".vllm" / "venv"
VLLM = os.environ.get("GRACEFUL_VLLM") or str(VENV / "bin" / "vllm")
MAKE_MODEL = Path(__file__).with_name("make_model.py")
# A server on two cores: engine start-up with a model this small takes 25 to 90 s.
START_LIMIT = 240.0

# vLLM on the CPU: no accelerator to detect, a 1 GiB KV cache, the engine's OpenMP threads on
# core 0 so that the API server, the hook and the tests keep core 1. No hub, no usage reports.
VLLM_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_CONFIG_PATH": str(Path(ROOT) / "examples" / "vllm" / "logging.json"),
    "PYTHONUNBUFFERED": "1",
}


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
    digest = hashlib.sha256(MAKE_MODEL.read_bytes()).hexdigest()[:12]
    target = Path(ROOT) / ".vllm" / f"model-{digest}"
    if not (target / "model.safetensors").exists():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        python = str(Path(VLLM).with_name("python"))
        subprocess.run([python, str(MAKE_MODEL), str(partial)], check=True, timeout=300, capture_output=True)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return str(target)


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


class VllmServer:
    """One ``vllm serve`` process group on 127.0.0.1 with graceful inside, its log in a file."""

    def __init__(self, model: str, args: tuple[str, ...], socket_dir: str, log: Path, env: dict[str, str]) -> None:
        self.model = model
        self.socket_dir = socket_dir
        self.log_path = log
        self.port = 0
        environment = {**os.environ, **VLLM_ENV, "GRACEFUL_SOCKET_DIR": socket_dir, **env}
        environment.pop("PYTHONPATH", None)  # the vLLM venv has graceful installed (editable) itself
        command = [
            VLLM, "serve", model, "--dtype", "float32", "--enforce-eager", "--max-model-len", "16384",
            "--host", "127.0.0.1", "--port", "0", "--middleware", "graceful.GracefulMiddleware", *args,
        ]  # fmt: skip
        with open(log, "wb") as out:
            # A process group of its own (killed whole at teardown), but the test's session: with the
            # kernel's autogroup scheduling a new session is a scheduling group of its own, and the
            # CPU engine's busy-waiting core process then starved the tests and the hooks they start
            # for as long as a stream ran (seconds per request read).
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=environment, stdout=out, stderr=subprocess.STDOUT, process_group=0
            )

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    def sockets(self) -> list[str]:
        return sorted(glob.glob(os.path.join(self.socket_dir, "*.sock")))

    def wait_ready(self, sockets: int = 1, limit: float = START_LIMIT) -> None:
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

    def wait_log(self, text: str, limit: float = 30.0) -> None:
        deadline = time.monotonic() + limit
        while text not in self.log:
            assert time.monotonic() < deadline, f"never logged {text!r}:\n{self.log[-6000:]}"
            time.sleep(0.05)

    def wait_exit(self, limit: float) -> int:
        try:
            return self.process.wait(limit)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"vllm still running after {limit}s:\n{self.log[-6000:]}") from None

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


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any] | str]:
    """The ``data:`` payloads of an event stream: parsed JSON, or the raw text (``[DONE]``)."""
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            yield data if data.startswith("[") else json.loads(data)
