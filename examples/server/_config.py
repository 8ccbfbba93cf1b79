"""The example server's settings, read from ``GRACEFUL_EXAMPLE_*`` environment variables.

``graceful run examples.server:app`` imports the app in each worker process, so the
environment is the one channel that reaches every worker; the ``serve`` command's
flags are written into it before the server starts.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, fields

from graceful import ConfigError, parse_duration

__all__ = ["DRAIN_ENV", "ENV", "Config", "drain_options_from_env", "served_by"]

# Field name -> environment variable. docs/kubernetes.md's table lists the same names.
ENV = {
    "model": "GRACEFUL_EXAMPLE_MODEL",
    "tokens_per_second": "GRACEFUL_EXAMPLE_TOKENS_PER_SECOND",
    "slots": "GRACEFUL_EXAMPLE_SLOTS",
    "queue_size": "GRACEFUL_EXAMPLE_QUEUE_SIZE",
    "load_delay": "GRACEFUL_EXAMPLE_LOAD_DELAY",
    "max_tokens": "GRACEFUL_EXAMPLE_MAX_TOKENS",
    "default_max_tokens": "GRACEFUL_EXAMPLE_DEFAULT_MAX_TOKENS",
    "idempotency_keys": "GRACEFUL_EXAMPLE_IDEMPOTENCY_KEYS",
    "selftest_interval": "GRACEFUL_EXAMPLE_SELFTEST_INTERVAL",
    "token_word": "GRACEFUL_EXAMPLE_TOKEN_WORD",
}


@dataclass(frozen=True)
class Config:
    """How the simulated engine behaves; every field has a flag and an environment variable."""

    model: str = "graceful-example"
    tokens_per_second: float = 20.0
    slots: int = 8
    queue_size: int = 128
    load_delay: float = 2.0
    max_tokens: int = 4096
    default_max_tokens: int = 16
    idempotency_keys: int = 10_000
    selftest_interval: float = 0.0
    token_word: str = "tok"

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ConfigError(f"{name}={getattr(self, name)!r} {rule} (environment variable {ENV[name]})")

        need(bool(self.model.strip()), "model", "must not be empty")
        need(0 < self.tokens_per_second < float("inf"), "tokens_per_second", "must be a number above 0, e.g. 20")
        need(self.slots >= 1, "slots", "must be at least 1")
        need(self.queue_size >= 0, "queue_size", "must be 0 or more (0: no waiting queue)")
        need(self.max_tokens >= 1, "max_tokens", "must be at least 1")
        need(1 <= self.default_max_tokens <= self.max_tokens, "default_max_tokens", "must be between 1 and max_tokens")
        need(self.idempotency_keys >= 1, "idempotency_keys", "must be at least 1")
        need(self.token_word.isascii() and self.token_word.isalpha(), "token_word", "must be letters only, e.g. tok")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """Build from ``GRACEFUL_EXAMPLE_*``; unset or empty variables keep their defaults."""
        environ = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for spec in fields(cls):
            var = ENV[spec.name]
            raw = environ.get(var, "").strip()
            if raw:
                values[spec.name] = _convert(spec.name, raw, var)
        return cls(**values)  # type: ignore[arg-type]

    def to_env(self) -> dict[str, str]:
        return {ENV[spec.name]: str(getattr(self, spec.name)) for spec in fields(self)}


def _convert(name: str, raw: str, var: str) -> object:
    kind = Config.__dataclass_fields__[name].type
    if name in ("load_delay", "selftest_interval"):
        return parse_duration(raw, name=f"environment variable {var}")
    if kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"environment variable {var}: {raw!r} is not a whole number; use e.g. 8") from None
    if kind == "float":
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"environment variable {var}: {raw!r} is not a number; use e.g. 20 or 7.5") from None
    return raw


# The app arrives at `graceful run` already wrapped, so the launcher's budget flags
# cannot reach its Drain; these variables (set by `serve`) do. GRACEFUL_GRACE_PERIOD
# is read by graceful itself.
DRAIN_ENV = {
    "propagation_wait": "GRACEFUL_EXAMPLE_PROPAGATION_WAIT",
    "drain_timeout": "GRACEFUL_EXAMPLE_DRAIN_TIMEOUT",
    "reserve": "GRACEFUL_EXAMPLE_RESERVE",
    "admit_during_propagation": "GRACEFUL_EXAMPLE_ADMIT_DURING_PROPAGATION",
}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def drain_options_from_env(environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """GracefulMiddleware drain options from ``GRACEFUL_EXAMPLE_*``, only those that are set."""
    environ = os.environ if environ is None else environ
    options: dict[str, object] = {}
    for name, var in DRAIN_ENV.items():
        raw = environ.get(var, "").strip()
        if name == "admit_during_propagation":
            if raw.lower() not in _TRUE | _FALSE:
                raise ConfigError(f"environment variable {var}: {raw!r} is not a boolean; use true or false")
            if raw:
                # An explicit false matters: graceful's own default is to admit.
                options[name] = raw.lower() in _TRUE
        elif raw:
            options[name] = parse_duration(raw, name=f"environment variable {var}")
    return options


def served_by() -> str:
    """This replica's name for ``X-Served-By``: the pod name, else host:pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}:{os.getpid()}"
