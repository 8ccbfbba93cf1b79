"""The public CLI surface, for embedding in an app's own click CLI.

``my_cli.add_command(graceful.cli.drain_command)`` offers ``myapp drain --propagation-wait=10s``;
``graceful.cli.main(argv)`` runs the whole ``graceful`` CLI and returns its exit code.
"""

from __future__ import annotations

from ._cli._main import cli, drain_command, main
from ._cli._soak import soak_command

__all__ = ["cli", "drain_command", "main", "soak_command"]
