"""``cronoq.BlockingScheduler``: the scheduler for threaded code.

It runs a ``Scheduler`` on an event loop in a thread of its own and offers the
same operations as blocking calls, safe from any number of threads.
Submissions from many threads are handed to the loop in batches: a thread
adds its task to an inbox and the loop admits everything waiting there in one
step, so submitting threads do not pay a loop round trip each.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
import _thread
from collections import deque
from typing import Any, Iterable, Sequence

from .core.actions import StatusEvent
from .core.errors import QueueFull, SchedulerError
from .core.snapshot import Snapshot, TaskInfo
from .core.types import ResourceConfig, TaskSpec
from . import realtime
from .runtime.durability import encoded_payload
from .runtime.events import EventBuffer
from .runtime.handle import TaskHandle
from .runtime.pool import Pool
from .runtime.scheduler import Scheduler

__all__ = ["BlockingScheduler", "BlockingHandle", "BlockingEventStream"]


class BlockingHandle:
    """The result of a task submitted through ``BlockingScheduler``."""

    __slots__ = ("id", "key", "duplicate", "_handle", "_lock")

    def __init__(self, handle: TaskHandle) -> None:
        self.id = handle.id
        self.key = handle.key
        self.duplicate = handle.duplicate
        self._handle = handle
        lock = _thread.allocate_lock()
        lock.acquire()
        self._lock = lock
        handle._on_done(self._resolved)   # called on the loop thread

    def _resolved(self, _handle: TaskHandle) -> None:
        self._lock.release()

    def done(self) -> bool:
        return self._handle.done()

    @property
    def status(self) -> str | None:
        """The terminal status once finished (``None`` before)."""
        return self._handle.status

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the task's output. Raises ``TaskFailed`` if it did not
        succeed, and the builtin ``TimeoutError`` after ``timeout`` seconds
        (the task keeps running)."""
        if not self._handle.done():
            acquired = self._lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout))
            if not acquired:
                raise TimeoutError(f"task {self.id} did not finish within {timeout} s")
            self._lock.release()
        return self._handle.result()

    def __repr__(self) -> str:
        return f"BlockingHandle(id={self.id}, key={self.key!r}, {self.status or 'pending'})"


