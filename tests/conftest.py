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
