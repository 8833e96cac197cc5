"""The calls of a process that runs the engine (no store, a store of its
own, or the lead of the processes sharing one): each takes the driver's
lock, changes the engine, pumps, and with a store returns once its changes
are committed. ``submit_from_thread`` and ``snapshot_from_thread`` are the
entry points of other threads (``BlockingScheduler``, servers, metrics)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable

from .. import realtime
from ..core.engine import Core
from ..core.explain import Explanation
from ..core.errors import InvalidTask, SchedulerError, TaskFailed
from ..core.snapshot import Reservation, Snapshot, TaskInfo
from ..core.types import TERMINAL, TaskSpec
from . import listing as _listing
from . import process as _process
from .admission import Admission
from .backend import Backend, Wrap
from .checkpoints import CheckpointBook
from .driver import EngineDriver
from .durability import EncodedPayloads
from .handle import TaskHandle
from .lifecycle import RUNNING, STOPPING
from .operations import RecurringArgs
from .results import Results

if TYPE_CHECKING:
    from .cluster import Cluster

__all__ = ["EngineBackend", "claims"]

log = logging.getLogger("cronoq.scheduler")


def claims(results: Iterable[tuple[int, bool]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """What a submitting call waits on: the ids it created (withdrawn if it
    fails) and the ids of duplicates it returns (it fails if they are)."""
    created = tuple(task_id for task_id, duplicate in results if not duplicate)
    needs = tuple(task_id for task_id, duplicate in results if duplicate)
    return created, needs


class EngineBackend:
    def __init__(self, driver: EngineDriver, admission: Admission, results: Results, checkpoints: CheckpointBook,
                 payloads: EncodedPayloads, store: Any, current: Callable[[], Backend]) -> None:
        self.driver = driver
        self.life = driver.life
        self.admission = admission
        self.results = results
        self.checkpoints = checkpoints
        self.payloads = payloads
        self.store = store
        self.current = current                # the backend calls go to now (it may be another)
        self.cluster: Cluster | None = None   # while leading the processes sharing the store

    # ------------------------------------------------------------ checks

    def serving(self) -> Core:
        """The engine, if the scheduler serves and this process runs the engine (from any thread)."""
        life = self.life
        if life.state is not RUNNING or life.forks != _process.forks:
            life.check()   # raises the error that says why
        loop = life.loop
        assert loop is not None
        if loop.is_closed():
            life.check()
        driver = self.driver
        core = driver.core
        if core is None or not driver.leading:
            raise SchedulerError("this process does not lead the store: its calls go through the store")
        return core

    def check(self) -> Core:
        """The engine, if calls are allowed now and here (on the loop)."""
        core = self.serving()
        self.life.check_loop()
        return core

    # ------------------------------------------------------------ submission

    async def _admit(self, spec: TaskSpec) -> tuple[int, bool]:
        self.check()
        if self.driver.log is not None:
            self.payloads.encode(spec)   # TypeError now, before anything is stored
        admission = self.admission
        return await admission.with_room(self.check, lambda core: admission.admit_now(core, spec),
                                         (spec.pool, spec.priority))

    async def submit_spec(self, spec: TaskSpec, handle: bool, wrap: Wrap | None = None, pair: bool = False) -> Any:
        task_id, duplicate = await self._admit(spec)
        driver = self.driver
        with driver.lock:
            value: Any = (task_id, duplicate) if pair else task_id
            if handle:
                value = self.results.attach(task_id, spec.key, duplicate)
                if wrap is not None:
                    value = wrap(value)
            driver.pump()
        if driver.log is not None:
            await driver.log.durable(*claims(((task_id, duplicate),)))
        return value

    def submit_from_thread(self, spec: TaskSpec, handle: bool, wrap: Wrap | None
                           ) -> tuple[Any, Callable[[], Awaitable[Any]] | None]:
        driver = self.driver
        if driver.log is not None:
            self.payloads.encode(spec)   # outside the lock: it may be slow
        lock = driver.lock
        if not lock.acquire(False):
            _wait_for_engine(lock)
        try:
            result = self.admission.admit_now(self.serving(), spec)
            if result is None:
                return None, lambda: self.current().submit_spec(spec, handle, wrap, not handle)
            task_id, duplicate = result
            value: Any = result
            if handle:
                value = self.results.attach(task_id, spec.key, duplicate)
                if wrap is not None:
                    value = wrap(value)
            wake = driver.ask_pump()
        finally:
            lock.release()
        if wake:
            driver.wake_to_pump()
        log_ = driver.log
        if log_ is None:
            return value, None

        async def committed() -> Any:
            await log_.durable(*claims(((task_id, duplicate),)))
            return value

        return None, committed

    async def _admit_batch(self, specs: list[TaskSpec]) -> list[tuple[int, bool]]:
        if self.driver.log is not None:
            for i, spec in enumerate(specs):
                try:
                    self.payloads.encode(spec)
                except InvalidTask as exc:
                    raise exc.at_index(i) from None
        line = [(specs[0].pool, specs[0].priority) if specs else None]
        _, results = await self.admission.with_room(self.check, self.admission.batch_attempt(specs, line), line)
        return results

    async def submit_batch(self, specs: list[TaskSpec]) -> list[TaskHandle]:
        results = await self._admit_batch(specs)
        driver = self.driver
        with driver.lock:
            handles = [self.results.attach(task_id, spec.key, duplicate)
                       for spec, (task_id, duplicate) in zip(specs, results)]
            driver.pump()
        if driver.log is not None:
            await driver.log.durable(*claims(results))
        return handles

    async def enqueue_batch(self, specs: list[TaskSpec]) -> list[tuple[int, bool]]:
        results = await self._admit_batch(specs)
        driver = self.driver
        with driver.lock:
            driver.pump()
        if driver.log is not None:
            await driver.log.durable(*claims(results))
        return results

    # ------------------------------------------------------------ other calls

    async def cancel(self, ref: int | str) -> bool:
        driver = self.driver
        with driver.lock:
            cancelled = self.check().cancel(driver.clock.now_ns(), ref)
            driver.pump()
        if driver.log is not None:
            await driver.log.durable()
        return cancelled

    async def handle(self, ref: int | str) -> TaskHandle:
        driver = self.driver
        with driver.lock:
            info = self.check().info(ref)
        if info.status in TERMINAL and driver.log is not None:
            await driver.log.durable()   # an ended task is reported only once its end is stored
        with driver.lock:
            handle = self.results.attach(info.id, info.key, True)
        if info.status in TERMINAL and not handle.done():
            # Its output is being loaded from the store: return the handle resolved.
            try:
                await handle
            except (TaskFailed, asyncio.CancelledError):
                if handle.status is None:
                    raise   # this call was cancelled
        return handle

    async def info(self, ref: int | str) -> TaskInfo:
        with self.driver.lock:
            info = self.check().info(ref)
        book = self.checkpoints
        if info.stages is None:
            stages = book.stages_of(info.id)
            info.stages = list(stages) if stages is not None else None
        info.checkpoints = book.of(info.id, tuple(info.stages) if info.stages else None)
        return info

    async def explain(self, ref: int | str) -> Explanation:
        driver = self.driver
        with driver.lock:
            return self.check().explain(ref, driver.clock.now_ns())

    async def reservations(self, ahead_ns: int, pools: list[str] | None) -> list[Reservation]:
        driver = self.driver
        with driver.lock:
            return self.check().reservations(driver.clock.now_ns(), ahead_ns, pools)
    async def dependents(self, ref: int | str) -> list[tuple[int, str]]:
        with self.driver.lock:
            return self.check().dependents(ref)

    async def snapshot(self) -> Snapshot:
        with self.driver.lock:
            self.check()
            return self._snapshot_locked()

    def snapshot_from_thread(self, timeout: float | None) -> Snapshot:
        driver = self.driver
        lock = driver.lock
        if not lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            raise SchedulerError(f"the scheduler did not let go of its engine within {timeout:g} s")
        try:
            core = self.serving()
            snap = self._snapshot_locked(pump=False)
            # Taking it fired timers: the loop carries out the rest.
            wake = bool(core.actions) and driver.ask_pump()
        finally:
            lock.release()
        if wake:
            driver.wake_to_pump()
        return snap

    def _snapshot_locked(self, pump: bool = True) -> Snapshot:
        """A snapshot: the engine's view plus the runners'."""
        driver = self.driver
        core = driver.core
        assert core is not None
        snap = core.snapshot(driver.clock.now_ns())
        if pump:
            driver.pump()
            self.checkpoints.sweep(at_most_every=1.0)   # (on the loop: the book is the loop's)
        snap.checkpoints = self.checkpoints.stats()
        runners = driver.runners
        for pool in snap.pools:
            runner = runners.get(pool.name)
            if runner is not None:
                pool.stray_threads = runner.stray_threads
        return snap

    async def set_capacity(self, pool: str, capacity: int) -> None:
        driver = self.driver
        with driver.lock:
            self.check().set_capacity(driver.clock.now_ns(), pool, capacity)
            driver.pump()

    async def set_group_capacity(self, pool: str, labels: dict[str, str], capacity: int) -> None:
        driver = self.driver
        with driver.lock:
            self.check().set_group_capacity(driver.clock.now_ns(), pool, labels, capacity)
            driver.pump()

    async def add_recurring(self, args: RecurringArgs) -> None:
        driver = self.driver
        if driver.log is not None:
            self.payloads.encode(args.template)
        with driver.lock:
            self.check().add_recurring(driver.clock.now_ns(), args.name, args.cron, args.template, tz=args.tz,
                                       overlap=args.overlap, tolerance=args.tolerance, on_miss=args.on_miss)
            driver.pump()
        if driver.log is not None:
            await driver.log.durable(needs=(args.name,))

    async def remove_recurring(self, name: str) -> bool:
        driver = self.driver
        with driver.lock:
            removed = self.check().remove_recurring(driver.clock.now_ns(), name)
            driver.pump()
        if driver.log is not None:
            await driver.log.durable()
        return removed

    async def list_tasks(self, pools: Iterable[str] | None, statuses: Iterable[str] | None, after: int,
                         limit: int, newest_first: bool = False, before: int = 0) -> list[TaskInfo]:
        return await _listing.list_tasks(self.check(), self.store, pools, statuses, after, limit, newest_first,
                                         before)

    # ------------------------------------------------------------ shutdown

    async def shutdown(self, grace: float) -> None:
        """Stop dispatching, give running attempts ``grace``, give back what
        never started, store what is pending, step down, finish."""
        driver = self.driver
        with driver.lock:
            self.life.state = STOPPING
            core = driver.core
            assert core is not None
            core.stop_dispatching()
            self.admission.fail_waiters(SchedulerError("the scheduler is shutting down"))
            busy = bool(core.running)
        if busy and grace > 0:
            driver.drained = asyncio.Event()
            try:
                await realtime.wait_for(driver.drained.wait(), grace)   # real time, frozen clock or not
            except asyncio.TimeoutError:
                pass
        cluster = self.cluster
        unstarted = [] if cluster is None else await cluster.leader.settle_offers()
        unstarted += [lease for runner in driver.runners.values() for lease in runner.cancel_all()]
        if unstarted:
            with driver.lock:
                now = driver.now_ns()
                for lease in unstarted:
                    core.give_back(now, lease)
                driver.pump()
        await asyncio.sleep(0)
        log_ = driver.log
        if log_ is None:
            left = len(core.tasks)
            if left:
                log.warning("shutdown: %d unfinished tasks are dropped (without a store nothing keeps them)",
                            left, extra={"action": "dropped", "count": left})
        else:
            if not await log_.flush(log_.commit_timeout):
                log.error("shutdown: some changes could not be stored", extra={"action": "store_outage"})
            log_.fail_all(SchedulerError("the scheduler shut down"))
            if cluster is not None:   # a call left unanswered would be carried out again
                await cluster.leader.finish_serving(log_.commit_timeout)
            try:
                await self.store.release_leadership()
                log.info("leadership released", extra={"action": "leader_released"})
            except Exception as exc:
                log.error("could not release leadership: %s", exc, extra={"action": "store_outage"})
        if cluster is not None:
            await cluster.stop(0.0)
        driver.finish()


def _wait_for_engine(lock: threading.RLock) -> None:
    """The loop holds the engine: yield the interpreter to it instead of
    blocking (a thread blocked on the lock would wait for the loop thread
    to give up the interpreter, up to a switch interval, each time)."""
    for _ in range(64):
        time.sleep(0)
        if lock.acquire(False):
            return
    lock.acquire()
