"""A drop-in for code written against the legacy ``ElasticPriorityScheduler``.

Swap one import line::

    from cronoq_compat import ElasticPriorityScheduler, Priority, Task
    # or: from cronoq.compat import ElasticPriorityScheduler, Priority, Task

and the legacy calls (``start``, ``submit``, ``get_metrics``, ``get_cost``,
``completed_count``, ``stop``) run on the real engine through
``cronoq.BlockingScheduler``. As in the original, a task "runs" by sleeping
for its duration. ``MIGRATING.md`` lists every behavioural difference and
shows the native call for each legacy one.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import cronoq
from cronoq.blocking import BlockingHandle, BlockingScheduler, fresh_blocking_copy
from cronoq.core.types import KEY_LIMIT, MAX_SECONDS, TaskSpec, check_length, time_to_ns, to_ns
from cronoq import realtime

__all__ = [
    "ElasticPriorityScheduler", "Task", "Priority", "QualityMetrics", "CompatError",
    "DuplicateTaskError", "UnknownDependencyError", "ReservationConflictError", "LEGACY_POOL",
]

LEGACY_POOL = "legacy"
_PLAIN_NUMBERS = (float, int)   # (not bool, nor subclasses: those take the long way)
_TOLERANCE = 1.0   # seconds: a fixed start is on time within this (cronoq's default)


class Priority(enum.IntEnum):
    """Legacy priorities; a larger value is more important. Each maps onto
    the cronoq class of the same name."""

    LOW = 0
    NORMAL = 1
    HIGH = 2
    CRITICAL = 3

    @property
    def cronoq_class(self) -> str:
        return _CLASS_NAMES[self]


_CLASS_NAMES = {p: p.name.lower() for p in Priority}


@dataclass(frozen=True, init=False)
class Task:
    """A legacy task: it runs by sleeping ``duration`` seconds.

    ``fixed_start`` and ``deadline`` are Unix times in seconds;
    ``dependencies`` are ids of other legacy tasks that must succeed first
    (None means none).
    """

    id: str
    duration: float
    priority: Priority = Priority.NORMAL
    fixed_start: float | None = None
    dependencies: Sequence[str] | None = ()
    deadline: float | None = None

    def __init__(self, id: str, duration: float, priority: Priority = Priority.NORMAL,
                 fixed_start: float | None = None, dependencies: Sequence[str] | None = (),
                 deadline: float | None = None) -> None:
        # The frozen dataclass's own __init__, but its fields stored at once
        # instead of by six object.__setattr__ calls (half a plain task's cost).
        object.__setattr__(self, "__dict__", {"id": id, "duration": duration, "priority": priority,
                                              "fixed_start": fixed_start, "dependencies": dependencies,
                                              "deadline": deadline})
        self.__post_init__()

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id or "\x00" in self.id:
            raise ValueError(f"Task id must be a non-empty string without NUL, got {self.id!r}")
        duration = self.duration
        plain = self.fixed_start is None and self.deadline is None and type(duration) in _PLAIN_NUMBERS \
            and 0 <= duration <= MAX_SECONDS   # (a duration to_ns takes)
        for name in () if plain else ("duration", "fixed_start", "deadline"):
            value = getattr(self, name)
            if value is None and name != "duration":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or (name == "duration" and value < 0):
                raise ValueError(f"Task {name} must be a finite number of seconds"
                                 f"{' >= 0' if name == 'duration' else ''}, got {value!r}")
            # The engine's bounds, checked here so a legacy ``except ValueError`` sees them.
            if name == "duration":
                to_ns(value, "Task duration", error=ValueError)
            else:
                time_to_ns(value, f"Task {name}", error=ValueError)
        if type(self.priority) is not Priority:
            try:
                object.__setattr__(self, "priority", Priority(self.priority))
            except ValueError:
                raise ValueError(f"Task priority must be a Priority, got {self.priority!r}") from None
        dependencies = self.dependencies
        if type(dependencies) is tuple and not dependencies:
            return   # the default, kept cheap
        if dependencies is None:
            object.__setattr__(self, "dependencies", ())
            return
        if isinstance(dependencies, str) or not isinstance(dependencies, Iterable):
            raise ValueError(f"Task dependencies must be a list of task ids, got {dependencies!r}")
        object.__setattr__(self, "dependencies", tuple(dependencies))


@dataclass
class QualityMetrics:
    """How well the scheduler is doing, computed from cronoq snapshots.

    ``schedule_quality`` = 0.4 × timeliness + 0.4 × priority_adherence +
    0.2 × utilization, where timeliness is the share of deadlines and fixed
    starts that were met (see MIGRATING.md). All rates are in [0, 1]; a rate
    with nothing to measure is 1.0 (utilization is measured always).
    """

    schedule_quality: float
    priority_adherence: float
    deadline_hit_rate: float = 1.0
    fixed_start_hit_rate: float = 1.0
    timeliness: float = 1.0
    utilization: float = 0.0
    schedule_efficiency: float = 1.0
    completed: int = 0
    failed: int = 0
    pending: int = 0
    running: int = 0
    workers: int = 0
    desired_workers: int = 0
    wait_p50: float = 0.0
    wait_p90: float = 0.0
    wait_p99: float = 0.0
    cost: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class CompatError(cronoq.AdmissionError, ValueError):
    """Base of the errors ``submit`` raises; a ``ValueError`` for legacy code,
    and a ``cronoq.AdmissionError`` for native code."""


class DuplicateTaskError(CompatError):
    """A task with this id was already submitted (within the retention window)."""


class UnknownDependencyError(CompatError, cronoq.UnknownDependency):
    """A dependency names a task id that was never submitted."""


class ReservationConflictError(CompatError, cronoq.ReservationConflict):
    """The fixed start cannot be reserved: too many overlap already."""


@dataclass
class _Job:
    duration: float
    deadline: float | None
    fixed_start: float | None


_JOB = "cronoq_compat.job"


class _LegacyCodec:
    """The store's codec around legacy jobs: a job is stored as a small JSON
    object ``{"cronoq_compat.job": [duration, deadline, fixed_start]}``
    (through the inner codec), native payloads as the inner codec says."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def encode(self, value: Any) -> bytes:
        if isinstance(value, _Job):
            value = {_JOB: [value.duration, value.deadline, value.fixed_start]}
        data: bytes = self.inner.encode(value)
        return data

    def decode(self, data: bytes) -> Any:
        value = self.inner.decode(data)
        if isinstance(value, dict) and len(value) == 1 and _JOB in value:
            duration, deadline, fixed_start = value[_JOB]
            return _Job(duration, deadline, fixed_start)
        return value


