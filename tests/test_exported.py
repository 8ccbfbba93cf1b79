"""The public surface is a contract: benchmarks, users' code and outside checks import these names."""

from __future__ import annotations

import subprocess
import sys

import pytest

import graceful


def test_exported_members() -> None:
    assert sorted(graceful.__all__) == [
        "AsyncResumingTransport",
        "Budget",
        "ConfigError",
        "Drain",
        "DrainResult",
        "DrainStatus",
        "GracefulMiddleware",
        "NotAccepting",
        "ResumingTransport",
        "State",
        "default_final_frame",
        "parse_duration",
    ]
    for name in graceful.__all__:
        member = getattr(graceful, name)
        assert getattr(member, "__module__", "graceful").startswith("graceful")
    assert set(graceful.__all__) <= set(dir(graceful))


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="Drian"):
        graceful.Drian


def test_public_modules() -> None:
    from graceful import cli, engine

    assert callable(cli.main) and cli.drain_command.name == "drain"
    assert cli.soak_command.name == "soak" and sorted(cli.__all__) == ["cli", "drain_command", "main", "soak_command"]
    assert callable(engine.wait_idle)
    assert sorted(engine.__all__) == [
        "EngineConfig",
        "EngineDrainResult",
        "EnginePreset",
        "EngineProgress",
        "MAX_KV_BUFFER",
        "PRESETS",
        "effective_wait",
        "read_metrics",
        "wait_idle",
    ]


def test_soak_exports_library_names_only() -> None:
    from graceful import soak

    assert sorted(soak.__all__) == ["Attempt", "RequestRecord", "SoakConfig", "SoakReport", "run_soak"]
    assert not hasattr(soak, "soak_command")


def test_soak_loads_only_when_asked_for() -> None:
    code = (
        "import sys, graceful._cli._main as c; before = 'graceful._soak._runner' in sys.modules; "
        "c.main(['soak', '--help']); print(before, 'graceful._cli._soak' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "Send short, long and streaming requests" in out
    assert out.split()[-2:] == ["False", "True"]


def test_the_drain_command_does_not_import_the_middleware() -> None:
    code = (
        "import sys, graceful._cli._main; "
        "print('graceful._asgi._middleware' in sys.modules, 'prometheus_client' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
