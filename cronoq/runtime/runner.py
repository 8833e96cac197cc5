"""Running attempts in-process.

A runner is the executor side of one pool: the scheduler hands it dispatches
and aborts, and it reports outcomes back. A remote runner (workers over the
network) would implement the same methods: ``dispatch``, ``abort``,
``heartbeat``, ``close`` and ``cancel_all``.

``LocalRunner`` runs an ``async def`` executor. Instead of an asyncio task per
attempt it keeps a few long-lived worker coroutines: a worker that reports an
outcome takes the next dispatch of its pool right away, so a busy pool creates
no tasks and no futures. An abort cancels the worker's task while it awaits
the executor; the worker swallows that one cancellation and carries on.

``ThreadRunner`` runs a plain function on threads the pool owns (not the
loop's default executor, whose few threads would queue attempts the engine
counts as running, in FIFO order). It starts a thread only when no idle one
is free, so it grows to the pool's busy count and no further; idle threads
leave after a minute. Python cannot stop a thread: an attempt given up
(timeout, cancel, lost lease, shutdown) keeps its thread until the function
returns. That thread is a *stray*: it is never handed another attempt, it is
counted (``PoolSnapshot.stray_threads``) and logged, and the next attempt
gets a thread of its own, so a hung function never holds up healthy ones.

Every outcome ends the attempt, whatever the executor raises: a
``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``,
``SystemExit``, ``GeneratorExit``, the executor's own ``CancelledError``)
is a retryable failure named after its type. ``KeyboardInterrupt`` and
``SystemExit`` from an ``async def`` executor then go on to the code running
the loop, as asyncio does with them; raised in a thread they end nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from ..core.errors import Permanent, Retryable
from ..core.types import NS, PERMANENT, RETRYABLE, SUCCESS
from .context import TaskContext

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = ["LocalRunner", "ThreadRunner", "clean_message"]

log = logging.getLogger("cronoq.scheduler")

_MAX_MESSAGE = 8192
_IDLE_THREAD_SECONDS = 60.0
STRAY_WARNING_SECONDS = 1.0    # a given-up function still running this long after is logged


def clean_message(text: object) -> str:
    """A failure message fit for events and stores: NUL replaced, 8 KiB at most."""
    message = str(text)
    if "\x00" in message:
        message = message.replace("\x00", "\ufffd")
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE - 1] + "\u2026"
    return message


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not keep the attempt from ending
        text = "<the exception could not be printed>"
    return clean_message(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def _failure(exc: BaseException) -> tuple[str, str | None, int | None]:
    """(outcome, message, retry_after_ns) for an exception an executor raised."""
    if isinstance(exc, Retryable):
        retry_after = None if exc.retry_after is None else max(0, int(exc.retry_after * NS))
        return RETRYABLE, clean_message(exc.message) if exc.message else None, retry_after
    if isinstance(exc, Permanent):
        return PERMANENT, clean_message(exc.message) if exc.message else None, None
    return RETRYABLE, _describe(exc), None   # anything else, BaseExceptions included


class LocalRunner:
    def __init__(self, scheduler: Scheduler, pool: str, fn: Callable[..., Any]) -> None:
        self.scheduler = scheduler
        self.pool = pool
        self.fn = fn
        self.queue: deque = deque()            # (entry, lease, attempt) not yet picked up
        self.idle: list[asyncio.Future] = []   # parked workers
        self.current: dict[int, tuple] = {}    # lease -> (worker task, context)
        self.dropped: set[int] = set()         # aborted before a worker picked them up
        self.workers: set[asyncio.Task] = set()
        self.closed = False
        loop = scheduler._loop
        assert loop is not None, "runners are made by a started scheduler"
        self._loop: asyncio.AbstractEventLoop = loop
        self._loop_thread = threading.get_ident()

    @property
    def stray_threads(self) -> int:
        return 0

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
                self._spawn()

    def _spawn(self) -> None:
        task = self._loop.create_task(self._work())
        self.workers.add(task)
        task.add_done_callback(self._worker_done)

    def _worker_done(self, task: asyncio.Task) -> None:
        self.workers.discard(task)
        if not task.cancelled():
            task.exception()   # retrieved: a KeyboardInterrupt already went to the loop's runner

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

    def heartbeat(self, lease: int) -> bool:
        if threading.get_ident() == self._loop_thread:
            self.scheduler._heartbeat(lease)
            return True
        try:
            self._loop.call_soon_threadsafe(self.scheduler._heartbeat, lease)
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
        leases of dispatches that no worker had started: they never ran."""
        self.close()
        for task, ctx in list(self.current.values()):
            ctx._cancelled = True
            task.cancel()
        unstarted = [lease for _, lease, _ in self.queue if lease not in self.dropped]
        self.queue.clear()
        self.dropped.clear()
        return unstarted

    # -- the workers

    async def _work(self) -> None:
        queue = self.queue
        fn = self.fn
        loop = self._loop
        task = asyncio.current_task()
        assert task is not None
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
            escaping: BaseException | None = None
            try:
                output = await fn(ctx, entry.payload)
                outcome = SUCCESS
            except asyncio.CancelledError as exc:
                if task.cancelling():   # this worker was cancelled: by an abort, or by whoever owns the loop
                    del current[lease]
                    if ctx._cancelled and not self.closed:
                        task.uncancel()    # the scheduler gave this attempt up; it already knows
                        continue
                    raise
                outcome, message, retry_after = _failure(exc)   # the executor's own: a failure
            except (KeyboardInterrupt, SystemExit) as exc:
                outcome, message, retry_after = _failure(exc)
                escaping = exc
            except BaseException as exc:  # noqa: B036 - any other failure ends the attempt, retryable
                outcome, message, retry_after = _failure(exc)
            del current[lease]
            if ctx._cancelled and task.cancelling():
                task.uncancel()    # the executor swallowed our cancellation; the
                                   # engine will count its report as stale
            report(entry, lease, outcome, output, message, retry_after)
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


