"""``cronoq``: the command line of cronoq-server (extra ``cronoq[cli]``).

``main(argv)`` runs it and returns the exit code (``ExitCode``). Packages
contribute subcommands through a module with ``add_parser(subparsers)`` and
``run(args) -> int`` listed in ``cronoq.cli.plugins.PLUGINS``; such a
subcommand reaches the server with ``add_connection_arguments(parser)`` and
``settings_from(args)`` (then ``make_client(settings)``), the same options,
environment and checks as the built-in commands. docs/cli.md has the details.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .connection import Settings, add_connection_arguments, settings_from
from .exits import CliError, ExitCode

if TYPE_CHECKING:
    from ..client import Client

__all__ = ["main", "ExitCode", "CliError", "Settings", "add_connection_arguments", "settings_from", "make_client"]


def main(argv: Sequence[str] | None = None, prog: str = "cronoq") -> int:
    """Run ``cronoq ARGS`` (default: the process's arguments); returns the exit code.
    ``prog`` names the program in usage lines (``python -m cronoq`` is the same one)."""
    from .app import main as run
    return run(argv, prog)


def make_client(settings: Settings) -> Client:
    """A ``cronoq.client.Client`` connected as ``settings`` say (token, TLS, retries)."""
    from .remote import client_from
    return client_from(settings)
