"""Durable acknowledgements: group commit and held effects.

With a store, every engine mutation goes into the open batch. One commit is
in flight at a time; mutations produced meanwhile wait in the open batch and
go out together in the next transaction (group commit), while the loop keeps
running. Every effect (dispatch, abort, event, handle resolution) that the
engine produced after a mutation waits for that mutation's commit, so a worker
never runs a task a crash could "unsubmit", and an acknowledged call is on
disk.

The converse holds too: a submission whose call raises was not admitted.
When a commit fails (the store is unavailable) or a caller's ``commit_timeout``
passes, the submissions that call made are withdrawn: taken out of the
batches, forgotten by the engine, and deleted from the store should an
earlier attempt have written them after all. A caller whose rows are being
written at that moment waits for that attempt's outcome instead: committed,
the call succeeds; failed, it raises. Other changes (cancel, schedules) stay
and are written when the store returns.

A failed commit is retried with backoff. A commit the database refuses for
its data (``StoreRejected``: a constraint, a value too large) is split until
the rows at fault are isolated: those are refused (their submissions
withdrawn, their callers told why, the refusal logged) and the rest is
committed, so one bad row never blocks the commits after it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from typing import Any, Callable, Iterable

from .. import realtime
from ..core.engine import (
    MUT_OUTPUT, MUT_RECURRING, MUT_RECURRING_REMOVED, MUT_STATUS, MUT_SUBMIT, MUT_WITHDRAWN,
)
from ..core.errors import InvalidTask, SchedulerError
from ..core.persist import schedule_record, spec_record
from ..store.base import Batch, Fenced, ScheduleRow, StatusRow, StoreRejected, StoreUnavailable, TaskRow
from .clock import Cancellable
from .lifecycle import TaskGroup
from .runner import clean_message

__all__ = ["DurableLog", "DurableHooks", "EncodedPayloads", "ready_callbacks"]

log = logging.getLogger("cronoq.store")


class EncodedPayloads:
    """Each task's payload as the codec writes it, encoded once: at
    submission (outside the engine's lock, so the codec's errors reach the
    caller), then read back when the task's row is written. A leader keeps
    the bytes a follower sent as they are. Specs are weak keys: their bytes
    go when they go. Thread-safe (a thread's submit encodes on that thread)."""

    __slots__ = ("codec", "_by_spec")

    def __init__(self, codec: Any) -> None:
        self.codec = codec
        self._by_spec: weakref.WeakKeyDictionary[Any, bytes] = weakref.WeakKeyDictionary()

    def encode(self, spec: Any) -> bytes:
        """The payload of ``spec`` as the codec writes it; ``InvalidTask`` if
        too deeply nested, the codec's own error if it cannot encode it."""
        data = self._by_spec.get(spec)
        if data is None:
            try:
                data = self.codec.encode(spec.payload)
            except RecursionError:
                raise InvalidTask("payload is nested too deeply for the codec to store it") from None
            self._by_spec[spec] = data
        return data

    def remember(self, spec: Any, data: bytes) -> None:
        """``spec``'s payload is ``data`` (as another process encoded it)."""
        self._by_spec[spec] = data


class DurableHooks:
    """How the durable log reaches the scheduler it serves (on its loop):

    - ``accepting_commits()``: whether writing still makes sense (False once
      leadership is lost or the scheduler stopped);
    - ``release(effects)``: effects whose mutations are now committed;
    - ``withdraw(task_ids, message)``: submissions that were not made
      durable and whose callers are told so: forget them;
    - ``drop_schedule(name)``: a schedule the database refused: remove it;
    - ``fenced(reason)``: a newer leader took over: stop at once.
    """

    __slots__ = ("accepting_commits", "release", "withdraw", "drop_schedule", "fenced")

    def __init__(self, *, accepting_commits: Callable[[], bool], release: Callable[[list[Any]], None],
                 withdraw: Callable[[Iterable[int], str], None], drop_schedule: Callable[[str], None],
                 fenced: Callable[[str], None]) -> None:
        self.accepting_commits = accepting_commits
        self.release = release
        self.withdraw = withdraw
        self.drop_schedule = drop_schedule
        self.fenced = fenced


class _Waiter:
    """A call waiting until its changes are durable.

    ``claims``: the ids of the tasks the call submitted (withdrawn if the call
    fails); ``needs``: the ids and schedule names its answer vouches for (the
    call fails if one of them is withdrawn or refused).
    """

    __slots__ = ("future", "claims", "needs", "deadline", "stage", "deferred")

    def __init__(self, future: asyncio.Future[None], claims: tuple[Any, ...], needs: tuple[Any, ...], deadline: float,
                 stage: int) -> None:
        self.future = future
        self.claims = claims
        self.needs = needs
        self.deadline = deadline
        self.stage = stage                                # the batch it waits for
        self.deferred: SchedulerError | None = None       # given up while its rows were being written


# A caller that commits its own batch (``durable``) and so need not wait goes
# on without suspending; at least this often (seconds) it lets the loop run,
# which bounds how long I/O that arrived meanwhile waits.
YIELD_EVERY = 0.001


# Loop steps a commit that could be made on the loop's thread waits for the
# loop to be idle before it goes to the store's thread instead.
DEFER_STEPS = 4


def ready_callbacks(loop: asyncio.AbstractEventLoop) -> Any:
    """The callbacks ``loop`` will run in its next step, or None if it does
    not say (only asyncio's own loops do).

    The one place that reads asyncio's private ``_ready`` queue. No public
    API tells whether anything else waits to run: ``call_soon`` can only
    queue behind it, which means suspending, and the commit on this thread
    that idleness allows (see ``DurableLog.durable``) is worth doing only
    without that. tests/test_runtime_durable_idle.py fails if asyncio's
    loops stop having this attribute, instead of durable submits silently
    becoming slower."""
    return getattr(loop, "_ready", None)


def _idle(loop: asyncio.AbstractEventLoop, own: asyncio.Handle | None) -> bool:
    """Whether ``loop`` has no callback queued to run now but ``own``. Only
    asyncio's own loops can say; others never count as idle. (A timer that
    is due waits for one commit at most, as I/O does: see YIELD_EVERY.)"""
    ready = ready_callbacks(loop)
    if ready is None or len(ready) > 4:
        return False
    for handle in ready:
        if handle is not own and not handle.cancelled():
            return False
    return True


def _effect_task(raw: tuple[Any, ...]) -> int | None:
    kind = raw[0]
    if kind == 1:      # DISPATCH (entry, lease, ...)
        task_id: int = raw[1].id
    elif kind == 3:    # EVENT (task id, ...)
        task_id = raw[1]
    elif kind == 2:    # ABORT (lease, task id, ...)
        task_id = raw[2]
    else:
        return None
    return task_id
    return None


def _units(batch: Batch) -> list[Batch]:
    """``batch`` split into independent parts: one per task, one per schedule."""
    tasks: dict[int, Batch] = {}
    schedules: dict[str, Batch] = {}

    def task(task_id: int) -> Batch:
        unit = tasks.get(task_id)
        if unit is None:
            unit = tasks[task_id] = Batch()
        return unit

    for t in batch.tasks:
        unit = task(t.id)
        unit.tasks.append(t)
        unit.high_water = max(unit.high_water, t.id)
    for s in batch.statuses:
        task(s.id).statuses.append(s)
    for output in batch.outputs:
        task(output[0]).outputs.append(output)
    for task_id in batch.withdrawn:
        task(task_id).withdrawn.append(task_id)
    for row in batch.schedules:
        schedules.setdefault(row.name, Batch()).schedules.append(row)
    for name in batch.removed_schedules:
        schedules.setdefault(name, Batch()).removed_schedules.append(name)
    return [*tasks.values(), *schedules.values()]


def _merge(units: list[Batch]) -> Batch:
    if len(units) == 1:
        return units[0]
    merged = Batch()
    for unit in units:
        merged.extend(unit)
    return merged


class DurableLog:
    def __init__(self, hooks: DurableHooks, store: Any, payloads: EncodedPayloads, epoch: int,
                 commit_timeout: float, tasks: TaskGroup) -> None:
        self.hooks = hooks
        self.store = store
        self.payloads = payloads
        self.codec = payloads.codec
        self.tasks = tasks
        self.epoch = epoch
        self.commit_timeout = commit_timeout
        self.open = Batch()
        self.open_effects: list[tuple[Any, ...]] = []
        self.open_waiters: list[_Waiter] = []
        self.open_stage = 1
        self.inflight: Batch | None = None
        self.inflight_effects: list[tuple[Any, ...]] = []
        self.inflight_waiters: list[_Waiter] = []
        self.inflight_stage = 0
        self.sending = False      # an attempt to commit the batch in flight is under way
        self.task: asyncio.Task[None] | None = None
        self.outage = False
        self.commits = 0
        self.refused = 0          # changes the database refused (logged, callers told)
        self.deadlines: deque[_Waiter] = deque()
        self.timer: Cancellable | None = None
        self.starting: asyncio.Handle | None = None   # the commit loop's start, due this loop step
        # Stores that can commit on this thread at once when it is quick (SQLite).
        self.commit_now: Callable[[int, Batch], bool] | None = getattr(store, "commit_now", None)
        self.committed_now = 0
        self.yielded = 0.0   # when a call that committed itself last let the loop run

    # -- filling the open batch (on the loop, inside the pump)

    def add(self, mutation: tuple[Any, ...]) -> None:
        kind = mutation[0]
        batch = self.open
        if kind == MUT_STATUS:
            _, task_id, status, attempt, at, message = mutation
            batch.statuses.append(StatusRow(task_id, status, attempt, at,
                                            None if message is None else clean_message(message)))
        elif kind == MUT_SUBMIT:
            _, task_id, pool, spec, submitted = mutation
            batch.tasks.append(TaskRow(task_id, pool, spec.kind, spec.priority, spec.key,
                                       spec_record(spec, submitted), self.payloads.encode(spec),
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
                                               self.payloads.encode(rec.template)))
        elif kind == MUT_RECURRING_REMOVED:
            batch.removed_schedules.append(mutation[1])
        elif kind == MUT_WITHDRAWN:
            batch.withdrawn.append(mutation[1])

    def hold(self, raw: tuple[Any, ...]) -> bool:
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
        """Start the commit loop; with a store that can commit at once, at the
        end of this loop step (a call about to wait may commit its batch
        itself meanwhile: see ``durable``)."""
        if self.task is None and self.starting is None and self.open:
            if self.commit_now is None:
                self._start()
            else:
                self.starting = asyncio.get_running_loop().call_soon(self._start_later, 0)

    def _start_later(self, deferred: int) -> None:
        self.starting = None
        if self.task is not None or not self.open:
            return
        loop = asyncio.get_running_loop()
        if _idle(loop, None):
            if self._commit_open_now():   # nothing else to run: written here, waiters woken
                return
        elif deferred < DEFER_STEPS:
            # Callbacks are waiting: let them run first. They may add to this
            # batch, or be a thread's call about to wait for it; and what woke
            # with them (a due timer, a reply from a thread) often has the loop
            # idle again a step or two later, when the commit costs no thread
            # hand-offs. A loop that stays busy sends it to the store's thread.
            self.starting = loop.call_soon(self._start_later, deferred + 1)
            return
        self._start()

    def _start(self) -> None:
        """Start the commit loop now."""
        if self.starting is not None:
            self.starting.cancel()
            self.starting = None
        if self.task is None and self.open:
            self.task = self.tasks.spawn(self._run())

    # -- waiting for durability

    async def durable(self, claims: tuple[Any, ...] = (), needs: tuple[Any, ...] = ()) -> None:
        """Return once everything produced so far is committed. ``claims``:
        ids of tasks this call submitted (withdrawn if it fails); ``needs``:
        further ids or schedule names whose refusal fails it."""
        loop = asyncio.get_running_loop()
        if self.open:
            if self.starting is not None and self.commit_now is not None and _idle(loop, self.starting) \
                    and self._commit_open_now():
                now = realtime.real_monotonic()
                if now - self.yielded >= YIELD_EVERY:   # let the loop look at its I/O now and then
                    self.yielded = now
                    await asyncio.sleep(0)
                return
            waiters, stage = self.open_waiters, self.open_stage
        elif self.inflight is not None:
            waiters, stage = self.inflight_waiters, self.inflight_stage
        else:
            return
        waiter = _Waiter(loop.create_future(), claims, claims + needs if needs else claims,
                         realtime.real_monotonic() + self.commit_timeout, stage)
        waiters.append(waiter)
        # One timer for all waiters (their deadlines come in order), instead of
        # a wait_for and a shield per call: this is on every durable call's path.
        deadlines = self.deadlines
        while deadlines and deadlines[0].future.done():   # committed ones leave from the front
            deadlines.popleft()
        deadlines.append(waiter)
        if self.timer is None:   # commit timeouts are real time (a test may freeze the clock)
            self.timer = realtime.call_later(deadlines[0].deadline - realtime.real_monotonic(),
                                             self._expire, loop)
        await waiter.future

    def _commit_open_now(self) -> bool:
        """Commit the open batch on this thread, now (the loop has nothing
        else to run, so it would only wait for the store's thread). False if
        the store declines or fails: the commit loop then writes the batch and
        deals with any failure as usual."""
        assert self.commit_now is not None
        batch = self.open
        try:
            if not self.commit_now(self.epoch, batch):
                return False
        except Exception:   # not written: the commit loop tries again, and reports
            return False
        self.open = Batch()
        effects, self.open_effects = self.open_effects, []
        waiters, self.open_waiters = self.open_waiters, []
        self.open_stage += 1
        self.commits += 1
        self.committed_now += 1
        # self.starting stays: it finds nothing to write, or what came since.
        self.hooks.release(effects)
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.set_result(None)
        return True

    def _expire(self) -> None:
        self.timer = None
        deadlines = self.deadlines
        loop = asyncio.get_running_loop()
        now = realtime.real_monotonic()
        while deadlines and (deadlines[0].future.done() or deadlines[0].deadline <= now):
            waiter = deadlines.popleft()
            if not waiter.future.done():
                self._give_up(waiter, StoreUnavailable(
                    f"the store did not commit within {self.commit_timeout:g} s (unavailable)"))
        if deadlines:
            self.timer = realtime.call_later(deadlines[0].deadline - now, self._expire, loop)

    def _being_written(self, waiter: _Waiter) -> bool:
        """Whether rows of ``waiter``'s submissions may be committing right now."""
        return bool(waiter.claims) and self.sending and waiter.stage == self.inflight_stage

    def _give_up(self, waiter: _Waiter, error: SchedulerError) -> None:
        """Fail a waiting call; withdraw what it submitted (or, if that is being
        written now, let the attempt's outcome decide)."""
        if self._being_written(waiter):
            waiter.deferred = error
            return
        if waiter.claims:
            self._withdraw(waiter.claims, type(error)(
                f"{error}; the task was not admitted (submit it again; a key makes that safe)"))
        if not waiter.future.done():
            waiter.future.set_exception(type(error)(
                f"{error}; the change stays and is written when the store returns"))

    def _withdraw(self, task_ids: Iterable[int], error: SchedulerError) -> None:
        """Take submissions back: out of the batches and the held effects, out
        of the engine (whose withdrawal deletes any row of them), and fail
        every call that vouches for them."""
        ids = set(task_ids)
        attempted = self._strip(ids)
        self.hooks.withdraw(ids, str(error))
        # A row only an attempt that failed may have written (its answer lost)
        # needs the delete the engine asked for; one never sent does not.
        open_batch = self.open
        if open_batch.withdrawn:
            open_batch.withdrawn = [i for i in open_batch.withdrawn if i not in ids or i in attempted]
        for waiter in (*self.open_waiters, *self.inflight_waiters):
            if not waiter.future.done() and waiter.needs and not ids.isdisjoint(waiter.needs):
                waiter.future.set_exception(error)

    def _strip(self, ids: set[int]) -> set[int]:
        """Take ``ids`` out of the batches not being written and out of the
        held effects; returns those that were in the batch in flight."""
        batches = [self.open]
        attempted: set[int] = set()
        if self.inflight is not None and not self.sending:
            batches.append(self.inflight)
            attempted = {t.id for t in self.inflight.tasks if t.id in ids}
        for batch in batches:
            if batch.tasks:
                batch.tasks = [t for t in batch.tasks if t.id not in ids]
            if batch.statuses:
                batch.statuses = [s for s in batch.statuses if s.id not in ids]
            if batch.outputs:
                batch.outputs = [o for o in batch.outputs if o[0] not in ids]
        if self.open_effects:
            self.open_effects = [raw for raw in self.open_effects if _effect_task(raw) not in ids]
        if self.inflight_effects:
            self.inflight_effects = [raw for raw in self.inflight_effects if _effect_task(raw) not in ids]
        return attempted

    async def flush(self, timeout: float) -> bool:
        """Wait until nothing is pending (shutdown); False on timeout."""
        try:
            while self.open or self.inflight is not None:
                self._start()
                task = self.task
                if task is None:
                    break
                await realtime.wait_for(asyncio.shield(task), timeout)
        except (asyncio.TimeoutError, SchedulerError):
            return False
        return True

    def fail_all(self, error: BaseException) -> None:
        """The scheduler stops: fail every waiting call. Their submissions are
        taken out of the batches (nothing more is written for them); a call
        whose rows are being written now gets that attempt's outcome."""
        message = str(error)
        for waiter in (*self.open_waiters, *self.inflight_waiters):
            if waiter.future.done():
                continue
            if self._being_written(waiter):
                waiter.deferred = SchedulerError(message)
                continue
            if waiter.claims:
                self._strip(set(waiter.claims))
                waiter.future.set_exception(SchedulerError(f"{message}; the task was not admitted"))
            else:
                waiter.future.set_exception(error)
        self.open_waiters = [w for w in self.open_waiters if not w.future.done()]
        self.inflight_waiters = [w for w in self.inflight_waiters if not w.future.done()]
        self.deadlines.clear()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def discard_open(self) -> None:
        """Leadership is lost: nothing more may be written, so the open
        batch is dropped (the next leader recovers from what is stored)."""
        self.open = Batch()
        self.open_effects = []

    # -- the commit loop

    async def _run(self) -> None:
        try:
            while self.open:
                batch, self.open = self.open, Batch()
                self.inflight = batch
                self.inflight_effects, self.open_effects = self.open_effects, []
                self.inflight_waiters, self.open_waiters = self.open_waiters, []
                self.inflight_stage = self.open_stage
                self.open_stage += 1
                delay = 0.05
                refused: list[Any] | None = None
                while True:
                    try:
                        refused = await self._write(batch)
                        break
                    except Fenced as exc:
                        self._settle_deferred(exc)
                        self.hooks.fenced(f"fenced: {exc}")
                        return
                    except Exception as exc:  # unavailable: not written; keep the rest, retry it
                        error = exc if isinstance(exc, SchedulerError) else StoreUnavailable(str(exc))
                        if not self.hooks.accepting_commits():
                            self._settle_deferred(error)
                            return   # stopped meanwhile (leadership lost): nothing more to write
                        if not self.outage:
                            self.outage = True
                            log.error("store unavailable, retrying the commit: %s", exc,
                                      extra={"action": "store_outage"})
                        error = StoreUnavailable(f"the store is unavailable: {exc}")
                        if getattr(exc, "uncertain", False):
                            error = StoreUnavailable(
                                f"the store is unavailable: {exc} (the connection failed during the commit, "
                                f"which may have been written: such rows are deleted when the store returns, "
                                f"and this scheduler never runs them)")
                        for waiter in self.inflight_waiters:
                            if not waiter.future.done():
                                self._give_up(waiter, error)
                        self.inflight_waiters = []
                        if not batch:   # all of it was withdrawn: nothing is left to write
                            refused = None
                            break
                        await realtime.sleep(delay)
                        delay = min(delay * 2, 2.0)
                if refused is not None:
                    if self.outage:
                        self.outage = False
                        log.warning("store available again", extra={"action": "store_recovered"})
                    self.commits += 1
                    if refused:
                        self._refuse(refused)
                self.inflight = None
                effects = self.inflight_effects
                waiters = self.inflight_waiters
                self.inflight_effects = []
                self.inflight_waiters = []
                self.hooks.release(effects)
                for waiter in waiters:
                    if not waiter.future.done():
                        waiter.future.set_result(None)
        except asyncio.CancelledError:
            # The scheduler's shutdown cancels what is left of its tasks: no
            # call is left waiting for a commit that will not be reported.
            for waiter in self.inflight_waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(SchedulerError(
                        "the scheduler shut down while the change was being stored (it may have been written)"))
            raise
        finally:
            self.task = None
            if self.open and self.hooks.accepting_commits():
                self._start()

    def _settle_deferred(self, error: SchedulerError) -> None:
        """The attempt failed: calls that waited for its outcome raise (their
        rows were not written)."""
        for waiter in self.inflight_waiters:
            if waiter.deferred is not None and not waiter.future.done():
                waiter.future.set_exception(type(waiter.deferred)(
                    f"{waiter.deferred}; the task was not admitted ({error})"))

    async def _write(self, batch: Batch) -> list[tuple[Batch, StoreRejected]]:
        """Commit ``batch``; if the database refuses its data, commit it in
        parts until the refused ones are isolated, and return those."""
        self.sending = True
        try:
            try:
                await self.store.commit(self.epoch, batch)
                return []
            except StoreRejected as exc:
                units = _units(batch)
                if len(units) == 1:
                    return [(units[0], exc)]
                log.warning("the store refused a commit of %d changes (%s); isolating the ones at fault",
                            len(units), exc, extra={"action": "store_rejected"})
                refused: list[tuple[Batch, StoreRejected]] = []
                middle = len(units) // 2
                await self._bisect(units[:middle], refused)
                await self._bisect(units[middle:], refused)
                return refused
        finally:
            self.sending = False

    async def _bisect(self, units: list[Batch], refused: list[Any]) -> None:
        try:
            await self.store.commit(self.epoch, _merge(units))
        except StoreRejected as exc:
            if len(units) == 1:
                refused.append((units[0], exc))
                return
            middle = len(units) // 2
            await self._bisect(units[:middle], refused)
            await self._bisect(units[middle:], refused)

    def _refuse(self, refused: list[tuple[Batch, StoreRejected]]) -> None:
        """The parts of a committed batch the database refused: withdraw the
        submissions, drop the schedules, log it all; the callers are told."""
        for unit, exc in refused:
            self.refused += 1
            submitted = [t.id for t in unit.tasks]
            if submitted:
                for task_id in submitted:
                    log.error("the store refused task %d, which was not admitted: %s", task_id, exc,
                              extra={"action": "store_rejected", "task_id": task_id})
                self._withdraw(submitted, StoreRejected(
                    f"the store refused the task, which was not admitted: {exc}"))
            elif unit.statuses or unit.outputs or unit.withdrawn:
                task_id = (unit.statuses[0].id if unit.statuses
                           else unit.outputs[0][0] if unit.outputs else unit.withdrawn[0])
                log.error("the store refused a change of task %d (it is not stored; after a restart the "
                          "task may run again): %s", task_id, exc,
                          extra={"action": "store_rejected", "task_id": task_id})
            names = {row.name for row in unit.schedules} | set(unit.removed_schedules)
            for name in names:
                log.error("the store refused a change of schedule %r, which is removed: %s", name, exc,
                          extra={"action": "store_rejected"})
                self.hooks.drop_schedule(name)
                error = StoreRejected(f"the store refused schedule {name!r}, which is removed: {exc}")
                for waiter in (*self.open_waiters, *self.inflight_waiters):
                    if not waiter.future.done() and name in waiter.needs:
                        waiter.future.set_exception(error)
