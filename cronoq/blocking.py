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
import contextvars
import concurrent.futures.thread  # noqa: F401 - registers its exit hook before ours (ours runs first)
import logging
import os
import signal
import threading
import time
import weakref
import _thread
from typing import Any, Awaitable, Callable, Iterable, ParamSpec, Sequence, TypeVar

from .core.actions import StatusEvent
from .core.errors import AdmissionError, SchedulerError
from .core.snapshot import Snapshot, TaskInfo
from .core.types import CoreConfig, ResourceConfig, TaskSpec
from . import realtime
from .runtime.checkpoints import DEFAULT_MAX_CHECKPOINT_BYTES
from .runtime.clock import Clock
from .runtime.events import EventBuffer, EventSink
from .runtime.handle import TaskHandle
from .runtime.listing import RecurringInfo
from .runtime import process as _process
from .runtime.pool import Pool
from .runtime.scheduler import Scheduler, configuration_of, fresh_copy
from .store.base import Store
from .store.codec import Codec

__all__ = ["BlockingScheduler", "BlockingHandle", "BlockingEventStream", "schedulers"]

log = logging.getLogger("cronoq.scheduler")

_T = TypeVar("_T")
_P = ParamSpec("_P")


class BlockingHandle:
    """The result of a task submitted through ``BlockingScheduler``."""

    __slots__ = ("id", "key", "duplicate", "_handle", "_done", "_forks")

    def __init__(self, handle: TaskHandle) -> None:
        self.id = handle.id
        self.key = handle.key
        self.duplicate = handle.duplicate
        self._handle = handle
        self._done: threading.Event | None = None    # made when a thread first waits
        self._forks = _process.forks

    def done(self) -> bool:
        return self._handle.status is not None

    @property
    def status(self) -> str | None:
        """The terminal status once finished (``None`` before)."""
        return self._handle.status

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the task's output. Raises ``TaskFailed`` if it did not
        succeed, and the builtin ``TimeoutError`` after ``timeout`` seconds
        (the task keeps running)."""
        handle = self._handle
        if handle.status is None:
            if self._forks != _process.forks:
                raise SchedulerError("this handle belongs to a scheduler of the process this one was forked "
                                     "from: its task's end is not reported here")
            done = self._done
            if done is None:
                done = self._done = threading.Event()
                handle.on_resolve(lambda _: done.set())    # set on the loop thread
            if not done.wait(None if timeout is None else max(0.0, timeout)):
                raise TimeoutError(f"task {self.id} did not finish within {timeout} s")
        return handle.result()

    def __repr__(self) -> str:
        return f"BlockingHandle(id={self.id}, key={self.key!r}, {self.status or 'pending'})"


class BlockingEventStream(EventBuffer):
    """A blocking iterator of ``StatusEvent`` (same buffering rules as the
    async ``EventStream``). Use it in a ``with`` block or close it."""

    def __init__(self, capacity: int, on_lag: str, owner: BlockingScheduler) -> None:
        super().__init__(capacity, on_lag)
        self._cond = threading.Condition()
        self._owner = owner
        self._forks = _process.forks

    def deliver(self, event: StatusEvent) -> None:
        """From the scheduler (its loop thread): buffer one event."""
        with self._cond:
            self._store(event)
            self._cond.notify()

    def end(self) -> None:
        """From the scheduler: it stopped."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def close(self) -> None:
        if not self.closed:
            if self._forks != _process.forks:
                self.closed = True    # (its lock may be held by a thread the fork left behind)
                return
            self._owner.scheduler.unsubscribe(self)
            self.end()

    def __iter__(self) -> BlockingEventStream:
        return self

    def __next__(self) -> StatusEvent:
        return self.next()

    def next(self, timeout: float | None = None) -> StatusEvent:
        """The next event; ``TimeoutError`` if none arrives within ``timeout``."""
        if self._forks != _process.forks:
            raise SchedulerError("this event stream belongs to a scheduler of the process this one was "
                                 "forked from: no event reaches it here")
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

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Waiter:
    """One blocked caller: a lock the loop releases with the answer.

    Settled once: the first answer wins (the loop's, or the error given to
    every call still in flight when the scheduler stops). While ``calls`` is
    set, the waiter is in that set of calls in flight and leaves it when settled.
    """

    __slots__ = ("lock", "value", "error", "settled", "calls")

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()
        self.lock.acquire()
        self.value: Any = None
        self.error: BaseException | None = None
        self.settled = False
        self.calls: set[_Waiter] | None = None

    def track(self, calls: set[_Waiter]) -> None:
        self.calls = calls
        calls.add(self)

    def set(self, value: Any) -> None:
        if not self.settled:
            self.settled = True
            self.value = value
            if self.calls is not None:
                self.calls.discard(self)
            self.lock.release()

    def fail(self, error: BaseException) -> None:
        if not self.settled:
            self.settled = True
            self.error = error
            if self.calls is not None:
                self.calls.discard(self)
            self.lock.release()

    def wait(self) -> Any:
        self.lock.acquire()
        if self.error is not None:
            raise self.error
        return self.value