# What every plain legacy task's spec holds but its payload and key, per priority.
_PLAIN_FIELDS = {p: TaskSpec(None, pool=LEGACY_POOL, kind="legacy", priority=p.cronoq_class).__dict__
                 for p in Priority}


def _spec_of(task: Task, job: _Job) -> TaskSpec:
    """The native task for a legacy one (its id is the key)."""
    if not task.dependencies and task.fixed_start is None and task.deadline is None:
        # A plain task, the common case: its spec is copied from the
        # priority's, as cronoq.Task(job, pool=..., key=..., kind=...,
        # priority=...) would make it, without parsing four options again.
        spec = TaskSpec.__new__(TaskSpec)
        fields = _PLAIN_FIELDS[task.priority].copy()
        fields["payload"] = job
        fields["key"] = check_length(task.id, "key", KEY_LIMIT)   # (Task checked the rest)
        spec.__dict__ = fields
        return spec
    options: dict[str, Any] = {"pool": LEGACY_POOL, "key": task.id, "kind": "legacy",
                               "priority": task.priority.cronoq_class}
    if task.dependencies:
        options["after"] = list(task.dependencies)
    if task.fixed_start is not None or task.deadline is not None:
        # The duration sizes the reservation and the latest start time.
        options["duration_hint"] = float(task.duration)
        if task.fixed_start is not None:
            options["start_at"] = float(task.fixed_start)
        if task.deadline is not None:
            options["deadline_at"] = float(task.deadline)
    return cronoq.Task(job, **options)


def _schedule_quality(timeliness: float, adherence: float, utilization: float) -> float:
    return 0.4 * timeliness + 0.4 * adherence + 0.2 * utilization


