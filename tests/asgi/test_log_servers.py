"""The drain is in the log of every server graceful documents, with no logging configured by the user
(issue 51): real subprocesses, SIGTERM, and the drain's start and end in the server's output, once
per worker, in the server's own format. The rule itself (``_asgi/_log.py``) on loggers of its own."""

from __future__ import annotations

import logging
import re
import signal
import time
from collections.abc import Callable, Iterator

import pytest

from graceful._asgi import _log
from graceful._asgi._log import show_in_server_log
from tests.asgi.test_sigterm import start_server

# Each server's own prefix of a line at INFO: uvicorn's "INFO:     ", gunicorn's and hypercorn's
# "[date] [pid] [INFO] ", granian's "[INFO] ".
STAMPED = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}\] \[\d+\] \[INFO\] "
PREFIX = {
    "uvicorn-h11": r"INFO:     ",
    "gunicorn": STAMPED,
    "hypercorn-asyncio": STAMPED,
    "granian": r"\[INFO\] ",
    "graceful-run": r"INFO:     ",
}
WORKERS = {"gunicorn": 2}
# The servers that log uvicorn's "Application startup complete" (gunicorn's workers run uvicorn's).
STARTUP_LINE = {"uvicorn-h11", "gunicorn", "graceful-run"}
Loggers = tuple[logging.Logger, logging.Logger]


@pytest.mark.servers
@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", list(PREFIX))
def test_sigterm_drain_is_in_the_servers_log(name: str, socket_dir: str) -> None:
    """1. the server runs the compatibility app; nobody configures logging but the server 2. SIGTERM
    to its main process 3. it drains and exits. Its output holds the drain's start and its end,
    once per worker (graceful run's too: not twice), each line in the server's own format."""
    workers = WORKERS.get(name, 1)
    with start_server(name, socket_dir) as (server, log):
        # /ready answered from one worker: each must have finished its startup (bounded, on the log's changes).
        deadline = time.monotonic() + 30
        with log.changed:
            while log.text().count("Application startup complete") < workers and name in STARTUP_LINE:
                assert log.changed.wait(max(0.0, deadline - time.monotonic())), log.text()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(30)
    text = log.text()
    began = re.findall(rf"(?m)^{PREFIX[name]}state SERVING -> DRAINING at .* \(reason=SIGTERM", text)
    ended = re.findall(rf"(?m)^{PREFIX[name]}drain drained: reason=SIGTERM ", text)
    assert (len(began), len(ended)) == (workers, workers), text
    assert text.count("state SERVING -> DRAINING") == workers, text  # in no other format either


@pytest.fixture
def loggers(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Callable[[], Loggers]]:
    """Loggers of this test's own, in graceful's place and in a server's, made in the test's body:
    pytest hangs its capturing handlers on every logger that does not propagate as each phase
    begins. Neither reaches pytest's handlers on the root logger; nothing is left on them after."""
    prefix = f"tests.log.{request.node.name}"
    monkeypatch.setattr(_log, "SERVER_LOGGERS", (f"{prefix}.server.error",))
    made: list[logging.Logger] = []

    def make() -> Loggers:
        ours, theirs = logging.getLogger(f"{prefix}.graceful"), logging.getLogger(f"{prefix}.server")
        ours.propagate = theirs.propagate = False
        made.extend((ours, theirs, logging.getLogger(f"{prefix}.server.error")))
        return ours, theirs

    yield make
    for each in made:
        each.handlers.clear()
        each.setLevel(logging.NOTSET)


def test_with_no_handler_it_takes_the_servers_handlers_and_level(loggers: Callable[[], Loggers]) -> None:
    ours, theirs = loggers()
    handler = logging.StreamHandler()
    theirs.addHandler(handler)  # on the parent of the server's error logger, as uvicorn's are
    theirs.setLevel(logging.WARNING)  # uvicorn --log-level warning
    show_in_server_log(ours)
    assert ours.handlers == [handler] and ours.level == logging.WARNING
    show_in_server_log(ours)  # a second lifespan startup in the same process
    assert ours.handlers == [handler]


def test_with_no_server_log_yet_it_writes_to_stderr_at_info(loggers: Callable[[], Loggers]) -> None:
    ours, _ = loggers()  # the server's logger has no handler yet (hypercorn's, at lifespan startup)
    show_in_server_log(ours)
    [handler] = ours.handlers
    assert isinstance(handler, logging.StreamHandler) and ours.level == logging.INFO
    record = logging.LogRecord("graceful", logging.INFO, __file__, 1, "state SERVING -> DRAINING", None, None)
    assert re.fullmatch(STAMPED + "state SERVING -> DRAINING", handler.format(record))  # hypercorn's format


def test_logging_configured_for_graceful_is_left_alone(loggers: Callable[[], Loggers]) -> None:
    ours, theirs = loggers()
    theirs.addHandler(logging.StreamHandler())
    off = logging.NullHandler()  # how a user keeps graceful out of the log
    ours.addHandler(off)
    show_in_server_log(ours)
    assert ours.handlers == [off] and ours.level == logging.NOTSET
    ours.removeHandler(off)
    ours.setLevel(logging.ERROR)  # a level set by the user stays, with the server's handlers
    show_in_server_log(ours)
    assert ours.level == logging.ERROR and ours.handlers == theirs.handlers


def test_a_handler_above_it_counts_as_configured(loggers: Callable[[], Loggers]) -> None:
    ours, _ = loggers()
    child = logging.getLogger(f"{ours.name}.engine")  # graceful.engine under graceful
    ours.addHandler(logging.NullHandler())
    show_in_server_log(child)
    assert child.handlers == []
