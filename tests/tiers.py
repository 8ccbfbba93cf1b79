"""The suite's tiers (docs/testing.md, "Tiers"): each test gets exactly one of these markers at collection.

- ``fast``: in-process only. No subprocess, no balancer, no vLLM: ``bash scripts/test-fast`` runs this tier
  alone, in under three minutes on a 2-core machine.
- ``servers``: real servers (uvicorn, gunicorn, hypercorn, granian, ``graceful run``) started as processes,
  the console script run as a process, and the balancers (HAProxy, nginx, Envoy).
- ``gateways``: a real LiteLLM proxy, and Node's openai SDK as a caller.
- ``vllm``: a real vLLM on the CPU.

A test's tier is its own marker if it has one, else its folder's or file's (``BY_PATH``), else ``fast``.
A test left ``fast`` that starts a process fails, with the fix in its message (``forbid_processes``), so
the fast tier stays in-process as tests are added: nobody has to remember to mark a test.
"""

from __future__ import annotations

import multiprocessing.util
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

TIERS = ("fast", "servers", "gateways", "vllm")
MARKERS = (
    "fast: in-process only (tests/tiers.py); bash scripts/test-fast runs this tier",
    "servers: real servers, the console script and balancers as processes (tests/tiers.py)",
    "gateways: a real LiteLLM proxy and Node callers (tests/tiers.py)",
    "vllm: a real vLLM on the CPU (tests/tiers.py)",
    # Not a tier: a test that pins its processes to two CPUs, which pytest-xdist's busy workers would skew.
    # scripts/test runs it with the vllm tier, alone.
    "every_core: needs two CPUs of its own; scripts/test runs it with the vllm tier (tests/tiers.py)",
    # Not a tier either: vllm tests that scripts/test starts once the fast, servers and gateways tiers have
    # ended, beside the rest of the vllm tier, their engines on the second core.
    "vllm_late: a vllm test that scripts/test starts once the other tiers have ended (tests/tiers.py)",
)

# A folder, a file or a test (relative to the repository root) whose every test is in one tier. Or mark a
# test where it is written (@pytest.mark.servers).
BY_PATH = {
    "tests/vllm/": "vllm",
    "tests/litellm/": "gateways",
    "tests/test_rollout_litellm.py": "gateways",
    "tests/test_rollout.py": "servers",
    "tests/test_rollout_advice.py": "servers",
    "tests/test_compat.py": "servers",
    "tests/test_envoy.py": "servers",
    "tests/test_gateway.py": "servers",
    "tests/test_nginx_refusal.py": "servers",
    "tests/test_benchmarks_smoke.py": "servers",
    "tests/test_example_server.py": "servers",
    "tests/serve/": "servers",
    "tests/soak/": "servers",
    "tests/asgi/test_sigterm.py": "servers",
    "tests/asgi/test_dropin.py": "servers",
    "tests/asgi/test_multiprocess_metrics.py": "servers",
    "tests/resume/test_resume_rollout.py": "servers",
    "tests/resume/test_resume_soak.py": "servers",
    "tests/docs/": "servers",
    # Single tests of files that are otherwise in-process (a parametrized test is named without its ids).
    "tests/admin/test_admin.py::test_accept_failures_back_off_and_serving_resumes": "servers",
    "tests/admin/test_admin.py::test_curl_reads_status": "servers",
    "tests/admin/test_admin.py::test_socket_of_a_process_owned_by_someone_else_is_kept": "servers",
    "tests/admin/test_admin.py::test_socket_that_cannot_be_removed_is_logged": "servers",
    "tests/asgi/test_bad_options.py::test_a_bad_variable_under_a_server_is_one_line_without_a_traceback": "servers",
    "tests/cli/test_advise.py::test_a_known_mix_is_reported_within_a_bucket_and_the_share_at_risk_exactly": "servers",
    "tests/cli/test_advise.py::test_bad_input_gets_one_line_naming_the_fix": "servers",
    "tests/cli/test_advise.py::test_the_drain_says_at_its_start_what_may_outlast_it": "servers",
    "tests/cli/test_bad_input.py::test_bad_input_gets_one_line_in_the_commands_voice": "servers",
    "tests/cli/test_cli.py::test_ctrl_c_during_a_drain_prints_aborted_and_exits_1": "servers",
    "tests/cli/test_cli.py::test_graceful_run_finds_a_module_in_the_current_directory": "servers",
    "tests/cli/test_cli.py::test_run_on_a_busy_port_exits_with_uvicorns_code_without_traceback": "servers",
    "tests/cli/test_cli.py::test_subprocess_env_socket_dir": "servers",
    "tests/cli/test_cli.py::test_subprocess_help_and_exit_codes": "servers",
    "tests/cli/test_cli.py::test_worker_resumed_during_the_drain_exits_1": "servers",
    "tests/cli/test_cli_drain.py::test_a_usage_problem_found_without_click_is_told_by_click": "servers",
    "tests/cli/test_drain_imports.py::test_engine_mode_loads_the_engine_code_only_when_asked": "servers",
    "tests/cli/test_drain_imports.py::test_the_hook_loads_only_its_own_modules": "servers",
    "tests/cli/test_outlook_line.py::test_a_stream_older_than_every_one_seen_raises_no_alarm": "servers",
    "tests/drain/test_quiet.py::test_graceful_run_takes_it_from_the_option_or_the_environment": "servers",
    "tests/engine/test_engine.py::test_slow_engine_ends_at_the_budget_within_half_a_second": "servers",
    "tests/resume/test_resume_cases.py::test_a_503_is_not_resumed_but_left_to_the_sdk": "servers",
    "tests/resume/test_resume_cases.py::test_a_replica_killed_mid_stream_is_resumed_from_the_cut": "servers",
    "tests/resume/test_resume_cases.py::test_a_stream_queued_past_the_handoff_is_handed_off_as_it_starts": "servers",
    "tests/resume/test_resume_cases.py::test_max_resumes_bounds_the_continuations": "servers",
    "tests/resume/test_resume_raw.py::test_the_spliced_stream_reads_as_one_response": "servers",
    "tests/resume/test_resume_sdk.py::test_streams_drained_mid_way_continue_exactly_on_the_other_replica": "servers",
    "tests/test_exported.py::test_soak_loads_only_when_asked_for": "servers",
    "tests/test_exported.py::test_the_drain_command_does_not_import_the_middleware": "servers",
    "tests/test_gateway_resources.py::test_the_envoyfilter_patch_is_a_route_envoy_accepts": "servers",
}


