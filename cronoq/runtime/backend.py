"""What ``Scheduler``'s public calls go to: a backend.

``EngineBackend`` (this process runs the engine: no store, a store of its
own, or the lead of a shared one) and ``FollowerBackend`` (another process
leads; every call goes to it through the store) are interchangeable:
``Leadership`` swaps one for the other when the lead is taken or lost.
The submit hooks are applied before a call reaches its backend.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Protocol

from ..core.engine import Core
from ..core.explain import Explanation
from ..core.snapshot import Reservation, Snapshot, TaskInfo
from ..core.types import TaskSpec
from .handle import TaskHandle
from .operations import RecurringArgs

__all__ = ["Backend", "Wrap"]

Wrap = Callable[[TaskHandle], Any]


class Backend(Protocol):
    async def submit_spec(self, spec: TaskSpec, handle: bool, wrap: Wrap | None = None,
                          pair: bool = False) -> Any:
        """Admit ``spec``: its handle (``wrap(handle)`` if given), or its id
        (``(id, duplicate)`` with ``pair``)."""

    def submit_from_thread(self, spec: TaskSpec, handle: bool, wrap: Wrap | None
                           ) -> tuple[Any, Callable[[], Awaitable[Any]] | None]:
        """See ``Scheduler.submit_from_thread``."""

    async def submit_batch(self, specs: list[TaskSpec]) -> list[TaskHandle]:
        ...

    async def enqueue_batch(self, specs: list[TaskSpec]) -> list[tuple[int, bool]]:
        """Admit a batch, all or none: the (id, duplicate) pairs."""

    async def cancel(self, ref: int | str) -> bool:
        ...

    async def handle(self, ref: int | str) -> TaskHandle:
        ...

    async def info(self, ref: int | str) -> TaskInfo:
        ...

    async def explain(self, ref: int | str) -> Explanation:
        ...

    async def dependents(self, ref: int | str) -> list[tuple[int, str]]:
        """See ``Scheduler.dependents``."""

    async def snapshot(self) -> Snapshot:
        ...

    async def reservations(self, ahead_ns: int, pools: list[str] | None) -> list[Reservation]:
        ...

    def snapshot_from_thread(self, timeout: float | None) -> Snapshot:
        ...

    async def set_capacity(self, pool: str, capacity: int) -> None:
        ...

    async def set_group_capacity(self, pool: str, labels: dict[str, str], capacity: int) -> None:
        ...

    async def add_recurring(self, args: RecurringArgs) -> None:
        ...

    async def remove_recurring(self, name: str) -> bool:
        ...

    def check(self) -> Core:
        """The engine, if this process runs it and the call is on its loop;
        else ``SchedulerError`` (the listings read the engine itself)."""

    async def shutdown(self, grace: float) -> None:
        """Stop (see ``Scheduler.shutdown``); the scheduler is running."""