_NEW, _STARTING, _RUNNING, _STOPPING, _STOPPED = "new", "starting", "running", "stopping", "stopped"

# Every BlockingScheduler that may be serving, for the exit hook.
_live: weakref.WeakSet[BlockingScheduler] = weakref.WeakSet()
# Every BlockingScheduler of this process (and those it inherited through a fork), for server hooks.
_made: weakref.WeakSet[BlockingScheduler] = weakref.WeakSet()


def schedulers() -> list[BlockingScheduler]:
    """Every ``BlockingScheduler`` this process holds, those a fork's child
    inherited from its parent included: for server hooks that start or stop
    them all (``cronoq.contrib.gunicorn``)."""
    return list(_made)
_exit_hook_lock = threading.Lock()
_exit_hook_registered = False
# How long interpreter exit waits, beyond the grace and a store's commit timeout,
# for a scheduler to stop (a loop blocked by an executor would never stop).
_EXIT_MARGIN = 10.0


def _register_exit_hook() -> None:
    """Shut schedulers down at interpreter exit, before the interpreter waits
    for non-daemon threads and before ``concurrent.futures`` shuts its thread
    pools (both happen in ``threading._shutdown``, before ``atexit``)."""
    global _exit_hook_registered
    with _exit_hook_lock:
        if _exit_hook_registered:
            return
        register = getattr(threading, "_register_atexit", None)   # private, hence the fallback
        try:
            if register is None:
                raise RuntimeError("threading._register_atexit is not available")
            register(_shutdown_at_exit)
        except RuntimeError:   # missing, or the interpreter is already shutting down
            atexit.register(_shutdown_at_exit)
        _exit_hook_registered = True


