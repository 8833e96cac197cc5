"""Taking a snapshot of a scheduler from whatever thread a metrics system calls us on.

A scrape (prometheus-client's HTTP thread, an OpenTelemetry reader thread, an
ASGI handler on the scheduler's own loop) asks for one ``Snapshot``. On the
scheduler's loop thread it is read synchronously; from any other thread it is
taken on the loop with ``asyncio.run_coroutine_threadsafe`` and waited for at
most ``timeout`` seconds. Nothing here runs per task.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging

from ..core.errors import SchedulerError
from ..core.snapshot import Snapshot

__all__ = ["resolve", "take_snapshot"]

log = logging.getLogger("cronoq.telemetry")


def resolve(scheduler):
    """The asyncio ``Scheduler`` behind a ``Scheduler`` or a ``BlockingScheduler``."""
    from ..blocking import BlockingScheduler
    from ..runtime.scheduler import Scheduler

    if isinstance(scheduler, BlockingScheduler):
        return scheduler.scheduler
    if isinstance(scheduler, Scheduler):
        return scheduler
    raise TypeError(f"expected a cronoq.Scheduler or a cronoq.BlockingScheduler, "
                    f"got {type(scheduler).__name__}")


def take_snapshot(sched, timeout: float) -> Snapshot | None:
    """A snapshot of ``sched`` (an asyncio ``Scheduler``), or None when it is
    not serving (not started, stopped, its loop closed) or did not answer
    within ``timeout`` seconds."""
    loop = sched._loop
    if loop is None or not sched.running or loop.is_closed():
        return None
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        # On the loop thread (an ASGI handler, a callback): read it directly
        # (the scheduler carries out whatever the engine queued meanwhile).
        return sched._snapshot_now()
    try:
        future = asyncio.run_coroutine_threadsafe(sched.snapshot(), loop)
    except RuntimeError:   # the loop closed in the meantime
        return None
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        log.warning("the scheduler did not answer a metrics snapshot within %g s", timeout,
                    extra={"action": "snapshot_timeout"})
        return None
    except (SchedulerError, RuntimeError, concurrent.futures.CancelledError):
        return None
