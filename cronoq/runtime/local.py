"""``LocalRunner``: ``async def`` executors on the scheduler's loop.

Instead of an asyncio task per attempt it keeps a few long-lived worker
coroutines: a worker that reports an outcome takes the next attempt of its
pool right away, so a busy pool creates no tasks and no futures. An abort
cancels the worker's task while it awaits the executor; the worker swallows
that one cancellation and carries on.

Every outcome ends the attempt, whatever the executor raises (see
``outcome_of``). ``KeyboardInterrupt`` and ``SystemExit`` then go on to the
code running the loop, as asyncio does with them.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any, Callable, ClassVar

from ..core.types import SUCCESS
from .context import TaskContext
from .runner import ABORT_CANCELLED, ABORT_SHUTDOWN, Attempt, RunnerLink, outcome_of

__all__ = ["LocalRunner"]


class LocalRunner:
    """Runs a pool's ``async def`` executor ``fn(ctx, payload)``."""

    abort_takes_reason: ClassVar[bool] = True   # (see runner.aborter)

    def __init__(self, link: RunnerLink, fn: Callable[..., Any]) -> None:
        self.link = link
        self.pool = link.pool
        self.fn = fn
        self.queue: deque[Attempt] = deque()   # not yet picked up by a worker
        self.idle: list[asyncio.Future[None]] = []   # parked workers
        self.current: dict[int, tuple[asyncio.Task[None], Attempt]] = {}   # lease -> (worker, attempt)
        self.workers: set[asyncio.Task[None]] = set()
        self.closed = False
        self._loop = link.loop
        self._loop_thread = threading.get_ident()

    @property
    def stray_threads(self) -> int:
        return 0

    # -- from the scheduler

    def start(self, attempt: Attempt) -> None:
        queue = self.queue
        queue.append(attempt)
        # Workers neither parked nor inside an executor will look at the queue
        # without being woken (starting, or reporting an outcome right now).
        if len(queue) > len(self.workers) - len(self.idle) - len(self.current):
            if self.idle:
                waiter = self.idle.pop()
                if not waiter.done():
                    waiter.set_result(None)
            else:
                self._spawn()

    def _spawn(self) -> None:
        task = self._loop.create_task(self._work())
        self.workers.add(task)
        task.add_done_callback(self._worker_done)

    def _worker_done(self, task: asyncio.Task[None]) -> None:
        self.workers.discard(task)
        if not task.cancelled():
            task.exception()   # retrieved: a KeyboardInterrupt already went to the loop's runner

    def abort(self, lease: int, reason: str = ABORT_CANCELLED) -> bool:
        running = self.current.get(lease)
        if running is not None:
            task, attempt = running
            attempt.abort_reason = reason
            attempt.cancelled = True
            task.cancel()
            return True
        for attempt in self.queue:
            if attempt.lease == lease:
                attempt.abort_reason = reason
                attempt.cancelled = True   # the worker that takes it skips it
                return True
        return False

    def heartbeat(self, lease: int) -> bool:
        """For executors, from any thread."""
        if threading.get_ident() == self._loop_thread:
            return self.link.heartbeat(lease)
        try:
            self._loop.call_soon_threadsafe(self.link.heartbeat, lease)
        except RuntimeError:   # the loop is closed: nobody is listening any more
            return False
        return True

    def close(self) -> None:
        """No more work: idle workers exit, running attempts go on."""
        self.closed = True
        for waiter in self.idle:
            if not waiter.done():
                waiter.set_result(None)
        self.idle.clear()

    def cancel_all(self) -> list[int]:
        """Cancel every running attempt (after the shutdown grace). Returns the
        leases of attempts that no worker had started: they never ran."""
        self.close()
        for task, attempt in list(self.current.values()):
            attempt.abort_reason = ABORT_SHUTDOWN
            attempt.cancelled = True
            task.cancel()
        unstarted = [attempt.lease for attempt in self.queue if not attempt.cancelled]
        self.queue.clear()
        return unstarted

    # -- the workers

    async def _work(self) -> None:
        queue = self.queue
        fn = self.fn
        loop = self._loop
        task = asyncio.current_task()
        assert task is not None
        current = self.current
        report = self.link.report
        heartbeat = self.heartbeat
        book = self.link.checkpoints
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
            attempt = queue.popleft()
            if attempt.cancelled:
                continue
            lease = attempt.lease
            ctx = TaskContext(attempt, heartbeat, book)
            current[lease] = (task, attempt)
            output = None
            message = None
            retry_after = None
            escaping: BaseException | None = None
            try:
                output = await fn(ctx, attempt.payload)
                outcome: str = SUCCESS
            except asyncio.CancelledError as exc:
                if task.cancelling():   # this worker was cancelled: by an abort, or by whoever owns the loop
                    del current[lease]
                    if attempt.cancelled and not self.closed:
                        task.uncancel()    # the scheduler gave this attempt up; it already knows
                        continue
                    raise
                outcome, message, retry_after = outcome_of(exc)   # the executor's own: a failure
            except (KeyboardInterrupt, SystemExit) as exc:
                outcome, message, retry_after = outcome_of(exc)
                escaping = exc
            except BaseException as exc:  # noqa: B036 - any other failure ends the attempt, retryable
                outcome, message, retry_after = outcome_of(exc)
            del current[lease]
            if attempt.cancelled and task.cancelling():
                task.uncancel()    # the executor swallowed our cancellation; the
                                   # engine will count its report as stale
            report(attempt, outcome, output, message, retry_after)
            if escaping is not None:
                # This worker ends with the exception: another takes its queue.
                self.workers.discard(task)
                if queue:
                    self._spawn()
                raise escaping
            streak += 1
            if streak >= 64:
                # Executors that never suspend would keep this worker from
                # ever yielding: let the loop breathe now and then.
                streak = 0
                await asyncio.sleep(0)
