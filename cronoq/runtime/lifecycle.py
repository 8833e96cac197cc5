"""A scheduler's lifecycle: its state, the loop it belongs to, and the one
group that owns every background task it starts.

The states go one way: NEW -> STARTING -> RUNNING -> STOPPING -> STOPPED
(a start that fails goes back to NEW; a standby told to stop while it waits
to lead goes to STOPPED). Every background task (waiting to lead, loading a
stored output, the durable log's commits, the cluster's cycles and the
calls it serves) is spawned into ``Lifecycle.tasks``; shutdown cancels and
awaits what is left of them in one place.
"""

from __future__ import annotations

import asyncio
import enum
import os
import threading
from typing import Any, Callable, Coroutine, Protocol, TypeVar

from ..core.engine import Core
from ..core.errors import SchedulerError
from . import process as _process

__all__ = ["State", "Lifecycle", "TaskGroup", "Guarded", "cancel_and_wait"]

_T = TypeVar("_T")


class State(enum.StrEnum):
    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


NEW, STARTING, RUNNING, STOPPING, STOPPED = State.NEW, State.STARTING, State.RUNNING, State.STOPPING, State.STOPPED
# The states in which the engine still carries out what it asked for.
SERVING = (RUNNING, STOPPING)


class TaskGroup:
    """The background tasks of one scheduler (a nursery: each is spawned
    here, and ``close`` cancels and awaits those still running)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, _T], loop: asyncio.AbstractEventLoop | None = None
              ) -> asyncio.Task[_T]:
        tasks = self._tasks
        if len(tasks) >= 64:   # those cancelled before they ran never left (see _owned)
            tasks.difference_update([task for task in tasks if task.done()])
        task = (loop or asyncio.get_running_loop()).create_task(self._owned(coro))
        tasks.add(task)
        return task

    async def _owned(self, coro: Coroutine[Any, Any, _T]) -> _T:
        # The task leaves the group as it ends. Not a done callback: that
        # would be one more callback for the loop to run after each durable
        # commit, and a loop with nothing else to run commits on the caller's
        # turn (see durability.ready_callbacks).
        try:
            return await coro
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._tasks.discard(task)

    def __len__(self) -> int:
        return len(self._tasks)

    def cancel(self) -> None:
        """Cancel every task of the group but the caller's own."""
        current = _current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()

    async def close(self) -> None:
        """Cancel the tasks left and wait until they are gone (the caller's
        own task, should it be one of them, is neither cancelled nor awaited)."""
        current = _current_task()
        while True:
            tasks = [task for task in self._tasks if task is not current and not task.done()]
            if not tasks:
                return
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (if any) and wait until it is gone, whatever it raised."""
    if task is not None:
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:   # no running loop
        return None


class Lifecycle:
    """Where a scheduler is in its life, and on which loop and process."""

    def __init__(self) -> None:
        self.state = NEW
        self.loop: asyncio.AbstractEventLoop | None = None
        self.forks = _process.forks
        self.pid = os.getpid()
        self.tasks = TaskGroup()
        self.abort_start: asyncio.Future[None] | None = None   # set: a start waiting to lead gives up
        self._stopped: asyncio.Event | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The scheduler starts on ``loop``, in this process."""
        self.loop = loop
        self.forks = _process.forks
        self.pid = os.getpid()
        self._stopped = asyncio.Event()

    def stop(self) -> None:
        """The scheduler has stopped (a shutdown waiting on ``stopped`` returns)."""
        self.state = STOPPED
        if self._stopped is not None:
            self._stopped.set()

    async def stopped(self) -> None:
        """Return once the scheduler has stopped."""
        if self.state is STOPPED or self._stopped is None:
            return
        await self._stopped.wait()

    def aborted(self) -> bool:
        """Whether a shutdown told the start (waiting to lead) to give up."""
        return self.abort_start is not None and self.abort_start.done()

    def check_fork(self) -> None:
        if self.forks != _process.forks:
            raise _process.forked_error(self.pid)

    def check(self) -> None:
        """Raise unless the scheduler serves here and now (leading or following)."""
        if self.forks != _process.forks:
            raise _process.forked_error(self.pid)
        if self.state is not RUNNING:
            if self.state is NEW:
                raise RuntimeError("the scheduler is not started: use 'async with' or await start()")
            raise SchedulerError(f"the scheduler is {self.state}")
        loop = self.loop
        assert loop is not None
        if loop.is_closed():
            self.state = STOPPED
            raise SchedulerError("the event loop that ran the scheduler is closed")

    def check_loop(self) -> None:
        """Raise unless called on the scheduler's loop."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not self.loop:
            raise SchedulerError("the scheduler belongs to another event loop; call it from that loop "
                                 "(or use BlockingScheduler from threads)")

    def on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False


class Guarded(Protocol):
    """What the parts beside the engine driver (``Admission``, ``Results``)
    reach of it: the lock that guards the engine, the engine, the lifecycle
    and the clock. (A protocol: they do not import the driver.)"""

    lock: threading.RLock
    core: Core | None
    life: Lifecycle
    system_time: bool
    now_ns: Callable[[], int]
