"""``cronoq.Scheduler``: the asyncio driver of the engine and the public API.

Every call applies one change to the engine and then runs the action pump:
dispatches go to the pool's runner, aborts cancel attempts, terminal events
resolve handles and reach event subscribers. One timer, armed for the
engine's next wake-up, is the only thing that runs on its own; an idle
scheduler arms none and uses no CPU.

The engine and the handle table are guarded by one lock. The loop takes it
for every step; other threads take it to admit a task or read a snapshot
at once (``submit_from_thread``, ``snapshot_from_thread``: the entry points
of ``BlockingScheduler``, the legacy compat and the metrics scrapes), and
then ask the loop to carry out what the engine queued.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import gc
import logging
import os
import threading
import time
from collections import deque
from typing import Any, Awaitable, Callable, Hashable, Iterable, Iterator, Sequence, TypeVar

from .. import realtime
from ..core import actions as act
from ..core.engine import Core
from ..core.errors import AdmissionError, CheckpointError, InvalidTask, QueueFull, SchedulerError, TaskFailed
from ..core.snapshot import Checkpoint, Snapshot, TaskInfo
from ..core.types import (
    CANCELLED, DEAD_LETTERED, READY, RUNNING, STATUSES, SUCCEEDED, SUCCESS, TERMINAL, CoreConfig, ResourceConfig,
    Status, TaskSpec, check_name,
)
from ..core.persist import RestoredSchedule, RestoredTask, spec_from_record
from ..store.base import (
    STORE_MEMBERS, Fenced, LeaderUnavailable, Store, StoredSchedule, StoredTask, StoreRejected, StoreUnavailable,
)
from ..store.codec import Codec, JsonCodec
from .checkpoints import DEFAULT_MAX_CHECKPOINT_BYTES, CheckpointBook
from .clock import Cancellable, Clock, SystemClock
from .durability import DurableHooks, DurableLog, encoded_payload
from .events import EventSink, EventStream
from .handle import TaskHandle
from .pool import Pool
from . import listing as _listing
from . import process as _process
from .local import LocalRunner
from .runner import ABORT_SHUTDOWN, Attempt, Runner, RunnerLink, abort_reason, aborter
from .threads import ThreadRunner
from .cluster import Cluster, ClusterRunner, info_from_dict, snapshot_from_dict
from ..core.persist import spec_record

__all__ = ["Scheduler"]

log = logging.getLogger("cronoq.scheduler")

# The wall clock, read without a Python frame on the hot paths when the
# scheduler runs on a SystemClock. A module attribute on purpose: freezegun
# replaces module attributes that are the real function, so frozen time is seen.
_wall_ns = time.time_ns

_NEW, _RUNNING, _STOPPING, _STOPPED = "new", "running", "stopping", "stopped"
_STATUS: dict[str, Status] = {status: status for status in STATUSES}
# Terminal statuses the event path handles without logging (dead letters are logged).
_QUIET_ENDS = TERMINAL - {DEAD_LETTERED}
_NO_OUTPUT: Any = object()   # "no output at hand" (None is a valid output)

_T = TypeVar("_T")

# What an admission listener is told: (now_ns, tasks, results, error); see add_admission_listener.
AdmissionListener = Callable[[int, Sequence[TaskSpec], "Sequence[tuple[int, bool]] | None",
                              "AdmissionError | None"], None]


def _consume(rows: Iterable[_T]) -> Iterator[_T]:
    """The items of ``rows``; a list is emptied as it is read (its rows freed)."""
    if isinstance(rows, list):
        freed: list[Any] = rows   # holds None where a row was read
        for i in range(len(rows)):
            row = rows[i]
            freed[i] = None
            yield row
        rows.clear()
    else:
        yield from rows


def _claims(results: Iterable[tuple[int, bool]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """What a submitting call waits on: the ids it created (withdrawn if it
    fails) and the ids of duplicates it returns (it fails if they are)."""
    claims = tuple(task_id for task_id, duplicate in results if not duplicate)
    needs = tuple(task_id for task_id, duplicate in results if duplicate)
    return claims, needs


# A dispatch that found no thread to run it waits this long before it is tried again.
_NOT_STARTED_DELAY_NS = 1_000_000_000


class _Turn:
    """A submitter's place in line for queue room."""

    __slots__ = ("key", "future")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.future: asyncio.Future[None] | None = None


