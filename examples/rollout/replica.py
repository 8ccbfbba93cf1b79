"""One replica of the example server (or of vLLM) as a subprocess in its own process group: a pod.

The graceful side runs ``python -m graceful run examples.server:app`` (SIGTERM drains);
the baseline runs plain ``python -m uvicorn examples.server:app`` with no preStop.
Both serve the same app with the same engine settings, so only the exit differs.
With ``--vllm`` both run ``vllm serve`` with the same model and arguments, the graceful
side with ``--middleware graceful.GracefulMiddleware`` (examples/rollout/vllm.py).
SIGTERM goes to the main process only (the kubelet signals the container's PID 1);
SIGKILL goes to the whole group (the container dies with everything in it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from .vllm import START_LIMIT, VLLM_ENV, VllmSetup

__all__ = ["ROOT", "Kind", "Replica", "ReplicaSettings"]

Kind = Literal["graceful", "baseline"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APP = "examples.server:app"


@dataclass(frozen=True)
class ReplicaSettings:
    """What every replica of one run shares: launcher, budget and simulated engine."""

    kind: Kind
    grace_period: float
    propagation_wait: float
    reserve: float | None = None
    propagation_quiet: float | None = None
    admit_during_propagation: bool = True
    tokens_per_second: float = 10.0
    slots: int = 64
    queue_size: int = 256
    load_delay: float = 0.5
    ignore_term: bool = False
    handoff_streams: bool = False
    announce_drain: bool = True  # graceful's responses carry x-envoy-immediate-health-check-fail from its drain's start
    admission: str | None = None  # the graceful side's admission option (GRACEFUL_ADMISSION); None: graceful's default
    log_dir: str = field(default_factory=tempfile.gettempdir)
    vllm: VllmSetup | None = None  # --vllm: replicas are vllm serve processes

    @property
    def startup_path(self) -> str:
        """The startup probe: the middleware's /startup, or plain vLLM's /health (it serves once its engine is up)."""
        return "/health" if self.vllm is not None and self.kind != "graceful" else "/startup"

    @property
    def start_limit(self) -> float:
        return START_LIMIT if self.vllm is not None else 30.0

    def environment(self, name: str, socket_dir: str) -> dict[str, str]:
        if self.vllm is not None:
            return self._vllm_environment(name, socket_dir)
        env = {
            **os.environ,
            "POD_NAME": name,
            "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p),
            "GRACEFUL_SOCKET_DIR": socket_dir,
            "GRACEFUL_GRACE_PERIOD": f"{self.grace_period:g}",
            "GRACEFUL_EXAMPLE_TOKENS_PER_SECOND": f"{self.tokens_per_second:g}",
            "GRACEFUL_EXAMPLE_SLOTS": str(self.slots),
            "GRACEFUL_EXAMPLE_QUEUE_SIZE": str(self.queue_size),
            "GRACEFUL_EXAMPLE_LOAD_DELAY": f"{self.load_delay:g}",
            "GRACEFUL_EXAMPLE_IDEMPOTENCY_KEYS": "1000000",
            "GRACEFUL_EXAMPLE_PROPAGATION_WAIT": f"{self.propagation_wait:g}",
            "GRACEFUL_EXAMPLE_ADMIT_DURING_PROPAGATION": "true" if self.admit_during_propagation else "false",
        }
        if self.reserve is not None:
            env["GRACEFUL_EXAMPLE_RESERVE"] = f"{self.reserve:g}"
        if self.handoff_streams:
            env["GRACEFUL_HANDOFF_STREAMS"] = "1"  # graceful run --handoff-streams, for the already wrapped app
        env["GRACEFUL_ANNOUNCE_DRAIN"] = "1" if self.announce_drain else "0"
        if self.admission is not None:
            env["GRACEFUL_ADMISSION"] = self.admission
        if self.kind != "graceful":
            # The example app carries the middleware, which under plain uvicorn would take SIGTERM
            # over and drain (drain_on_sigterm, on by default). The baseline is a server without
            # a drain: uvicorn's own SIGTERM handling.
            env["GRACEFUL_DRAIN_ON_SIGTERM"] = "0"
        return env

    def _vllm_environment(self, name: str, socket_dir: str) -> dict[str, str]:
        """docs/vllm.md's recipe: graceful is configured by its environment variables only."""
        env = {**os.environ, **VLLM_ENV, "POD_NAME": name}
        env.pop("PYTHONPATH", None)  # the vLLM venv has graceful installed (editable) itself
        if self.kind == "graceful":
            env.update(
                GRACEFUL_SOCKET_DIR=socket_dir,
                GRACEFUL_GRACE_PERIOD=f"{self.grace_period:g}",
                GRACEFUL_PROPAGATION_WAIT=f"{self.propagation_wait:g}",
                GRACEFUL_ADMIT_DURING_PROPAGATION="1" if self.admit_during_propagation else "0",
                # The kubelet's and Prometheus' reads of vLLM's own pages are never refused.
                GRACEFUL_EXEMPT_PATHS="/health,/metrics",
                GRACEFUL_ANNOUNCE_DRAIN="1" if self.announce_drain else "0",
            )
            if self.admission is not None:
                env["GRACEFUL_ADMISSION"] = self.admission
            if self.reserve is not None:
                env["GRACEFUL_RESERVE"] = f"{self.reserve:g}"
        return env

    def command(self, port: int, socket_dir: str) -> list[str]:
        if self.vllm is not None:
            argv = self.vllm.argv(port, graceful=self.kind == "graceful")
            if self.ignore_term:
                argv = [sys.executable, "-m", "examples.rollout.ignore_term", *argv]
            return argv
        host = [
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            os.environ.get("GRACEFUL_ROLLOUT_LOG_LEVEL", "warning"),
        ]
        if self.kind == "graceful":
            argv = [sys.executable, "-m", "graceful", "run", APP, *host, "--socket-dir", socket_dir]
        else:
            argv = [sys.executable, "-m", "uvicorn", APP, *host]
        if self.ignore_term:
            argv = [sys.executable, "-m", "examples.rollout.ignore_term", *argv]
        return argv