class ElasticPriorityScheduler:
    """The legacy scheduler API on the cronoq engine (synchronous, thread-safe).

    ``initial_workers`` / ``max_workers`` size an autoscaled pool (at least
    ``min_workers``). ``cost_per_worker_second`` feeds ``get_cost()``.
    ``native_pools`` adds native ``cronoq.Pool`` objects beside the legacy
    pool, for ``submit_native``.
    """

    def __init__(self, initial_workers: int = 1, max_workers: int = 4, *, min_workers: int = 1,
                 cost_per_worker_second: float = 0.0, shutdown_grace: float = 5.0,
                 native_pools: Iterable[cronoq.Pool] = (), resources: Sequence[cronoq.Resource] | None = None,
                 **scheduler_options: Any) -> None:
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"max_workers must be an integer >= 1, got {max_workers!r}")
        if isinstance(initial_workers, bool) or not isinstance(initial_workers, int) \
                or not 0 <= initial_workers <= max_workers:
            raise ValueError(f"initial_workers must be an integer in [0, max_workers], got {initial_workers!r}")
        min_workers = min(min_workers, max_workers)
        self._lock = threading.Lock()
        self._completed = 0
        self._submitting: set[str] = set()           # ids being submitted right now
        self._open_deadlines: dict[str, float] = {}   # task id -> deadline, not yet judged
        self._open_starts: dict[str, float] = {}      # task id -> fixed start, not yet judged
        self._deadline_judged = self._deadline_met = 0
        self._fixed_judged = self._fixed_met = 0
        pool = cronoq.Pool(
            LEGACY_POOL, self._run, min=min_workers, max=max_workers, initial=initial_workers,
            autoscale=cronoq.AutoscaleConfig(cost_per_worker_second=cost_per_worker_second),
            overflow="wait", retry=cronoq.RetryPolicy.none())   # a sleep has nothing to retry
        self._native_pools = list(native_pools)
        if scheduler_options.get("store") is not None:
            # Legacy jobs are stored too: wrap the codec (JSON unless given) so they can be.
            scheduler_options["codec"] = _LegacyCodec(scheduler_options.get("codec") or cronoq.JsonCodec())
        self._scheduler = BlockingScheduler([pool, *self._native_pools], resources,
                                            shutdown_grace=shutdown_grace, **scheduler_options)
        self._lifecycle = threading.Lock()   # one start() at a time

    # -- the legacy API

    def start(self) -> None:
        """Start the worker pool; nothing to do while it runs. After
        ``stop()`` it starts again, as the legacy prototype did, on a new
        scheduler with the same configuration (see MIGRATING.md)."""
        with self._lifecycle:
            state = self._scheduler.state_here
            if state in ("starting", "running"):
                return
            if state in ("stopping", "stopped"):
                # A stopped scheduler cannot start again: the next one takes its place.
                self._scheduler = fresh_blocking_copy(self._scheduler)
            self._scheduler.start()

    def stop(self, wait: bool = False, timeout: float | None = None) -> None:
        """Stop the scheduler. With ``wait=True``, first wait (up to
        ``timeout`` seconds) for every submitted task to finish."""
        # Not under the lifecycle lock: a start() that waits to lead (a standby) must be stoppable.
        scheduler = self._scheduler
        if wait and scheduler.running:
            # Real time: a test that froze the clock must not wait forever.
            deadline = None if timeout is None else realtime.real_monotonic() + timeout
            while deadline is None or realtime.real_monotonic() < deadline:
                pool = scheduler.snapshot().pool(LEGACY_POOL)
                if pool.pending == 0 and pool.busy == 0:
                    break
                time.sleep(0.01)
        scheduler.shutdown()

    def submit(self, task: Task) -> int:
        """Submit a legacy task; returns the cronoq task id.

        Raises ``DuplicateTaskError``, ``UnknownDependencyError``,
        ``ReservationConflictError`` (all ``ValueError``) or ``ValueError``
        for invalid fields; nothing is admitted then.
        """
        if not isinstance(task, Task):
            raise TypeError(f"submit takes a cronoq_compat.Task, got {type(task).__name__}")
        job = _Job(float(task.duration), task.deadline, task.fixed_start)
        spec = _spec_of(task, job)
        # A task with a deadline or a fixed start may run before submit returns:
        # register what it is judged on first. A plain task takes no lock (the
        # loop's _run would queue behind it, and it behind _run: a convoy), the
        # engine's key alone refuses its duplicates.
        judged = task.deadline is not None or task.fixed_start is not None
        if judged:
            with self._lock:
                if task.id in self._submitting:
                    raise DuplicateTaskError(f"a task with id {task.id!r} was already submitted")
                self._submitting.add(task.id)
                if task.deadline is not None:
                    self._open_deadlines[task.id] = float(task.deadline)
                if task.fixed_start is not None:
                    self._open_starts[task.id] = float(task.fixed_start)
        try:
            # Admitted on this thread (no round trip to the loop unless a store's
            # commit or a full queue says so), without a handle: legacy code gets an id.
            value, later = self._scheduler.scheduler.submit_from_thread(spec, handle=False)
            if later is not None:
                value = self._scheduler.call(later)
            task_id, duplicate = value
            if duplicate:
                raise DuplicateTaskError(f"a task with id {task.id!r} was already submitted")
        except BaseException as exc:
            if judged:
                with self._lock:
                    self._submitting.discard(task.id)
                    self._open_deadlines.pop(task.id, None)
                    self._open_starts.pop(task.id, None)
            if isinstance(exc, cronoq.UnknownDependency):
                raise UnknownDependencyError(f"task {task.id!r}: {exc.message}") from exc
            if isinstance(exc, cronoq.ReservationConflict):
                raise ReservationConflictError(f"task {task.id!r}: {exc.message}") from exc
            raise
        if judged:
            with self._lock:
                self._submitting.discard(task.id)
        return int(task_id)

    @property
    def completed_count(self) -> int:
        """Legacy tasks that ran to completion."""
        return self._completed

    def get_metrics(self) -> QualityMetrics:
        """Quality metrics of the legacy pool (see ``QualityMetrics`` and
        MIGRATING.md for the definitions)."""
        snap = self._scheduler.snapshot()
        pool = snap.pool(LEGACY_POOL)
        now = self._now()
        with self._lock:
            # A deadline or fixed start is judged once the task ran, or once
            # it is too late to be met.
            late_deadlines = sum(1 for d in self._open_deadlines.values() if d < now)
            late_starts = sum(1 for s in self._open_starts.values() if s + _TOLERANCE < now)
            deadline_total = self._deadline_judged + late_deadlines
            fixed_total = self._fixed_judged + late_starts
            deadline_met = self._deadline_met
            fixed_met = self._fixed_met
        deadline_rate = deadline_met / deadline_total if deadline_total else 1.0
        fixed_rate = fixed_met / fixed_total if fixed_total else 1.0
        judged = deadline_total + fixed_total
        timeliness = (deadline_met + fixed_met) / judged if judged else 1.0
        adherence = pool.priority_adherence
        utilization = min(1.0, max(0.0, pool.utilization))
        return QualityMetrics(
            schedule_quality=_schedule_quality(timeliness, adherence, utilization),
            priority_adherence=adherence,
            deadline_hit_rate=deadline_rate,
            fixed_start_hit_rate=fixed_rate,
            timeliness=timeliness,
            utilization=utilization,
            schedule_efficiency=pool.schedule_efficiency,
            completed=self._completed,
            failed=pool.failed,
            pending=pool.pending,
            running=pool.busy,
            workers=pool.capacity,
            desired_workers=pool.desired,
            wait_p50=pool.wait_p50,
            wait_p90=pool.wait_p90,
            wait_p99=pool.wait_p99,
            cost=pool.cost,
        )

    def get_cost(self) -> float:
        """Worker cost accumulated since start, over every pool."""
        snap = self._scheduler.snapshot()
        return sum(p.cost for p in snap.pools)

    def __enter__(self) -> ElasticPriorityScheduler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the way to the native API

    @property
    def native(self) -> BlockingScheduler:
        """The ``cronoq.BlockingScheduler`` underneath, for native calls (a
        new one after ``stop()`` and ``start()``)."""
        return self._scheduler

    def submit_native(self, payload: Any = None, **options: Any) -> BlockingHandle:
        """Submit a native task (to a pool given in ``native_pools``; the first
        one unless ``pool=`` says otherwise)."""
        if "pool" not in options:
            if not self._native_pools:
                raise ValueError("no native pool: pass native_pools=[cronoq.Pool(...)] to the constructor")
            options["pool"] = self._native_pools[0].name
        return self._scheduler.submit(payload, **options)

    # -- internals

    def _now(self) -> float:
        """Scheduling time (the program's clock, or the scheduler's VirtualClock)."""
        return self._scheduler.scheduler.clock.now_ns() / 1e9

    async def _run(self, ctx: cronoq.TaskContext, job: _Job) -> None:
        key = ctx.key   # every legacy task is submitted with its id as the key
        if job.fixed_start is not None and ctx.attempt == 1 and key is not None:
            started = self._now()
            with self._lock:
                if self._open_starts.pop(key, None) is not None:
                    self._fixed_judged += 1
                    if abs(started - job.fixed_start) <= _TOLERANCE:
                        self._fixed_met += 1
        if job.duration:
            clock = self._scheduler.scheduler.clock
            if isinstance(clock, cronoq.VirtualClock):
                await clock.sleep(job.duration)
            else:
                await realtime.sleep(job.duration)   # a frozen clock must not stop the "work"
        if job.deadline is None:
            self._completed += 1   # (only this loop's thread writes it: no lock)
            return None
        with self._lock:
            self._completed += 1
            if key is not None and self._open_deadlines.pop(key, None) is not None:
                self._deadline_judged += 1
                if self._now() <= job.deadline:
                    self._deadline_met += 1
        return None
