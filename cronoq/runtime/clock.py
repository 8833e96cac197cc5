"""Where the runtime gets its time from.

The engine only ever sees integer Unix nanoseconds; the runtime asks a clock
for the current time and for a callback at a given time. ``SystemClock`` uses
the wall clock and the event loop's timers. ``VirtualClock`` keeps time of its
own that tests move forward, so a one-hour backoff or a week of cron runs in
milliseconds.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Callable, Protocol

from ..core.types import NS

__all__ = ["Clock", "SystemClock", "VirtualClock"]


class Clock(Protocol):
    def now_ns(self) -> int:
        """The current time in Unix nanoseconds."""

    def call_at(self, when_ns: int, callback: Callable[[], None]):
        """Run ``callback`` on the running loop at ``when_ns``; returns an
        object with ``cancel()``."""

    async def sleep(self, seconds: float) -> None:
        """Sleep in this clock's time."""


class SystemClock:
    """Wall-clock time; wake-ups through the running loop's timers."""

    now_ns = staticmethod(time.time_ns)

    def call_at(self, when_ns: int, callback: Callable[[], None]):
        delay = (when_ns - time.time_ns()) / NS
        return asyncio.get_running_loop().call_later(delay if delay > 0 else 0, callback)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _VirtualTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """Time that moves only when told to.

    ``await clock.advance(seconds)`` runs every callback due in that span, in
    time order, letting the loop run between them, so executors that
    ``await clock.sleep(...)`` and the scheduler's timers interleave as they
    would in real time.
    """

    def __init__(self, start: float = 1_767_225_600.0) -> None:
        self._now = int(start * NS)
        self._timers: list[tuple[int, int, _VirtualTimer]] = []
        self._seq = itertools.count()

    def now_ns(self) -> int:
        return self._now

    def now(self) -> float:
        return self._now / NS

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> _VirtualTimer:
        timer = _VirtualTimer(callback)
        heapq.heappush(self._timers, (when_ns, next(self._seq), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        future = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        self.call_at(self._now + int(seconds * NS), wake)
        await future

    @property
    def pending(self) -> int:
        """Timers armed and not cancelled."""
        return sum(1 for _, _, t in self._timers if not t.cancelled)

    def next_timer(self) -> float | None:
        for when, _, timer in sorted(self._timers):
            if not timer.cancelled:
                return when / NS
        return None

    async def settle(self, rounds: int = 20) -> None:
        """Let ready tasks on the loop run."""
        for _ in range(rounds):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing what falls due on the way."""
        target = self._now + int(seconds * NS)
        await self.settle()
        timers = self._timers
        while timers and timers[0][0] <= target:
            when, _, timer = heapq.heappop(timers)
            if timer.cancelled:
                continue
            if when > self._now:
                self._now = when
            timer.callback()
            await self.settle()
        self._now = max(self._now, target)
        await self.settle()
