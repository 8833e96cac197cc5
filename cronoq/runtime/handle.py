"""``TaskHandle``: the awaitable result of a submitted task."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any, Callable

from ..core.errors import TaskFailed

__all__ = ["TaskHandle"]

_PENDING, _OK, _FAILED = 0, 1, 2


class TaskHandle:
    """Resolves to the executor's return value, or raises ``TaskFailed``.

    ``id`` is the task's id, ``key`` its key, ``duplicate`` whether the
    submission found an existing task with that key. Awaiting a handle never
    cancels the task; cancel it with ``Scheduler.cancel``.
    """

    __slots__ = ("id", "key", "duplicate", "_loop", "_state", "_value", "_future", "_callbacks")

    def __init__(self, task_id: int, key: str | None, duplicate: bool,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.id = task_id
        self.key = key
        self.duplicate = duplicate
        self._loop = loop
        self._state = _PENDING
        self._value: Any = None
        self._future: asyncio.Future[None] | list[asyncio.Future[None]] | None = None
        self._callbacks: list[Callable[[TaskHandle], Any]] | None = None

    # -- resolution (the scheduler's side, on its loop, as asyncio.Future's set_result)

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
        future = self._future
        if future is not None:
            self._future = None
            for f in future if isinstance(future, list) else (future,):
                if not f.done():
                    f.set_result(None)
        if self._callbacks:
            for callback in self._callbacks:
                callback(self)
            self._callbacks = None

    def add_done_callback(self, callback: Callable[[TaskHandle], Any]) -> None:
        """Call ``callback(handle)`` once resolved (at once if it already is),
        on the scheduler's loop."""
        if self._state:
            callback(self)
        elif self._callbacks is None:
            self._callbacks = [callback]
        else:
            self._callbacks.append(callback)

    # -- user side

    def done(self) -> bool:
        return self._state != _PENDING

    def result(self) -> Any:
        """The output of a finished task (raises ``TaskFailed`` if it failed,
        ``asyncio.InvalidStateError`` if it is still running)."""
        if self._state == _OK:
            return self._value
        if self._state == _FAILED:
            status, message = self._value
            raise TaskFailed(status, message, self.id)
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
        if not self._state:
            # One future per await: cancelling one awaiter (a wait_for that
            # timed out) must not cancel the others or later awaits.
            future: asyncio.Future[None] = self._loop.create_future()
            waiting = self._future
            if waiting is None:
                self._future = future
            elif isinstance(waiting, list):
                waiting[:] = [f for f in waiting if not f.done()]
                waiting.append(future)
            else:
                self._future = [future] if waiting.done() else [waiting, future]
            yield from future.__await__()
        return self.result()

    def __repr__(self) -> str:
        state = self.status or "pending"
        return f"TaskHandle(id={self.id}, key={self.key!r}, {state})"
