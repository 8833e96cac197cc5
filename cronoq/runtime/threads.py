"""``ThreadRunner``: plain-function executors on threads the pool owns.

Not the loop's default executor, whose few threads would queue attempts the
engine counts as running, in FIFO order. The runner starts a thread only
when no idle one is free, so it grows to the pool's busy count and no
further; idle threads leave after a minute. Python cannot stop a thread: an
attempt given up (timeout, cancel, lost lease, shutdown) keeps its thread
until the function returns. That thread is a *stray*: it is never handed
another attempt, it is counted (``PoolSnapshot.stray_threads``) and logged,
and the next attempt gets a thread of its own, so a hung function never holds
up healthy ones. Whatever the function raises ends its attempt (in a thread,
``KeyboardInterrupt`` is a failure like any other).
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, ClassVar

from ..core.types import SUCCESS
from .context import TaskContext
from .runner import ABORT_CANCELLED, ABORT_SHUTDOWN, Attempt, RunnerLink, outcome_of

__all__ = ["ThreadRunner"]

log = logging.getLogger("cronoq.scheduler")

_IDLE_THREAD_SECONDS = 60.0
STRAY_WARNING_SECONDS = 1.0    # a given-up function still running this long after is logged

_QUEUED, _RUNNING, _DONE, _DROPPED = range(4)


class _Job:
    """One attempt handed to a thread."""

    __slots__ = ("attempt", "ctx", "payload", "state", "given_up")

    def __init__(self, attempt: Attempt, ctx: TaskContext) -> None:
        self.attempt = attempt
        self.ctx = ctx
        self.payload = attempt.payload
        self.state = _QUEUED
        self.given_up = False    # the scheduler gave it up while its thread ran it


class ThreadRunner:
    """Runs a pool's plain-function executor on threads of its own."""

    abort_takes_reason: ClassVar[bool] = True   # (see runner.aborter)

    def __init__(self, link: RunnerLink, fn: Callable[..., Any]) -> None:
        self.link = link
        self.pool = link.pool
        self.fn = fn
        self.current: dict[int, _Job] = {}     # lease -> job, from start until reported or given up
        self.closed = False
        self._loop = link.loop
        self._loop_thread = threading.get_ident()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
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

    def start(self, attempt: Attempt) -> None:
        lease = attempt.lease
        job = _Job(attempt, TaskContext(attempt, self.heartbeat, self.link.checkpoints))
        self.current[lease] = job
        try:
            self._hand_over(job)
        except RuntimeError as exc:   # no thread could be started (resources, interpreter shutdown)
            del self.current[lease]
            job.state = _DROPPED
            self._loop.call_soon(self.link.not_started, lease, f"no thread to run it: {exc}")

    def abort(self, lease: int, reason: str = ABORT_CANCELLED) -> bool:
        job = self.current.pop(lease, None)
        if job is None:
            return False
        job.attempt.abort_reason = reason
        job.attempt.cancelled = True
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
        """For executors, from any thread."""
        if threading.get_ident() == self._loop_thread:
            return self.link.heartbeat(lease)
        try:
            self._loop.call_soon_threadsafe(self.link.heartbeat, lease)
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
            job.attempt.abort_reason = ABORT_SHUTDOWN
            job.attempt.cancelled = True
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
                outcome: str = SUCCESS
            except BaseException as exc:  # noqa: B036 - in a thread, KeyboardInterrupt is a failure too
                outcome, message, retry_after = outcome_of(exc)
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
        self.link.report(job.attempt, outcome, output, message, retry_after)
