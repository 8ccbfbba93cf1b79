"""The load generator behind ``graceful soak``, for use from Python (the rollout demo uses it).

The click command itself is ``graceful.cli.soak_command``.
"""

from ._soak import SoakConfig, run_soak
from ._soak_report import Attempt, RequestRecord, SoakReport

__all__ = ["Attempt", "RequestRecord", "SoakConfig", "SoakReport", "run_soak"]
