from ._budget import Budget, ConfigError, parse_duration
from ._frames import default_final_frame
from ._middleware import GracefulMiddleware
from ._state import Drain, DrainResult, DrainStatus, NotAccepting, State

__version__ = "0.1.0"

__all__ = [
    "Budget",
    "ConfigError",
    "Drain",
    "DrainResult",
    "DrainStatus",
    "GracefulMiddleware",
    "NotAccepting",
    "State",
    "default_final_frame",
    "parse_duration",
]
