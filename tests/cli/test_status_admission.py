"""``graceful status`` shows the requests admission="fits" refused because they would not have finished (issue 54)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from graceful._cli._main import cli
from graceful._drain._admission import WOULD_NOT_FINISH
from graceful._drain._state import core
from tests.servers import Served


def test_status_shows_the_requests_that_would_not_have_finished(served: Served) -> None:
    before = CliRunner().invoke(cli, ["status", "--socket-dir", served.socket_dir])
    assert before.exit_code == 0 and "would not finish" not in before.output
    for _ in range(3):
        core(served.mw.drain).count_rejected(WOULD_NOT_FINISH)
    after = CliRunner().invoke(cli, ["status", "--socket-dir", served.socket_dir])
    assert after.exit_code == 0
    assert after.output.splitlines()[1].endswith("  refused 3 that would not finish (admission fits)")
    rows = json.loads(CliRunner().invoke(cli, ["status", "--socket-dir", served.socket_dir, "--json"]).stdout)
    assert rows[0]["counters"]["rejected"] == {WOULD_NOT_FINISH: 3}
