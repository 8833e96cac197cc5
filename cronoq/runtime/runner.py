"""Running attempts in-process.

A runner is the executor side of one pool: the scheduler hands it dispatches
and aborts, and it reports outcomes back. ``LocalRunner`` runs a Python
function. Instead of an asyncio task per attempt it keeps a few long-lived
worker coroutines: a worker that reports an outcome takes the next dispatch
of its pool right away, so a busy pool creates no tasks and no futures. An
abort cancels the worker's task while it awaits the executor; the worker
swallows that one cancellation and carries on.

A remote runner (workers over the network) would implement the same four
methods: ``dispatch``, ``abort``, ``close`` and ``cancel_all``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from ..core.errors import Permanent, Retryable
from ..core.types import NS, PERMANENT, RETRYABLE, SUCCESS
from .context import TaskContext

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = ["LocalRunner", "clean_message"]

_MAX_MESSAGE = 8192


def clean_message(text: object) -> str:
    """A failure message fit for events and stores: NUL replaced, 8 KiB at most."""
    message = str(text)
    if "\x00" in message:
        message = message.replace("\x00", "\ufffd")
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE - 1] + "\u2026"
    return message


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return clean_message(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


class LocalRunner:
    def __init__(self, scheduler: Scheduler, pool: str, fn: Callable[..., Any], is_async: bool) -> None:
        self.scheduler = scheduler
        self.pool = pool
        self.fn = fn
        self.is_async = is_async
        self.queue: deque = deque()            # (entry, lease, attempt) not yet picked up
        self.idle: list[asyncio.Future] = []   # parked workers
        self.current: dict[int, tuple] = {}    # lease -> (worker task, context)
        self.dropped: set[int] = set()         # aborted before a worker picked them up
        self.workers: set[asyncio.Task] = set()
        self.closed = False
        self._loop = scheduler._loop
        self._loop_thread = threading.get_ident()

    # -- from the scheduler

    def dispatch(self, entry, lease: int, attempt: int) -> None:
        queue = self.queue
        queue.append((entry, lease, attempt))
        # Workers neither parked nor inside an executor will look at the queue
        # without being woken (starting, or reporting an outcome right now).
        if len(queue) > len(self.workers) - len(self.idle) - len(self.current):
            if self.idle:
                waiter = self.idle.pop()
                if not waiter.done():
                    waiter.set_result(None)
            else:
                task = self._loop.create_task(self._work())
                self.workers.add(task)
                task.add_done_callback(self.workers.discard)

    def abort(self, lease: int) -> bool:
        running = self.current.get(lease)
        if running is not None:
            task, ctx = running
            ctx._cancelled = True
            task.cancel()
            return True
        for item in self.queue:
            if item[1] == lease:
                self.dropped.add(lease)
                return True
        return False

    def heartbeat(self, lease: int) -> None:
        if threading.get_ident() == self._loop_thread:
            self.scheduler._heartbeat(lease)
        else:
            self._loop.call_soon_threadsafe(self.scheduler._heartbeat, lease)

    def close(self) -> None:
        """No more work: idle workers exit, running attempts go on."""
        self.closed = True
        for waiter in self.idle:
            if not waiter.done():
                waiter.set_result(None)
        self.idle.clear()

    def cancel_all(self) -> None:
        """Cancel every running attempt (after the shutdown grace)."""
        self.close()
        for task, ctx in list(self.current.values()):
            ctx._cancelled = True
            task.cancel()

    # -- the workers

    async def _work(self) -> None:
        queue = self.queue
        fn = self.fn
        is_async = self.is_async
        loop = self._loop
        task = asyncio.current_task()
        current = self.current
        report = self.scheduler._report
        streak = 0
        while True:
            if not queue:
                if self.closed:
                    return
                waiter = loop.create_future()
                self.idle.append(waiter)
                streak = 0
                await waiter
                continue
            entry, lease, attempt = queue.popleft()
            if self.dropped and lease in self.dropped:
                self.dropped.discard(lease)
                continue
            ctx = TaskContext(entry, lease, attempt, self)
            current[lease] = (task, ctx)
            output = None
            message = None
            retry_after = None
            try:
                if is_async:
                    output = await fn(ctx, entry.payload)
                else:
                    output = await loop.run_in_executor(None, fn, ctx, entry.payload)
                outcome = SUCCESS
            except asyncio.CancelledError:
                del current[lease]
                if ctx._cancelled and not self.closed:
                    task.uncancel()    # the scheduler gave this attempt up; it already knows
                    continue
                raise
            except Retryable as exc:
                outcome = RETRYABLE
                message = clean_message(exc.message) if exc.message else None
                if exc.retry_after is not None:
                    retry_after = max(0, int(exc.retry_after * NS))
            except Permanent as exc:
                outcome = PERMANENT
                message = clean_message(exc.message) if exc.message else None
            except Exception as exc:  # any other failure is retryable
                outcome = RETRYABLE
                message = _describe(exc)
            del current[lease]
            if ctx._cancelled and task.cancelling():
                task.uncancel()    # the executor swallowed our cancellation; the
                                   # engine will count its report as stale
            report(entry, lease, outcome, output, message, retry_after)
            streak += 1
            if streak >= 64:
                # Executors that never suspend would keep this worker from
                # ever yielding: let the loop breathe now and then.
                streak = 0
                await asyncio.sleep(0)
