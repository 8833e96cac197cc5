"""Run a cronoq-server inside this process, for tests and examples.

    async with cronoq.server.serve() as server:
        async with cronoq.client.Client(server.target) as client:
            ...

``serve(config)`` starts the same server as ``cronoq-server`` on the running
event loop, with its listeners on free loopback ports unless the
configuration names ports, and stops it gracefully on exit. ``config`` is a
``ServerConfig``, TOML text, or None (one pool ``default``, in memory, no
authentication). Signals are left to the program.
"""

from __future__ import annotations

import asyncio
import dataclasses
from contextlib import asynccontextmanager
from typing import AsyncIterator

from .config import ServerConfig, default_config, parse

__all__ = ["serve", "RunningServer"]


@dataclasses.dataclass(frozen=True)
class RunningServer:
    grpc_port: int
    http_port: int

    @property
    def target(self) -> str:
        """``127.0.0.1:PORT`` of the gRPC listener, for Client and Worker."""
        return f"127.0.0.1:{self.grpc_port}"


@asynccontextmanager
async def serve(config: ServerConfig | str | None = None, *,
                insecure_no_auth: bool = False) -> AsyncIterator[RunningServer]:
    from .app import Server

    if config is None:
        base = default_config()
        config = dataclasses.replace(base, server=dataclasses.replace(base.server, grpc_port=0, http_port=0))
    elif isinstance(config, str):
        config = parse(config)
    server = Server(config, insecure_no_auth=insecure_no_auth, handle_signals=False)
    task = asyncio.get_running_loop().create_task(server.run())
    serving = asyncio.get_running_loop().create_task(server.serving.wait())
    await asyncio.wait((task, serving), return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        serving.cancel()
        task.result()   # raises what stopped it
        raise RuntimeError("the server stopped before it served")
    try:
        yield RunningServer(server.grpc_port, server.http_port)
    finally:
        server.stop()
        await task
