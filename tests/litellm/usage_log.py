"""A LiteLLM success callback for the tests: one JSON line per logged request, as LiteLLM's spend tracking sees it.

The proxy loads it beside graceful's handler (``callbacks`` in the test's config.yaml) and writes to the
file named by ``GRACEFUL_TEST_USAGE_LOG``. The fields are those of LiteLLM's ``standard_logging_object``,
which its spend logs are built from (litellm/proxy/spend_tracking/spend_tracking_utils.py).
"""

from __future__ import annotations

import json
import os
from typing import Any

from litellm.integrations.custom_logger import CustomLogger


class UsageLog(CustomLogger):  # type: ignore[misc]
    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        logged = kwargs.get("standard_logging_object") or {}
        line = {
            name: logged.get(name)
            for name in ("id", "model_group", "model_id", "prompt_tokens", "completion_tokens", "total_tokens")
        }
        line["response_cost"] = logged.get("response_cost")
        with open(os.environ["GRACEFUL_TEST_USAGE_LOG"], "a") as out:
            out.write(json.dumps(line) + "\n")


recorder = UsageLog()
