"""``TaskHandle``: the awaitable result of a submitted task.

A handle is also an asyncio future as far as ``asyncio.gather``, ``wait``,
``as_completed``, ``wait_for`` and ``shield`` are concerned
(``asyncio.isfuture(handle)`` is true), so they use it directly instead of
wrapping each handle in a Task. Cancelling it (as they do when they are
cancelled or time out) cancels the current *wait*, never the task: the
callbacks registered so far see a cancelled future, and the next wait (an
``await``, another ``gather``) starts afresh, so a handle stays usable after
a timed-out ``wait_for``.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Generator
from typing import Any, Callable

from ..core.errors import TaskFailed

__all__ = ["TaskHandle"]

_PENDING, _OK, _FAILED = 0, 1, 2

# Done-callbacks due on each loop, in the order they fell due. One loop
# callback runs all those that fell due before it runs, instead of one
# loop callback (a Handle) per callback: gather puts one on every handle.
_Due = list[tuple["TaskHandle", Callable[["TaskHandle"], object], contextvars.Context]]
_due: dict[asyncio.AbstractEventLoop, _Due] = {}


def _forget_closed_loops() -> None:
    """Drop what fell due on loops closed before running it (asyncio drops
    its Handles with the loop): the table must not keep those loops. Loops
    of other threads add to the table meanwhile: iterate over a copy."""
    for loop in list(_due):
        if loop.is_closed():
            _due.pop(loop, None)


def _run_due(loop: asyncio.AbstractEventLoop) -> None:
    due = _due.pop(loop)
    for i in range(len(due)):
        handle, fn, context = due[i]
        try:
            context.run(fn, handle)
        except (SystemExit, KeyboardInterrupt):
            # It goes on to whoever runs the loop, as from a Handle; the rest still run.
            rest = due[i + 1:]
            if rest:
                later = _due.get(loop)
                if later is None:
                    loop.call_soon(_run_due, loop)
                    _due[loop] = rest
                else:
                    later[:0] = rest
            raise
        except BaseException as exc:  # noqa: B036 - as asyncio.Handle: reported, the loop goes on
            loop.call_exception_handler({"message": f"Exception in callback {fn!r}({handle!r})",
                                         "exception": exc, "handle": handle})


class TaskHandle:
    """Resolves to the executor's return value, or raises ``TaskFailed``.

    ``id`` is the task's id, ``key`` its key, ``duplicate`` whether the
    submission found an existing task with that key. Awaiting a handle never
    cancels the task; cancel it with ``Scheduler.cancel``.
    """

    # asyncio.isfuture() looks for this: gather and friends take the handle as a future.
    _asyncio_future_blocking = False

    __slots__ = ("id", "key", "duplicate", "_loop", "_state", "_value", "_waiters", "_callbacks", "_cancel",
                 "_notify")

    def __init__(self, task_id: int, key: str | None, duplicate: bool,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.id = task_id
        self.key = key
        self.duplicate = duplicate
        self._loop = loop
        self._state = _PENDING
        self._value: Any = None
        self._waiters: asyncio.Future[None] | list[asyncio.Future[None]] | None = None   # one per await
        # The future protocol: done-callbacks of the current wait, and whether
        # that wait was cancelled (with its message).
        self._callbacks: list[tuple[Callable[[TaskHandle], object], contextvars.Context | None]] | None = None
        self._cancel: tuple[Any] | None = None
        self._notify: list[Callable[[TaskHandle], Any]] | None = None

    # -- resolution (the scheduler's side, on its loop)

    def set_result(self, value: Any) -> None:
        """Resolve with the task's output (the scheduler calls this; the first
        resolution wins)."""
        if self._state:
            return
        self._state = _OK
        self._value = value
        self._wake()

    def set_failure(self, status: str, message: str | None) -> None:
        """Resolve as ended without a result: awaiting raises ``TaskFailed``
        (the scheduler calls this; the first resolution wins)."""
        if self._state:
            return
        self._state = _FAILED
        self._value = (status, message)
        self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        if waiters is not None:
            self._waiters = None
            for f in waiters if isinstance(waiters, list) else (waiters,):
                if not f.done():
                    f.set_result(None)
        if self._callbacks:
            self._run_callbacks()
        if self._notify:
            for callback in self._notify:
                callback(self)
            self._notify = None

    def _failure(self) -> TaskFailed:
        status, message = self._value
        return TaskFailed(status, message, self.id)

    def on_resolve(self, callback: Callable[[TaskHandle], Any]) -> None:
        """Call ``callback(handle)`` once resolved, on the thread that resolves
        it (the scheduler's loop), or at once if it is resolved. Safe from any
        thread, for waiters that are not coroutines (``BlockingHandle``): a
        callback added while the handle resolves may be called twice, so it
        must not mind (setting an event, say)."""
        notify = self._notify
        if notify is None:
            self._notify = notify = []
        notify.append(callback)
        if self._state:
            callback(self)

    # -- the user's side

    def done(self) -> bool:
        """Whether the task has ended (its outcome is known)."""
        self._cancel = None   # a cancelled wait is over: the next one starts afresh
        return self._state != _PENDING

    def result(self) -> Any:
        """The output of a finished task (raises ``TaskFailed`` if it failed,
        ``asyncio.InvalidStateError`` if it is still running, and
        ``CancelledError`` right after a wait on it was cancelled)."""
        if self._cancel is not None:
            raise self._make_cancelled_error()
        if self._state == _OK:
            return self._value
        if self._state == _FAILED:
            raise self._failure()
        raise asyncio.InvalidStateError(f"task {self.id} has not finished")

    @property
    def status(self) -> str | None:
        """The terminal status once finished (``None`` before)."""
        if self._state == _OK:
            return "succeeded"
        if self._state == _FAILED:
            status: str = self._value[0]
            return status
        return None

    def __await__(self) -> Generator[Any, None, Any]:
        self._cancel = None
        if not self._state:
            # One future per await: cancelling one awaiter (a wait_for that
            # timed out) must not cancel the others or later awaits.
            future: asyncio.Future[None] = self._loop.create_future()
            waiting = self._waiters
            if waiting is None:
                self._waiters = future
            elif isinstance(waiting, list):
                waiting[:] = [f for f in waiting if not f.done()]
                waiting.append(future)
            else:
                self._waiters = [future] if waiting.done() else [waiting, future]
            yield from future.__await__()
        return self.result()

    # -- the asyncio future protocol (gather, wait, as_completed, wait_for, shield)

    def _run_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, None
        if not callbacks:
            return
        loop = self._loop
        due = _due.get(loop)
        if due is None:
            if _due:
                _forget_closed_loops()
            due = []
            loop.call_soon(_run_due, loop)
            _due[loop] = due
        for fn, context in callbacks:
            # As call_soon would: a copy of the context at resolution, unless given.
            due.append((self, fn, contextvars.copy_context() if context is None else context))

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def add_done_callback(self, fn: Callable[[TaskHandle], object], *,
                          context: contextvars.Context | None = None) -> None:
        """As ``asyncio.Future.add_done_callback``, on the scheduler's loop:
        ``fn(handle)`` runs soon after the task ends (or this wait is cancelled)."""
        self._cancel = None
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append((fn, context))
        if self._state:
            self._run_callbacks()

    def remove_done_callback(self, fn: Callable[[TaskHandle], object]) -> int:
        callbacks = self._callbacks
        if not callbacks:
            return 0
        kept = [item for item in callbacks if item[0] != fn]
        self._callbacks = kept
        return len(callbacks) - len(kept)

    def cancel(self, msg: Any = None) -> bool:
        """Cancel the current wait on this handle (what ``gather`` and
        ``wait_for`` do when they are cancelled or time out): its callbacks
        see a cancelled future. The task is not cancelled: use
        ``Scheduler.cancel`` for that."""
        if self._state or self._cancel is not None:
            return False
        self._cancel = (msg,)
        self._run_callbacks()
        return True

    def cancelled(self) -> bool:
        """Whether the current wait on this handle was cancelled."""
        return self._cancel is not None

    def exception(self) -> BaseException | None:
        """As ``asyncio.Future.exception``: the ``TaskFailed`` of a failed
        task, None after a success."""
        if self._cancel is not None:
            raise self._make_cancelled_error()
        if self._state == _OK:
            return None
        if self._state == _FAILED:
            return self._failure()
        raise asyncio.InvalidStateError(f"task {self.id} has not finished")

    # asyncio.gather reads these of a cancelled child.
    @property
    def _cancel_message(self) -> Any:
        return None if self._cancel is None else self._cancel[0]

    def _make_cancelled_error(self) -> asyncio.CancelledError:
        message = self._cancel_message
        return asyncio.CancelledError() if message is None else asyncio.CancelledError(message)

    def __repr__(self) -> str:
        state = self.status or "pending"
        return f"TaskHandle(id={self.id}, key={self.key!r}, {state})"