def _exit_on_sigterm() -> None:
    """From a scheduler's start: a program that keeps SIGTERM's default action
    (killed at once, no cleanup: a plain script, waitress) exits cleanly on
    SIGTERM instead, so interpreter exit shuts its schedulers down. Only from
    the main thread (Python sets handlers there); a handler of the program's
    own (gunicorn's workers have one) is left alone."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError, AttributeError):   # not the main interpreter, or no SIGTERM here
        pass


def _on_sigterm(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # a second SIGTERM kills at once
    if any(not bs._forked() and bs._state in (_STARTING, _RUNNING) for bs in list(_live)):
        log.info("SIGTERM: exiting; the schedulers shut down first", extra={"action": "sigterm"})
        raise SystemExit(128 + signum)
    os.kill(os.getpid(), signum)   # nothing to shut down: the default action


def _shutdown_at_exit() -> None:
    schedulers = [bs for bs in list(_live) if not bs._forked()]
    for bs in schedulers:       # all stop at once: the graces overlap
        bs._request_stop(None)
    for bs in schedulers:
        bs._wait_stopped_at_exit()


class BlockingScheduler:
    """A thread-safe, synchronous scheduler with the options of ``Scheduler``.

    ``start()`` (or ``with``) runs the scheduler on a private event loop
    thread; ``shutdown()`` stops it (also done at interpreter exit). Calls
    from the scheduler's own loop thread (that is, from inside an async
    executor) raise ``SchedulerError``: use the async API there.
    """

    def __init__(self, pools: Sequence[Pool], resources: Sequence[ResourceConfig] | None = None,
                 emit_transitions: bool = False, *, shutdown_grace: float = 5.0,
                 event_capacity: int = 1024, store: Store | None = None, codec: Codec | None = None,
                 clock: Clock | None = None, max_pending_total: int | None = None, output_cache: int = 1024,
                 seed: int | None = None, config: CoreConfig | None = None,
                 max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES) -> None:
        self._sched = Scheduler(pools, resources, emit_transitions, shutdown_grace=shutdown_grace,
                                event_capacity=event_capacity, store=store, codec=codec, clock=clock,
                                max_pending_total=max_pending_total, output_cache=output_cache,
                                seed=seed, config=config, max_checkpoint_bytes=max_checkpoint_bytes)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # The gate guards the state and the calls in flight: a call
        # checks the state and reaches the loop under it, so a call that does
        # not raise is one the loop will answer (or fail when it stops).
        self._gate = threading.Lock()
        self._state = _NEW
        self._calls: set[_Waiter] = set()
        self._lifecycle = threading.Lock()     # one start() at a time
        self._stop_grace: float | None = None
        self._stop_requested: asyncio.Future[None] | None = None
        self._stop_error: Exception | None = None
        self._forks = _process.forks
        self._pid = os.getpid()
        _process.after_fork(self._after_fork)
        _made.add(self)
        # Here too: a server that starts it on a request thread (waitress) imported it on the main thread.
        _exit_on_sigterm()

    def ensure_started(self) -> BlockingScheduler:
        """Start it unless it runs in this process (new, or inherited through
        a fork); returns it. ``SchedulerError`` if it was shut down here."""
        if self._forks != _process.forks:
            self._adopt()
        elif self._state != _RUNNING:
            with self._lifecycle:
                if self._state == _NEW:
                    self._start_locked()
            if self._state != _RUNNING:
                raise self._refuse()
        return self

    @property
    def scheduler(self) -> Scheduler:
        """The async ``Scheduler`` underneath (use it only from its loop). In
        a fork's child, the one started there (not the parent's copy)."""
        self._here()
        return self._sched

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    @property
    def running(self) -> bool:
        return self._state == _RUNNING and self._sched.running and not self._forked()

    @property
    def state_here(self) -> str:
        """``"new"``, ``"starting"``, ``"running"``, ``"stopping"`` or
        ``"stopped"`` in this process; ``"inherited"`` for a scheduler a
        fork's child holds from its parent (its first call starts it here)."""
        return "inherited" if self._forked() else self._state

    @property
    def _ev(self) -> asyncio.AbstractEventLoop:
        """The loop, once started (internal use, where it is known to be set)."""
        loop = self._loop
        assert loop is not None
        return loop

    # ================================================================ lifecycle

    def start(self) -> None:
        """Start the loop thread and the scheduler on it; returns once it serves.

        With a store other processes share, it returns at once whether this
        process leads or follows (``scheduler.leading``); a store without
        that (``cluster=False``) makes a standby wait here until it leads,
        and ``shutdown()`` from another thread makes it give up. If the start
        fails, no thread is left behind and ``start()`` may be called again.

        In the child of a fork, a scheduler that came from the parent
        (started there or not) becomes a new scheduler of this process, with
        the same configuration, and starts: ``start()`` does it, and so does
        its first call here. The parent's scheduler is not touched."""
        if self._forks != _process.forks:
            self._adopt()
            return
        with self._lifecycle:
            self._start_locked()

    def _adopt(self) -> None:
        """In a fork's child: start afresh here (once, whichever thread comes first)."""
        with self._lifecycle:
            if self._forks == _process.forks:
                return
            self._sched = fresh_copy(self._sched)
            self._loop = None
            self._thread = None
            self._calls = set()
            self._stop_grace = None
            self._stop_requested = None
            self._stop_error = None
            self._state = _NEW
            self._pid = os.getpid()
            self._start_locked()
            # Only now: the other threads of the child wait above (on the lock)
            # until it serves, instead of being told it is starting.
            self._forks = _process.forks

    def _here(self) -> None:
        """Before a call: a scheduler inherited through a fork starts here first."""
        if self._forks != _process.forks:
            self._adopt()

    def _start_locked(self) -> None:
        """start(), holding the lifecycle lock."""
        with self._gate:
            if self._state in (_STOPPING, _STOPPED):
                raise SchedulerError("this BlockingScheduler is shut down; create a new one to start again")
            if self._state != _NEW:
                raise SchedulerError(f"this BlockingScheduler was already started (it is {self._state})")
            self._state = _STARTING
        loop = realtime.new_event_loop()   # real timers even while a test freezes time
        ready = _Waiter()
        thread = threading.Thread(target=self._run, args=(loop, ready), name="cronoq-scheduler",
                                  daemon=True)
        self._loop = loop
        self._thread = thread
        self._stop_grace = None
        _register_exit_hook()
        _live.add(self)
        try:
            thread.start()
            ready.wait()
        except BaseException as exc:  # noqa: B036 - re-raised once the thread is gone
            self._start_failed(thread, loop, failed=exc is ready.error)
            raise
        with self._gate:
            serving = self._state == _STARTING
            if serving:
                self._state = _RUNNING
        if not serving:   # shut down meanwhile, from another thread
            thread.join()
            raise SchedulerError("the scheduler was shut down while it started")
        _exit_on_sigterm()

    def _start_failed(self, thread: threading.Thread, loop: asyncio.AbstractEventLoop, failed: bool) -> None:
        """Leave no thread behind after a start that failed (``failed``) or was
        interrupted (Ctrl-C while a standby waits, no thread to be had)."""
        if not failed:
            self._request_stop(0.0)
        deadline = realtime.real_monotonic() + 1.0
        while True:
            try:
                thread.join()
                return
            except RuntimeError:   # not started: interrupted inside Thread.start(), or never will be
                if realtime.real_monotonic() > deadline and thread.ident is None:
                    break
                time.sleep(0.001)
        loop.close()               # nothing ran on it
        with self._gate:
            self._state = _NEW
        _live.discard(self)

    def shutdown(self, grace: float | None = None) -> None:
        """Stop admitting, let running attempts finish for ``grace`` seconds,
        cancel the rest, and stop the loop thread. A standby that waits to
        lead stops waiting. Calls still in flight get ``SchedulerError``."""
        self._check_thread()     # the loop thread must never wait for itself
        if self._forks != _process.forks:
            return   # inherited through a fork and never started here: nothing runs in this process
        thread = self._request_stop(grace)
        if thread is not None:
            thread.join()
        error, self._stop_error = self._stop_error, None
        if error is not None:
            raise error

    def _request_stop(self, grace: float | None) -> threading.Thread | None:
        """Ask the loop to stop (once); the thread to wait for, if any."""
        with self._gate:
            state = self._state
            if state == _NEW:
                self._state = _STOPPED
                return None
            if state in (_STARTING, _RUNNING):
                self._state = _STOPPING
                self._stop_grace = grace
                self._ev.call_soon_threadsafe(self._on_stop_request)   # the loop is open: see _run
            return self._thread

    def _at_exit(self) -> None:
        """What interpreter exit does for this scheduler."""
        if not self._forked():
            self._request_stop(None)
            self._wait_stopped_at_exit()

    def _wait_stopped_at_exit(self) -> None:
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        store = self._sched.store
        commit_timeout = float(store.commit_timeout) if store is not None else 0.0
        limit = self._sched.shutdown_grace + commit_timeout + _EXIT_MARGIN
        thread.join(limit)
        if thread.is_alive():
            log.error("the scheduler did not stop within %g s at interpreter exit (is an async executor "
                      "blocking its loop?); exiting without it", limit, extra={"action": "exit_timeout"})

    def __enter__(self) -> BlockingScheduler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ================================================================ the loop thread

    def _run(self, loop: asyncio.AbstractEventLoop, ready: _Waiter) -> None:
        asyncio.set_event_loop(loop)
        try:
            main = loop.create_task(self._main(ready))
            while True:
                try:
                    loop.run_until_complete(main)
                    break
                except (KeyboardInterrupt, SystemExit) as exc:
                    # An async executor raised it (its attempt already failed): a
                    # private loop thread has no caller to hand it to, so it goes on.
                    log.error("an executor raised %s on the scheduler's loop thread; the scheduler goes "
                              "on", type(exc).__name__, extra={"action": "executor_exit"})
        finally:
            with self._gate:
                # From here no call reaches the loop: fail those in flight.
                self._state = _NEW if self._state == _STARTING else _STOPPED
                pending = list(self._calls)
            error = SchedulerError("the scheduler shut down")
            for waiter in pending:
                waiter.fail(error)
            ready.fail(error)    # only if the start never answered
            self._close_loop(loop)
            _live.discard(self)

    async def _main(self, ready: _Waiter) -> None:
        self._stop_requested = asyncio.get_running_loop().create_future()
        with self._gate:
            stop_early = self._state == _STOPPING
        try:
            if stop_early:
                raise SchedulerError("the scheduler was shut down while it started")
            await self._sched.start()
        except BaseException as exc:
            ready.fail(exc)
            return
        ready.set(None)
        await self._stop_requested
        try:
            await self._sched.shutdown(self._stop_grace)
        except Exception as exc:  # handed to the shutdown() caller
            self._stop_error = exc

    def _on_stop_request(self) -> None:
        """On the loop: shutdown() was called."""
        stop = self._stop_requested
        if stop is not None and not stop.done():
            stop.set_result(None)
        if not self._sched.running:
            # A standby waiting to lead (or recovering) gives up: shutdown()
            # of a scheduler that is still starting makes its start() raise.
            self._ev.create_task(self._sched.shutdown())

    @staticmethod
    def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
        try:
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    # ================================================================ plumbing

    def _forked(self) -> bool:
        return self._forks != _process.forks

    def _check_process(self) -> None:
        if self._forks != _process.forks:
            raise _process.forked_error(self._pid)

    def _after_fork(self) -> None:
        # In the child of a fork: a thread of the parent may have held these.
        self._gate = threading.Lock()
        self._lifecycle = threading.Lock()

    def _check_thread(self) -> None:
        if self._thread is not None and threading.current_thread() is self._thread:
            raise SchedulerError("BlockingScheduler was called from its own event loop thread (an async "
                                 "executor?); that would deadlock: use the async Scheduler there")

    def _refuse(self) -> BaseException:
        """The error for a call made while the scheduler does not serve (under the gate)."""
        if self._forks != _process.forks:
            return _process.forked_error(self._pid)
        if self._state == _NEW:
            return RuntimeError("the scheduler is not started: use 'with' or call start()")
        if self._state == _STARTING:
            return SchedulerError("the scheduler is starting")
        return SchedulerError("the scheduler is shut down")

    def _send(self, fn: Callable[..., None], *args: Any) -> _Waiter:
        """Call ``fn(waiter, *args)`` on the loop; the waiter is answered there
        (or failed when the scheduler stops). Raises if the scheduler does not serve."""
        self._check_thread()
        self._here()
        waiter = _Waiter()
        with self._gate:
            if self._state != _RUNNING or self._forks != _process.forks:
                raise self._refuse()
            waiter.track(self._calls)
            self._ev.call_soon_threadsafe(fn, waiter, *args)
        return waiter

    def _call(self, coro_fn: Callable[_P, Awaitable[_T]], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run ``coro_fn(*args)`` on the loop and wait for its result. It runs
        in a copy of the caller's context, as it would on the caller's thread
        (submission hooks read the caller's context variables: its trace)."""
        context = contextvars.copy_context()
        value: _T = self._send(self._start_call, coro_fn, args, kwargs, context).wait()
        return value

    def _start_call(self, waiter: _Waiter, coro_fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...],
                    kwargs: dict[str, Any], context: contextvars.Context) -> None:
        self._ev.create_task(self._run_call(waiter, coro_fn, args, kwargs), context=context)

    @staticmethod
    async def _run_call(waiter: _Waiter, coro_fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> None:
        try:
            value = await coro_fn(*args, **kwargs)
        except BaseException as exc:  # noqa: B036 - handed to the caller
            waiter.fail(exc)
        else:
            waiter.set(value)

    def _post(self, spec: TaskSpec, want_handle: bool) -> Any:
        """Submit on this thread (see ``Scheduler.submit_from_thread``): the
        engine answers at once; the loop is needed only to wait for a
        commit, or for room in a full queue."""
        self._check_thread()
        self._here()
        with self._gate:
            if self._state != _RUNNING or self._forks != _process.forks:
                raise self._refuse()
        value, later = self._sched.submit_from_thread(spec, handle=want_handle,
                                                      wrap=BlockingHandle if want_handle else None)
        if later is not None:
            value = self._call(later)
        return value if want_handle else value[0]

    # ================================================================ the API

    def submit(self, payload: Any = None, **options: Any) -> BlockingHandle:
        """Submit a task; returns a ``BlockingHandle`` (``.result(timeout)``)."""
        handle: BlockingHandle = self._post(TaskSpec(payload, **options), True)
        return handle

    def enqueue(self, payload: Any = None, **options: Any) -> int:
        """Submit a task without a handle; returns its id."""
        task_id: int = self._post(TaskSpec(payload, **options), False)
        return task_id

    def submit_batch(self, tasks: Iterable[TaskSpec]) -> list[BlockingHandle]:
        """Submit ``cronoq.Task`` objects atomically (all or none)."""
        tasks = list(tasks)

        async def run() -> list[BlockingHandle]:
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

        async def run() -> BlockingHandle:
            return BlockingHandle(await self._sched.handle(ref))

        return self._call(run)

    def info(self, ref: int | str) -> TaskInfo:
        """What the scheduler knows of a task."""
        return self._call(self._sched.info, ref)

    def snapshot(self) -> Snapshot:
        """Pools, quality metrics over the window, and totals since start."""
        self._check_thread()
        self._here()
        with self._gate:
            if self._state != _RUNNING or self._forks != _process.forks:
                raise self._refuse()
        return self._sched.snapshot_from_thread()

    def events(self, on_lag: str = "drop") -> BlockingEventStream:
        """A blocking iterator of status events; close it (or use ``with``)."""
        self._check_thread()
        self._here()
        with self._gate:
            if self._state != _RUNNING or self._forks != _process.forks:
                raise self._refuse()
        stream = BlockingEventStream(self._sched.event_capacity, on_lag, self)
        self._sched.subscribe(stream)
        return stream

    def call(self, coro_fn: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``await coro_fn()`` on the scheduler's loop and return its
        result (in a copy of this thread's context). A call in flight when the
        scheduler stops raises ``SchedulerError``. For an answer that
        ``Scheduler.submit_from_thread`` leaves to the loop, say."""
        return self._call(coro_fn)

    def subscribe(self, sink: EventSink) -> None:
        """Deliver every status event to ``sink`` (its ``deliver`` and ``end``
        run on the scheduler's loop thread); ``events()`` is the ready-made one."""
        self._check_thread()
        self._here()
        with self._gate:
            if self._state != _RUNNING or self._forks != _process.forks:
                raise self._refuse()
        self._sched.subscribe(sink)

    def unsubscribe(self, sink: EventSink) -> None:
        """Stop delivering events to ``sink``."""
        self._sched.unsubscribe(sink)

    def add_submit_hook(self, hook: Callable[[TaskSpec], TaskSpec]) -> Callable[[], None]:
        """Call ``hook(task)`` for every task before it is admitted (see
        ``Scheduler.add_submit_hook``); returns a function that removes it."""
        return self._sched.add_submit_hook(hook)

    def add_admission_listener(
            self, listener: Callable[[int, Sequence[TaskSpec], Sequence[tuple[int, bool]] | None,
                                      AdmissionError | None], None]) -> Callable[[], None]:
        """Call ``listener(now_ns, tasks, results, error)`` after every admission
        (see ``Scheduler.add_admission_listener``); returns a function that removes it."""
        return self._sched.add_admission_listener(listener)

    def add_executor_middleware(
            self, middleware: Callable[[Callable[..., Any], bool], Callable[..., Any]]) -> Callable[[], None]:
        """Before ``start()``: wrap every pool's executor (see
        ``Scheduler.add_executor_middleware``)."""
        return self._sched.add_executor_middleware(middleware)

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

    # ================================================================ listings (Scheduler's twins)

    def list_tasks(self, *, pools: Iterable[str] | None = None, statuses: Iterable[str] | None = None,
                   after: int = 0, limit: int = 100) -> list[TaskInfo]:
        """Tasks with ids above ``after`` in id order (see ``Scheduler.list_tasks``)."""
        return self._call(self._sched.list_tasks, pools=pools, statuses=statuses, after=after, limit=limit)

    def recurring(self) -> list[RecurringInfo]:
        """The recurring schedules, sorted by name, with their next occurrence."""
        return self._call(self._sched.recurring)


def fresh_blocking_copy(blocking: BlockingScheduler) -> BlockingScheduler:
    """A new, unstarted ``BlockingScheduler`` with ``blocking``'s
    configuration, submit hooks and executor middleware (and the same store
    object), as a fork's child gets. A shut-down one cannot start again:
    ``cronoq_compat`` restarts the legacy scheduler with one of these."""
    pools, resources, emit_transitions, options = configuration_of(blocking._sched)
    copy_ = BlockingScheduler(pools, resources, emit_transitions, **options)
    copy_._sched = fresh_copy(blocking._sched)
    return copy_
