from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def registry() -> CollectorRegistry:
    """A fresh registry per test, so metric values never leak between tests."""
    return CollectorRegistry()


@pytest.fixture
def socket_dir() -> Iterator[str]:
    """A short directory for Unix sockets: pytest's tmp_path can exceed the ~107-byte limit."""
    with tempfile.TemporaryDirectory(prefix="g-", dir="/tmp") as path:
        os.chmod(path, 0o700)
        yield path


# Fixtures that start real servers, shared by the *_more test files (defined once, next to
# the tests they grew with).
from tests.test_cli import served  # noqa: E402, F401
from tests.test_run import launch  # noqa: E402, F401
