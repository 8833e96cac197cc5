"""``cronoq.BlockingScheduler``: the scheduler for threaded code.

It runs a ``Scheduler`` on an event loop in a thread of its own (owned by a
``Portal``, ``cronoq.runtime.portal``) and offers the same operations as
blocking calls, safe from any number of threads. Submissions and snapshots do
not wait for that thread: they run on the calling thread, under the
scheduler's engine lock (``Scheduler.submit_from_thread``).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures.thread  # noqa: F401 - registers its exit hook before ours (ours runs first)
import functools
import inspect
import logging
import os
import signal
import threading
import weakref
from typing import Any, Awaitable, Callable, Iterable, Sequence, TypeVar

from .core.actions import StatusEvent
from .core.errors import AdmissionError, SchedulerError
from .core.explain import Explanation
from .core.snapshot import Reservation, Snapshot, TaskInfo
from .core.types import CoreConfig, ResourceConfig, TaskSpec
from .runtime.checkpoints import DEFAULT_MAX_CHECKPOINT_BYTES
from .runtime.clock import Clock
from .runtime.events import EventBuffer, EventSink
from .runtime.handle import TaskHandle
from .runtime.listing import RecurringInfo
from .runtime import process as _process
from .runtime.pool import Pool
from .runtime.portal import Portal, PortalState
from .runtime.scheduler import Scheduler, configuration_of, fresh_copy
from .store.base import Store
from .store.codec import Codec

__all__ = ["BlockingScheduler", "BlockingHandle", "BlockingEventStream", "schedulers"]

log = logging.getLogger("cronoq.scheduler")

_T = TypeVar("_T")


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


# Every BlockingScheduler that may be serving, for the exit hook.
_live: weakref.WeakSet[BlockingScheduler] = weakref.WeakSet()
# Every BlockingScheduler of this process (and those it inherited through a fork), for server hooks.
_made: weakref.WeakSet[BlockingScheduler] = weakref.WeakSet()


def schedulers() -> list[BlockingScheduler]:
    """Every ``BlockingScheduler`` this process holds, those a fork's child
    inherited from its parent included: for server hooks that start or stop
    them all (``cronoq.contrib.gunicorn``)."""
    return list(_made)


# ---------------------------------------------------------------- interpreter exit

_exit_hook_lock = threading.Lock()
_exit_hook_registered = False
# How long interpreter exit waits, beyond the grace and a store's commit timeout,
# for a scheduler to stop (a loop blocked by an executor would never stop).
_EXIT_MARGIN = 10.0


def _register_exit_hook() -> None:
    """Shut schedulers down at interpreter exit, before the interpreter joins
    its non-daemon threads (one may wait for a task's result) and before
    ``concurrent.futures`` shuts its thread pools down."""
    global _exit_hook_registered
    with _exit_hook_lock:
        if _exit_hook_registered:
            return
        # Both happen in threading._shutdown, before atexit's hooks, and no public
        # API runs a hook that early (python/cpython#86128): this private one is
        # what concurrent.futures itself uses. Where it is missing, or refuses
        # (the interpreter already shuts down), atexit still stops the
        # schedulers, only after those threads were joined.
        register = getattr(threading, "_register_atexit", None)
        try:
            if register is None:
                raise RuntimeError("threading._register_atexit is not available")
            register(_shutdown_at_exit)
        except RuntimeError:
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
    serving = (PortalState.STARTING, PortalState.RUNNING)
    if any(not bs._forked() and bs._portal.state in serving for bs in list(_live)):
        log.info("SIGTERM: exiting; the schedulers shut down first", extra={"action": "sigterm"})
        raise SystemExit(128 + signum)
    os.kill(os.getpid(), signum)   # nothing to shut down: the default action


def _shutdown_at_exit() -> None:
    schedulers = [bs for bs in list(_live) if not bs._forked()]
    for bs in schedulers:       # all stop at once: the graces overlap
        bs._portal.request_stop(bs._sched.shutdown)
    for bs in schedulers:
        bs._wait_stopped_at_exit()


# ---------------------------------------------------------------- the facade


class BlockingScheduler:
    """A thread-safe, synchronous scheduler with the options of ``Scheduler``.

    ``start()`` (or ``with``) runs the scheduler on a private event loop
    thread; ``shutdown()`` stops it (also done at interpreter exit). Calls
    from the scheduler's own loop thread (that is, from inside an async
    executor) raise ``SchedulerError``: use the async API there.

    Each method is the ``Scheduler`` method of the same name, called on that
    loop through a ``Portal`` (``cronoq.runtime.portal``); ``submit``,
    ``enqueue``, ``snapshot`` and ``subscribe`` do their work on the calling
    thread instead, through the scheduler's entry points for threads.
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
        self._portal = Portal("BlockingScheduler", "cronoq-scheduler")
        self._lifecycle = threading.Lock()     # one start at a time
        self._forks = _process.forks
        self._pid = os.getpid()
        self._fork_hook = _process.after_fork(self._after_fork)
        _made.add(self)
        # Here too: a server that starts it on a request thread (waitress) imported it on the main thread.
        _exit_on_sigterm()

    def ensure_started(self) -> BlockingScheduler:
        """Start it unless it runs in this process (new, or inherited through
        a fork); returns it. ``SchedulerError`` if it was shut down here."""
        if self._forks != _process.forks:
            self._adopt()
        elif self._portal.state is not PortalState.RUNNING:
            with self._lifecycle:
                if self._portal.state is PortalState.NEW:
                    self._start_locked()
            self._portal.check()
        return self

    @property
    def scheduler(self) -> Scheduler:
        """The async ``Scheduler`` underneath (use it only from its loop). In
        a fork's child, the one started there (not the parent's copy)."""
        self._portal_here()
        return self._sched

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._portal.loop

    @property
    def running(self) -> bool:
        return self._portal.state is PortalState.RUNNING and self._sched.running and not self._forked()

    @property
    def state_here(self) -> str:
        """``"new"``, ``"starting"``, ``"running"``, ``"stopping"`` or
        ``"stopped"`` in this process; ``"inherited"`` for a scheduler a
        fork's child holds from its parent (its first call starts it here)."""
        return "inherited" if self._forked() else self._portal.state.value

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

    def _start_locked(self) -> None:
        """start(), holding the lifecycle lock."""
        _register_exit_hook()
        _live.add(self)
        try:
            # Interrupted (Ctrl-C while a standby waits), it stops without a grace.
            self._portal.start(self._sched.start, functools.partial(self._sched.shutdown, 0.0))
        except BaseException:
            if self._portal.state in (PortalState.NEW, PortalState.STOPPED):   # not "already started"
                _live.discard(self)
            raise
        _exit_on_sigterm()

    def shutdown(self, grace: float | None = None) -> None:
        """Stop admitting, let running attempts finish for ``grace`` seconds,
        cancel the rest, and stop the loop thread. A standby that waits to
        lead stops waiting. Calls still in flight get ``SchedulerError``."""
        self._portal.check_thread()     # the loop thread must never wait for itself
        if self._forks != _process.forks:
            return   # inherited through a fork and never started here: nothing runs in this process
        try:
            self._portal.stop(functools.partial(self._sched.shutdown, grace))
        finally:
            if self._portal.state is PortalState.STOPPED:
                _live.discard(self)

    def _adopt(self) -> None:
        """In a fork's child: start afresh here (once, whichever thread comes first)."""
        with self._lifecycle:
            if self._forks == _process.forks:
                return
            self._sched = fresh_copy(self._sched)
            self._portal = Portal("BlockingScheduler", "cronoq-scheduler")
            self._pid = os.getpid()
            self._start_locked()
            # Only now: the other threads of the child wait above (on the lock)
            # until it serves, instead of being told it is starting.
            self._forks = _process.forks

    def _after_fork(self) -> None:
        # In the child of a fork: a thread of the parent may have held it. (The
        # parent's portal is never used here: the first call makes a new one.)
        self._lifecycle = threading.Lock()

    def _forked(self) -> bool:
        return self._forks != _process.forks

    def _portal_here(self) -> Portal:
        """The portal of this process: a scheduler inherited through a fork
        starts here first. Read ``self._sched`` after this call, not before
        (starting here replaces it): in ``self._portal_here().call(self._sched.x)``
        Python evaluates the portal before the argument."""
        if self._forks != _process.forks:
            self._portal.check_thread()
            self._adopt()
        return self._portal

    def _at_exit(self) -> None:
        """What interpreter exit does for this scheduler."""
        if not self._forked():
            self._portal.request_stop(self._sched.shutdown)
            self._wait_stopped_at_exit()

    def _wait_stopped_at_exit(self) -> None:
        thread = self._portal.thread
        if thread is None or thread is threading.current_thread():
            return
        store = self._sched.store
        commit_timeout = float(store.commit_timeout) if store is not None else 0.0
        limit = self._sched.shutdown_grace + commit_timeout + _EXIT_MARGIN
        thread.join(limit)
        if thread.is_alive():
            log.error("the scheduler did not stop within %g s at interpreter exit (is an async executor "
                      "blocking its loop?); exiting without it", limit, extra={"action": "exit_timeout"})
        else:
            _live.discard(self)

    def __enter__(self) -> BlockingScheduler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<cronoq.BlockingScheduler {'running' if self.running else 'stopped'}>"

    # ================================================================ on the calling thread

    def _post(self, spec: TaskSpec, want_handle: bool) -> Any:
        """Submit on this thread (see ``Scheduler.submit_from_thread``): the
        engine answers at once; the loop is needed only to wait for a
        commit, or for room in a full queue."""
        portal = self._portal_here()
        portal.check()
        value, later = self._sched.submit_from_thread(spec, handle=want_handle,
                                                      wrap=BlockingHandle if want_handle else None)
        if later is not None:
            value = portal.call(later)
        return value if want_handle else value[0]

    def submit(self, payload: Any = None, **options: Any) -> BlockingHandle:
        """Submit a task; returns a ``BlockingHandle`` (``.result(timeout)``)."""
        handle: BlockingHandle = self._post(TaskSpec(payload, **options), True)
        return handle

    def enqueue(self, payload: Any = None, **options: Any) -> int:
        task_id: int = self._post(TaskSpec(payload, **options), False)
        return task_id

    def snapshot(self) -> Snapshot:
        self._portal_here().check()
        return self._sched.snapshot_from_thread()

    def events(self, on_lag: str = "drop") -> BlockingEventStream:
        """A blocking iterator of status events; close it (or use ``with``)."""
        self._portal_here().check()
        stream = BlockingEventStream(self._sched.event_capacity, on_lag, self)
        self._sched.subscribe(stream)
        return stream

    def subscribe(self, sink: EventSink) -> None:
        self._portal_here().check()
        self._sched.subscribe(sink)

    def unsubscribe(self, sink: EventSink) -> None:
        self._sched.unsubscribe(sink)

    def on_desired(self, listener: Callable[[str, int], None]) -> Callable[[], None]:
        return self._sched.on_desired(listener)

    def add_submit_hook(self, hook: Callable[[TaskSpec], TaskSpec]) -> Callable[[], None]:
        return self._sched.add_submit_hook(hook)

    def add_admission_listener(
            self, listener: Callable[[int, Sequence[TaskSpec], Sequence[tuple[int, bool]] | None,
                                      AdmissionError | None], None]) -> Callable[[], None]:
        return self._sched.add_admission_listener(listener)

    def add_executor_middleware(
            self, middleware: Callable[[Callable[..., Any], bool], Callable[..., Any]]) -> Callable[[], None]:
        return self._sched.add_executor_middleware(middleware)

    # ================================================================ on the loop, through the portal

    def call(self, coro_fn: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``await coro_fn()`` on the scheduler's loop and return its
        result (in a copy of this thread's context). A call in flight when the
        scheduler stops raises ``SchedulerError``. For an answer that
        ``Scheduler.submit_from_thread`` leaves to the loop, say."""
        return self._portal_here().call(coro_fn)

    def submit_batch(self, tasks: Iterable[TaskSpec]) -> list[BlockingHandle]:
        return [BlockingHandle(h) for h in self._portal_here().call(self._sched.submit_batch, list(tasks))]

    def enqueue_batch(self, tasks: Iterable[TaskSpec]) -> list[int]:
        return self._portal_here().call(self._sched.enqueue_batch, list(tasks))

    def cancel(self, ref: int | str) -> bool:
        return self._portal_here().call(self._sched.cancel, ref)

    def handle(self, ref: int | str) -> BlockingHandle:
        return BlockingHandle(self._portal_here().call(self._sched.handle, ref))

    def info(self, ref: int | str) -> TaskInfo:
        return self._portal_here().call(self._sched.info, ref)

    def explain(self, ref: int | str) -> Explanation:
        return self._portal_here().call(self._sched.explain, ref)

    def reservations(self, ahead: float, pools: Iterable[str] | None = None) -> list[Reservation]:
        return self._portal_here().call(self._sched.reservations, ahead, None if pools is None else list(pools))
    def dependents(self, ref: int | str) -> list[tuple[int, str]]:
        return self._portal_here().call(self._sched.dependents, ref)

    def set_capacity(self, pool: str, capacity: int) -> None:
        self._portal_here().call(self._sched.set_capacity, pool, capacity)

    def set_group_capacity(self, pool: str, labels: dict[str, str], capacity: int) -> None:
        self._portal_here().call(self._sched.set_group_capacity, pool, labels, capacity)

    def add_recurring(self, name: str, cron: str, payload: Any = None, *, tz: str = "UTC",
                      overlap: str = "skip", tolerance: float | None = None,
                      on_miss: str | None = None, key: str | None = None,
                      **task_options: Any) -> None:
        self._portal_here().call(self._sched.add_recurring, name, cron, payload, tz=tz, overlap=overlap,
                                 tolerance=tolerance, on_miss=on_miss, key=key, **task_options)

    def remove_recurring(self, name: str) -> bool:
        return self._portal_here().call(self._sched.remove_recurring, name)

    def list_tasks(self, *, pools: Iterable[str] | None = None, statuses: Iterable[str] | None = None,
                   after: int = 0, limit: int = 100, newest_first: bool = False,
                   before: int = 0) -> list[TaskInfo]:
        return self._portal_here().call(self._sched.list_tasks, pools=pools, statuses=statuses, after=after,
                                        limit=limit, newest_first=newest_first, before=before)

    def recurring(self) -> list[RecurringInfo]:
        return self._portal_here().call(self._sched.recurring)


def _share_docstrings() -> None:
    """A twin that says nothing of its own says what its ``Scheduler`` method says."""
    for name, twin in vars(BlockingScheduler).items():
        original = None if name.startswith("_") else getattr(Scheduler, name, None)
        if original is not None and inspect.isfunction(twin) and not twin.__doc__:
            twin.__doc__ = original.__doc__


_share_docstrings()


def fresh_blocking_copy(blocking: BlockingScheduler) -> BlockingScheduler:
    """A new, unstarted ``BlockingScheduler`` with ``blocking``'s
    configuration, submit hooks and executor middleware (and the same store
    object), as a fork's child gets. A shut-down one cannot start again:
    ``cronoq_compat`` restarts the legacy scheduler with one of these."""
    pools, resources, emit_transitions, options = configuration_of(blocking._sched)
    copy_ = BlockingScheduler(pools, resources, emit_transitions, **options)
    copy_._sched = fresh_copy(blocking._sched)
    return copy_
