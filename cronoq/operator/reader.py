"""Reading a pool's desired slots from a cronoq-server, over gRPC
(Admin.Snapshot, metrics role), one client per configured server."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Protocol

import grpc

from ..client import AccessDenied, Client
from .config import OperatorConfig, ServerEntry
from .decide import POOL_NOT_REPORTED, READ_REFUSED, SERVER_UNREACHABLE, UNKNOWN_SERVER, Reading

__all__ = ["PoolReader", "SnapshotReader"]

log = logging.getLogger("cronoq.operator")

# A server back after an outage is asked again within seconds, not after
# gRPC's default reconnect backoff of up to two minutes.
_CHANNEL_OPTIONS = (("grpc.max_reconnect_backoff_ms", 2000), ("grpc.initial_reconnect_backoff_ms", 200))


class PoolReader(Protocol):
    async def read(self, server: str, pool: str) -> Reading: ...


class SnapshotReader:
    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self._clients: dict[str, tuple[ServerEntry, str | None, Client]] = {}

    def _client(self, server: str) -> Client:
        entry = self.config.servers[server]
        token = entry.token()
        held = self._clients.get(server)
        if held is not None and held[:2] == (entry, token):
            return held[2]
        if held is not None:
            # The token changed (a rotated Secret), or the entry: a new client carries it.
            asyncio.get_running_loop().create_task(held[2].close())
        credentials = None
        if entry.ca_file is not None:
            credentials = grpc.ssl_channel_credentials(Path(entry.ca_file).read_bytes())
        client = Client(entry.url, token=token, credentials=credentials, options=_CHANNEL_OPTIONS, retry_for=1.0)
        self._clients[server] = (entry, token, client)
        return client

    async def read(self, server: str, pool: str) -> Reading:
        if server not in self.config.servers:
            return Reading.failed(UNKNOWN_SERVER, f"server {server!r} is not in the operator's configuration "
                                                  f"(known: {', '.join(sorted(self.config.servers)) or 'none'})")
        try:
            client = self._client(server)
            async with asyncio.timeout(self.config.read_timeout_s):
                snapshot = await client.snapshot()
        except AccessDenied as exc:
            return Reading.failed(READ_REFUSED, f"server {server!r} refused the operator's token: {exc}")
        except TimeoutError:
            return Reading.failed(SERVER_UNREACHABLE, f"server {server!r} did not answer within "
                                                      f"{self.config.read_timeout_s:g} s")
        except Exception as exc:
            # Whatever the failure (down, refused token, timeout), the Deployment is left alone.
            message = str(exc) or type(exc).__name__
            return Reading.failed(SERVER_UNREACHABLE, f"cannot read server {server!r}: {message}")
        for entry in snapshot["pools"]:
            if entry["name"] == pool:
                return Reading.of(int(entry["desired"]))
        missing = f"server {server!r} does not report pool {pool!r}"
        if snapshot.get("unavailable_shards"):
            missing += f" (shards it could not ask: {', '.join(snapshot['unavailable_shards'])})"
        return Reading.failed(POOL_NOT_REPORTED, missing)

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for _, _, client in clients.values():
            await client.close()
