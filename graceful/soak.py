"""The load generator behind ``graceful soak``, for use from Python (the rollout demo uses it).

The click command itself is ``graceful.cli.soak_command``.
"""

from ._soak._report import Attempt, RequestRecord, SoakReport
from ._soak._runner import SoakConfig, run_soak

__all__ = ["Attempt", "RequestRecord", "SoakConfig", "SoakReport", "run_soak"]
