"""docs/soak.md: ``graceful soak`` as the page runs it, its Python use, and the demo's command lines.

1. docs_src/soak/soak.console: the page's command, as typed but for the URL, through the console
   script against three example-server replicas behind the demo's L4 forwarder. The page shows
   a run of 2 minutes; this one is stopped as the page says a run stops early, with Ctrl-C (SIGINT)
   once 40 requests have ended, and its table is held to the page's, every count and time aside.
2. docs_src/soak/soak_rollout.py, run with python as the page says, against ``graceful run
   examples.server:app`` while the "rollout" is that server's preStop drain (``graceful drain``).
3. The demo's command lines (docs_src/soak/demo*.console): run with stand-ins for the programs
   (tests/docs/recorded.py), each handed to the demo's own command.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest

from examples.rollout.balancer import open_balancer
from examples.server import create_app
from examples.server._config import Config
from tests.docs.recorded import check_started, recorded
from tests.docs.shown import console, unmatched
from tests.servers import Launched
from tests.utils import ROOT, run_uvicorn

pytestmark = pytest.mark.timeout(90)

SOAK = "docs_src/soak/soak.console"
SOAK_ROLLOUT = "docs_src/soak/soak_rollout.py"
DEMO = {
    "docs_src/soak/demo.console": ["scripts/demo", "scripts/demo", "python", "python", "scripts/demo", "scripts/demo"],
    "docs_src/soak/demo_vllm.console": ["scripts/demo", "python"],
    "docs_src/soak/demo_litellm.console": ["scripts/setup-litellm", "python", "python"],
}
# Fast replicas: a 256-token answer in about 0.3 s, serving from the start.
FAST = Config(tokens_per_second=1000, load_delay=0)
ENDED = 40  # requests ended before the Ctrl-C


def read(path: str) -> str:
    return (Path(ROOT) / path).read_text()


def spaced(text: str) -> str:
    """Runs of spaces as one: a table's columns widen and narrow with its counts."""
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


@contextlib.asynccontextmanager
async def three_replicas_behind_a_forwarder() -> AsyncIterator[str]:
    """replica-0..2, example servers under real uvicorn, behind the demo's L4 forwarder: its URL."""
    async with contextlib.AsyncExitStack() as stack:
        balancer = await stack.enter_async_context(open_balancer("forwarder"))
        for index in range(3):
            name = f"replica-{index}"
            server = await stack.enter_async_context(run_uvicorn(create_app(FAST, name=name, admin=False)))
            await balancer.add(name, server.port)
        yield f"http://127.0.0.1:{balancer.port}"


@pytest.mark.anyio
async def test_the_soak_session_prints_the_pages_table(tmp_path: Path) -> None:
    """1. the page's command (the URL aside) against three replicas 2. Ctrl-C once 40 requests ended
    3. exit 0, the table, line for line as the page shows it (counts and times aside), and the
    records, report and plot the command names, in the folder it ran in."""
    [(command, shown)] = console(read(SOAK))
    assert "http://127.0.0.1:8000" in command
    records = tmp_path / "out.jsonl"
    environment = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    async with three_replicas_behind_a_forwarder() as url:
        typed = command.replace("http://127.0.0.1:8000", url)
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            process = await anyio.open_process(
                ["bash", "-c", f"exec {typed}"], cwd=tmp_path, env=environment, stdout=stdout, stderr=stderr
            )
        try:
            with anyio.fail_after(30):
                while not records.exists() or len(records.read_text().splitlines()) < ENDED:
                    assert process.returncode is None, err.read_text()
                    await anyio.sleep(0.05)
            process.send_signal(signal.SIGINT)
            with anyio.fail_after(30):
                code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    printed, errors = out.read_text(), err.read_text()
    assert code == 0, printed + errors
    assert unmatched(spaced(shown), spaced(printed)) == [], printed
    requests = int(re.search(r"no unexplained loss in (\d+) requests", printed).group(1))  # type: ignore[union-attr]
    assert requests >= ENDED
    assert len(records.read_text().splitlines()) == requests
    assert json.loads((tmp_path / "report.json").read_text())["requests"] == requests
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_soak_rollout_py_soaks_until_the_rollout_command_ends(
    launch: Callable[..., Launched], socket_dir: str, tmp_path: Path
) -> None:
    """1. ``graceful run examples.server:app`` 2. ``python soak_rollout.py URL graceful drain ...``: it
    soaks the server while the drain runs 3. the drain ends, the soak stops: exit 0, the table, and
    report.json in the folder it ran in, with the requests the server answered."""
    server = launch(
        app="examples.server:app",
        GRACEFUL_EXAMPLE_TOKENS_PER_SECOND=str(FAST.tokens_per_second),
        GRACEFUL_EXAMPLE_LOAD_DELAY="0",
    )
    server.wait_ready()
    rollout = ["graceful", "drain", "--socket-dir", socket_dir, "--propagation-wait", "1s"]
    environment = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
    ran = subprocess.run(
        [sys.executable, str(Path(ROOT) / SOAK_ROLLOUT), server.base, *rollout],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr + server.log
    assert "verdict: no unexplained loss in" in ran.stdout, ran.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["by_reason"]["ok"] > 0 and report["requests"] >= report["by_reason"]["ok"]
    assert "drained" in ran.stdout + ran.stderr  # the rollout command's own output, passed through


@pytest.mark.parametrize("path", sorted(DEMO))
def test_the_demos_command_lines_are_ones_it_takes(path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = recorded(path, tmp_path)
    assert [name for name, _ in started] == DEMO[path], started
    check_started(started, monkeypatch)
