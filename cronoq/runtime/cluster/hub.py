"""What each role of a process's cluster reaches of the process's part
(``Cluster``, in ``cycle``) that holds them: a protocol, so the roles do
not import the module that makes them."""

from __future__ import annotations

import asyncio
from typing import Any, Iterable, Protocol

from ...store.cluster import Incoming
from ...store.codec import Codec
from ..durability import EncodedPayloads
from ..lifecycle import TaskGroup

__all__ = ["Hub"]


class Hub(Protocol):
    loop: asyncio.AbstractEventLoop | None
    codec: Codec
    payloads: EncodedPayloads
    tasks: TaskGroup
    identity: str
    poll: float
    stopping: bool

    def wake(self) -> None:
        """Run the next cycle now (something waits to be written or read)."""

    async def request(self, kind: str, body: dict[str, Any], payloads: Iterable[bytes] = ()) -> Any:
        """A call to the leader."""

    async def cycle_once(self) -> Incoming | None:
        """One cycle now."""
