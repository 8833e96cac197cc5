"""Read-only views of the engine's state, built on demand by ``Core.snapshot``."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["GroupSnapshot", "PoolSnapshot", "Snapshot", "TaskInfo", "Checkpoint", "Reservation",
           "TOTAL_FIELDS", "PoolField", "POOL_FIELDS"]

TOTAL_FIELDS = ("submitted", "dispatched", "succeeded", "failed", "dead_lettered", "cancelled",
                "skipped", "missed", "shed", "retries", "timeouts", "lease_expiries",
                "stale_completions", "recurring_conflicts", "recurring_invalid")



class PoolField(NamedTuple):
    """A field of a pool's snapshot as cronoq-server sends it (the cronoq.v1
    PoolSnapshot message, the HTTP API's JSON, the client's dict): ``wire``
    its name there, ``attr`` the ``PoolSnapshot`` attribute it comes from
    (None: the server's own), ``kind`` ``count``, ``number``, ``seconds``
    or ``classes`` (counts by class, in ``CLASSES`` order)."""

    wire: str
    attr: str | None
    kind: str
    doc: str


POOL_FIELDS = (
    PoolField("capacity", "capacity", "count", "Slots of its connected workers."),
    PoolField("busy", "busy", "count", "Slots running an attempt."),
    PoolField("held", "held", "count", "Free slots held for fixed starts about to begin."),
    PoolField("desired", "desired", "count", "The capacity its autoscaler asks for (queue pressure, wait "
                                            "objectives, upcoming reservations; smoothed), at least its min; "
                                            "without an autoscaler, its capacity."),
    PoolField("pending", "pending", "count", "Tasks waiting to run."),
    PoolField("pending_by_class", "pending_by_class", "classes",
              "Pending tasks by class: critical, high, normal, low."),
    PoolField("reservations", "reservations", "count", "Fixed-start reservations booked."),
    PoolField("dispatched", "dispatched", "count", "Attempts started over the metrics window."),
    PoolField("succeeded", "succeeded", "count", "Attempts that succeeded over the metrics window."),
    PoolField("failed", "failed", "count", "Attempts that failed over the metrics window."),
    PoolField("priority_adherence", "priority_adherence", "number",
              "1 - priority inversions / dispatches over the window."),
    PoolField("fixed_start_hit_rate", "fixed_start_hit_rate", "number",
              "Fixed starts begun within their tolerance / fixed starts judged."),
    PoolField("utilization", "utilization", "number", "Busy slot-time / capacity slot-time over the window."),
    PoolField("schedule_efficiency", "schedule_efficiency", "number",
              "Run time of successful attempts / all run time over the window."),
    PoolField("wait_p50_s", "wait_p50", "seconds", "Median wait from ready to dispatch over the window."),
    PoolField("wait_p90_s", "wait_p90", "seconds", "90th percentile wait."),
    PoolField("wait_p99_s", "wait_p99", "seconds", "99th percentile wait."),
    PoolField("cost", "cost", "number", "Slot-seconds times the cost per slot-second, since start."),
    PoolField("workers_connected", None, "count", "Connected workers."),
)


class _View:
    __slots__: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if isinstance(value, list):
                value = [v.as_dict() if isinstance(v, _View) else v for v in value]
            out[name] = value
        return out

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.as_dict() == other.as_dict()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_rebuild, (type(self), {n: getattr(self, n) for n in self.__slots__}))


def _rebuild(cls: type[_View], fields: dict[str, Any]) -> _View:
    obj = cls.__new__(cls)
    for name, value in fields.items():
        setattr(obj, name, value)
    return obj


class GroupSnapshot(_View):
    """One worker group of a pool: the slots whose workers carry exactly ``labels``."""

    __slots__ = ("labels", "capacity", "busy")

    def __init__(self, labels: dict[str, str], capacity: int, busy: int) -> None:
        self.labels = labels
        self.capacity = capacity
        self.busy = busy


class PoolSnapshot(_View):
    """A pool's state now and its quality over the metrics window.

    Counts (dispatched, succeeded, failed) and rates cover the window; rates are
    1.0 when nothing was measured. Waits are seconds from becoming ready to
    dispatch; ``wait_p50_s_by_class`` and ``wait_p99_s_by_class`` are those of
    each class (critical, high, normal, low; 0.0 for a class that had none).
    ``worker_seconds`` and ``cost`` accumulate since start.
    ``stray_threads`` counts threads still running a plain function whose
    attempt was given up (filled in by the scheduler; the engine has none).
    """

    __slots__ = ("name", "capacity", "busy", "held", "desired", "pending", "pending_by_class",
                 "reservations", "dispatched", "succeeded", "failed", "priority_adherence",
                 "fixed_start_hit_rate", "utilization", "schedule_efficiency", "wait_p50",
                 "wait_p90", "wait_p99", "wait_p50_s_by_class", "wait_p99_s_by_class", "worker_seconds", "cost",
                 "groups", "stray_threads")

    name: str
    capacity: int
    busy: int
    held: int
    desired: int
    pending: int
    pending_by_class: dict[str, int]
    reservations: int
    dispatched: int
    succeeded: int
    failed: int
    priority_adherence: float
    fixed_start_hit_rate: float
    utilization: float
    schedule_efficiency: float
    wait_p50: float
    wait_p90: float
    wait_p99: float
    wait_p50_s_by_class: list[float]
    wait_p99_s_by_class: list[float]
    worker_seconds: float
    cost: float
    groups: list[GroupSnapshot]
    stray_threads: int

    def __init__(self, **fields: Any) -> None:
        for name in self.__slots__:
            if name in fields:
                setattr(self, name, fields[name])
            elif name in _OPTIONAL:   # (from a leader of an older version, or filled in later)
                setattr(self, name, _OPTIONAL[name]())
            else:
                raise KeyError(name)


# The fields a PoolSnapshot may be built without, and their defaults.
_OPTIONAL: dict[str, Any] = {"stray_threads": int, "wait_p50_s_by_class": lambda: [0.0] * 4,
                             "wait_p99_s_by_class": lambda: [0.0] * 4}


class Snapshot(_View):
    """The whole scheduler: its pools, totals since start, and task counts.
    ``window`` is the metrics window in seconds, which the pools' counts and
    rates cover."""

    __slots__ = ("pools", "totals", "live_tasks", "running", "pending", "at", "checkpoints", "window")

    def __init__(self, pools: list[PoolSnapshot], totals: dict[str, int], live_tasks: int,
                 running: int, pending: int, at: float, checkpoints: dict[str, int] | None = None,
                 window: float = 60.0) -> None:
        self.pools = pools
        self.totals = totals
        self.live_tasks = live_tasks
        self.running = running
        self.pending = pending
        self.at = at
        # Filled in by the scheduler (checkpoints are runtime data): tasks holding
        # checkpoints, checkpoints held, saved and attempts resumed since start.
        self.checkpoints = checkpoints if checkpoints is not None else {
            "tasks": 0, "held": 0, "saved": 0, "resumed": 0}
        self.window = window

    def pool(self, name: str) -> PoolSnapshot:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no pool named {name!r}")


class Checkpoint(_View):
    """The checkpoint of one stage of a task: ``data`` as the codec decoded
    it, ``at`` when it was saved (Unix seconds), ``attempt`` the attempt that
    saved it and ``size`` its encoded size in bytes."""

    __slots__ = ("stage", "data", "at", "attempt", "size")

    def __init__(self, stage: str, data: Any, at: float, attempt: int, size: int) -> None:
        self.stage = stage
        self.data = data
        self.at = at
        self.attempt = attempt
        self.size = size


class TaskInfo(_View):
    """What the scheduler knows of one task (live, or retained after it
    ended): ``stages`` as declared (None if none), ``checkpoints`` in stage
    order, ``tenant`` the one it was submitted for (None if none),
    ``max_attempts`` the attempts its retry policy allows (None when not
    known: a finished task read from the store, or restored without its options)."""

    __slots__ = ("id", "status", "pool", "key", "kind", "attempt", "message", "stages", "checkpoints", "tenant",
                 "max_attempts")

    def __init__(self, id: int, status: str, pool: str, key: str | None, kind: str | None,
                 attempt: int, message: str | None, stages: list[str] | None = None,
                 checkpoints: list[Checkpoint] | None = None, tenant: str | None = None,
                 max_attempts: int | None = None) -> None:
        self.id = id
        self.status = status
        self.pool = pool
        self.key = key
        self.kind = kind
        self.attempt = attempt
        self.message = message
        self.stages = stages
        self.checkpoints: list[Checkpoint] = checkpoints if checkpoints is not None else []
        self.tenant = tenant
        self.max_attempts = max_attempts


class Reservation(_View):
    """A fixed-start task that has not started yet: its pool's booking for it,
    ``start`` its start time and ``deadline`` its deadline (Unix nanoseconds,
    None: none), ``tolerance`` how late it may start (ns), ``held`` whether
    the engine already holds a free slot for it."""

    __slots__ = ("id", "pool", "key", "kind", "start", "tolerance", "held", "deadline")

    def __init__(self, id: int, pool: str, key: str | None, kind: str, start: int, tolerance: int, held: bool,
                 deadline: int | None) -> None:
        self.id = id
        self.pool = pool
        self.key = key
        self.kind = kind
        self.start = start
        self.tolerance = tolerance
        self.held = held
        self.deadline = deadline

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reservation:
        return cls(**data)