class Scheduler:
    """An embedded scheduler bound to the event loop that starts it.

    Use ``async with Scheduler(pools) as sched:`` or ``await start()`` /
    ``await shutdown()``. Calls before ``start()`` raise ``RuntimeError``;
    after shutdown, or once the loop closed, ``SchedulerError``.
    """

    def __init__(self, pools: Sequence[Pool], resources: Sequence[ResourceConfig] | None = None,
                 emit_transitions: bool = False, *, shutdown_grace: float = 5.0,
                 event_capacity: int = 1024, store: Store | None = None, codec: Codec | None = None,
                 clock: Clock | None = None, max_pending_total: int | None = None, output_cache: int = 1024,
                 seed: int | None = None, config: CoreConfig | None = None,
                 max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES) -> None:
        pools = list(pools)
        # What fresh_copy() makes a new scheduler from (a fork's child starts one of its own).
        self._given: tuple[list[Pool], Any, bool, dict[str, Any]] = (pools, resources, emit_transitions, dict(
            shutdown_grace=shutdown_grace, event_capacity=event_capacity, store=store, codec=codec, clock=clock,
            max_pending_total=max_pending_total, output_cache=output_cache, seed=seed, config=config,
            max_checkpoint_bytes=max_checkpoint_bytes))
        if not pools:
            raise ValueError("pools must name at least one Pool")
        names = set()
        for pool in pools:
            if not isinstance(pool, Pool):
                raise ValueError(f"pools must be cronoq.Pool objects, got {type(pool).__name__}")
            if pool.name in names:
                raise ValueError(f"duplicate pool name {pool.name!r}")
            names.add(pool.name)
        self.pools = pools
        self.resources = list(resources or ())
        resource_names = set()
        for resource in self.resources:
            if not isinstance(resource, ResourceConfig):
                raise ValueError(f"resources must be cronoq.Resource objects, got {type(resource).__name__}")
            if resource.name in resource_names:
                raise ValueError(f"duplicate resource name {resource.name!r}")
            resource_names.add(resource.name)
        if isinstance(shutdown_grace, bool) or not isinstance(shutdown_grace, (int, float)) \
                or not shutdown_grace >= 0:
            raise ValueError(f"shutdown_grace must be a number of seconds >= 0, got {shutdown_grace!r}")
        self.shutdown_grace = float(shutdown_grace)
        if isinstance(event_capacity, bool) or not isinstance(event_capacity, int) or event_capacity < 1:
            raise ValueError(f"event_capacity must be an integer >= 1, got {event_capacity!r}")
        self.event_capacity = event_capacity
        if isinstance(output_cache, bool) or not isinstance(output_cache, int) or output_cache < 0:
            raise ValueError(f"output_cache must be an integer >= 0, got {output_cache!r}")
        self._output_limit = output_cache
        if isinstance(max_checkpoint_bytes, bool) or not isinstance(max_checkpoint_bytes, int) \
                or max_checkpoint_bytes < 1:
            raise ValueError(f"max_checkpoint_bytes must be an integer >= 1, got {max_checkpoint_bytes!r}")
        if store is not None and not isinstance(store, Store):
            if isinstance(store, (str, os.PathLike)):
                raise ValueError(f"store must be a store object, not a path: "
                                 f"use store=cronoq.SqliteStore({os.fspath(store)!r})")
            missing = [name for name in STORE_MEMBERS if not hasattr(store, name)]
            raise ValueError(f"store must be a cronoq store (SqliteStore, PostgresStore, or one with "
                             f"the Store methods); {type(store).__name__} lacks {', '.join(missing)}")
        self.store: Any = store   # a Store, or None
        if codec is not None and not (hasattr(codec, "encode") and hasattr(codec, "decode")):
            raise ValueError("codec must have encode(value) -> bytes and decode(bytes) -> value")
        self.codec: Codec = codec if codec is not None else JsonCodec()
        self.clock: Clock = clock or SystemClock()
        self._now_ns = self.clock.now_ns
        self._system_time = type(self.clock) is SystemClock
        if config is None:
            config = CoreConfig(emit_transitions=emit_transitions, max_pending_total=max_pending_total,
                                seed=0 if seed is None else seed)
        else:
            if not isinstance(config, CoreConfig):
                raise ValueError(f"config must be a cronoq.core.CoreConfig, got {type(config).__name__}")
            beside = [name for name, given in (("emit_transitions", emit_transitions),
                                               ("max_pending_total", max_pending_total is not None),
                                               ("seed", seed is not None)) if given]
            if beside:
                raise ValueError(f"{', '.join(beside)} would be ignored beside config=: set "
                                 f"{'it' if len(beside) == 1 else 'them'} in the CoreConfig instead")
        self._config = config
        self._checkpoints = CheckpointBook(codec=self.codec, max_bytes=max_checkpoint_bytes,
                                           now_ns=self.clock.now_ns, is_live=self._attempt_live,
                                           known=self._knows, on_saved=self._stage_completed)
        self._state = _NEW
        self._loop: asyncio.AbstractEventLoop | None = None
        self._core: Core | None = None
        self._runners: dict[str, Runner] = {}
        self._aborts: list[Callable[[int, str], bool]] = []   # each runner's abort(lease, reason)
        self._handles: dict[int, Any] = {}          # task id -> handle or [handles]
        self._outputs: dict[int, Any] = {}           # recent outputs, oldest first
        self._output_order: deque[int] = deque()
        self._delivering: dict[int, Any] = {}        # outputs whose success event is not out yet
        self._loading: dict[int, asyncio.Task[None]] = {}  # task id -> load of its stored output
        self._sinks: list[EventSink] = []
        # Guards the engine, the handles and the sinks (see the module docstring).
        self._lock = threading.RLock()
        self._pump_asked = False                      # a thread asked the loop to pump
        self._submit_hooks: list[Callable[[TaskSpec], TaskSpec]] = []
        self._admission_listeners: list[AdmissionListener] = []
        self._middleware: list[Callable[[Callable[..., Any], bool], Callable[..., Any]]] = []
        self._room: dict[Any, deque[_Turn]] = {}     # submitters waiting for queue room, per line
        self._timer: Cancellable | None = None
        self._timer_at: int | None = None
        self._drained: asyncio.Event | None = None
        self._log: DurableLog | None = None
        self._abort_start: asyncio.Future[None] | None = None
        self._forks = _process.forks
        self._pid = os.getpid()
        _process.after_fork(self._after_fork)
        self.epoch = 0
        self.lost_reason: str | None = None
        # Many processes, one scheduler (cronoq/runtime/cluster.py): with a store
        # that supports it, this process leads (runs the engine) or follows.
        self._cluster: Cluster | None = None
        self._leading = False
        self._lead_task: asyncio.Task[None] | None = None
        self._forget_siblings: Callable[[], None] | None = None   # in memory: see process.note_in_memory

    # ================================================================ lifecycle

    async def start(self) -> None:
        """Start the scheduler on the running loop."""
        if self._state != _NEW:
            raise SchedulerError(f"the scheduler is {self._state}; create a new one to start again")
        self._loop = asyncio.get_running_loop()
        self._checkpoints.bind(self._loop)
        self._forks = _process.forks
        self._pid = os.getpid()
        self._state = "starting"
        try:
            if self.store is not None and getattr(self.store, "cluster", False) is True:
                await self._start_cluster()
                return
            if self.store is not None:
                await self._start_durable()
            else:
                self._core = Core(self._config, [p.config for p in self.pools], self.resources,
                                  now=self.clock.now_ns())
                self._forget_siblings = _process.note_in_memory([p.name for p in self.pools], log)
        except BaseException:
            aborted = self._abort_start is not None and self._abort_start.done()
            self._state = _STOPPED if aborted else _NEW
            raise
        self._use_runners({p.name: self._make_runner(p) for p in self.pools})
        with self._lock:
            self._state = _RUNNING
            self._leading = True
            self._pump()

    def _engine_link(self, pool: Pool) -> RunnerLink:
        loop = self._loop
        assert loop is not None
        name = pool.name

        def set_capacity(labels: dict[str, str], slots: int) -> None:
            self._set_capacity_now(name, labels, slots)

        return RunnerLink(name, loop, self._report, self._heartbeat, self._not_started, set_capacity,
                          checkpoints=self._checkpoints)

    def _use_runners(self, runners: dict[str, Runner]) -> None:
        self._runners = runners
        self._aborts = [aborter(runner) for runner in runners.values()]

    def _abort(self, lease: int, reason: str) -> None:
        """The runner that holds ``lease`` gives it up (``reason``: one of ABORT_REASONS)."""
        for abort in self._aborts:
            if abort(lease, reason):
                break

    def _make_runner(self, pool: Pool) -> Runner:
        link = self._engine_link(pool)
        if pool.runner is not None:
            return pool.runner(link)
        return self._executor_runner(pool, link)

    def _executor_runner(self, pool: Pool, link: RunnerLink) -> Runner:
        """The runner of a pool's own executor (middleware applied), reporting through ``link``."""
        executor = pool.executor
        assert executor is not None
        for middleware in self._middleware:
            executor = middleware(executor, pool.is_async)
        return LocalRunner(link, executor) if pool.is_async else ThreadRunner(link, executor)

    async def _start_durable(self) -> None:
        """Lead (a standby waits here, until shutdown() gives up), take a new
        epoch, recover, restore. If anything fails after leading, step down."""
        store = self.store
        loop = self._loop
        assert loop is not None   # start() set it
        self._abort_start = abort = loop.create_future()
        acquire = loop.create_task(store.acquire_leadership())
        try:
            await asyncio.wait((acquire, abort), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not acquire.done():
                acquire.cancel()
        if not acquire.done() or acquire.cancelled():
            raise SchedulerError("the scheduler was shut down while it waited to lead")
        self.epoch = acquire.result()
        try:
            await self._recover()
            if abort.done():
                raise SchedulerError("the scheduler was shut down while it recovered")
        except BaseException:
            try:
                await store.release_leadership()
            except Exception as exc:
                log.error("could not release leadership: %s", exc, extra={"action": "store_outage"})
            raise

    async def _recover(self) -> None:
        store = self.store
        epoch = self.epoch
        log.info("leadership acquired (epoch %d)", epoch, extra={"epoch": epoch, "action": "leader"})
        config = copy.copy(self._config)
        config.epoch = epoch
        config.persist = True
        # The store's retention (finished tasks kept for dependencies and keys) applies in memory too.
        config.retention_ns = max(config.retention_ns, int(store.retention_ns))
        self._core = core = Core(config, [p.config for p in self.pools], self.resources,
                                 now=self.clock.now_ns())
        hooks = DurableHooks(accepting_commits=self._accepting_commits, release=self._release,
                             withdraw=self._withdraw, drop_schedule=self._drop_schedule, fenced=self._lost)
        self._log = DurableLog(hooks, store, self.codec, epoch, float(store.commit_timeout))
        now = self.clock.now_ns()
        recovered = await store.recover(now, config.retention_ns)
        # Millions of objects are made here and all of them live on: the cyclic
        # collector would scan the growing heap again and again for nothing.
        collecting = gc.isenabled()
        gc.disable()
        try:
            tasks = self._decode_tasks(recovered.tasks)
            recovered.tasks = []   # the rows go as they are decoded
            schedules = [self._decode_schedule(row) for row in recovered.schedules]
            quarantined = core.restore(now, tasks, schedules, recovered.high_water)
        finally:
            if collecting:
                gc.enable()
        restored = self._checkpoints.restore(
            (c.task_id, c.stage, c.data, c.attempt, c.saved_ns) for c in await store.load_checkpoints())
        if restored:
            log.info("recovered %d checkpoints", restored, extra={"action": "recovered", "count": restored})
        self._checkpoints.durable = self._save_checkpoint
        if quarantined:
            log.warning("%d stored tasks were quarantined at recovery", len(quarantined),
                        extra={"action": "quarantine", "count": len(quarantined)})
        log.info("recovered %d live tasks and %d schedules", len(core.tasks), len(core.recurring),
                 extra={"action": "recovered", "epoch": epoch})
        store.on_lost(self._lost_threadsafe)

    def _decode_tasks(self, rows: Iterable[StoredTask]) -> Iterator[RestoredTask]:
        """The stored rows as the engine restores them, one at a time (a row,
        its record and its payload bytes are freed as the next is read).

        Rows whose record is one shared dict (equal options: the store shares
        them) share one read-only spec; each carries its own payload.
        """
        decode = self.codec.decode
        shared: dict[int, tuple[dict[str, Any], TaskSpec]] = {}
        for row in _consume(rows):
            record = row.record
            hit = shared.get(id(record))
            status = _STATUS.get(row.status)
            if hit is not None and hit[0] is record and status is not None and row.payload is not None:
                try:
                    payload = decode(row.payload)
                except Exception as exc:  # any decoding problem quarantines the row
                    yield self._undecodable(row, status, exc)
                    continue
                yield RestoredTask(row.id, row.pool, hit[1], row.submitted_ns, status, row.attempt,
                                   row.message, row.finished_ns, None, payload)
                continue
            task = self._decode_task(row)
            if task.spec is not None and isinstance(record, dict) and "key" not in record \
                    and len(shared) < 4096:
                shared[id(record)] = (record, task.spec)
            yield task

    def _undecodable(self, row: StoredTask, status: str, exc: Exception) -> RestoredTask:
        return RestoredTask(row.id, row.pool, None, row.submitted_ns, status, row.attempt,
                            row.message, row.finished_ns, error=f"cannot decode the stored task: {exc}")

    def _decode_task(self, row: StoredTask) -> RestoredTask:
        # The engine compares statuses by identity: map the store's strings to its constants.
        status = _STATUS.get(row.status)
        try:
            if status is None:
                status = READY
                raise ValueError(f"unknown status {row.status!r}")
            if row.record is None or row.payload is None:
                raise ValueError("the stored record is unreadable")
            spec = spec_from_record(row.record, self.codec.decode(row.payload))
            return RestoredTask(row.id, row.pool, spec, row.submitted_ns, status, row.attempt,
                                row.message, row.finished_ns)
        except Exception as exc:  # any decoding problem quarantines the row
            assert status is not None   # set to READY above when unknown
            return self._undecodable(row, status, exc)

    def _decode_schedule(self, row: StoredSchedule) -> RestoredSchedule:
        record = row.record or {}
        try:
            if row.payload is None:
                raise ValueError("the stored payload is unreadable")
            template = spec_from_record(record["template"], self.codec.decode(row.payload))
            if record.get("deadline_in_ns") is not None:
                template.deadline_in_ns = record["deadline_in_ns"]
                template.plain = False
            return RestoredSchedule(row.name, record["cron"], record.get("tz", "UTC"),
                                    record.get("overlap", "skip"), record["tolerance_ns"],
                                    record.get("on_miss", "run_late"), record.get("key"), template,
                                    record.get("next_start_ns"), record.get("last_task"),
                                    record.get("last_start_ns"))
        except Exception as exc:
            return RestoredSchedule(row.name, record.get("cron", ""), record.get("tz", "UTC"), "skip", 0,
                                    "run_late", None, None, None, None, None,
                                    error=f"cannot decode the stored schedule: {exc}")

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop admitting work, give running attempts ``grace`` seconds
        (default ``shutdown_grace``), then cancel them. Handles of tasks that
        did not finish resolve with ``TaskFailed(status="shutdown")``.

        Dispatches that had not started are given back: queued work stays
        queued (in the store, when there is one) without using an attempt.
        Plain functions still running after the grace are told so
        (``ctx.is_cancelled()``) and left to finish in their threads.

        A scheduler still waiting to lead (a standby) stops waiting: its
        ``start()`` raises ``SchedulerError``."""
        if self._forks != _process.forks:
            raise _process.forked_error(self._pid)
        if self._state in (_NEW, _STOPPED):
            self._state = _STOPPED
            return
        if self._state == "starting":   # a standby waiting to lead (or recovering): give up
            if self._abort_start is not None and not self._abort_start.done():
                self._abort_start.set_result(None)
            return
        if self._state == _STOPPING:
            while self._state != _STOPPED:
                await realtime.sleep(0.01)
            return
        grace = self.shutdown_grace if grace is None else grace
        if self._cluster is not None and not self._leading:
            await self._shutdown_follower(grace)
            return
        with self._lock:
            self._state = _STOPPING
            core = self._core
            assert core is not None
            core.stop_dispatching()
            turns = [t for waiting in self._room.values() for t in waiting]
            self._room.clear()
            busy = bool(core.running)
        for turn in turns:
            if turn.future is not None and not turn.future.done():
                turn.future.set_exception(SchedulerError("the scheduler is shutting down"))
        if busy and grace > 0:
            self._drained = asyncio.Event()
            try:
                await realtime.wait_for(self._drained.wait(), grace)   # real time, frozen clock or not
            except asyncio.TimeoutError:
                pass
        unstarted = [] if self._cluster is None else await self._cluster.settle_offers()
        unstarted += [lease for runner in self._runners.values() for lease in runner.cancel_all()]
        if unstarted:
            with self._lock:
                now = self._now_ns()
                for lease in unstarted:
                    core.give_back(now, lease)
                self._pump()
        await asyncio.sleep(0)
        if self._log is None:
            left = len(core.tasks)
            if left:
                log.warning("shutdown: %d unfinished tasks are dropped (without a store nothing keeps them)",
                            left, extra={"action": "dropped", "count": left})
        else:
            if not await self._log.flush(self._log.commit_timeout):
                log.error("shutdown: some changes could not be stored", extra={"action": "store_outage"})
            self._log.fail_all(SchedulerError("the scheduler shut down"))
            if self._cluster is not None:   # a call left unanswered would be carried out again
                await self._cluster.finish_serving(self._log.commit_timeout)
            try:
                await self.store.release_leadership()
                log.info("leadership released", extra={"action": "leader_released"})
            except Exception as exc:
                log.error("could not release leadership: %s", exc, extra={"action": "store_outage"})
        if self._cluster is not None:
            await self._cluster.stop(0.0)
        self._finish_shutdown()

    async def _shutdown_follower(self, grace: float) -> None:
        """A follower leaves: the attempts leased to it get ``grace``; those it
        never started go back to the leader (no attempt used)."""
        with self._lock:
            self._state = _STOPPING
        task, self._lead_task = self._lead_task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self._leading:   # it took the lead just before the cancel: shut down as the leader
            with self._lock:
                self._state = _RUNNING
            await self.shutdown(grace)
            return
        cluster = self._cluster
        assert cluster is not None
        await cluster.stop(grace)
        self._finish_shutdown()

    def _finish_shutdown(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            handles = self._handles
            self._handles = {}
            self._delivering.clear()
            for load in list(self._loading.values()):
                load.cancel()
            self._loading.clear()
            for value in handles.values():
                for handle in value if isinstance(value, list) else (value,):
                    handle.set_failure("shutdown", "the scheduler shut down before the task finished")
            sinks, self._sinks = self._sinks, []
            self._state = _STOPPED
        for sink in sinks:
            sink.end()
        forget, self._forget_siblings = self._forget_siblings, None
        if forget is not None:
            forget()

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    @property
    def running(self) -> bool:
        return self._state == _RUNNING

    def _check(self) -> Core:
        """The engine, if calls are allowed now and here (on the loop)."""
        core = self._check_serving()
        self._check_loop()
        return core

    def _check_loop(self) -> None:
        """Raise unless called on the scheduler's loop."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not self._loop:
            raise SchedulerError("the scheduler belongs to another event loop; call it from that loop "
                                 "(or use BlockingScheduler from threads)")

    def _after_fork(self) -> None:
        # In the child of a fork: a thread of the parent may have held it.
        self._lock = threading.RLock()

    def _check_serving(self) -> Core:
        """The engine, if the scheduler serves (from any thread)."""
        self._check_state()
        core = self._core
        if core is None or not self._leading:
            raise SchedulerError("this process does not lead the store: its calls go through the store")
        return core

    def _check_state(self) -> None:
        """Raise unless the scheduler serves here and now (leading or following)."""
        if self._forks != _process.forks:
            raise _process.forked_error(self._pid)
        if self._state != _RUNNING:
            if self._state == _NEW:
                raise RuntimeError("the scheduler is not started: use 'async with' or await start()")
            raise SchedulerError(f"the scheduler is {self._state}")
        loop = self._loop
        assert loop is not None
        if loop.is_closed():
            self._state = _STOPPED
            raise SchedulerError("the event loop that ran the scheduler is closed")

    # ================================================================ the pump

    def _pump(self) -> None:
        """Carry out everything the engine asked for, then re-arm the timer."""
        with self._lock:
            if self._log is None:
                self._pump_memory()
            else:
                self._pump_durable()

    def _pump_memory(self) -> None:
        core = self._core
        assert core is not None
        actions = core.actions
        runners = self._runners
        handles = self._handles
        sinks = self._sinks
        while actions:
            raw = actions.popleft()
            kind = raw[0]
            if kind == 1:   # DISPATCH
                entry = raw[1]
                runners[entry.pool.name].start(Attempt(entry, raw[2], raw[3]))
            elif kind == 3:   # EVENT
                status = raw[4]
                if status is SUCCEEDED:
                    self._deliver(raw[1])
                elif status in _QUIET_ENDS:
                    if handles:
                        handle = handles.pop(raw[1], None)
                        if handle is not None:
                            self._resolve(handle, raw[1], status, raw[7])
                elif status is DEAD_LETTERED:
                    self._dead_letter(raw)
                if sinks:
                    event = act.event_from(raw)
                    for sink in sinks:
                        sink.deliver(event)
            elif kind == 2:   # ABORT
                self._abort(raw[1], abort_reason(raw[3]))
        # (_after_effects, inline: this runs after every engine step)
        if self._room:
            self._wake_room()
        if self._drained is not None and not core.running:
            self._drained.set()
        if self._timer_at is not None or core.timer_heap:
            self._arm()

    def _pump_durable(self) -> None:
        """The pump with a store: mutations go to the open batch; every other
        action waits until the mutations before it are committed."""
        core = self._core
        log_ = self._log
        assert core is not None and log_ is not None
        actions = core.actions
        while actions:
            raw = actions.popleft()
            if raw[0] == 4:   # PERSIST
                log_.add(raw[1])
            elif not log_.hold(raw):
                self._effect(raw)
        log_.kick()
        self._after_effects()

    def _effect(self, raw: tuple[Any, ...]) -> None:
        kind = raw[0]
        if kind == 1:
            entry = raw[1]
            if self._state != _RUNNING:
                # Committed before the shutdown began: it has not started, so it
                # goes back to the queue (and the store) without using an attempt.
                core = self._core
                assert core is not None
                core.give_back(self._now_ns(), raw[2])
                return
            self._runners[entry.pool.name].start(Attempt(entry, raw[2], raw[3]))
        elif kind == 3:
            status = raw[4]
            if status is SUCCEEDED:
                self._deliver(raw[1])
            elif status in _QUIET_ENDS:
                handle = self._handles.pop(raw[1], None)
                if handle is not None:
                    self._resolve(handle, raw[1], status, raw[7])
            elif status is DEAD_LETTERED:
                self._dead_letter(raw)
            if self._sinks:
                event = act.event_from(raw)
                for sink in self._sinks:
                    sink.deliver(event)
        elif kind == 2:
            self._abort(raw[1], abort_reason(raw[3]))

    def _release(self, effects: list[Any]) -> None:
        """Effects whose mutations were committed (the durable log's hook)."""
        with self._lock:
            if self._state not in (_RUNNING, _STOPPING):
                return
            for raw in effects:
                self._effect(raw)
            core = self._core
            assert core is not None
            if core.actions:
                self._pump()   # what giving back a dispatch changed
            else:
                self._after_effects()

    def _after_effects(self) -> None:
        if self._room:
            self._wake_room()
        if self._drained is not None:
            core = self._core
            assert core is not None   # a drain is awaited only once started
            if not core.running:
                self._drained.set()
        self._arm()

    def _ask_pump(self) -> None:
        """From another thread, under the lock: have the loop pump (once)."""
        if not self._pump_asked:
            self._pump_asked = True
            loop = self._loop
            assert loop is not None
            loop.call_soon_threadsafe(self._asked_pump)

    def _asked_pump(self) -> None:
        with self._lock:
            self._pump_asked = False
            if self._state in (_RUNNING, _STOPPING):
                self._pump()

    def _accepting_commits(self) -> bool:
        return self._state in (_RUNNING, _STOPPING)

    def _withdraw(self, task_ids: Iterable[int], message: str) -> None:
        """Submissions the store did not make durable, whose callers are told
        so: the engine forgets them (the durable log's hook)."""
        with self._lock:
            if self._core is None:
                return
            for task_id in self._core.withdraw(self.clock.now_ns(), task_ids, message):
                handle = self._handles.pop(task_id, None)
                for h in handle if isinstance(handle, list) else (() if handle is None else (handle,)):
                    h.set_failure(CANCELLED, message)
            self._pump()

    def _drop_schedule(self, name: str) -> None:
        """A schedule the store refused: remove it, so memory and store agree
        (the durable log's hook)."""
        with self._lock:
            if self._core is not None:
                self._core.remove_recurring(self.clock.now_ns(), name)
                self._pump()

    def _lost_threadsafe(self, reason: str) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._lost(reason)
        else:
            loop.call_soon_threadsafe(self._lost, reason)

    def _lost(self, reason: str) -> None:
        """Leadership is gone (fenced, lease lost): stop at once, write nothing
        more (with processes sharing the store: follow from now on)."""
        with self._lock:
            if self._state not in (_RUNNING, _STOPPING):
                return
            if self._cluster is not None and self._state == _RUNNING:
                if self._leading:
                    self._demote(reason)
                return
            log.error("leadership lost: %s", reason, extra={"action": "leader_lost", "epoch": self.epoch})
            self._state = _STOPPING
            core = self._core
            assert core is not None
            core.stop_dispatching()
            turns = self._take_room_waiters()
        error = SchedulerError(f"this scheduler lost leadership ({reason}); another one serves now")
        self._fail_in_flight(turns, error)
        for runner in self._runners.values():
            runner.cancel_all()
        self._finish_shutdown()
        self.lost_reason = reason

    def _take_room_waiters(self) -> list[_Turn]:
        turns = [t for waiting in self._room.values() for t in waiting]
        self._room.clear()
        return turns

    def _fail_in_flight(self, turns: list[_Turn], error: SchedulerError) -> None:
        """Leadership is gone: submitters waiting for room and commits not yet
        acknowledged get ``error``; nothing more is written."""
        for turn in turns:
            if turn.future is not None and not turn.future.done():
                turn.future.set_exception(error)
        if self._log is not None:
            self._log.fail_all(error)
            self._log.discard_open()

    def _arm(self) -> None:
        core = self._core
        assert core is not None
        if self._timer_at is None and not core.timer_heap:
            return   # no timer armed and none wanted: the common case, kept cheap
        at = core.next_wakeup()
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is not None and self._state in (_RUNNING, _STOPPING):
            self._timer = self.clock.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            self._timer_at = None
            loop = self._loop
            if self._state not in (_RUNNING, _STOPPING) or loop is None or loop.is_closed():
                return
            core = self._core
            assert core is not None
            core.advance(self.clock.now_ns())
            self._pump()

    # ================================================================ the runners' link

    def _report(self, attempt: Attempt, outcome: str, output: Any, message: str | None,
                retry_after_ns: int | None) -> None:
        """A runner's outcome for one attempt."""
        with self._lock:
            core = self._core
            if self._state is _STOPPED or core is None:
                return
            now = _wall_ns() if self._system_time else self._now_ns()
            if core.complete(now, attempt.lease, outcome, output, message, retry_after_ns) \
                    and outcome == SUCCESS:
                # Kept until its success event goes out (with a store, once committed):
                # then it goes to the handles waiting for it, whatever the cache holds.
                self._delivering[attempt.id] = output
            if self._log is None:
                self._pump_memory()
            else:
                self._pump_durable()

    def _not_started(self, lease: int, message: str) -> None:
        """A runner could not start this attempt: it gives the attempt back."""
        with self._lock:
            if self._state not in (_RUNNING, _STOPPING):
                return
            delay = _NOT_STARTED_DELAY_NS if self._state == _RUNNING else 0
            core = self._core
            assert core is not None
            if core.give_back(self._now_ns(), lease, delay, message):
                log.warning("an attempt could not start (%s); its task waits %g s without using an attempt",
                            message, delay / 1e9, extra={"action": "not_started", "error": message})
            self._pump()

    def _heartbeat(self, lease: int) -> bool:
        with self._lock:
            if self._state not in (_RUNNING, _STOPPING):
                return False
            core = self._core
            assert core is not None
            alive = core.heartbeat(self.clock.now_ns(), lease)
            self._pump()
            return alive

    def _set_capacity_now(self, pool: str, labels: dict[str, str], slots: int) -> None:
        """A runner's capacity for a worker group (remote workers came or went;
        also while the runner is made, at start)."""
        with self._lock:
            core = self._core
            if self._state in (_NEW, _STOPPED) or core is None:
                return
            core.set_group_capacity(self.clock.now_ns(), pool, labels, slots)
            if self._state != "starting":
                self._pump()

    # ================================================================ handles

    def _deliver(self, task_id: int) -> None:
        """A success event goes out: hand the output to the waiting handles
        and keep it in the cache for handles attached later."""
        output = self._delivering.pop(task_id, _NO_OUTPUT)
        if output is not _NO_OUTPUT and self._output_limit:
            self._outputs[task_id] = output          # (as _remember_output, inline: every success)
            order = self._output_order
            order.append(task_id)
            if len(order) > self._output_limit:
                self._outputs.pop(order.popleft(), None)
        handle = self._handles.pop(task_id, None)
        if handle is not None:
            if output is not _NO_OUTPUT and type(handle) is TaskHandle:
                handle.set_result(output)   # the common case, without _resolve's checks
            else:
                self._resolve(handle, task_id, SUCCEEDED, None, output)

    def _remember_output(self, task_id: int, output: Any) -> None:
        if not self._output_limit:
            return
        self._outputs[task_id] = output
        self._output_order.append(task_id)
        if len(self._output_order) > self._output_limit:
            self._outputs.pop(self._output_order.popleft(), None)

    def _dead_letter(self, raw: tuple[Any, ...]) -> None:
        """A task ran out of attempts: log it, then resolve its handles."""
        task_id, pool, key, attempt, message = raw[1], raw[2], raw[3], raw[5], raw[7]
        log.warning("task %d (pool %s) dead-lettered after attempt %d: %s", task_id, pool, attempt, message,
                    extra={"action": "dead_letter", "task_id": task_id, "pool": pool, "key": key,
                           "attempt": attempt, "error": message})
        handle = self._handles.pop(task_id, None)
        if handle is not None:
            self._resolve(handle, task_id, DEAD_LETTERED, message)

    def _resolve(self, handle: Any, task_id: int, status: str, message: str | None,
                 output: Any = _NO_OUTPUT) -> None:
        """Resolve ``handle`` (one or a list). For a success, ``output`` if given,
        else the cached output; ``message`` then says why there is none."""
        if status is SUCCEEDED and output is _NO_OUTPUT:
            output = self._outputs.get(task_id, _NO_OUTPUT)
            if output is _NO_OUTPUT and message is None:
                message = ("the task succeeded but its output is no longer available (no store, and "
                           f"output_cache keeps only the last {self._output_limit} outputs)"
                           if self.store is None else
                           "the task succeeded but its output is no longer available (the store has "
                           "none: it could not be encoded, or was pruned)")
        for h in handle if isinstance(handle, list) else (handle,):
            if status is not SUCCEEDED:
                h.set_failure(status, message)
            elif output is _NO_OUTPUT:
                h.set_failure(SUCCEEDED, message)
            else:
                h.set_result(output)

    def _attach(self, task_id: int, key: str | None, duplicate: bool) -> TaskHandle:
        """A handle on a known task (under the lock, from any thread). Of a
        finished task whose output is not at hand (not cached), it resolves
        once the output is loaded from the store."""
        loop = self._loop
        core = self._core
        assert loop is not None and core is not None   # only a started scheduler attaches
        handle = TaskHandle(task_id, key, duplicate, loop)
        if task_id not in core.tasks and task_id not in self._delivering:
            info = core.info(task_id)
            if info.status not in TERMINAL:
                return handle
            if info.status is not SUCCEEDED or self.store is None or task_id in self._outputs:
                self._resolve(handle, task_id, info.status, info.message)
                return handle
            if task_id not in self._loading:
                self._load_output_soon(task_id)
        existing = self._handles.get(task_id)
        if existing is None:
            self._handles[task_id] = handle
        elif isinstance(existing, list):
            existing.append(handle)
        else:
            self._handles[task_id] = [existing, handle]
        return handle

    def _load_output_soon(self, task_id: int) -> None:
        loop = self._loop
        assert loop is not None
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._loading[task_id] = loop.create_task(self._load_output(task_id))
        else:
            loop.call_soon_threadsafe(self._start_load, task_id)

    def _start_load(self, task_id: int) -> None:
        with self._lock:
            if task_id not in self._loading and task_id in self._handles and self._state == _RUNNING:
                loop = self._loop
                assert loop is not None
                self._loading[task_id] = loop.create_task(self._load_output(task_id))

    async def _load_output(self, task_id: int) -> None:
        """Resolve the handles of a finished task with its stored output."""
        output = _NO_OUTPUT
        message = None
        try:
            data = await self.store.load_output(task_id)
            if data is not None:
                output = self.codec.decode(data)
        except asyncio.CancelledError:
            raise   # shutdown: it fails the handles itself
        except Exception as exc:
            message = f"the task succeeded but its output could not be loaded from the store: {exc}"
        finally:
            self._loading.pop(task_id, None)
        with self._lock:
            if output is not _NO_OUTPUT and self._output_limit:
                self._remember_output(task_id, output)
            handle = self._handles.pop(task_id, None)
            if handle is not None:
                self._resolve(handle, task_id, SUCCEEDED, message, output)

    # ================================================================ submission

    def _admit_now(self, core: Core, spec: TaskSpec) -> tuple[int, bool] | None:
        """Admission, the one place it happens (under the lock): the answer,
        or None when a full queue asks the submitter to wait for room."""
        now = _wall_ns() if self._system_time else self._now_ns()
        try:
            result = core.submit(now, spec)
        except QueueFull as exc:
            if core.overflow_policy(spec.pool) != "wait" or exc.never:
                if self._admission_listeners:
                    self._tell_admission(now, (spec,), None, exc)
                raise
            return None
        except AdmissionError as exc:
            if self._admission_listeners:
                self._tell_admission(now, (spec,), None, exc)
            raise
        if self._admission_listeners:
            self._tell_admission(now, (spec,), (result,), None)
        return result

    def _tell_admission(self, now: int, specs: Sequence[TaskSpec],
                        results: Sequence[tuple[int, bool]] | None, error: AdmissionError | None) -> None:
        for listener in self._admission_listeners:
            try:
                listener(now, specs, results, error)
            except Exception:  # the admission stands whatever a listener does
                log.exception("an admission listener failed", extra={"action": "listener_error"})

    async def _admit(self, spec: TaskSpec) -> tuple[int, bool]:
        self._check()
        if self._log is not None:
            encoded_payload(spec, self.codec)   # TypeError now, before anything is stored
        return await self._with_room(lambda core: self._admit_now(core, spec), (spec.pool, spec.priority))

    async def _with_room(self, attempt: Callable[[Core], _T | None], line: Any) -> _T:
        """Run ``attempt(core)`` (under the lock) until it fits; while it
        returns None (a full queue with the "wait" policy), wait for room.

        Waiters queue per (pool, class) line, in arrival order: a submitter
        keeps its place across retries, and one line's full bound does not
        hold up another's. ``line`` is that key, or a one-item list holding
        it when the attempt updates it (batches).
        """
        turn = None
        try:
            while True:
                with self._lock:
                    result = attempt(self._check())
                    if result is not None:
                        return result
                    key = line[0] if isinstance(line, list) else line
                    if turn is None or turn.key != key:
                        if turn is not None:
                            self._leave_line(turn)
                        turn = _Turn(key)
                        self._room.setdefault(key, deque()).append(turn)
                    loop = self._loop
                    assert loop is not None
                    turn.future = loop.create_future()
                await turn.future
        finally:
            if turn is not None:
                with self._lock:
                    self._leave_line(turn)
                    if self._state == _RUNNING:
                        self._wake_room()   # the next in line may fit now

    def _leave_line(self, turn: _Turn) -> None:
        waiting = self._room.get(turn.key)
        if waiting is not None:
            try:
                waiting.remove(turn)
            except ValueError:
                pass
            if not waiting:
                del self._room[turn.key]

    def _wake_room(self) -> None:
        # The first in each line retries; the next is woken once it is admitted.
        for waiting in self._room.values():
            future = waiting[0].future
            if future is not None and not future.done():
                future.set_result(None)

    async def submit(self, payload: Any = None, **options: Any) -> TaskHandle:
        """Submit a task; returns its ``TaskHandle``. Options are those of
        ``cronoq.Task`` (pool, kind, priority, key, deadline_in, ...)."""
        handle: TaskHandle = await self._submit_spec(TaskSpec(payload, **options), True)
        return handle

    async def enqueue(self, payload: Any = None, **options: Any) -> int:
        """Submit a task without a handle (cheaper); returns its id."""
        task_id: int = await self._submit_spec(TaskSpec(payload, **options), False)
        return task_id

    async def _submit_spec(self, spec: TaskSpec, handle: bool,
                           wrap: Callable[[TaskHandle], Any] | None = None, hooked: bool = False,
                           pair: bool = False) -> Any:
        if self._submit_hooks and not hooked:
            spec = self._hooked(spec)
        if not self._leading and self._cluster is not None:
            self._check_state()
            return await self._follow_one(spec, handle, wrap, pair)
        task_id, duplicate = await self._admit(spec)
        with self._lock:
            value: Any = (task_id, duplicate) if pair else task_id
            if handle:
                value = self._attach(task_id, spec.key, duplicate)
                if wrap is not None:
                    value = wrap(value)
            self._pump()
        if self._log is not None:
            await self._log.durable(*_claims(((task_id, duplicate),)))
        return value

    def submit_from_thread(self, spec: TaskSpec, *, handle: bool = True,
                           wrap: Callable[[TaskHandle], Any] | None = None
                           ) -> tuple[Any, Callable[[], Awaitable[Any]] | None]:
        """Submit from a thread other than the scheduler's loop: the entry
        point of ``BlockingScheduler`` and of servers.

        Admission runs at once, on this thread, under the engine's lock, so
        its errors are raised here and its answer does not wait for the loop;
        the loop is then asked to carry out what the engine queued. Returns
        ``(value, later)``: ``value`` is the handle (``wrap(handle)`` if
        given, made under the lock) or, with ``handle=False``, the pair
        ``(id, duplicate)``. When
        ``later`` is not None, the call is not answered yet: run
        ``await later()`` on the loop for the value (with a store, the commit
        of the submission; with a full queue under the "wait" policy, the
        wait for room and the admission).
        """
        if self._submit_hooks:
            spec = self._hooked(spec)
        if not self._leading and self._cluster is not None:
            self._check_state()
            encoded_payload(spec, self.codec)   # TypeError here, at the call
            return None, lambda: self._follow_one(spec, handle, wrap, not handle)
        if self._log is not None:
            encoded_payload(spec, self.codec)   # outside the lock: it may be slow
        lock = self._lock
        if not lock.acquire(False):
            self._wait_for_engine(lock)
        try:
            result = self._admit_now(self._check_serving(), spec)
            if result is None:
                return None, lambda: self._submit_spec(spec, handle, wrap, hooked=True, pair=not handle)
            task_id, duplicate = result
            value: Any = result
            if handle:
                value = self._attach(task_id, spec.key, duplicate)
                if wrap is not None:
                    value = wrap(value)
            self._ask_pump()
        finally:
            lock.release()
        if self._log is None:
            return value, None
        log_ = self._log

        async def committed() -> Any:
            await log_.durable(*_claims(((task_id, duplicate),)))
            return value

        return None, committed

    @staticmethod
    def _wait_for_engine(lock: threading.RLock) -> None:
        """The loop holds the engine: yield the interpreter to it instead of
        blocking (a thread blocked on the lock would wait for the loop thread
        to give up the interpreter, up to a switch interval, each time)."""
        for _ in range(64):
            time.sleep(0)
            if lock.acquire(False):
                return
        lock.acquire()

    async def _admit_batch(self, tasks: Iterable[TaskSpec], hooked: bool = False
                           ) -> tuple[list[TaskSpec], list[tuple[int, bool]]]:
        specs = list(tasks)
        for i, spec in enumerate(specs):
            if not isinstance(spec, TaskSpec):
                raise TypeError(f"submit_batch takes cronoq.Task objects; item {i} is {type(spec).__name__}")
        if self._submit_hooks and not hooked:
            specs = [self._hooked(spec) for spec in specs]
        if not self._leading and self._cluster is not None:
            self._check_state()
            return specs, await self._follow_submit(specs, True)
        for i, spec in enumerate(specs):
            if self._log is not None:
                try:
                    encoded_payload(spec, self.codec)
                except InvalidTask as exc:
                    raise exc.at_index(i) from None

        def attempt(core: Core) -> tuple[list[TaskSpec], list[tuple[int, bool]]] | None:
            now = _wall_ns() if self._system_time else self._now_ns()
            try:
                results = core.submit_batch(now, specs)
            except QueueFull as exc:
                index = exc.index if exc.index is not None else 0
                if core.overflow_policy(specs[index].pool) != "wait" or exc.never:
                    if self._admission_listeners:
                        self._tell_admission(now, specs, None, exc)
                    raise
                line[0] = (specs[index].pool, specs[index].priority)
                return None
            except AdmissionError as exc:
                if self._admission_listeners:
                    self._tell_admission(now, specs, None, exc)
                raise
            if self._admission_listeners:
                self._tell_admission(now, specs, results, None)
            return specs, results

        line = [(specs[0].pool, specs[0].priority) if specs else None]
        result: tuple[list[TaskSpec], list[tuple[int, bool]]] = await self._with_room(attempt, line)
        return result

    async def submit_batch(self, tasks: Iterable[TaskSpec]) -> list[TaskHandle]:
        """Submit ``cronoq.Task`` objects atomically: all or none. Tasks may
        depend on keys defined anywhere in the batch."""
        specs, results = await self._admit_batch(tasks)
        if not self._leading and self._cluster is not None:
            return [self._watched(task_id, spec.key, duplicate) for spec, (task_id, duplicate) in zip(specs, results)]
        with self._lock:
            handles = [self._attach(task_id, spec.key, duplicate)
                       for spec, (task_id, duplicate) in zip(specs, results)]
            self._pump()
        if self._log is not None:
            await self._log.durable(*_claims(results))
        return handles

    async def enqueue_batch(self, tasks: Iterable[TaskSpec]) -> list[int]:
        """``submit_batch`` without handles; returns the ids."""
        _, results = await self._admit_batch(tasks)
        if not self._leading and self._cluster is not None:
            return [task_id for task_id, _ in results]
        self._pump()
        if self._log is not None:
            await self._log.durable(*_claims(results))
        return [task_id for task_id, _ in results]

    # ================================================================ other calls

    async def cancel(self, ref: int | str) -> bool:
        """Cancel a task by id or key: True if this call cancelled it, False if
        it had already finished. ``UnknownTask`` if no such task is known."""
        if not self._leading and self._cluster is not None:
            return bool(await self._follow_call("cancel", {"ref": ref}))
        with self._lock:
            cancelled = self._check().cancel(self.clock.now_ns(), ref)
            self._pump()
        if self._log is not None:
            await self._log.durable()
        return cancelled

    async def handle(self, ref: int | str) -> TaskHandle:
        """A handle on an existing task, live or finished (within retention)."""
        if not self._leading and self._cluster is not None:
            found = info_from_dict(await self._follow_call("info", {"ref": ref}))
            watched = self._watched(found.id, found.key, True)
            if found.status in TERMINAL:
                try:
                    await watched
                except (TaskFailed, asyncio.CancelledError):
                    if watched.status is None:
                        raise
            return watched
        with self._lock:
            info = self._check().info(ref)
        if info.status in TERMINAL and self._log is not None:
            await self._log.durable()   # an ended task is reported only once its end is stored
        with self._lock:
            handle = self._attach(info.id, info.key, True)
        if info.status in TERMINAL and not handle.done():
            # Its output is being loaded from the store: return the handle resolved.
            try:
                await handle
            except (TaskFailed, asyncio.CancelledError):
                if handle.status is None:
                    raise   # this call was cancelled
        return handle

    async def info(self, ref: int | str) -> TaskInfo:
        """What the scheduler knows of a task (status, attempt, message, its
        declared stages and checkpoints...)."""
        if not self._leading and self._cluster is not None:
            return info_from_dict(await self._follow_call("info", {"ref": ref}))
        with self._lock:
            info = self._check().info(ref)
        book = self._checkpoints
        if info.stages is None:
            stages = book.stages_of(info.id)
            info.stages = list(stages) if stages is not None else None
        info.checkpoints = book.of(info.id, tuple(info.stages) if info.stages else None)
        return info

    # ================================================================ checkpoints

    def _attempt_live(self, attempt: Attempt) -> bool:
        with self._lock:
            core = self._core
            return (not attempt.cancelled and core is not None and self._state in (_RUNNING, _STOPPING)
                    and attempt.lease in core.running)

    def _knows(self, task_id: int) -> bool:
        core = self._core
        return core is not None and (task_id in core.tasks or task_id in core.retained)

    async def _save_checkpoint(self, task_id: int, stage: str, data: bytes, attempt: int, at_ns: int) -> None:
        """Write a checkpoint to the store, fenced by this leader's epoch."""
        try:
            await self.store.save_checkpoint(self.epoch, task_id, stage, data, attempt, at_ns)
        except Fenced as exc:
            self._lost(f"fenced: {exc}")
            raise

    async def _save_for_member(self, body: dict[str, Any], data: bytes) -> dict[str, Any]:
        """The leader saves the checkpoint of an attempt it leased to another
        process, if that attempt is still out there (its lease, task and
        attempt number match): as its own attempts' checkpoints, committed
        and fenced by its epoch before the member gets the answer."""
        cluster = self._cluster
        assert cluster is not None
        stage = body["stage"]
        attempt = cluster.leased_attempt(int(body["lease"]), str(body["member"]))
        if attempt is None or attempt.id != body["task"] or attempt.attempt != body["attempt"]:
            raise CheckpointError(f"attempt {body['attempt']} of task {body['task']} is over (it ended, was "
                                  f"cancelled, given up, or placed by a leader that is gone): stage {stage!r} "
                                  f"was not saved")
        try:
            value = self.codec.decode(data)
        except Exception as exc:
            raise CheckpointError(f"the checkpoint of stage {stage!r} cannot be decoded by the leader's codec: "
                                  f"{type(exc).__name__}: {exc}") from None
        checkpoint = await self._checkpoints.save(attempt, stage, value)
        return {"at": checkpoint.at}

    def _stage_completed(self, attempt: Attempt, checkpoint: Checkpoint) -> None:
        """A stage's checkpoint was saved: tell the subscribers (with every transition)."""
        if not self._config.emit_transitions:
            return
        with self._lock:
            sinks = list(self._sinks)
        if sinks:
            event = act.StatusEvent(attempt.id, attempt.pool, attempt.key, RUNNING, attempt.attempt,
                                    checkpoint.at, f"stage {checkpoint.stage!r} completed", checkpoint.stage,
                                    attempt.tenant)
            for sink in sinks:
                sink.deliver(event)

    async def snapshot(self) -> Snapshot:
        """Pools, quality metrics over the window, and totals since start."""
        if not self._leading and self._cluster is not None:
            return snapshot_from_dict(await self._follow_call("snapshot", {}))
        with self._lock:
            self._check()
            return self._snapshot_locked()

    def snapshot_from_thread(self, timeout: float | None = None) -> Snapshot:
        """``snapshot()`` from any thread, at once (metrics scrapes, the
        blocking facade): read under the engine's lock, waiting for it at
        most ``timeout`` seconds (``SchedulerError`` after that)."""
        if not self._leading and self._cluster is not None:
            return self._follow_from_thread(timeout)
        if not self._lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            raise SchedulerError(f"the scheduler did not let go of its engine within {timeout:g} s")
        try:
            self._check_serving()
            snap = self._snapshot_locked(pump=False)
            core = self._core
            assert core is not None
            if core.actions:
                self._ask_pump()   # taking it fired timers: the loop carries out the rest
            return snap
        finally:
            self._lock.release()

    def _snapshot_locked(self, pump: bool = True) -> Snapshot:
        """A snapshot: the engine's view plus the runners'."""
        core = self._core
        assert core is not None
        snap = core.snapshot(self.clock.now_ns())
        if pump:
            self._pump()
            self._checkpoints.sweep(at_most_every=1.0)   # (on the loop: the book is the loop's)
        snap.checkpoints = self._checkpoints.stats()
        runners = self._runners
        for pool in snap.pools:
            runner = runners.get(pool.name)
            if runner is not None:
                pool.stray_threads = runner.stray_threads
        return snap

    def events(self, on_lag: str = "drop") -> EventStream:
        """A stream of status events (terminal ones; every transition with
        ``emit_transitions=True``). Use ``async with`` or close it."""
        self._check_state()
        self._check_loop()
        stream = EventStream(self.event_capacity, on_lag, self.unsubscribe)
        self.subscribe(stream)
        return stream

    def subscribe(self, sink: EventSink) -> None:
        """Deliver every status event to ``sink`` (from any thread); its
        ``deliver`` and ``end`` run on the scheduler's loop. ``events()`` is
        the ready-made sink."""
        with self._lock:
            self._check_state()
            self._sinks.append(sink)

    def unsubscribe(self, sink: EventSink) -> None:
        """Stop delivering events to ``sink`` (from any thread)."""
        with self._lock:
            if sink in self._sinks:
                self._sinks.remove(sink)

    async def set_capacity(self, pool: str, capacity: int) -> None:
        """Set the capacity of a pool's unlabeled workers (an autoscaled pool
        overrides it at its next evaluation)."""
        if not self._leading and self._cluster is not None:
            await self._follow_call("set_capacity", {"pool": pool, "capacity": capacity})
            return
        with self._lock:
            self._check().set_capacity(self.clock.now_ns(), pool, capacity)
            self._pump()

    async def set_group_capacity(self, pool: str, labels: dict[str, str], capacity: int) -> None:
        """Set the capacity of the pool's workers that carry exactly ``labels``."""
        if not self._leading and self._cluster is not None:
            await self._follow_call("set_group_capacity", {"pool": pool, "labels": labels, "capacity": capacity})
            return
        with self._lock:
            self._check().set_group_capacity(self.clock.now_ns(), pool, labels, capacity)
            self._pump()

    async def add_recurring(self, name: str, cron: str, payload: Any = None, *, tz: str = "UTC",
                            overlap: str = "skip", tolerance: float | None = None,
                            on_miss: str | None = None, key: str | None = None,
                            **task_options: Any) -> None:
        """Register (or replace) a cron schedule; each occurrence is a
        fixed-start task built from ``payload`` and ``task_options``."""
        self._check_state()
        check_name(name, "name", error=ValueError)
        template = TaskSpec(payload, key=key, **task_options)
        if not self._leading and self._cluster is not None:
            record = spec_record(template, 0)
            record.pop("deadline_ns", None)   # relative: sent apart
            await self._follow_call("add_recurring", {
                "name": name, "cron": cron, "template": record, "deadline_in_ns": template.deadline_in_ns,
                "tz": tz, "overlap": overlap, "tolerance": tolerance, "on_miss": on_miss},
                [encoded_payload(template, self.codec)])
            return
        await self._add_recurring_spec(name, cron, template, tz, overlap, tolerance, on_miss)

    async def _add_recurring_spec(self, name: str, cron: str, template: TaskSpec, tz: str, overlap: str,
                                  tolerance: float | None, on_miss: str | None) -> None:
        if self._log is not None:
            encoded_payload(template, self.codec)
        with self._lock:
            self._check().add_recurring(self.clock.now_ns(), name, cron, template, tz=tz, overlap=overlap,
                                        tolerance=tolerance, on_miss=on_miss)
            self._pump()
        if self._log is not None:
            await self._log.durable(needs=(name,))

    async def remove_recurring(self, name: str) -> bool:
        """Stop a schedule (an occurrence already created still runs)."""
        if not self._leading and self._cluster is not None:
            return bool(await self._follow_call("remove_recurring", {"name": name}))
        with self._lock:
            removed = self._check().remove_recurring(self.clock.now_ns(), name)
            self._pump()
        if self._log is not None:
            await self._log.durable()
        return removed

    # ================================================================ many processes

    @property
    def leading(self) -> bool:
        """Whether this process runs the engine: without a store always (once
        started); with a shared store, only the process that leads it (the
        others follow: their calls go through the store)."""
        return self._leading and self._state in (_RUNNING, _STOPPING)

    async def _start_cluster(self) -> None:
        """Join the store's processes: lead at once if the store has no leader
        (recovering first), else follow and try to lead in the background."""
        store = self.store
        loop = self._loop
        assert loop is not None
        transport = await store.cluster_transport()
        cluster = Cluster(transport, self.codec, pools=[p.name for p in self.pools if p.runner is None],
                          request_timeout=float(store.request_timeout), poll=float(store.cluster_poll),
                          heartbeat=float(store.member_heartbeat), member_ttl=float(store.member_ttl))
        self._cluster = cluster
        cluster.start(loop)
        for pool in self.pools:
            if pool.runner is None:
                cluster.member_link(pool.name, functools.partial(self._executor_runner, pool),
                                    checkpoints=self._checkpoints)
        self._abort_start = abort = loop.create_future()
        epoch: int | None = None
        try:
            try:
                epoch = await store.try_leadership()
            except StoreUnavailable as exc:   # busy, say: follow, and try again in the background
                log.warning("could not try to lead at start: %s", exc, extra={"action": "store_outage"})
            if epoch is not None:
                self.epoch = epoch
                try:
                    await self._recover()
                    if abort.done():
                        raise SchedulerError("the scheduler was shut down while it recovered")
                except BaseException:
                    await self._release_quietly()
                    raise
        except BaseException:
            self._cluster = None
            self._core = None
            self._log = None
            await cluster.stop(0.0)
            raise
        with self._lock:
            self._state = _RUNNING
            if epoch is not None:
                self._become_leader()
            else:
                self._lead_task = loop.create_task(self._lead_later())

    async def _release_quietly(self) -> None:
        try:
            await self.store.release_leadership()
        except Exception as exc:
            log.error("could not release leadership: %s", exc, extra={"action": "store_outage"})

    def _become_leader(self) -> None:
        """Under the lock, recovered: run the engine from now on."""
        cluster = self._cluster
        assert cluster is not None
        self._use_runners({p.name: self._cluster_runner(p, cluster) for p in self.pools})
        self._leading = True
        cluster.lead(self.epoch, self._serve_request, self._lost_threadsafe)
        self._pump()

    def _cluster_runner(self, pool: Pool, cluster: Cluster) -> Runner:
        link = self._engine_link(pool)
        if pool.runner is not None:
            return pool.runner(link)

        def encode(attempt: Attempt) -> bytes:
            return self.codec.encode(attempt.payload)

        return ClusterRunner(link, cluster, encode, self._give_back,
                             heartbeats=pool.config.lease_ttl_ns is not None)

    def _give_back(self, lease: int) -> None:
        """An attempt another process gave back unstarted: it waits again, no attempt used."""
        with self._lock:
            core = self._core
            if self._state not in (_RUNNING, _STOPPING) or core is None or not self._leading:
                return
            core.give_back(self._now_ns(), lease)
            self._pump()

    async def _lead_later(self) -> None:
        """A follower's background: wait for the store's leadership, recover, lead."""
        store = self.store
        logged = False
        while self._state == _RUNNING:
            try:
                epoch = await store.acquire_leadership()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if getattr(store, "closed", False):
                    log.error("the store was closed while this scheduler follows: it will never lead",
                              extra={"action": "store_outage"})
                    return
                if not logged:
                    log.warning("waiting to lead: %s", exc, extra={"action": "store_outage"})
                    logged = True
                await realtime.sleep(1.0)
                continue
            self.epoch = epoch
            try:
                await self._recover()
            except asyncio.CancelledError:
                self._core = None
                self._log = None
                await self._release_quietly()
                raise
            except Exception as exc:
                log.error("could not recover after taking the lead: %s", exc, extra={"action": "store_outage"})
                self._core = None
                self._log = None
                await self._release_quietly()
                await realtime.sleep(1.0)
                continue
            with self._lock:
                if self._state == _RUNNING:
                    self._become_leader()
                    return
            self._core = None
            self._log = None
            await self._release_quietly()
            return

    def _demote(self, reason: str) -> None:
        """Under the lock: leadership is lost, but this process goes on as a
        follower; waiting handles are resolved from the store."""
        cluster = self._cluster
        core = self._core
        assert cluster is not None and core is not None
        log.error("leadership lost: %s; this process follows from now on", reason,
                  extra={"action": "leader_lost", "epoch": self.epoch})
        self._leading = False
        core.stop_dispatching()
        error = SchedulerError(f"this process lost the lead ({reason}); call again: another process leads")
        self._fail_in_flight(self._take_room_waiters(), error)
        for lease in list(core.running):
            self._abort(lease, ABORT_SHUTDOWN)
        cluster.step_down()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_at = None
        handles, self._handles = self._handles, {}
        for value in handles.values():
            for handle in value if isinstance(value, list) else (value,):
                cluster.watch(handle)
        self._delivering.clear()
        self._core = None
        self._log = None
        self._use_runners({})
        self.lost_reason = reason
        loop = self._loop
        assert loop is not None
        self._lead_task = loop.create_task(self._lead_again())

    async def _lead_again(self) -> None:
        await self._release_quietly()   # whatever the store still holds of the lost lead
        await self._lead_later()

    async def _serve_request(self, kind: str, body: dict[str, Any], payloads: list[bytes]) -> Any:
        """The leader carries out a follower's call (admission first, in inbox
        order). A call refused because this leader stops (nothing of it was
        carried out) raises ``LeaderUnavailable``: the cluster leaves it in the
        inbox for the next leader instead of answering."""
        try:
            return await self._carry_out(kind, body, payloads)
        except SchedulerError as exc:
            if (self._state == _RUNNING and self._leading) or isinstance(exc, StoreRejected) \
                    or getattr(exc, "uncertain", False):
                raise   # a refusal of the call itself, or a commit that may have been made
            raise LeaderUnavailable(f"the leader stops and did not carry out the call: {exc}") from exc

    async def _carry_out(self, kind: str, body: dict[str, Any], payloads: list[bytes]) -> Any:
        if kind == "submit":
            specs = []
            for record, data in zip(body["tasks"], payloads):
                spec = spec_from_record(record, self.codec.decode(data))
                spec.__dict__["_encoded"] = data   # stored as the follower encoded it
                specs.append(spec)
            if body.get("batch"):
                _, results = await self._admit_batch(specs, hooked=True)
                self._pump()
                if self._log is not None:
                    await self._log.durable(*_claims(results))
                return [[task_id, duplicate] for task_id, duplicate in results]
            pair = await self._submit_spec(specs[0], False, hooked=True, pair=True)
            return [list(pair)]
        if kind == "cancel":
            return await self.cancel(body["ref"])
        if kind == "info":
            return (await self.info(body["ref"])).as_dict()
        if kind == "snapshot":
            return (await self.snapshot()).as_dict()
        if kind == "set_capacity":
            await self.set_capacity(body["pool"], body["capacity"])
            return None
        if kind == "set_group_capacity":
            await self.set_group_capacity(body["pool"], body["labels"], body["capacity"])
            return None
        if kind == "add_recurring":
            template = spec_from_record(body["template"], self.codec.decode(payloads[0]))
            template.__dict__["_encoded"] = payloads[0]
            if body.get("deadline_in_ns") is not None:
                template.deadline_in_ns = body["deadline_in_ns"]
                template.plain = False
            await self._add_recurring_spec(body["name"], body["cron"], template, body["tz"], body["overlap"],
                                           body["tolerance"], body["on_miss"])
            return None
        if kind == "remove_recurring":
            return await self.remove_recurring(body["name"])
        if kind == "checkpoint":
            return await self._save_for_member(body, payloads[0])
        raise SchedulerError(f"unknown request {kind!r} (a process of a newer cronoq?)")

    async def _follow_submit(self, specs: list[TaskSpec], batch: bool) -> list[tuple[int, bool]]:
        cluster = self._cluster
        assert cluster is not None
        self._check_loop()
        now = self.clock.now_ns()
        payloads = []
        for i, spec in enumerate(specs):
            try:
                payloads.append(encoded_payload(spec, self.codec))
            except InvalidTask as exc:
                raise exc.at_index(i) if batch else exc from None
        records = [spec_record(spec, now) for spec in specs]
        answer = await cluster.request("submit", {"tasks": records, "batch": batch}, payloads)
        return [(int(task_id), bool(duplicate)) for task_id, duplicate in answer]

    async def _follow_one(self, spec: TaskSpec, handle: bool, wrap: Callable[[TaskHandle], Any] | None,
                          pair: bool) -> Any:
        ((task_id, duplicate),) = await self._follow_submit([spec], False)
        if handle:
            value: Any = self._watched(task_id, spec.key, duplicate)
            return wrap(value) if wrap is not None else value
        return (task_id, duplicate) if pair else task_id

    async def _follow_call(self, kind: str, body: dict[str, Any], payloads: Sequence[bytes] = ()) -> Any:
        self._check_state()
        self._check_loop()
        cluster = self._cluster
        assert cluster is not None
        return await cluster.request(kind, body, payloads)

    def _follow_from_thread(self, timeout: float | None) -> Snapshot:
        """``snapshot_from_thread`` of a follower: the leader's snapshot, through the store."""
        self._check_state()
        loop = self._loop
        assert loop is not None
        future = asyncio.run_coroutine_threadsafe(self._follow_call("snapshot", {}), loop)
        try:
            return snapshot_from_dict(future.result(timeout))
        except TimeoutError:
            future.cancel()
            raise SchedulerError(f"the leader's snapshot did not come within {timeout:g} s") from None

    def _watched(self, task_id: int, key: str | None, duplicate: bool) -> TaskHandle:
        """A follower's handle, resolved when the store says its task ended."""
        loop = self._loop
        cluster = self._cluster
        assert loop is not None and cluster is not None
        handle = TaskHandle(task_id, key, duplicate, loop)
        cluster.watch(handle)
        return handle

    # ================================================================ hooks

    def add_submit_hook(self, hook: Callable[[TaskSpec], TaskSpec]) -> Callable[[], None]:
        """Call ``hook(task)`` for every task before it is admitted, in the
        submitter's context (its thread or task; for ``BlockingScheduler``
        calls, a copy of the calling thread's context), and admit the
        ``Task`` it returns (the same, or a changed copy: never change the
        caller's). Returns a function that removes the hook."""
        if not callable(hook):
            raise ValueError(f"hook must be callable, got {type(hook).__name__}")
        with self._lock:
            self._submit_hooks = [*self._submit_hooks, hook]

        def remove() -> None:
            with self._lock:
                self._submit_hooks = [h for h in self._submit_hooks if h is not hook]

        return remove

    def _hooked(self, spec: TaskSpec) -> TaskSpec:
        for hook in self._submit_hooks:
            spec = hook(spec)
            if not isinstance(spec, TaskSpec):
                raise TypeError(f"a submit hook returned {type(spec).__name__}, not a cronoq.Task")
        return spec

    def add_admission_listener(self, listener: AdmissionListener) -> Callable[[], None]:
        """Call ``listener(now_ns, tasks, results, error)`` after every
        admission: ``tasks`` are the ``Task`` objects admitted together (one,
        or a batch), ``now_ns`` the admission time (Unix nanoseconds, on the
        scheduler's clock), and either ``results`` their ``(id, duplicate)``
        pairs or ``error`` the ``AdmissionError`` that refused them all (a
        full queue under ``overflow="wait"`` is not a refusal: the listener
        hears of the task once it is admitted). It runs on the submitter's
        thread under the engine lock: keep it short and do not call the
        scheduler from it; its exceptions are logged and the admission stands.
        Returns a function that removes the listener."""
        if not callable(listener):
            raise ValueError(f"listener must be callable, got {type(listener).__name__}")
        with self._lock:
            self._admission_listeners = [*self._admission_listeners, listener]

        def remove() -> None:
            with self._lock:
                self._admission_listeners = [x for x in self._admission_listeners if x is not listener]

        return remove

    @property
    def config(self) -> CoreConfig:
        """The engine settings this scheduler was made with (``config=``, or
        the one built from ``seed``, ``emit_transitions`` and
        ``max_pending_total``). Read it; do not change it."""
        return self._config

    def add_executor_middleware(
            self, middleware: Callable[[Callable[..., Any], bool], Callable[..., Any]]) -> Callable[[], None]:
        """Before ``start()``: wrap every pool's executor. ``middleware(executor,
        is_async)`` returns the executor to run instead, of the same kind (an
        ``async def`` for an async one). Pools given a ``runner`` are not
        wrapped. Returns a function that removes it (before start)."""
        if not callable(middleware):
            raise ValueError(f"middleware must be callable, got {type(middleware).__name__}")
        if self._state != _NEW:
            raise SchedulerError("executor middleware must be added before the scheduler starts")
        self._middleware.append(middleware)

        def remove() -> None:
            if self._state != _NEW:
                raise SchedulerError("executor middleware cannot be removed once the scheduler started")
            if middleware in self._middleware:
                self._middleware.remove(middleware)

        return remove

    def __repr__(self) -> str:
        return f"<cronoq.Scheduler {self._state} pools={[p.name for p in self.pools]}>"

    # ================================================================ listings (cronoq.runtime.listing)

    async def list_tasks(self, *, pools: Iterable[str] | None = None, statuses: Iterable[str] | None = None,
                         after: int = 0, limit: int = 100) -> list[TaskInfo]:
        """Tasks with ids above ``after`` in id order, at most ``limit``: live
        ones, and finished ones the engine retains or the store keeps. Only
        those of ``pools`` and ``statuses`` when given (``UnknownPool`` for a
        pool the scheduler does not have)."""
        core = self._check()
        return await _listing.list_tasks(core, self.store, pools, statuses, after, limit)

    async def recurring(self) -> list[_listing.RecurringInfo]:
        """The recurring schedules, sorted by name, with their next occurrence."""
        return _listing.recurring(self._check())


def configuration_of(sched: Scheduler) -> tuple[list[Pool], Any, bool, dict[str, Any]]:
    """What ``sched`` was made with: (pools, resources, emit_transitions, options)."""
    return sched._given


def fresh_copy(sched: Scheduler) -> Scheduler:
    """A new, unstarted scheduler with ``sched``'s configuration, submit
    hooks and executor middleware (and the same store object). For the child
    of a fork, whose copy of a started scheduler has none of its threads:
    ``BlockingScheduler`` starts one of these there."""
    pools, resources, emit_transitions, options = sched._given
    copy_ = Scheduler(pools, resources, emit_transitions, **options)
    copy_._submit_hooks = list(sched._submit_hooks)
    copy_._middleware = list(sched._middleware)
    return copy_
