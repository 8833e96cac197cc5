"""Where the runtime gets its time from.

The engine only ever sees integer Unix nanoseconds; the runtime asks a clock
for the current time and for a callback at a given time. ``SystemClock`` uses
the wall clock the program sees (frozen in tests that freeze time) and the
event loop's timers. ``VirtualClock`` keeps time of its
own that tests move forward, so a one-hour backoff or a week of cron runs in
milliseconds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import threading
import time
import weakref
from typing import Callable, Protocol

from ..core.types import NS
from .. import realtime

__all__ = ["Clock", "SystemClock", "VirtualClock"]


class Cancellable(Protocol):
    """What ``Clock.call_at`` returns: a wake-up that can be called off."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    def now_ns(self) -> int:
        """The current time in Unix nanoseconds."""

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> Cancellable:
        """Run ``callback`` on the running loop at ``when_ns``; returns an
        object with ``cancel()``."""

    async def sleep(self, seconds: float) -> None:
        """Sleep in this clock's time."""


class SystemClock:
    """The wall clock the program sees, ``time.time_ns()``.

    Wake-ups use the event loop's timers. While the program's clock is
    patched (freezegun, time-machine), a wake-up is instead checked every
    ``poll_interval`` real seconds against the patched clock, so that moving
    frozen time makes what is due happen within about that interval.
    ``patched_time`` forces either way (None: look at ``time.time_ns`` at
    each wake-up it arms).
    """

    def __init__(self, *, patched_time: bool | None = None, poll_interval: float = 0.01) -> None:
        if patched_time is not None and not isinstance(patched_time, bool):
            raise ValueError(f"patched_time must be True, False or None, got {patched_time!r}")
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) \
                or not 0 < poll_interval <= 60:
            raise ValueError(f"poll_interval must be a number of seconds in (0, 60], got {poll_interval!r}")
        self.patched_time = patched_time
        self.poll_interval = float(poll_interval)

    def now_ns(self) -> int:
        # Looked up at each call: a clock patched after start is the one seen.
        return time.time_ns()

    def _patched(self) -> bool:
        patched = self.patched_time
        return not realtime.wall_clock_is_real() if patched is None else patched

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> Cancellable:
        loop = asyncio.get_running_loop()
        if self._patched():
            return _WallClockWatch(when_ns, callback, loop, self.poll_interval)
        return realtime.call_later((when_ns - time.time_ns()) / NS, callback, loop)

    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        timer = self.call_at(time.time_ns() + int(seconds * NS), wake)
        try:
            await future
        finally:
            timer.cancel()


class _WallClockWatch:
    """A wake-up at a time of a patched wall clock: checked in real time."""

    __slots__ = ("when_ns", "callback", "loop", "interval", "timer", "cancelled")

    def __init__(self, when_ns: int, callback: Callable[[], None], loop: asyncio.AbstractEventLoop,
                 interval: float) -> None:
        self.when_ns = when_ns
        self.callback = callback
        self.loop = loop
        self.interval = interval
        self.cancelled = False
        self.timer: Cancellable | None = None
        self._check()

    def _check(self) -> None:
        if self.cancelled:
            return
        if time.time_ns() >= self.when_ns:
            self.cancelled = True
            # Through the loop, never inline: call_at's caller is not ready for it.
            self.timer = realtime.call_later(0, self.callback, self.loop)
            return
        self.timer = realtime.call_later(self.interval, self._check, self.loop)

    def cancel(self) -> None:
        self.cancelled = True
        if self.timer is not None:
            self.timer.cancel()


class _VirtualTimer:
    __slots__ = ("callback", "cancelled", "loop")

    def __init__(self, callback: Callable[[], None], loop: asyncio.AbstractEventLoop | None) -> None:
        self.callback = callback
        self.cancelled = False
        self.loop = loop

    def cancel(self) -> None:
        self.cancelled = True


async def _settle(rounds: int) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def _fire_and_settle(callback: Callable[[], None], rounds: int) -> None:
    callback()
    await _settle(rounds)


class VirtualClock:
    """Time that moves only when told to.

    ``await clock.advance(seconds)`` runs every callback due in that span, in
    time order, letting the loop run between them, so executors that
    ``await clock.sleep(...)`` and the scheduler's timers interleave as they
    would in real time. A callback armed from another event loop (a
    ``BlockingScheduler``'s thread) runs on that loop. From a thread with no
    running loop (a test driving ``BlockingScheduler`` or legacy code), use
    ``clock.advance_blocking(seconds)``.
    """

    def __init__(self, start: float = 1_767_225_600.0) -> None:
        self._now = int(start * NS)
        self._timers: list[tuple[int, int, _VirtualTimer]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()    # timers are armed from loop threads too
        self._loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

    def now_ns(self) -> int:
        return self._now

    def now(self) -> float:
        return self._now / NS

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> _VirtualTimer:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        timer = _VirtualTimer(callback, loop)
        with self._lock:
            if loop is not None:
                self._loops.add(loop)
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
        with self._lock:
            return sum(1 for _, _, t in self._timers if not t.cancelled)

    def next_timer(self) -> float | None:
        with self._lock:
            for when, _, timer in sorted(self._timers):
                if not timer.cancelled:
                    return when / NS
        return None

    async def settle(self, rounds: int = 20) -> None:
        """Let ready tasks on the loop run."""
        await _settle(rounds)

    def _pop_due(self, target: int) -> _VirtualTimer | None:
        with self._lock:
            timers = self._timers
            while timers and timers[0][0] <= target:
                when, _, timer = heapq.heappop(timers)
                if timer.cancelled:
                    continue
                if when > self._now:
                    self._now = when
                return timer
        return None

    def _other_loops(self, current: asyncio.AbstractEventLoop | None) -> list[asyncio.AbstractEventLoop]:
        with self._lock:
            return [loop for loop in self._loops if loop is not current and not loop.is_closed()]

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing what falls due on the way."""
        target = self._now + int(seconds * NS)
        loop = asyncio.get_running_loop()
        await self.settle()
        while (timer := self._pop_due(target)) is not None:
            if timer.loop is None or timer.loop is loop:
                timer.callback()
                await self.settle()
            elif not timer.loop.is_closed():
                await asyncio.wrap_future(self._run_on(timer))
        with self._lock:
            self._now = max(self._now, target)
        await self.settle()

    def advance_blocking(self, seconds: float) -> None:
        """``advance`` for code that runs schedulers on their own loop
        threads (``BlockingScheduler``, legacy code), called from a thread
        with no running event loop. Callbacks run on the loop that armed them."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("advance_blocking() was called on a running event loop: "
                               "await clock.advance(seconds) there")
        target = self._now + int(seconds * NS)
        self._settle_others(None)
        while (timer := self._pop_due(target)) is not None:
            if timer.loop is None:
                timer.callback()          # armed outside any loop: run it here
                continue
            if timer.loop.is_closed():
                continue                  # its scheduler is gone
            self._run_on(timer).result()
            self._settle_others(timer.loop)
        with self._lock:
            self._now = max(self._now, target)
        self._settle_others(None)

    def _run_on(self, timer: _VirtualTimer) -> concurrent.futures.Future[None]:
        assert timer.loop is not None   # callers run loop-less timers themselves
        return asyncio.run_coroutine_threadsafe(_fire_and_settle(timer.callback, 20), timer.loop)

    def _settle_others(self, done: asyncio.AbstractEventLoop | None) -> None:
        for loop in self._other_loops(done):
            try:
                asyncio.run_coroutine_threadsafe(_settle(20), loop).result()
            except RuntimeError:
                pass
