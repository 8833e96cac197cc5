"""cronoq.mcp: a Model Context Protocol server for cronoq-server (extra ``cronoq[mcp]``).

AI agents (Claude Desktop, Cursor, any MCP client) drive a cronoq-server
through it: tools submit, follow, cancel and explain tasks and manage
recurring schedules; resources show the server live; prompts are ready
workflows. It talks to the server only through ``cronoq.client`` with the
token in ``$CRONOQ_TOKEN``, whose role applies. Run it with ``cronoq-mcp``
(stdio, or ``--http HOST:PORT`` for streamable HTTP with its own access
token); ``build_server(client)`` gives the ``MCPServer`` for embedding.
docs/mcp.md has the details.
"""

from typing import TYPE_CHECKING, Any

from .cli import main

if TYPE_CHECKING:
    from .server import build_server

__all__ = ["build_server", "main"]


def __getattr__(name: str) -> Any:
    # Lazily: the command line must load (and say what is missing) without the extra.
    if name == "build_server":
        from .server import build_server
        return build_server
    raise AttributeError(f"module 'cronoq.mcp' has no attribute {name!r}")