class BlockingEventStream(EventBuffer):
    """A blocking iterator of ``StatusEvent`` (same buffering rules as the
    async ``EventStream``). Use it in a ``with`` block or close it."""

    def __init__(self, capacity: int, on_lag: str, owner: BlockingScheduler) -> None:
        super().__init__(capacity, on_lag)
        self._cond = threading.Condition()
        self._owner = owner

    # called on the loop thread, as a subscriber of the async scheduler
    def _push(self, event: StatusEvent) -> None:
        with self._cond:
            self._store(event)
            self._cond.notify()

    def _end(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def close(self) -> None:
        if not self.closed:
            self._owner._unsubscribe(self)
            self._end()

    def __iter__(self) -> BlockingEventStream:
        return self

    def __next__(self) -> StatusEvent:
        return self.next()

    def next(self, timeout: float | None = None) -> StatusEvent:
        """The next event; ``TimeoutError`` if none arrives within ``timeout``."""
        with self._cond:
            while True:
                event = self._take()
                if event is not None:
                    return event
                if self.closed:
                    raise StopIteration
                if not self._cond.wait(timeout):
                    raise TimeoutError(f"no event within {timeout} s")

    def __enter__(self) -> BlockingEventStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Waiter:
    """One blocked submitter: a lock the loop releases with the answer."""

    __slots__ = ("lock", "value", "error")

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()
        self.lock.acquire()
        self.value = None
        self.error: BaseException | None = None

    def set(self, value) -> None:
        self.value = value
        self.lock.release()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.lock.release()

    def wait(self):
        self.lock.acquire()
        if self.error is not None:
            raise self.error
        return self.value


class BlockingScheduler:
    """A thread-safe, synchronous scheduler with the options of ``Scheduler``.

    ``start()`` (or ``with``) runs the scheduler on a private event loop
    thread; ``shutdown()`` stops it (also done at interpreter exit). Calls
    from the scheduler's own loop thread (that is, from inside an async
    executor) raise ``SchedulerError``: use the async API there.
    """

    def __init__(self, pools: Sequence[Pool], resources: Sequence[ResourceConfig] | None = None,
                 emit_transitions: bool = False, *, shutdown_grace: float = 5.0,
                 event_capacity: int = 1024, store=None, codec=None, clock=None,
                 max_pending_total: int | None = None, output_cache: int = 1024,
                 seed: int | None = None, config=None) -> None:
        self._sched = Scheduler(pools, resources, emit_transitions, shutdown_grace=shutdown_grace,
                                event_capacity=event_capacity, store=store, codec=codec, clock=clock,
                                max_pending_total=max_pending_total, output_cache=output_cache,
                                seed=seed, config=config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._inbox: deque = deque()
        self._inbox_lock = threading.Lock()
        self._lifecycle = threading.Lock()
        self._stopped = False

    @property
    def scheduler(self) -> Scheduler:
        """The async ``Scheduler`` underneath (use it only from its loop)."""
        return self._sched

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    @property
    def running(self) -> bool:
        return self._sched.running

    # ================================================================ lifecycle

    def start(self) -> None:
        """Start the loop thread and the scheduler on it; returns once it serves."""
        with self._lifecycle:
            if self._thread is not None:
                raise SchedulerError("this BlockingScheduler was already started")
            loop = realtime.new_event_loop()   # real timers even while a test freezes time
            ready = _Waiter()

            def run() -> None:
                asyncio.set_event_loop(loop)

                async def boot() -> None:
                    try:
                        await self._sched.start()
                    except BaseException as exc:
                        ready.fail(exc)
                    else:
                        ready.set(None)

                loop.create_task(boot())
                loop.run_forever()
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

            self._loop = loop
            self._thread = threading.Thread(target=run, name="cronoq-scheduler", daemon=True)
            self._thread.start()
            try:
                ready.wait()
            except BaseException:
                loop.call_soon_threadsafe(loop.stop)
                self._thread.join()
                raise
            atexit.register(self._at_exit)

    def shutdown(self, grace: float | None = None) -> None:
        """Stop admitting, let running attempts finish for ``grace`` seconds,
        cancel the rest, and stop the loop thread."""
        self._check_thread()     # before taking the lock: the loop thread must never wait on it
        with self._lifecycle:
            if self._thread is None or self._stopped:
                return
            self._stopped = True
            future = asyncio.run_coroutine_threadsafe(self._sched.shutdown(grace), self._loop)
            try:
                future.result()
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join()
                atexit.unregister(self._at_exit)
                self._fail_inbox(SchedulerError("the scheduler shut down"))

    def _at_exit(self) -> None:
        try:
            self.shutdown()
        except Exception:  # interpreter exit: nothing left to report to
            pass

    def __enter__(self) -> BlockingScheduler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ================================================================ plumbing

    def _check_thread(self) -> None:
        if self._thread is not None and threading.current_thread() is self._thread:
            raise SchedulerError("BlockingScheduler was called from its own event loop thread (an async "
                                 "executor?); that would deadlock: use the async Scheduler there")

    def _loop_or_fail(self) -> asyncio.AbstractEventLoop:
        if self._thread is None:
            raise RuntimeError("the scheduler is not started: use 'with' or call start()")
        if self._stopped:
            raise SchedulerError("the scheduler is shut down")
        self._check_thread()
        return self._loop

    def _call(self, coro_fn, *args, **kwargs):
        """Run ``coro_fn(*args)`` on the loop and wait for its result."""
        loop = self._loop_or_fail()
        future = asyncio.run_coroutine_threadsafe(coro_fn(*args, **kwargs), loop)
        return future.result()

    def _on_loop(self, fn, *args):
        """Run a plain function on the loop and wait for its result."""
        loop = self._loop_or_fail()
        waiter = _Waiter()

        def run() -> None:
            try:
                waiter.set(fn(*args))
            except BaseException as exc:
                waiter.fail(exc)

        loop.call_soon_threadsafe(run)
        return waiter.wait()

    def _post(self, spec: TaskSpec, want_handle: bool):
        loop = self._loop_or_fail()
        waiter = _Waiter()
        with self._inbox_lock:
            first = not self._inbox
            self._inbox.append((spec, want_handle, waiter))
        if first:
            loop.call_soon_threadsafe(self._drain)
        return waiter.wait()

    def _drain(self) -> None:
        """On the loop: admit everything the threads posted, in one step."""
        with self._inbox_lock:
            items = list(self._inbox)
            self._inbox.clear()
        sched = self._sched
        answers = []
        for spec, want_handle, waiter in items:
            try:
                core = sched._check()
                if sched._log is not None:
                    encoded_payload(spec, sched.codec)
                try:
                    task_id, duplicate = core.submit(sched.clock.now_ns(), spec)
                except QueueFull:
                    if core.overflow_policy(spec.pool) != "wait":
                        raise
                    self._loop.create_task(self._submit_waiting(spec, want_handle, waiter))
                    continue
                if want_handle:
                    answers.append((waiter, BlockingHandle(sched._attach(task_id, spec.key, duplicate))))
                else:
                    answers.append((waiter, task_id))
            except BaseException as exc:
                waiter.fail(exc)
        if sched.running:
            sched._pump()
        if sched._log is not None and answers:
            self._loop.create_task(self._answer_when_durable(answers))
        else:
            for waiter, value in answers:
                waiter.set(value)

    async def _answer_when_durable(self, answers: list) -> None:
        try:
            await self._sched._durable()
        except BaseException as exc:
            for waiter, _ in answers:
                waiter.fail(exc)
        else:
            for waiter, value in answers:
                waiter.set(value)

    async def _submit_waiting(self, spec: TaskSpec, want_handle: bool, waiter: _Waiter) -> None:
        try:
            task_id, duplicate = await self._sched._admit(spec)
            value = (BlockingHandle(self._sched._attach(task_id, spec.key, duplicate)) if want_handle
                     else task_id)
            self._sched._pump()
            await self._sched._durable()
            waiter.set(value)
        except BaseException as exc:
            waiter.fail(exc)

    def _fail_inbox(self, error: BaseException) -> None:
        with self._inbox_lock:
            items = list(self._inbox)
            self._inbox.clear()
        for _, _, waiter in items:
            waiter.fail(error)

    # ================================================================ the API

    def submit(self, payload: Any = None, **options: Any) -> BlockingHandle:
        """Submit a task; returns a ``BlockingHandle`` (``.result(timeout)``)."""
        return self._post(TaskSpec(payload, **options), True)

    def enqueue(self, payload: Any = None, **options: Any) -> int:
        """Submit a task without a handle; returns its id."""
        return self._post(TaskSpec(payload, **options), False)

    def submit_batch(self, tasks: Iterable[TaskSpec]) -> list[BlockingHandle]:
        """Submit ``cronoq.Task`` objects atomically (all or none)."""
        tasks = list(tasks)

        async def run():
            return [BlockingHandle(h) for h in await self._sched.submit_batch(tasks)]

        return self._call(run)

    def enqueue_batch(self, tasks: Iterable[TaskSpec]) -> list[int]:
        """``submit_batch`` without handles; returns the ids."""
        return self._call(self._sched.enqueue_batch, list(tasks))

    def cancel(self, ref: int | str) -> bool:
        """Cancel a task by id or key (False if it already finished)."""
        return self._call(self._sched.cancel, ref)

    def handle(self, ref: int | str) -> BlockingHandle:
        """A handle on an existing task, live or finished (within retention)."""

        async def run():
            return BlockingHandle(await self._sched.handle(ref))

        return self._call(run)

    def info(self, ref: int | str) -> TaskInfo:
        """What the scheduler knows of a task."""
        return self._call(self._sched.info, ref)

    def snapshot(self) -> Snapshot:
        """Pools, quality metrics over the window, and totals since start."""
        return self._call(self._sched.snapshot)

    def events(self, on_lag: str = "drop") -> BlockingEventStream:
        """A blocking iterator of status events; close it (or use ``with``)."""
        stream = BlockingEventStream(self._sched.event_capacity, on_lag, self)

        def subscribe() -> None:
            self._sched._check()
            self._sched._streams.append(stream)

        self._on_loop(subscribe)
        return stream

    def _unsubscribe(self, stream: BlockingEventStream) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed() and not self._stopped:
            loop.call_soon_threadsafe(self._sched._detach, stream)

    def set_capacity(self, pool: str, capacity: int) -> None:
        """Set the capacity of a pool's unlabeled workers."""
        return self._call(self._sched.set_capacity, pool, capacity)

    def set_group_capacity(self, pool: str, labels: dict[str, str], capacity: int) -> None:
        """Set the capacity of the pool's workers that carry exactly ``labels``."""
        return self._call(self._sched.set_group_capacity, pool, labels, capacity)

    def add_recurring(self, name: str, cron: str, payload: Any = None, *, tz: str = "UTC",
                      overlap: str = "skip", tolerance: float | None = None,
                      on_miss: str | None = None, key: str | None = None,
                      **task_options: Any) -> None:
        """Register (or replace) a cron schedule."""
        return self._call(self._sched.add_recurring, name, cron, payload, tz=tz, overlap=overlap,
                          tolerance=tolerance, on_miss=on_miss, key=key, **task_options)

    def remove_recurring(self, name: str) -> bool:
        """Stop a schedule (an occurrence already created still runs)."""
        return self._call(self._sched.remove_recurring, name)

    def __repr__(self) -> str:
        return f"<cronoq.BlockingScheduler {'running' if self.running else 'stopped'}>"

