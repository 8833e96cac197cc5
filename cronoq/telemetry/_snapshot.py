"""Taking a snapshot of a scheduler from whatever thread a metrics system calls us on.

A scrape (prometheus-client's HTTP thread, an OpenTelemetry reader thread, an
ASGI handler on the scheduler's own loop) asks for one ``Snapshot``; the
scheduler reads it under its lock, on the calling thread, so a scrape never
waits for the loop. Nothing here runs per task.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..core.errors import SchedulerError
from ..core.snapshot import Snapshot

if TYPE_CHECKING:
    from ..blocking import BlockingScheduler
    from ..runtime.scheduler import Scheduler

__all__ = ["resolve", "take_snapshot"]

log = logging.getLogger("cronoq.telemetry")


def resolve(scheduler: Scheduler | BlockingScheduler) -> Scheduler:
    """The asyncio ``Scheduler`` behind a ``Scheduler`` or a ``BlockingScheduler``."""
    from ..blocking import BlockingScheduler
    from ..runtime.scheduler import Scheduler

    if isinstance(scheduler, BlockingScheduler):
        return scheduler.scheduler
    if isinstance(scheduler, Scheduler):
        return scheduler
    raise TypeError(f"expected a cronoq.Scheduler or a cronoq.BlockingScheduler, "
                    f"got {type(scheduler).__name__}")


def take_snapshot(sched: Scheduler, timeout: float) -> Snapshot | None:
    """A snapshot of ``sched`` (an asyncio ``Scheduler``), or None when it is
    not serving (not started, stopped, its loop closed) or held its engine
    for more than ``timeout`` seconds. It is read on the calling thread,
    under the scheduler's lock."""
    if not sched.running:
        return None
    try:
        return sched.snapshot_from_thread(timeout)
    except SchedulerError as exc:
        if "let go" in str(exc):
            log.warning("the scheduler did not answer a metrics snapshot within %g s", timeout,
                        extra={"action": "snapshot_timeout"})
        return None
    except RuntimeError:
        return None
