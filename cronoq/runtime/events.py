"""Status event streams: a bounded buffer per subscriber."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable, Protocol

from ..core.actions import StatusEvent
from ..core.errors import EventsLagged

__all__ = ["EventBuffer", "EventSink", "EventStream"]


class EventSink(Protocol):
    """What receives a scheduler's status events (``Scheduler.subscribe``):
    both methods are called on the scheduler's loop thread."""

    def deliver(self, event: StatusEvent) -> None:
        """One event (never blocks)."""

    def end(self) -> None:
        """The scheduler stopped: no more events."""


class EventBuffer:
    """The buffering rules every event stream shares: at most ``capacity``
    events, the oldest dropped (and counted in ``lagged``) when full; with
    ``on_lag="raise"`` the next read after a loss raises ``EventsLagged``."""

    def __init__(self, capacity: int, on_lag: str) -> None:
        if on_lag not in ("drop", "raise"):
            raise ValueError(f"on_lag must be 'drop' or 'raise', got {on_lag!r}")
        self._buffer: deque[StatusEvent] = deque()
        self._capacity = capacity
        self._raise = on_lag == "raise"
        self._unreported = 0
        self.lagged = 0
        self.closed = False

    def _store(self, event: StatusEvent) -> None:
        buffer = self._buffer
        if len(buffer) >= self._capacity:
            buffer.popleft()
            self.lagged += 1
            self._unreported += 1
        buffer.append(event)

    def _take(self) -> StatusEvent | None:
        """The next buffered event, or None; raises EventsLagged first if due."""
        if self._unreported and self._raise:
            skipped, self._unreported = self._unreported, 0
            raise EventsLagged(skipped)
        if self._buffer:
            return self._buffer.popleft()
        return None


class EventStream(EventBuffer):
    """An async iterator of ``StatusEvent``.

    It buffers up to ``capacity`` events; a consumer that falls behind loses
    the oldest ones, counted in ``lagged``. With ``on_lag="raise"`` the next
    iteration after a loss raises ``EventsLagged`` (iterating again continues
    with what is buffered). The stream ends when the scheduler shuts down or
    the stream is closed.
    """

    def __init__(self, capacity: int, on_lag: str, detach: Callable[[EventStream], object]) -> None:
        super().__init__(capacity, on_lag)
        self._waiter: asyncio.Future[None] | None = None
        self._detach = detach

    def deliver(self, event: StatusEvent) -> None:
        """From the scheduler: buffer one event."""
        self._store(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def end(self) -> None:
        """From the scheduler: it stopped."""
        self.closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        """Stop receiving events; buffered ones can still be read."""
        if not self.closed:
            self._detach(self)
            self.end()

    async def aclose(self) -> None:
        self.close()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> StatusEvent:
        while True:
            event = self._take()
            if event is not None:
                return event
            if self.closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
