"""``--vllm``: replicas that are real ``vllm serve`` processes on the CPU, with a tiny model made once.

The vLLM is the one ``bash scripts/setup-vllm`` makes (``.vllm/venv``; ``GRACEFUL_VLLM`` names
another ``vllm`` command). The model is ``tests/vllm/make_model.py``'s (random weights, a
tokenizer trained on the spot, no hub), made with vLLM's Python and kept under
``.vllm/model-<hash of the script>``: the cache the vLLM tests use (tests/vllm/conftest.py).
Each server runs with the environment of the tests and of docs/vllm.md's recipe: graceful
configured by ``GRACEFUL_*`` variables only, its log lines through ``examples/vllm/logging.json``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

from graceful import ConfigError

__all__ = ["MODEL_NAME", "START_LIMIT", "VLLM_ENV", "VllmSetup", "find_vllm", "prepare"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAKE_MODEL = os.path.join(ROOT, "tests", "vllm", "make_model.py")
MODEL_NAME = "tiny-random"  # --served-model-name: the model field of every request
# Engine start-up with this model takes 25 to 90 s on two cores, longer beside a busy engine.
START_LIMIT = 240.0
MODEL_LIMIT = 300.0

# vLLM on the CPU: no accelerator to detect, a 1 GiB KV cache, the engine's OpenMP threads on
# core 0 (or the cores VLLM_CPU_OMP_THREADS_BIND names where it is set: the vllm tests started late
# run on the second core) so that the API servers, the hooks, the balancer and the clients keep the
# other cores. No hub, no usage reports.
VLLM_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND") or "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_CONFIG_PATH": os.path.join(ROOT, "examples", "vllm", "logging.json"),
    "PYTHONUNBUFFERED": "1",
}


@dataclass(frozen=True)
class VllmSetup:
    """The ``vllm`` command and the model directory every replica of a run serves."""

    command: str
    model: str

    def argv(self, port: int, *, graceful: bool) -> list[str]:
        argv = [
            self.command, "serve", self.model, "--served-model-name", MODEL_NAME, "--dtype", "float32",
            "--enforce-eager", "--max-model-len", "16384", "--host", "127.0.0.1", "--port", str(port),
            "--disable-uvicorn-access-log",
        ]  # fmt: skip
        if graceful:
            argv += ["--middleware", "graceful.GracefulMiddleware"]
        return argv


def find_vllm() -> str:
    """The ``vllm`` command: ``GRACEFUL_VLLM``, else the one scripts/setup-vllm makes; ConfigError if absent."""
    command = os.environ.get("GRACEFUL_VLLM") or os.path.join(ROOT, ".vllm", "venv", "bin", "vllm")
    if not os.access(command, os.X_OK):
        raise ConfigError(
            f"--vllm: no vllm command at {command}; run bash scripts/setup-vllm (or scripts/demo --vllm), "
            "or set GRACEFUL_VLLM to one"
        )
    return command


def prepare(command: str) -> VllmSetup:
    """The model, made once per version of make_model.py (seconds) with the Python next to ``command``.

    Raises RuntimeError when it cannot be made.
    """
    with open(MAKE_MODEL, "rb") as script:
        digest = hashlib.sha256(script.read()).hexdigest()[:12]
    target = os.path.join(ROOT, ".vllm", f"model-{digest}")
    with _alone(target + ".lock"):
        if not os.path.exists(os.path.join(target, "model.safetensors")):
            partial = target + ".partial"
            shutil.rmtree(partial, ignore_errors=True)
            python = os.path.join(os.path.dirname(command), "python")
            try:
                subprocess.run(
                    [python, MAKE_MODEL, partial], check=True, timeout=MODEL_LIMIT, capture_output=True, cwd=ROOT
                )
            except (OSError, subprocess.SubprocessError) as exc:
                detail = getattr(exc, "stderr", b"") or b""
                raise RuntimeError(f"could not make the model with {python}: {exc} {detail[-500:]!r}") from None
            shutil.rmtree(target, ignore_errors=True)
            os.rename(partial, target)
    return VllmSetup(command=command, model=target)


@contextlib.contextmanager
def _alone(path: str) -> Iterator[None]:
    """Hold the lock file ``path``: a second process making the same model (the vllm tests' two workers, a
    demo beside them) waits for the first and then finds it made. The wait is bounded by the making's own."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    deadline = time.monotonic() + MODEL_LIMIT + 30.0
    with open(path, "w") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"another process held {path} for more than {MODEL_LIMIT + 30.0:g} s") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