class Times:
    """Seconds and tests per tier (setup, call and teardown), from the reports pytest makes."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(TIERS, 0.0)
        self.tests: dict[str, set[str]] = {tier: set() for tier in TIERS}

    def add(self, report: pytest.TestReport) -> None:
        tier = next((name for name in TIERS if name in report.keywords), None)
        if tier is not None:
            self.seconds[tier] += report.duration
            self.tests[tier].add(report.nodeid)

    def lines(self) -> list[str]:
        ran = [tier for tier in TIERS if self.tests[tier]]
        return [f"tier {tier}: {len(self.tests[tier])} tests in {self.seconds[tier]:.0f} s" for tier in ran]


TIMES = Times()


def tier_of(item: pytest.Item, root: str) -> str:
    own = [mark.name for mark in item.iter_markers() if mark.name in TIERS]
    if own:
        return own[0]  # the closest marker: a test's own, then its class's, then its module's
    path = os.path.relpath(str(item.path), root)
    test = f"{path}::{item.originalname}" if isinstance(item, pytest.Function) else path
    for prefix, tier in BY_PATH.items():
        if prefix in (path, test) or (prefix.endswith("/") and path.startswith(prefix)):
            return tier
    return "fast"


def assign(items: list[pytest.Item], root: str) -> None:
    for item in items:
        tier = tier_of(item, root)
        if item.get_closest_marker(tier) is None:
            item.add_marker(tier)


class StartedAProcess(AssertionError):
    pass


@contextmanager
def forbid_processes(test: str) -> Iterator[None]:
    """Within a ``fast`` test, starting a process raises :class:`StartedAProcess`, naming the fix."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise StartedAProcess(
            f"{test} is in the fast tier (in-process only) but starts a process: mark it "
            "@pytest.mark.servers (or add its file to BY_PATH in tests/tiers.py)"
        )

    saved = (subprocess.Popen._execute_child, os.fork, multiprocessing.util.spawnv_passfds)  # type: ignore[attr-defined]
    subprocess.Popen._execute_child = refuse  # type: ignore[attr-defined]
    os.fork = refuse
    multiprocessing.util.spawnv_passfds = refuse
    try:
        yield
    finally:
        subprocess.Popen._execute_child, os.fork, multiprocessing.util.spawnv_passfds = saved  # type: ignore[attr-defined]
