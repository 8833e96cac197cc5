"""``Worker``: one thread that runs a store's blocking calls in order, and
the fork gate those calls hold. Apart from the SQL stores, so that the
runtime's cluster loop uses it without loading SQLAlchemy."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import threading
from typing import Any, Callable, TypeVar

__all__ = ["Worker", "fork_gate"]

_T = TypeVar("_T")

# What the worker thread runs: (future to resolve, function, arguments).
_WorkItem = tuple["asyncio.Future[Any] | concurrent.futures.Future[Any]", Callable[..., Any], tuple[Any, ...]]


def _resolve(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if not future.done():   # the caller may have given up (cancelled) meanwhile
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)


class _ForkGate:
    """Database calls in flight hold it shared; a fork waits until none is.

    SQLite keeps per-process bookkeeping of the file locks its connections
    hold: a fork taken while a thread of the parent is inside a transaction
    copies locks the child can never release, and the child's own connections
    then wait on them forever (gunicorn --preload with a scheduler started at
    import). Waiting for a quiet moment is bounded (``FORK_WAIT``)."""

    FORK_WAIT = 30.0

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._busy = 0

    def enter(self) -> None:
        with self._cond:
            self._busy += 1

    def leave(self) -> None:
        with self._cond:
            self._busy -= 1
            if self._busy == 0:
                self._cond.notify_all()

    def before_fork(self) -> None:
        self._cond.acquire()    # held across the fork: no call starts meanwhile
        self._cond.wait_for(lambda: self._busy == 0, timeout=self.FORK_WAIT)

    def after_fork_in_parent(self) -> None:
        self._cond.release()

    def after_fork_in_child(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._busy = 0   # the parent's threads are not in this process


fork_gate = _ForkGate()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=fork_gate.before_fork, after_in_parent=fork_gate.after_fork_in_parent,
                        after_in_child=fork_gate.after_fork_in_child)


class Worker:
    """One thread that runs a store's blocking database calls, in order.

    Lighter than a ``ThreadPoolExecutor`` round trip (the write path makes one
    per commit): the thread hands the result straight back to the loop. It is a
    daemon, so a store that was never closed does not hold up interpreter exit
    (a transaction cut short there is rolled back by the database).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[_WorkItem | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._busy = threading.Lock()   # held while a call runs (on the thread, or in run_here)

    def _put(self, item: _WorkItem) -> None:
        if self._stopped:
            raise RuntimeError(f"{self.name} is shut down")
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
            self._thread.start()
        self._queue.put(item)

    @property
    def started(self) -> bool:
        """Whether its thread was started (by a first call)."""
        return self._thread is not None

    def call(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        """Run ``fn(*args)`` on the thread; an asyncio future of the running loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        self._put((future, fn, args))
        return future

    def submit(self, fn: Callable[..., _T], *args: Any) -> concurrent.futures.Future[_T]:
        """Run ``fn(*args)`` on the thread, from any thread."""
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._put((future, fn, args))
        return future

    def run_here(self, fn: Callable[..., bool], *args: Any) -> bool:
        """Run ``fn(*args)`` on the calling thread if the worker is idle (no
        call running or queued), so it keeps their order; False, without
        calling ``fn``, if it is not. Returns what ``fn`` returns."""
        if self._stopped or not self._busy.acquire(False):
            return False
        try:
            if not self._queue.empty():
                return False
            fork_gate.enter()
            try:
                return fn(*args)
            finally:
                fork_gate.leave()
        finally:
            self._busy.release()

    def shutdown(self) -> None:
        """Stop the thread once the calls already queued are done."""
        if not self._stopped:
            self._stopped = True
            if self._thread is not None:
                self._queue.put(None)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            value: Any
            with self._busy:
                fork_gate.enter()
                try:
                    ok, value = True, fn(*args)
                except BaseException as exc:
                    ok, value = False, exc
                finally:
                    fork_gate.leave()
            if isinstance(future, concurrent.futures.Future):
                if future.set_running_or_notify_cancel():
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
                continue
            try:
                future.get_loop().call_soon_threadsafe(_resolve, future, ok, value)
            except RuntimeError:   # the loop is closed: nobody waits any more
                pass
            del item, future, value