# ---------------------------------------------------------------- plain functions

_QUEUED, _RUNNING, _DONE, _DROPPED = range(4)


class _Job:
    """One attempt handed to a thread."""

    __slots__ = ("ctx", "payload", "state", "given_up")

    def __init__(self, ctx: TaskContext, payload: Any) -> None:
        self.ctx = ctx
        self.payload = payload
        self.state = _QUEUED
        self.given_up = False    # the scheduler gave it up while its thread ran it


class ThreadRunner:
    """Runs a pool's plain-function executor on threads of its own."""

    def __init__(self, scheduler: Scheduler, pool: str, fn: Callable[..., Any]) -> None:
        self.scheduler = scheduler
        self.pool = pool
        self.fn = fn
        self.current: dict[int, _Job] = {}     # lease -> job, from dispatch until reported or given up
        self.closed = False
        loop = scheduler._loop
        assert loop is not None, "runners are made by a started scheduler"
        self._loop: asyncio.AbstractEventLoop = loop
        self._loop_thread = threading.get_ident()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Guarded by the lock:
        self._threads = 0     # threads alive
        self._idle = 0        # threads waiting for a job, less the jobs already on their way to them
        self._stray = 0       # threads still running an attempt that was given up
        self._named = 0
        self._closed = False

    @property
    def stray_threads(self) -> int:
        """Threads still running an attempt the scheduler gave up."""
        return self._stray

    @property
    def threads(self) -> int:
        """Threads alive (busy, idle and stray)."""
        return self._threads

    # -- from the scheduler (on the loop)

    def dispatch(self, entry, lease: int, attempt: int) -> None:
        job = _Job(TaskContext(entry, lease, attempt, self), entry.payload)
        self.current[lease] = job
        try:
            self._hand_over(job)
        except RuntimeError as exc:   # no thread could be started (resources, interpreter shutdown)
            del self.current[lease]
            job.state = _DROPPED
            self._loop.call_soon(self.scheduler._not_started, lease, f"no thread to run it: {exc}")

    def abort(self, lease: int) -> bool:
        job = self.current.pop(lease, None)
        if job is None:
            return False
        job.ctx._cancelled = True
        if self._give_up(job) == _RUNNING:
            # A function that checks ctx.is_cancelled() returns soon: warn only if it lingers.
            self._loop.call_later(STRAY_WARNING_SECONDS, self._warn_stray, job)
        return True

    def _warn_stray(self, job: _Job) -> None:
        if job.state == _RUNNING:
            ctx = job.ctx
            log.warning("task %d (pool %s) attempt %d was given up %g s ago but its function still runs; "
                        "its thread is not reused until it returns", ctx.id, self.pool, ctx.attempt,
                        STRAY_WARNING_SECONDS, extra={"action": "stray_thread", "task_id": ctx.id,
                                                      "pool": self.pool, "attempt": ctx.attempt})

    def heartbeat(self, lease: int) -> bool:
        if threading.get_ident() == self._loop_thread:
            self.scheduler._heartbeat(lease)
            return True
        try:
            self._loop.call_soon_threadsafe(self.scheduler._heartbeat, lease)
        except RuntimeError:   # the loop is closed: nobody is listening any more
            return False
        return True

    def close(self) -> None:
        """No more work: idle threads leave, running attempts go on."""
        self.closed = True
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._jobs.put(None)

    def cancel_all(self) -> list[int]:
        """Give up every attempt (after the shutdown grace). Returns the leases
        of dispatches that no thread had started: they never ran."""
        unstarted = []
        running = 0
        for lease, job in list(self.current.items()):
            was = self._give_up(job)
            if was == _DONE:
                continue   # its outcome is on its way to the loop: let it be reported
            job.ctx._cancelled = True
            del self.current[lease]
            if was == _RUNNING:
                running += 1
            elif was == _QUEUED:
                unstarted.append(lease)
        self.close()
        if running:
            log.warning("pool %s: %d functions still run after the shutdown grace; their threads are "
                        "left to finish (Python cannot stop a thread)", self.pool, running,
                        extra={"action": "stray_thread", "pool": self.pool, "count": running})
        return unstarted

    # -- the threads

    def _hand_over(self, job: _Job) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool's threads are closed")
            if self._idle:
                self._idle -= 1
                start = False
            else:
                self._threads += 1
                self._named += 1
                start = True
                name = f"cronoq-{self.pool}-{self._named}"
        if start:
            thread = threading.Thread(target=self._thread_main, name=name, daemon=True)
            try:
                thread.start()
            except BaseException:
                with self._lock:
                    self._threads -= 1
                raise
        self._jobs.put(job)

    def _give_up(self, job: _Job) -> int:
        """The scheduler is done with this attempt; returns the job's state
        before: queued (it will never start), running (its thread becomes a
        stray) or done (its outcome is on its way)."""
        with self._lock:
            was = job.state
            if was == _QUEUED:
                job.state = _DROPPED   # the thread that takes it skips it
            elif was == _RUNNING and not job.given_up:
                job.given_up = True
                self._stray += 1
            return was

    def _thread_main(self) -> None:
        jobs = self._jobs
        lock = self._lock
        fn = self.fn
        while True:
            try:
                job = jobs.get(timeout=_IDLE_THREAD_SECONDS)
            except queue.Empty:
                with lock:
                    if self._idle > 0:   # more idle threads than jobs on their way: leave
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue
            if job is None:
                with lock:
                    self._threads -= 1
                return
            with lock:
                if job.state != _QUEUED:
                    if self._closed:
                        self._threads -= 1
                        return
                    self._idle += 1
                    continue
                job.state = _RUNNING
            ctx = job.ctx
            output = None
            message = None
            retry_after = None
            try:
                output = fn(ctx, job.payload)
                outcome = SUCCESS
            except BaseException as exc:  # noqa: B036 - in a thread, KeyboardInterrupt is a failure too
                outcome, message, retry_after = _failure(exc)
            with lock:
                job.state = _DONE
                given_up = job.given_up
                if given_up:
                    self._stray -= 1
                leaving = self._closed
                if leaving:
                    self._threads -= 1
                else:
                    self._idle += 1
            if given_up:
                log.debug("task %d (pool %s) attempt %d: its function returned after the attempt was given up",
                         ctx.id, self.pool, ctx.attempt,
                         extra={"action": "stray_thread_done", "task_id": ctx.id, "pool": self.pool,
                                "attempt": ctx.attempt})
            else:
                try:
                    self._loop.call_soon_threadsafe(self._finished, job, outcome, output, message, retry_after)
                except RuntimeError:   # the loop is closed: nobody waits for it
                    pass
            del job, ctx, output
            if leaving:
                return

    def _finished(self, job: _Job, outcome: str, output: Any, message: str | None,
                  retry_after: int | None) -> None:
        lease = job.ctx.lease
        if self.current.get(lease) is not job:
            return   # given up meanwhile: the engine already moved on
        del self.current[lease]
        self.scheduler._report(job.ctx._entry, lease, outcome, output, message, retry_after)
