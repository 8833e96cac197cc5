"""Results and the handle table: which handles wait for which task, the
recent outputs, and the outputs loaded back from the store.

Everything here runs under the engine's lock (the driver's), on the loop or
on a thread that admits a task (``attach``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from ..core.types import DEAD_LETTERED, SUCCEEDED, TERMINAL
from .handle import TaskHandle
from .lifecycle import RUNNING, Guarded

__all__ = ["Results", "NO_OUTPUT"]

log = logging.getLogger("cronoq.scheduler")

NO_OUTPUT: Any = object()   # "no output at hand" (None is a valid output)


class Results:
    def __init__(self, driver: Guarded, store: Any, codec: Any, output_limit: int) -> None:
        self.driver = driver
        self.store = store
        self.codec = codec
        self.output_limit = output_limit
        self.handles: dict[int, Any] = {}          # task id -> handle or [handles]
        self.outputs: dict[int, Any] = {}          # recent outputs, oldest first
        self.output_order: deque[int] = deque()
        self.delivering: dict[int, Any] = {}       # outputs whose success event is not out yet
        self.loading: dict[int, asyncio.Task[None]] = {}  # task id -> load of its stored output

    def deliver(self, task_id: int) -> None:
        """A success event goes out: hand the output to the waiting handles
        and keep it in the cache for handles attached later."""
        output = self.delivering.pop(task_id, NO_OUTPUT)
        if output is not NO_OUTPUT and self.output_limit:
            self.outputs[task_id] = output          # (as remember, inline: every success)
            order = self.output_order
            order.append(task_id)
            if len(order) > self.output_limit:
                self.outputs.pop(order.popleft(), None)
        handle = self.handles.pop(task_id, None)
        if handle is not None:
            if output is not NO_OUTPUT and type(handle) is TaskHandle:
                handle.set_result(output)   # the common case, without resolve's checks
            else:
                self.resolve(handle, task_id, SUCCEEDED, None, output)

    def remember(self, task_id: int, output: Any) -> None:
        if not self.output_limit:
            return
        self.outputs[task_id] = output
        self.output_order.append(task_id)
        if len(self.output_order) > self.output_limit:
            self.outputs.pop(self.output_order.popleft(), None)

    def dead_letter(self, raw: tuple[Any, ...]) -> None:
        """A task ran out of attempts: log it, then resolve its handles."""
        task_id, pool, key, attempt, message = raw[1], raw[2], raw[3], raw[5], raw[7]
        log.warning("task %d (pool %s) dead-lettered after attempt %d: %s", task_id, pool, attempt, message,
                    extra={"action": "dead_letter", "task_id": task_id, "pool": pool, "key": key,
                           "attempt": attempt, "error": message})
        handle = self.handles.pop(task_id, None)
        if handle is not None:
            self.resolve(handle, task_id, DEAD_LETTERED, message)

    def resolve(self, handle: Any, task_id: int, status: str, message: str | None,
                output: Any = NO_OUTPUT) -> None:
        """Resolve ``handle`` (one or a list). For a success, ``output`` if given,
        else the cached output; ``message`` then says why there is none."""
        if status is SUCCEEDED and output is NO_OUTPUT:
            output = self.outputs.get(task_id, NO_OUTPUT)
            if output is NO_OUTPUT and message is None:
                message = ("the task succeeded but its output is no longer available (no store, and "
                           f"output_cache keeps only the last {self.output_limit} outputs)"
                           if self.store is None else
                           "the task succeeded but its output is no longer available (the store has "
                           "none: it could not be encoded, or was pruned)")
        for h in handle if isinstance(handle, list) else (handle,):
            if status is not SUCCEEDED:
                h.set_failure(status, message)
            elif output is NO_OUTPUT:
                h.set_failure(SUCCEEDED, message)
            else:
                h.set_result(output)

    def attach(self, task_id: int, key: str | None, duplicate: bool) -> TaskHandle:
        """A handle on a known task (under the lock, from any thread). Of a
        finished task whose output is not at hand (not cached), it resolves
        once the output is loaded from the store."""
        driver = self.driver
        loop = driver.life.loop
        core = driver.core
        assert loop is not None and core is not None   # only a started scheduler attaches
        handle = TaskHandle(task_id, key, duplicate, loop)
        if task_id not in core.tasks and task_id not in self.delivering:
            info = core.info(task_id)
            if info.status not in TERMINAL:
                return handle
            if info.status is not SUCCEEDED or self.store is None or task_id in self.outputs:
                self.resolve(handle, task_id, info.status, info.message)
                return handle
            if task_id not in self.loading:
                self._load_soon(task_id)
        existing = self.handles.get(task_id)
        if existing is None:
            self.handles[task_id] = handle
        elif isinstance(existing, list):
            existing.append(handle)
        else:
            self.handles[task_id] = [existing, handle]
        return handle

    def take_handles(self) -> list[TaskHandle]:
        """Every waiting handle, taken out of the table (leaving it empty)."""
        handles = [h for value in self.handles.values() for h in (value if isinstance(value, list) else (value,))]
        self.handles = {}
        self.delivering.clear()
        return handles

    def fail_all(self) -> None:
        """Shutdown: every waiting handle fails; loads under way stop."""
        for load in list(self.loading.values()):
            load.cancel()
        self.loading.clear()
        for handle in self.take_handles():
            handle.set_failure("shutdown", "the scheduler shut down before the task finished")

    def _load_soon(self, task_id: int) -> None:
        driver = self.driver
        life = driver.life
        if life.on_loop():
            self.loading[task_id] = life.tasks.spawn(self._load(task_id))
        else:
            loop = life.loop
            assert loop is not None
            loop.call_soon_threadsafe(self._start_load, task_id)

    def _start_load(self, task_id: int) -> None:
        driver = self.driver
        with driver.lock:
            if task_id not in self.loading and task_id in self.handles and driver.life.state is RUNNING:
                self.loading[task_id] = driver.life.tasks.spawn(self._load(task_id))

    async def _load(self, task_id: int) -> None:
        """Resolve the handles of a finished task with its stored output."""
        output = NO_OUTPUT
        message = None
        try:
            data = await self.store.load_output(task_id)
            if data is not None:
                output = self.codec.decode(data)
        except asyncio.CancelledError:
            raise   # shutdown: it fails the handles itself
        except Exception as exc:
            message = f"the task succeeded but its output could not be loaded from the store: {exc}"
        finally:
            self.loading.pop(task_id, None)
        with self.driver.lock:
            if output is not NO_OUTPUT and self.output_limit:
                self.remember(task_id, output)
            handle = self.handles.pop(task_id, None)
            if handle is not None:
                self.resolve(handle, task_id, SUCCEEDED, message, output)