class Replica:
    """A running replica: its port, admin socket directory and process."""

    def __init__(self, name: str, settings: ReplicaSettings) -> None:
        self.name = name
        self.settings = settings
        self.port = 0
        self.socket_dir = tempfile.mkdtemp(prefix="g-", dir="/tmp")
        self.log_path = os.path.join(settings.log_dir, f"{name}.log")
        self.process: asyncio.subprocess.Process | None = None
        self.started = 0.0
        self.exited: float | None = None
        self.sigkilled = False

    async def start(self) -> None:
        self.port = _free_port()
        with open(self.log_path, "ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *self.settings.command(self.port, self.socket_dir),
                cwd=ROOT,
                env=self.settings.environment(self.name, self.socket_dir),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                **self._group(),
            )
        self.started = time.monotonic()

    async def wait_started(self, timeout: float | None = None) -> None:
        """Poll the startup probe (``/startup`` 200, plain vLLM's ``/health``) as the kubelet does, every 100 ms."""
        timeout = self.settings.start_limit if timeout is None else timeout
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.port}{self.settings.startup_path}"
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.returncode is not None:
                    raise RuntimeError(f"replica {self.name} exited with {self.returncode}; see {self.log_path}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url)).status_code == 200:
                        return
                await asyncio.sleep(0.1)
        raise RuntimeError(f"replica {self.name} failed its startup probe for {timeout:g}s; see {self.log_path}")

    def _group(self) -> dict[str, Any]:
        """A process group of its own; with vLLM in this session, without: a new session.

        With the kernel's autogroup scheduling a session is a scheduling group of its own.
        Beside busy-waiting CPU vLLM engines a process in a new session waited seconds for
        the CPU (the preStop hook reached its replica up to 11 s late; tests/vllm/conftest.py
        saw the same), one in this session does not.
        """
        return {"process_group": 0} if self.settings.vllm is not None else {"start_new_session": True}

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    async def pre_stop(
        self, *, propagation_wait: float, timeout: float, propagation_quiet: float | None = None
    ) -> tuple[int, list[dict[str, Any]]]:
        """``graceful drain`` against this replica's admin socket.

        Returns its exit code and each worker's drain result from ``--json`` (``started_at``,
        ``propagation``, ``handed_off``, ...; empty when unknown).
        """
        argv = [
            sys.executable,
            "-m",
            "graceful",
            "drain",
            "--socket-dir",
            self.socket_dir,
            "--propagation-wait",
            f"{propagation_wait:g}s",
            "--timeout",
            f"{timeout:g}s",
            "--quiet",
            "--json",
        ]
        if propagation_quiet is not None:
            argv += ["--propagation-quiet", f"{propagation_quiet:g}s"]
        with open(self.log_path, "ab") as log:
            hook = await asyncio.create_subprocess_exec(
                *argv,
                cwd=ROOT,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                **self._group(),
            )
        try:
            out, _ = await hook.communicate()
            code = hook.returncode
            assert code is not None
            return code, _results(out)
        finally:
            if hook.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(hook.pid, signal.SIGKILL)
                await hook.wait()

    async def statuses(self) -> list[dict[str, Any]]:
        """Each worker's admin ``/status`` (its budget, request durations and drains), as
        ``graceful status --json`` prints them; empty when none answers."""
        found = []
        for name in sorted(os.listdir(self.socket_dir)):
            path = os.path.join(self.socket_dir, name)
            if not name.endswith(".sock"):
                continue
            try:
                async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=path), timeout=5.0) as client:
                    answer = await client.get("http://graceful/status")
                found.append({"socket": path, **answer.json()})
            except (httpx.HTTPError, ValueError):
                continue
        return found

    async def executions(self) -> dict[str, int] | None:
        """The replica's execution count per idempotency key, or None when it cannot answer (vLLM keeps none)."""
        if self.settings.vllm is not None:
            return None
        try:
            async with httpx.AsyncClient(timeout=5.0) as client:
                response = await client.get(f"http://127.0.0.1:{self.port}/debug/executions")
                response.raise_for_status()
                return {str(key): int(value) for key, value in response.json().items()}
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    def terminate(self) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.sigkilled = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the exit; True if it exited."""
        if self.process is None:
            return True
        try:
            await asyncio.wait_for(self.process.wait(), max(timeout, 0.0))
        except TimeoutError:
            return False
        self.exited = self.exited or time.monotonic()
        return True

    async def stop(self) -> None:
        """Cleanup at the end of a run, or after a failure: SIGKILL the group, never leave it behind."""
        if self.process is not None:
            if self.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                await self.process.wait()
            # The wrapper or a worker may outlive the group leader's exit.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            for entry in os.listdir(self.socket_dir):
                os.unlink(os.path.join(self.socket_dir, entry))
            os.rmdir(self.socket_dir)


def _results(out: bytes) -> list[dict[str, Any]]:
    """Each worker's drain result in ``graceful drain --json`` output."""
    try:
        workers = json.loads(out)["workers"]
        return [dict(worker["result"]) for worker in workers if worker.get("result")]
    except (ValueError, KeyError, TypeError):
        return []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
