"""How ``graceful run`` finds the app's own GracefulMiddleware and judges its flags against the app's code
(``graceful/_serve/_load.py``), in-process; the options given in code that it reads (``in_code``)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware

from graceful import ConfigError, Drain, GracefulMiddleware
from graceful._serve._load import Flag, find_middleware, in_flag_words, refuse_contradictions
from tests.apps.streaming import app as streaming_app


def middleware(app: Any = streaming_app, **options: Any) -> GracefulMiddleware:
    return GracefulMiddleware(app, registry=CollectorRegistry(), admin=False, **options)


def test_the_options_given_in_code_are_recorded() -> None:
    """``in_code`` names what the code passed; a budget option passed as None is not given (its variable
    fills it), a hook passed as None is (it turns the variable's hook off)."""
    drain = Drain(grace_period=90, drain_timeout=None, on_drained=None, admit_during_propagation=False)
    assert drain.config.in_code == {"grace_period", "on_drained", "admit_during_propagation"}
    assert Drain().config.in_code == frozenset()
    wrapped = middleware(propagation_wait="10s", socket_dir="/tmp/graceful-test")
    assert wrapped.drain.config.in_code == {"propagation_wait"}
    assert wrapped.options.in_code == {"admin", "socket_dir"}


def test_the_app_itself_and_a_chain_of_app_attributes() -> None:
    inner = middleware()
    assert find_middleware(inner) is inner
    outer = GZipMiddleware(GZipMiddleware(inner))  # wrapped inside other middleware, in code
    assert find_middleware(outer) is inner
    assert find_middleware(streaming_app) is None


def test_a_middleware_that_starlette_lists_is_built_once_and_kept() -> None:
    """``app.add_middleware(GracefulMiddleware, ...)``: the stack is built here, as the first request would
    build it, and kept, so that the first request does not build a second middleware."""
    app = FastAPI()
    app.add_middleware(GracefulMiddleware, registry=CollectorRegistry(), admin=False, grace_period=90)
    assert app.middleware_stack is None
    found = find_middleware(app)
    assert isinstance(found, GracefulMiddleware) and found.drain.budget.grace_period == 90
    stack = app.middleware_stack
    assert stack is not None
    assert find_middleware(app) is found and app.middleware_stack is stack
    drain = Drain(grace_period=120)
    plain = Starlette(middleware=[Middleware(GracefulMiddleware, drain=drain, registry=CollectorRegistry())])
    assert find_middleware(plain).drain is drain  # type: ignore[union-attr]
    assert find_middleware(Starlette()) is None


def test_a_chain_is_followed_only_so_far() -> None:
    class Loop:
        def __init__(self) -> None:
            self.app = self

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None: ...

    assert find_middleware(Loop()) is None


def flag(option: str, value: Any, typed: str) -> Flag:
    return Flag(option, value, typed, typed.split(" ")[-1])


def test_a_flag_that_contradicts_the_code_is_refused_and_an_equal_one_is_not() -> None:
    app = middleware(grace_period="2m", reserve=20, admit_during_propagation=True)
    equal = [flag("grace_period", 120.0, "--grace-period 120"), flag("reserve", 20.0, "--reserve 20s")]
    unset = [flag("propagation_wait", 5.0, "--propagation-wait 5s")]  # not in code: it fills, no contradiction
    refuse_contradictions("myapp:app", app, equal + unset)
    with pytest.raises(ConfigError) as refused:
        refuse_contradictions("myapp:app", app, [flag("grace_period", 90.0, "--grace-period 90"), *unset])
    assert str(refused.value) == (
        "--grace-period 90 contradicts grace_period=120 set in code for myapp:app; drop the flag or the code's value"
    )
    no_admit = Flag("admit_during_propagation", False, "--no-admit-during-propagation", "0")
    with pytest.raises(ConfigError) as both:
        refuse_contradictions("myapp:app", app, [flag("reserve", 5.0, "--reserve 5"), no_admit])
    assert str(both.value) == (
        "--reserve 5 contradicts reserve=20 and --no-admit-during-propagation contradicts "
        "admit_during_propagation=True set in code for myapp:app; drop the flags or the code's values"
    )


def test_a_socket_dir_set_in_code_is_compared_as_a_path(tmp_path: Any) -> None:
    app = middleware(socket_dir=str(tmp_path))
    refuse_contradictions("a:app", app, [Flag("socket_dir", f"{tmp_path}/", f"--socket-dir {tmp_path}/", "")])
    with pytest.raises(ConfigError, match=r"--socket-dir /elsewhere contradicts socket_dir='"):
        refuse_contradictions("a:app", app, [Flag("socket_dir", "/elsewhere", "--socket-dir /elsewhere", "")])


def test_a_message_about_a_variable_set_from_a_flag_names_the_flag() -> None:
    flags = [flag("propagation_wait", 100.0, "--propagation-wait 100"), flag("grace_period", 30.0, "--grace-period 30")]
    said = (
        "propagation_wait (GRACEFUL_PROPAGATION_WAIT) 100s is longer than the whole drain; shorten "
        "propagation_wait (GRACEFUL_PROPAGATION_WAIT); environment variable GRACEFUL_RESERVE: '40' stays"
    )
    assert in_flag_words(said, flags) == (
        "--propagation-wait 100s is longer than the whole drain; shorten --propagation-wait; "
        "environment variable GRACEFUL_RESERVE: '40' stays"
    )
