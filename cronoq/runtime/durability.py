"""Durable acknowledgements: group commit and held effects.

With a store, every engine mutation goes into the open batch. One commit is
in flight at a time; mutations produced meanwhile wait in the open batch and
go out together in the next transaction (group commit), while the loop keeps
running. Every effect (dispatch, abort, event, handle resolution) that the
engine produced after a mutation waits for that mutation's commit, so a worker
never runs a task a crash could "unsubmit", and an acknowledged call is on
disk. A failed commit is retried with backoff, unchanged; callers waiting on
it get ``SchedulerError`` after ``commit_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING

from ..core.engine import MUT_OUTPUT, MUT_RECURRING, MUT_RECURRING_REMOVED, MUT_STATUS, MUT_SUBMIT
from ..core.errors import InvalidTask, SchedulerError
from ..core.persist import schedule_record, spec_record
from ..store.base import Batch, Fenced, ScheduleRow, StatusRow, TaskRow
from .runner import clean_message

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = ["DurableLog"]

log = logging.getLogger("cronoq.store")


def encoded_payload(spec, codec) -> bytes:
    """The payload as the codec writes it (cached on the spec at submission)."""
    data = spec.__dict__.get("_encoded")
    if data is None:
        try:
            data = codec.encode(spec.payload)
        except RecursionError:
            raise InvalidTask("payload is nested too deeply for the codec to store it") from None
        spec._encoded = data
    return data


class DurableLog:
    def __init__(self, scheduler: Scheduler, store, codec, epoch: int, commit_timeout: float) -> None:
        self.scheduler = scheduler
        self.store = store
        self.codec = codec
        self.epoch = epoch
        self.commit_timeout = commit_timeout
        self.open = Batch()
        self.open_effects: list[tuple] = []
        self.open_waiters: list[asyncio.Future] = []
        self.inflight: Batch | None = None
        self.inflight_effects: list[tuple] = []
        self.inflight_waiters: list[asyncio.Future] = []
        self.task: asyncio.Task | None = None
        self.outage = False
        self.commits = 0
        self.deadlines: deque[tuple[float, asyncio.Future]] = deque()
        self.timer: asyncio.TimerHandle | None = None

    # -- filling the open batch (on the loop, inside the pump)

    def add(self, mutation: tuple) -> None:
        kind = mutation[0]
        batch = self.open
        if kind == MUT_STATUS:
            _, task_id, status, attempt, at, message = mutation
            batch.statuses.append(StatusRow(task_id, status, attempt, at,
                                            None if message is None else clean_message(message)))
        elif kind == MUT_SUBMIT:
            _, task_id, pool, spec, submitted = mutation
            batch.tasks.append(TaskRow(task_id, pool, spec.kind, spec.priority, spec.key,
                                       spec_record(spec, submitted), encoded_payload(spec, self.codec),
                                       submitted))
            if task_id > batch.high_water:
                batch.high_water = task_id
        elif kind == MUT_OUTPUT:
            _, task_id, output = mutation
            try:
                data = self.codec.encode(output)
            except Exception as exc:   # any codec failure (even too deep a value) must not stop the worker
                log.warning("the output of task %d cannot be stored: %s", task_id, exc,
                            extra={"task_id": task_id, "action": "output"})
            else:
                batch.outputs.append((task_id, data))
        elif kind == MUT_RECURRING:
            _, name, rec = mutation
            batch.schedules.append(ScheduleRow(name, schedule_record(rec),
                                               encoded_payload(rec.template, self.codec)))
        elif kind == MUT_RECURRING_REMOVED:
            batch.removed_schedules.append(mutation[1])

    def hold(self, raw: tuple) -> bool:
        """Keep an effect until the mutations before it are durable; False if
        nothing is pending, so it can run at once."""
        if self.open:
            self.open_effects.append(raw)
            return True
        if self.inflight is not None:
            self.inflight_effects.append(raw)
            return True
        return False

    def kick(self) -> None:
        if self.task is None and self.open:
            self.task = asyncio.get_running_loop().create_task(self._run())

    # -- waiting for durability

    async def durable(self) -> None:
        """Return once everything produced so far is committed."""
        if self.open:
            waiters = self.open_waiters
        elif self.inflight is not None:
            waiters = self.inflight_waiters
        else:
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        waiters.append(waiter)
        # One timer for all waiters (their deadlines come in order), instead of
        # a wait_for and a shield per call: this is on every durable call's path.
        deadlines = self.deadlines
        while deadlines and deadlines[0][1].done():   # committed ones leave from the front
            deadlines.popleft()
        deadlines.append((loop.time() + self.commit_timeout, waiter))
        if self.timer is None:
            self.timer = loop.call_at(self.deadlines[0][0], self._expire)
        await waiter

    def _expire(self) -> None:
        self.timer = None
        deadlines = self.deadlines
        loop = asyncio.get_running_loop()
        now = loop.time()
        while deadlines and (deadlines[0][1].done() or deadlines[0][0] <= now):
            _, waiter = deadlines.popleft()
            if not waiter.done():
                waiter.set_exception(SchedulerError(
                    f"the store did not commit within {self.commit_timeout:g} s (unavailable); the "
                    f"change will be written when it returns: retry with a key to be safe"))
        if deadlines:
            self.timer = loop.call_at(deadlines[0][0], self._expire)

    async def flush(self, timeout: float) -> bool:
        """Wait until nothing is pending (shutdown); False on timeout."""
        try:
            while self.open or self.inflight is not None:
                self.kick()
                task = self.task
                if task is None:
                    break
                await asyncio.wait_for(asyncio.shield(task), timeout)
        except (asyncio.TimeoutError, SchedulerError):
            return False
        return True

    def fail_all(self, error: BaseException) -> None:
        for waiter in self.open_waiters + self.inflight_waiters:
            if not waiter.done():
                waiter.set_exception(error)
        self.open_waiters.clear()
        self.inflight_waiters.clear()
        self.deadlines.clear()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    # -- the commit loop

    async def _run(self) -> None:
        try:
            while self.open:
                batch, self.open = self.open, Batch()
                effects, self.open_effects = self.open_effects, []
                waiters, self.open_waiters = self.open_waiters, []
                self.inflight = batch
                self.inflight_effects = effects
                self.inflight_waiters = waiters
                delay = 0.05
                while True:
                    try:
                        await self.store.commit(self.epoch, batch)
                        break
                    except Fenced as exc:
                        self.scheduler._lost(f"fenced: {exc}")
                        return
                    except Exception as exc:  # unavailable: keep the batch, retry it
                        if not self.scheduler._accepting_commits():
                            return   # stopped meanwhile (leadership lost): nothing more to write
                        if not self.outage:
                            self.outage = True
                            log.error("store unavailable, retrying the commit: %s", exc,
                                      extra={"action": "store_outage"})
                        for waiter in self.inflight_waiters:
                            if not waiter.done():
                                waiter.set_exception(SchedulerError(f"the store is unavailable: {exc}"))
                        self.inflight_waiters = []
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 2.0)
                if self.outage:
                    self.outage = False
                    log.warning("store available again", extra={"action": "store_recovered"})
                self.commits += 1
                self.inflight = None
                effects = self.inflight_effects
                waiters = self.inflight_waiters
                self.inflight_effects = []
                self.inflight_waiters = []
                self.scheduler._release(effects)
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        finally:
            self.task = None
            if self.open and self.scheduler._accepting_commits():
                self.kick()
