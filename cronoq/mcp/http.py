"""The streamable HTTP transport, behind an access token of its own.

The gateway's token (``Authorization: Bearer <token>``) decides who may reach
the MCP endpoint; the cronoq-server token the gateway holds decides what it
may do upstream. They are independent: a client of the gateway never sees
the server token. Tokens in the query string are not accepted (they end up
in logs and proxies; the MCP authorization rules forbid them).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import signal
import socket
from typing import Any, Iterator

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["AccessTokenMiddleware", "serve_http", "MIN_TOKEN_LENGTH"]

log = logging.getLogger("cronoq.mcp")
MIN_TOKEN_LENGTH = 16


class AccessTokenMiddleware:
    """Answers 401 to HTTP requests without ``Authorization: Bearer <token>``."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._allowed(scope):
            body = json.dumps({"error": "unauthorized: this MCP endpoint needs 'Authorization: Bearer <access "
                                        "token>' (the gateway's token, not the cronoq-server token)"}).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"www-authenticate", b'Bearer realm="cronoq-mcp"'),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        presented = [value for name, value in scope.get("headers", ()) if name == b"authorization"]
        # compare_digest: the time taken does not tell how much of a guess was right.
        return len(presented) == 1 and hmac.compare_digest(presented[0], self._expected)


class _Uvicorn(uvicorn.Server):
    """uvicorn, logging the bound address once it accepts connections, and
    exiting normally on SIGTERM (uvicorn re-raises the signal after its
    graceful shutdown, which would end the process with it)."""

    def __init__(self, config: uvicorn.Config, url: str) -> None:
        super().__init__(config)
        self.url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            log.info("listening: %s", self.url)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


async def serve_http(app: MCPServer[Any], *, host: str = "127.0.0.1", port: int = 0, path: str = "/mcp",
                     access_token: str | None, access_log: bool = False) -> None:
    """Serve ``app`` over streamable HTTP at ``http://host:port/path`` until
    SIGINT or SIGTERM. Port 0 binds a free port; the log says which
    (``listening: URL``). Without ``access_token`` anyone who reaches the
    address may use the gateway. ``OSError`` when the address cannot be bound."""
    starlette = app.streamable_http_app(streamable_http_path=path, host=host)
    asgi: ASGIApp = AccessTokenMiddleware(starlette, access_token) if access_token is not None else starlette
    sock = _bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    config = uvicorn.Config(asgi, log_config=None, access_log=access_log, lifespan="on",
                            timeout_graceful_shutdown=5)
    server = _Uvicorn(config, f"http://{shown}:{bound_port}{path}")
    try:
        await server.serve(sockets=[sock])
    finally:
        sock.close()
