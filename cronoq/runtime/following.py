"""The calls of a process that follows: another process of the store's
cluster runs the engine, and every call goes to it as one of the versioned
operations (``cronoq.runtime.operations``) through the store's inbox.
Handles of its tasks resolve when the store says the task ended."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Awaitable, Callable, TypeVar

from ..core.engine import Core
from ..core.errors import SchedulerError, TaskFailed
from ..core.explain import Explanation
from ..core.snapshot import Reservation, Snapshot, TaskInfo
from ..core.types import TERMINAL, TaskSpec
from . import operations as ops
from .backend import Wrap
from .clock import Clock
from .durability import EncodedPayloads
from .handle import TaskHandle
from .lifecycle import Lifecycle

if TYPE_CHECKING:
    from .cluster import Cluster

__all__ = ["FollowerBackend"]

_A = TypeVar("_A")
_R = TypeVar("_R")


class FollowerBackend:
    def __init__(self, life: Lifecycle, cluster: Cluster, payloads: EncodedPayloads, clock: Clock,
                 leave: Callable[[float], Awaitable[None]]) -> None:
        self.life = life
        self.cluster = cluster
        self.payloads = payloads
        self.clock = clock
        self._leave = leave

    async def _send(self, op: ops.Operation[_A, _R], args: _A) -> _R:
        self.life.check()
        self.life.check_loop()
        return await ops.send(self.cluster.request, op, args, self.payloads)

    async def _submit(self, specs: list[TaskSpec], batch: bool) -> list[tuple[int, bool]]:
        self.life.check_loop()
        return await ops.send(self.cluster.request, ops.SUBMIT, ops.SubmitArgs(specs, batch, self.clock.now_ns()),
                              self.payloads)

    def _watched(self, task_id: int, key: str | None, duplicate: bool) -> TaskHandle:
        """A handle resolved when the store says its task ended."""
        loop = self.life.loop
        assert loop is not None
        handle = TaskHandle(task_id, key, duplicate, loop)
        self.cluster.watch(handle)
        return handle

    async def _one(self, spec: TaskSpec, handle: bool, wrap: Wrap | None, pair: bool) -> Any:
        ((task_id, duplicate),) = await self._submit([spec], False)
        if handle:
            value: Any = self._watched(task_id, spec.key, duplicate)
            return wrap(value) if wrap is not None else value
        return (task_id, duplicate) if pair else task_id

    async def submit_spec(self, spec: TaskSpec, handle: bool, wrap: Wrap | None = None, pair: bool = False) -> Any:
        self.life.check()
        return await self._one(spec, handle, wrap, pair)

    def submit_from_thread(self, spec: TaskSpec, handle: bool, wrap: Wrap | None
                           ) -> tuple[Any, Callable[[], Awaitable[Any]] | None]:
        self.life.check()
        self.payloads.encode(spec)   # TypeError here, at the call
        return None, lambda: self._one(spec, handle, wrap, not handle)

    async def submit_batch(self, specs: list[TaskSpec]) -> list[TaskHandle]:
        self.life.check()
        results = await self._submit(specs, True)
        return [self._watched(task_id, spec.key, duplicate) for spec, (task_id, duplicate) in zip(specs, results)]

    async def enqueue_batch(self, specs: list[TaskSpec]) -> list[tuple[int, bool]]:
        self.life.check()
        return await self._submit(specs, True)

    async def cancel(self, ref: int | str) -> bool:
        return await self._send(ops.CANCEL, ref)

    async def handle(self, ref: int | str) -> TaskHandle:
        found = await self._send(ops.INFO, ref)
        watched = self._watched(found.id, found.key, True)
        if found.status in TERMINAL:
            try:
                await watched
            except (TaskFailed, asyncio.CancelledError):
                if watched.status is None:
                    raise
        return watched

    async def info(self, ref: int | str) -> TaskInfo:
        return await self._send(ops.INFO, ref)

    async def explain(self, ref: int | str) -> Explanation:
        return await self._send(ops.EXPLAIN, ref)

    async def dependents(self, ref: int | str) -> list[tuple[int, str]]:
        return await self._send(ops.DEPENDENTS, ref)

    async def snapshot(self) -> Snapshot:
        return await self._send(ops.SNAPSHOT, None)

    async def reservations(self, ahead_ns: int, pools: list[str] | None) -> list[Reservation]:
        return await self._send(ops.RESERVATIONS, ops.ReservationsArgs(ahead_ns, pools))

    def snapshot_from_thread(self, timeout: float | None) -> Snapshot:
        """The leader's snapshot, through the store."""
        self.life.check()
        loop = self.life.loop
        assert loop is not None
        future = asyncio.run_coroutine_threadsafe(self._send(ops.SNAPSHOT, None), loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise SchedulerError(f"the leader's snapshot did not come within {timeout:g} s") from None

    async def set_capacity(self, pool: str, capacity: int) -> None:
        await self._send(ops.SET_CAPACITY, (pool, capacity))

    async def set_group_capacity(self, pool: str, labels: dict[str, str], capacity: int) -> None:
        await self._send(ops.SET_GROUP_CAPACITY, (pool, labels, capacity))

    async def add_recurring(self, args: ops.RecurringArgs) -> None:
        await self._send(ops.ADD_RECURRING, args)

    async def remove_recurring(self, name: str) -> bool:
        return await self._send(ops.REMOVE_RECURRING, name)

    def check(self) -> Core:
        self.life.check()
        raise SchedulerError("this process does not lead the store: its calls go through the store")

    async def shutdown(self, grace: float) -> None:
        await self._leave(grace)
