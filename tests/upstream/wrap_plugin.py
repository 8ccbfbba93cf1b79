"""pytest plugin that runs an upstream test suite with every app wrapped in ``GracefulMiddleware``.

``scripts/upstream-suites`` loads it (``-p wrap_plugin``, with this directory on ``PYTHONPATH``) for
the wrapped run of the Starlette, FastAPI and sse-starlette test suites, and compares that run with
a plain one: a test that passes plain and fails wrapped is a place where the middleware, with its
default options, changes what an application does.

What it wraps, as soon as the plugin is loaded (before the suite's conftest files are imported):

- **Every Starlette application**, FastAPI's included, and mounted sub-applications: the result of
  ``build_middleware_stack()`` becomes ``GracefulMiddleware(stack)``, so the middleware is the
  outermost layer of the stack that ``Starlette.__call__`` runs, outside ``ServerErrorMiddleware``,
  as ``app = GracefulMiddleware(app)`` would put it. ``FastAPI`` overrides that method without
  calling ``Starlette``'s, so the override of every subclass is wrapped too: those defined already
  and, through ``Starlette.__init_subclass__``, those defined later (FastAPI is imported by the
  suite after this plugin). A stack that is already a ``GracefulMiddleware`` (a subclass's override
  that calls ``super()``) is not wrapped twice.
- **Raw ASGI apps handed to ``starlette.testclient.TestClient``** (``fastapi.testclient`` is the same
  class) that are not Starlette applications: plain functions, classes, ASGI2 apps (turned into
  ASGI3 first, as the client would), routers and third-party middleware. A Starlette application
  is left alone there: its stack is wrapped already.
- **Raw ASGI apps handed to ``httpx.ASGITransport``** (and ``httpx2``'s), the same way: a few tests
  drive an app through an ``httpx.AsyncClient`` instead of the TestClient.

sse-starlette's suite needs nothing more: the apps it builds are Starlette applications, served by
uvicorn in the test's own process, driven through ``httpx2.ASGITransport`` or a ``TestClient``.

Not wrapped: apps called directly by a test (``await app(scope, receive, send)``, as most of
sse-starlette's tests call an ``EventSourceResponse``) and apps in subprocesses that a test starts
(the plugin is only loaded into the pytest process).

Each test's junit XML entry gets a ``graceful_refusals`` property (for example
``server_starting=2``) when a wrapped app refused requests during it, counted through
``Core.count_rejected`` (a ``Drain``'s internal face), so that ``scripts/upstream_compare.py`` can
tell failures that follow from a refusal (no lifespan ran, so the app never left STARTING) from other differences.

Every middleware uses the default options and so runs its admin socket at lifespan startup; the
socket directory is ``$GRACEFUL_SOCKET_DIR``, set here to a short temporary directory when the
caller has not set it (a Unix socket path is limited to 107 bytes).
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Generator
from typing import Any

import pytest
from starlette import testclient
from starlette.applications import Starlette

from graceful import GracefulMiddleware
from graceful._drain._core import Core

_MARK = "_graceful_upstream_wrapped"


def _wrap_build(cls: type) -> None:
    """Wrap ``cls``'s own ``build_middleware_stack`` (if it defines one) so its stack is wrapped."""
    original = cls.__dict__.get("build_middleware_stack")
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def build_middleware_stack(self: Starlette) -> Any:
        stack = original(self)
        if isinstance(stack, GracefulMiddleware):
            return stack
        return GracefulMiddleware(stack)

    setattr(build_middleware_stack, _MARK, True)
    cls.build_middleware_stack = build_middleware_stack  # type: ignore[attr-defined]


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found


def _patch_starlette() -> None:
    for cls in [Starlette, *_subclasses(Starlette)]:
        _wrap_build(cls)

    original = Starlette.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        if original is not None:
            original.__func__(cls, **kwargs)
        else:
            super(Starlette, cls).__init_subclass__(**kwargs)
        _wrap_build(cls)

    Starlette.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]


def _patch_testclient() -> None:
    client = testclient.TestClient
    original: Callable[..., None] = client.__init__
    is_asgi3: Callable[[Any], bool] = testclient._is_asgi3
    asgi2: Callable[[Any], Any] = testclient._WrapASGI2

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if args:
            app, args = args[0], args[1:]
        else:
            app = kwargs.pop("app")
        if not isinstance(app, (Starlette, GracefulMiddleware)):
            if not is_asgi3(app):
                app = asgi2(app)
            app = GracefulMiddleware(app)
        original(self, app, *args, **kwargs)

    client.__init__ = __init__  # type: ignore[method-assign]


def _patch_asgi_transport() -> None:
    for module in ("httpx", "httpx2"):
        try:
            transport = __import__(module).ASGITransport
        except (ImportError, AttributeError):
            continue
        original: Callable[..., None] = transport.__init__

        def __init__(self: Any, *args: Any, _original: Callable[..., None] = original, **kwargs: Any) -> None:
            if args:
                app, args = args[0], args[1:]
            else:
                app = kwargs.pop("app")
            if not isinstance(app, (Starlette, GracefulMiddleware)):
                app = GracefulMiddleware(app)
            _original(self, app, *args, **kwargs)

        transport.__init__ = functools.wraps(original)(__init__)


_refused: Counter[str] = Counter()


def _patch_refusal_count() -> None:
    original: Callable[..., None] | None = getattr(Core, "count_rejected", None)
    if original is None:  # the library no longer counts refusals there: no property then
        return

    @functools.wraps(original)
    def count_rejected(self: Core, reason: str, *args: Any, **kwargs: Any) -> None:
        _refused[reason] += 1
        original(self, reason, *args, **kwargs)

    Core.count_rejected = count_rejected  # type: ignore[method-assign]


def _socket_dir() -> None:
    if os.environ.get("GRACEFUL_SOCKET_DIR", "").strip():
        return
    path = tempfile.mkdtemp(prefix="gu-", dir="/tmp" if os.path.isdir("/tmp") else None)
    os.environ["GRACEFUL_SOCKET_DIR"] = path
    _made.append(path)


_made: list[str] = []
_socket_dir()
_patch_starlette()
_patch_testclient()
_patch_asgi_transport()
_patch_refusal_count()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _refused.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # junitxml writes the properties of the teardown report, made after the test's last phase.
    if call.when == "teardown" and _refused:
        item.user_properties.append(("graceful_refusals", ",".join(f"{k}={v}" for k, v in sorted(_refused.items()))))
        _refused.clear()
    return (yield)


def pytest_report_header() -> str:
    where = os.environ["GRACEFUL_SOCKET_DIR"]
    return f"graceful wrap_plugin: every app wrapped in GracefulMiddleware (admin sockets in {where})"


def pytest_unconfigure() -> None:
    for path in _made:
        shutil.rmtree(path, ignore_errors=True)
