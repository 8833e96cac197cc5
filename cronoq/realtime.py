"""Real time, whatever the program's clock says.

cronoq keeps two kinds of time apart:

- scheduling time (fixed starts, deadlines, aging, cron, backoff, metric
  windows) follows the wall clock the program sees, ``time.time_ns()``, so
  that a test that freezes or moves time (freezegun, time-machine) moves the
  schedule with it;
- protective time (shutdown grace, commit timeouts, store leases and their
  renewals, waits with a timeout, the sleeps of legacy tasks) is real time
  that nothing can stop, so that a frozen clock never hangs a program and
  never lets a lease lapse.

This module is the second kind. It reads the operating system's clocks
through ``time.clock_gettime_ns``, which clock-freezing libraries leave alone
(freezegun does not patch it), and falls back to the functions captured when
cronoq was imported. Its timers run on the event loop's own timers when the
loop's clock is real; when a frozen clock has stopped the loop's clock too, a
single daemon thread keeps the time and wakes the loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import sys
import threading
import time
import types
from typing import Any, Callable

__all__ = [
    "real_monotonic", "real_monotonic_ns", "real_time_ns", "wall_clock_is_real", "loop_clock_is_real",
    "call_later", "sleep", "wait_for", "RealTimeEventLoop", "new_event_loop",
]

NS = 1_000_000_000


def _pick_clocks() -> tuple[Callable[[], int], Callable[[], int]]:
    if hasattr(time, "clock_gettime_ns") and hasattr(time, "CLOCK_MONOTONIC"):
        gettime = time.clock_gettime_ns
        mono_id, wall_id = time.CLOCK_MONOTONIC, time.CLOCK_REALTIME
        return (lambda: gettime(mono_id)), (lambda: gettime(wall_id))
    # No clock_gettime (Windows): the functions as they are now, or freezegun's
    # own copies of the real ones when cronoq is imported inside a frozen test.
    api = sys.modules.get("freezegun.api")
    mono = getattr(api, "real_monotonic_ns", None) or time.monotonic_ns
    wall = getattr(api, "real_time_ns", None) or time.time_ns
    return mono, wall


real_monotonic_ns, real_time_ns = _pick_clocks()


def real_monotonic() -> float:
    """Seconds on the real monotonic clock (the default event loop's clock)."""
    return real_monotonic_ns() / NS


_BUILTIN = types.BuiltinFunctionType
_DRIFT_NS = NS // 2


def wall_clock_is_real() -> bool:
    """False while the program's ``time.time_ns`` is replaced (freezegun) or
    disagrees with the system's real-time clock (time-machine)."""
    now = time.time_ns
    if not isinstance(now, _BUILTIN):
        return False
    now_ns: int = now()
    return abs(now_ns - real_time_ns()) < _DRIFT_NS


def loop_clock_is_real(loop: asyncio.AbstractEventLoop) -> bool:
    """Does ``loop.time()`` move with real time? (Not under freezegun
    without ``real_asyncio=True``: the default loops read ``time.monotonic``.)"""
    if isinstance(loop, RealTimeEventLoop):
        return True
    return abs(loop.time() - real_monotonic()) < 0.5


class RealTimeEventLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is always real (cronoq's own loop threads)."""

    def time(self) -> float:
        return real_monotonic_ns() / NS


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A loop for a thread cronoq owns: timers and sleeps in real time."""
    return RealTimeEventLoop()


# ---------------------------------------------------------------- timers


class _Timer:
    __slots__ = ("loop", "callback", "cancelled", "handle")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], Any]) -> None:
        self.loop = loop
        self.callback = callback
        self.cancelled = False
        self.handle: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.handle is not None:
            self.handle.cancel()

    def _fire(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.callback()


class _Ticker:
    """One daemon thread that wakes loops whose own clock stands still."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[int, int, _Timer]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, deadline_ns: int, timer: _Timer) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline_ns, next(self._seq), timer))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="cronoq-realtime", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        heap = self._heap
        cond = self._cond
        while True:
            with cond:
                while heap and heap[0][2].cancelled:
                    heapq.heappop(heap)
                if not heap:
                    cond.wait()
                    continue
                delay = (heap[0][0] - real_monotonic_ns()) / NS
                if delay > 0:
                    cond.wait(delay)
                    continue
                _, _, timer = heapq.heappop(heap)
            try:
                timer.loop.call_soon_threadsafe(timer._fire)
            except RuntimeError:   # the loop closed meanwhile
                pass

    def _after_fork(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap = []
        self._thread = None


_ticker = _Ticker()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ticker._after_fork)


def call_later(delay: float, callback: Callable[[], Any],
               loop: asyncio.AbstractEventLoop | None = None) -> _Timer:
    """Run ``callback`` on ``loop`` (the running loop by default) after
    ``delay`` real seconds. Returns an object with ``cancel()``."""
    if loop is None:
        loop = asyncio.get_running_loop()
    timer = _Timer(loop, callback)
    if loop_clock_is_real(loop):
        timer.handle = loop.call_later(max(delay, 0.0), timer._fire)
    else:
        _ticker.add(real_monotonic_ns() + int(max(delay, 0.0) * NS), timer)
    return timer


async def sleep(seconds: float) -> None:
    """``asyncio.sleep`` in real time."""
    loop = asyncio.get_running_loop()
    if loop_clock_is_real(loop):
        await asyncio.sleep(seconds)
        return
    future = loop.create_future()

    def wake() -> None:
        if not future.done():
            future.set_result(None)

    timer = call_later(seconds, wake, loop)
    try:
        await future
    finally:
        timer.cancel()


async def wait_for(awaitable: Any, timeout: float | None) -> Any:
    """``asyncio.wait_for`` with a real-time timeout (``asyncio.TimeoutError``)."""
    loop = asyncio.get_running_loop()
    if timeout is None or loop_clock_is_real(loop):
        return await asyncio.wait_for(awaitable, timeout)
    task = asyncio.ensure_future(awaitable)
    expired = False

    def expire() -> None:
        nonlocal expired
        if not task.done():
            expired = True
            task.cancel()

    timer = call_later(timeout, expire, loop)
    try:
        return await task
    except asyncio.CancelledError:
        if expired:
            raise asyncio.TimeoutError() from None
        raise
    finally:
        timer.cancel()
