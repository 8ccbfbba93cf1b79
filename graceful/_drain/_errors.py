"""The one error for a wrong setting, shared by every package that checks one."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A user-supplied setting is wrong; the message names the value and the fix."""
