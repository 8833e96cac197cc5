"""``cronoq.Scheduler``: the public API, over interchangeable backends.

A ``Scheduler`` is a thin layer: it checks its arguments, applies the
submit hooks, and hands each call to its current backend
(``EngineBackend`` when this process runs the engine, ``FollowerBackend``
when another process of a shared store does). The parts behind it, one
module each (docs/architecture.md has the map):

- ``lifecycle``: the state (``State``) and the one task group that owns
  every background task;
- ``driver``: the lock, the engine, the action pump, the timer, the
  runners' link;
- ``engine_backend`` / ``following``: the calls, on the engine or sent to
  the leader as the versioned operations of ``operations``;
- ``leadership``: start, lead, demote, lead later (it swaps the backend);
- ``admission``: submit hooks, admission listeners, waiting for room;
- ``results``: the handle table and the outputs;
- ``recovery``: what a new leader loads from the store.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Awaitable, Callable, Iterable, Sequence

from ..core import actions as act
from ..core.errors import SchedulerError
from ..core.explain import Explanation
from ..core.snapshot import Checkpoint, Reservation, Snapshot, TaskInfo
from ..core.types import NS, RUNNING as TASK_RUNNING, CoreConfig, ResourceConfig, TaskSpec, check_name
from ..store.base import STORE_MEMBERS, Store
from ..store.codec import Codec, JsonCodec
from . import listing as _listing
from .admission import Admission, AdmissionListener
from .backend import Backend
from .checkpoints import DEFAULT_MAX_CHECKPOINT_BYTES, CheckpointBook
from .clock import Clock, SystemClock
from .driver import EngineDriver, Middleware
from .durability import EncodedPayloads
from .engine_backend import EngineBackend
from .events import EventSink, EventStream
from .handle import TaskHandle
from .leadership import Leadership
from .lifecycle import NEW, RUNNING, SERVING, STARTING, STOPPED, STOPPING, Lifecycle
from .operations import RecurringArgs
from .pool import Pool
from .results import Results
from .runner import Attempt

__all__ = ["Scheduler", "AdmissionListener"]


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
        self._life = life = Lifecycle()
        self._middleware: list[Middleware] = []
        self._checkpoints = CheckpointBook(codec=self.codec, max_bytes=max_checkpoint_bytes,
                                           now_ns=self.clock.now_ns, is_live=self._attempt_live,
                                           known=self._knows, on_saved=self._stage_completed)
        self._driver = driver = EngineDriver(life, self.clock, config, self._checkpoints, self._middleware)
        self._admission = admission = Admission(driver)
        results = Results(driver, store, self.codec, output_cache)
        driver.attach(results, admission)
        payloads = EncodedPayloads(self.codec)
        self._engine = engine = EngineBackend(driver, admission, results, self._checkpoints, payloads, store,
                                              self._current)
        self._backend: Backend = engine
        self._leadership = Leadership(engine, pools, self.resources, config, store, payloads, self._checkpoints,
                                      self._use)

    def _use(self, backend: Backend) -> None:
        self._backend = backend

    def _current(self) -> Backend:
        return self._backend

    # ================================================================ lifecycle

    async def start(self) -> None:
        """Start the scheduler on the running loop."""
        life = self._life
        if life.state is not NEW:
            raise SchedulerError(f"the scheduler is {life.state}; create a new one to start again")
        loop = asyncio.get_running_loop()
        life.bind(loop)
        self._checkpoints.bind(loop)
        life.state = STARTING
        try:
            await self._leadership.start()
        except BaseException:
            life.state = STOPPED if life.aborted() else NEW
            raise

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
        life = self._life
        life.check_fork()
        state = life.state
        if state is NEW or state is STOPPED:
            life.state = STOPPED
            return
        if state is STARTING:   # a standby waiting to lead (or recovering): give up
            if life.abort_start is not None and not life.abort_start.done():
                life.abort_start.set_result(None)
            return
        if state is STOPPING:   # another shutdown is under way: its end is this one's
            await life.stopped()
            return
        await self._backend.shutdown(self.shutdown_grace if grace is None else grace)
        await life.tasks.close()

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    @property
    def running(self) -> bool:
        return self._life.state is RUNNING

    @property
    def leading(self) -> bool:
        """Whether this process runs the engine: without a store always (once
        started); with a shared store, only the process that leads it (the
        others follow: their calls go through the store)."""
        return self._driver.leading and self._life.state in SERVING

    @property
    def epoch(self) -> int:
        """The fencing epoch this scheduler leads (or last led) in; 0 without a store."""
        return self._leadership.epoch

    @property
    def lost_reason(self) -> str | None:
        """Why this scheduler last lost the lead (None if it never did)."""
        return self._leadership.lost_reason

    # ================================================================ submission

    async def submit(self, payload: Any = None, **options: Any) -> TaskHandle:
        """Submit a task; returns its ``TaskHandle``. Options are those of
        ``cronoq.Task`` (pool, kind, priority, key, deadline_in, ...)."""
        spec = TaskSpec(payload, **options)
        if self._admission.submit_hooks:
            spec = self._admission.hooked(spec)
        handle: TaskHandle = await self._backend.submit_spec(spec, True)
        return handle

    async def enqueue(self, payload: Any = None, **options: Any) -> int:
        """Submit a task without a handle (cheaper); returns its id."""
        spec = TaskSpec(payload, **options)
        if self._admission.submit_hooks:
            spec = self._admission.hooked(spec)
        task_id: int = await self._backend.submit_spec(spec, False)
        return task_id

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
        if self._admission.submit_hooks:
            spec = self._admission.hooked(spec)
        return self._backend.submit_from_thread(spec, handle, wrap)

    def _batch(self, tasks: Iterable[TaskSpec]) -> list[TaskSpec]:
        specs = list(tasks)
        for i, spec in enumerate(specs):
            if not isinstance(spec, TaskSpec):
                raise TypeError(f"submit_batch takes cronoq.Task objects; item {i} is {type(spec).__name__}")
        if self._admission.submit_hooks:
            specs = [self._admission.hooked(spec) for spec in specs]
        return specs

    async def submit_batch(self, tasks: Iterable[TaskSpec]) -> list[TaskHandle]:
        """Submit ``cronoq.Task`` objects atomically: all or none. Tasks may
        depend on keys defined anywhere in the batch."""
        return await self._backend.submit_batch(self._batch(tasks))

    async def enqueue_batch(self, tasks: Iterable[TaskSpec]) -> list[int]:
        """``submit_batch`` without handles; returns the ids."""
        results = await self._backend.enqueue_batch(self._batch(tasks))
        return [task_id for task_id, _ in results]

    # ================================================================ other calls

    async def cancel(self, ref: int | str) -> bool:
        """Cancel a task by id or key: True if this call cancelled it, False if
        it had already finished. ``UnknownTask`` if no such task is known."""
        return await self._backend.cancel(ref)

    async def handle(self, ref: int | str) -> TaskHandle:
        """A handle on an existing task, live or finished (within retention)."""
        return await self._backend.handle(ref)

    async def info(self, ref: int | str) -> TaskInfo:
        """What the scheduler knows of a task (status, attempt, message, its
        declared stages and checkpoints...)."""
        return await self._backend.info(ref)

    async def explain(self, ref: int | str) -> Explanation:
        """Why a task is waiting, from the leader's engine: its score, its place
        in its pool's line and every reason it does not run yet (see
        ``cronoq.core.Explanation``). ``UnknownTask`` if no such task is known."""
        return await self._backend.explain(ref)

    async def dependents(self, ref: int | str) -> list[tuple[int, str]]:
        """The tasks waiting on a live task through a dependency edge, as
        (id, condition) pairs (see ``cronoq.core.Core.dependents``): none once
        it ended. ``UnknownTask`` if no such task is known."""
        return await self._backend.dependents(ref)

    async def snapshot(self) -> Snapshot:
        """Pools, quality metrics over the window, and totals since start."""
        return await self._backend.snapshot()

    async def reservations(self, ahead: float, pools: Iterable[str] | None = None) -> list[Reservation]:
        """The fixed-start tasks not started yet that start within ``ahead``
        seconds, or already hold a slot, by start time (of ``pools``; None:
        every pool). See ``cronoq.core.Reservation``."""
        return await self._backend.reservations(int(ahead * NS), None if pools is None else list(pools))

    def snapshot_from_thread(self, timeout: float | None = None) -> Snapshot:
        """``snapshot()`` from any thread, at once (metrics scrapes, the
        blocking facade): read under the engine's lock, waiting for it at
        most ``timeout`` seconds (``SchedulerError`` after that)."""
        return self._backend.snapshot_from_thread(timeout)

    def events(self, on_lag: str = "drop") -> EventStream:
        """A stream of status events (terminal ones; every transition with
        ``emit_transitions=True``). Use ``async with`` or close it."""
        self._life.check()
        self._life.check_loop()
        stream = EventStream(self.event_capacity, on_lag, self.unsubscribe)
        self.subscribe(stream)
        return stream

    def subscribe(self, sink: EventSink) -> None:
        """Deliver every status event to ``sink`` (from any thread); its
        ``deliver`` and ``end`` run on the scheduler's loop. ``events()`` is
        the ready-made sink."""
        with self._driver.lock:
            self._life.check()
            self._driver.sinks.append(sink)

    def unsubscribe(self, sink: EventSink) -> None:
        """Stop delivering events to ``sink`` (from any thread)."""
        driver = self._driver
        with driver.lock:
            if sink in driver.sinks:
                driver.sinks.remove(sink)

    def on_desired(self, listener: Callable[[str, int], None]) -> Callable[[], None]:
        """Call ``listener(pool, desired)`` whenever the autoscaler of a pool
        moves its target (on the scheduler's loop, under its lock: it must
        not block). Returns the function that stops it."""
        driver = self._driver
        with driver.lock:
            driver.scale_listeners.append(listener)

        def stop() -> None:
            with driver.lock:
                if listener in driver.scale_listeners:
                    driver.scale_listeners.remove(listener)

        return stop

    async def set_capacity(self, pool: str, capacity: int) -> None:
        """Set the capacity of a pool's unlabeled workers (an autoscaled pool
        overrides it at its next evaluation)."""
        await self._backend.set_capacity(pool, capacity)

    async def set_group_capacity(self, pool: str, labels: dict[str, str], capacity: int) -> None:
        """Set the capacity of the pool's workers that carry exactly ``labels``."""
        await self._backend.set_group_capacity(pool, labels, capacity)

    async def add_recurring(self, name: str, cron: str, payload: Any = None, *, tz: str = "UTC",
                            overlap: str = "skip", tolerance: float | None = None,
                            on_miss: str | None = None, key: str | None = None,
                            **task_options: Any) -> None:
        """Register (or replace) a cron schedule; each occurrence is a
        fixed-start task built from ``payload`` and ``task_options``."""
        self._life.check()
        check_name(name, "name", error=ValueError)
        template = TaskSpec(payload, key=key, **task_options)
        await self._backend.add_recurring(RecurringArgs(name, cron, template, tz, overlap, tolerance, on_miss))

    async def remove_recurring(self, name: str) -> bool:
        """Stop a schedule (an occurrence already created still runs)."""
        return await self._backend.remove_recurring(name)

    # ================================================================ checkpoints

    def _attempt_live(self, attempt: Attempt) -> bool:
        driver = self._driver
        with driver.lock:
            core = driver.core
            return (not attempt.cancelled and core is not None and self._life.state in SERVING
                    and attempt.lease in core.running)

    def _knows(self, task_id: int) -> bool:
        core = self._driver.core
        return core is not None and (task_id in core.tasks or task_id in core.retained)

    def _stage_completed(self, attempt: Attempt, checkpoint: Checkpoint) -> None:
        """A stage's checkpoint was saved: tell the subscribers (with every transition)."""
        if not self._config.emit_transitions:
            return
        driver = self._driver
        with driver.lock:
            sinks = list(driver.sinks)
        if sinks:
            event = act.StatusEvent(attempt.id, attempt.pool, attempt.key, TASK_RUNNING, attempt.attempt,
                                    checkpoint.at, f"stage {checkpoint.stage!r} completed", checkpoint.stage,
                                    attempt.tenant)
            for sink in sinks:
                sink.deliver(event)

    # ================================================================ hooks

    def add_submit_hook(self, hook: Callable[[TaskSpec], TaskSpec]) -> Callable[[], None]:
        """Call ``hook(task)`` for every task before it is admitted, in the
        submitter's context (its thread or task; for ``BlockingScheduler``
        calls, a copy of the calling thread's context), and admit the
        ``Task`` it returns (the same, or a changed copy: never change the
        caller's). Returns a function that removes the hook."""
        if not callable(hook):
            raise ValueError(f"hook must be callable, got {type(hook).__name__}")
        admission = self._admission
        with self._driver.lock:
            admission.submit_hooks = [*admission.submit_hooks, hook]

        def remove() -> None:
            with self._driver.lock:
                admission.submit_hooks = [h for h in admission.submit_hooks if h is not hook]

        return remove

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
        admission = self._admission
        with self._driver.lock:
            admission.listeners = [*admission.listeners, listener]

        def remove() -> None:
            with self._driver.lock:
                admission.listeners = [x for x in admission.listeners if x is not listener]

        return remove

    @property
    def config(self) -> CoreConfig:
        """The engine settings this scheduler was made with (``config=``, or
        the one built from ``seed``, ``emit_transitions`` and
        ``max_pending_total``). Read it; do not change it."""
        return self._config

    def add_executor_middleware(self, middleware: Middleware) -> Callable[[], None]:
        """Before ``start()``: wrap every pool's executor. ``middleware(executor,
        is_async)`` returns the executor to run instead, of the same kind (an
        ``async def`` for an async one). Pools given a ``runner`` are not
        wrapped. Returns a function that removes it (before start)."""
        if not callable(middleware):
            raise ValueError(f"middleware must be callable, got {type(middleware).__name__}")
        if self._life.state is not NEW:
            raise SchedulerError("executor middleware must be added before the scheduler starts")
        self._middleware.append(middleware)

        def remove() -> None:
            if self._life.state is not NEW:
                raise SchedulerError("executor middleware cannot be removed once the scheduler started")
            if middleware in self._middleware:
                self._middleware.remove(middleware)

        return remove

    def __repr__(self) -> str:
        return f"<cronoq.Scheduler {self._life.state} pools={[p.name for p in self.pools]}>"

    # ================================================================ listings (cronoq.runtime.listing)

    async def list_tasks(self, *, pools: Iterable[str] | None = None, statuses: Iterable[str] | None = None,
                         after: int = 0, limit: int = 100, newest_first: bool = False,
                         before: int = 0) -> list[TaskInfo]:
        """Tasks with ids above ``after`` in id order, at most ``limit``: live
        ones, and finished ones the engine retains or the store keeps. Only
        those of ``pools`` and ``statuses`` when given (``UnknownPool`` for a
        pool the scheduler does not have). With ``newest_first``, descending
        ids, only those below ``before`` when it is not 0."""
        core = self._backend.check()
        return await _listing.list_tasks(core, self.store, pools, statuses, after, limit, newest_first, before)

    async def recurring(self) -> list[_listing.RecurringInfo]:
        """The recurring schedules, sorted by name, with their next occurrence."""
        return _listing.recurring(self._backend.check())


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
    copy_._admission.submit_hooks = list(sched._admission.submit_hooks)
    copy_._middleware[:] = sched._middleware
    return copy_
