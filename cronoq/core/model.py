"""The engine's data model: live tasks, worker groups and the state of a pool.

These are plain records with slots; the rules that move them live in
``cronoq.core.engine``. Queues, resources, timers and the metrics window hold
references to ``Entry`` objects, so an entry is the one place a live task's
state is kept.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Final

from .autoscale import Autoscaler
from .metrics import PoolWindow, RunStats
from .queues import Queued, ReadyQueues
from .reservations import Calendar
from .statuses import READY
from .types import CLASSES, CoreConfig, PoolConfig, RetryPolicy, Status, TaskSpec

if TYPE_CHECKING:
    from .resources import ResourceState

__all__ = ["W_NONE", "W_QUEUE", "W_PARKED", "W_LABEL", "W_DUE", "Labels", "Edge", "Extra", "Entry",
           "Group", "ShedIndex", "PoolState", "Plan"]

# Where a READY task waits.
W_NONE: Final = 0      # not waiting in a queue (blocked, scheduled, running, retrying, ended)
W_QUEUE: Final = 1     # the pool's ready queues
W_PARKED: Final = 2    # parked on a resource
W_LABEL: Final = 3     # waiting for a slot in a worker group with its labels
W_DUE: Final = 4       # the pool's due queue (fixed starts and their retries)

Labels = frozenset[tuple[str, str]]
Edge = tuple["Entry", str]   # (child, condition) on a parent, (parent, condition) in a plan
# A retained task: (status, pool, key, kind, attempt, message, tenant, max_attempts;
# None when not known: a task restored without its options). The status is
# kept as its plain string: a tuple of plain values is left alone by the
# garbage collector, which matters for a million records (an enum member
# would keep every record tracked).
Record = tuple[str, str, str | None, str | None, int, str | None, str | None, int | None]


class Extra:
    """Per-task state that most tasks never need."""

    __slots__ = ("parents", "awaits", "park_seq", "parked_on", "hb", "start", "tolerance",
                 "on_miss", "hold", "guard", "recurring", "reoffered")

    def __init__(self) -> None:
        self.parents: tuple[int, ...] = ()      # live parent ids at admission (cycle checks)
        self.awaits: list[str] | None = None    # keys this task waits to appear
        self.park_seq: int | None = None
        self.parked_on: ResourceState[Entry] | None = None
        self.hb = 0                             # last heartbeat (lease TTL pools)
        self.start: int | None = None           # fixed start
        self.tolerance = 0
        self.on_miss = "run_late"
        self.hold = False                       # a slot is held for this task
        self.guard: int | None = None           # previous occurrence (recurring, overlap skip)
        self.recurring: str | None = None
        self.reoffered = False                  # may take units ahead of a resource's waiters


class Entry(Queued):
    """A live task. Queues hold references to entries; ids order submissions."""

    # (and, from Queued: id, cls, submitted, est, lst, tag, status, spec)
    __slots__ = ("pool", "attempt", "ready_at", "payload", "key", "kind", "lease", "started", "deadline",
                 "unmet", "children", "group", "where", "x")

    def __init__(self, task_id: int, pool: PoolState, cls: int, now: int, payload: Any,
                 key: str | None, kind: str, spec: TaskSpec | None) -> None:
        self.id = task_id
        self.pool = pool
        self.cls = cls
        self.status: Status = READY
        self.attempt = 0
        self.submitted = now
        self.ready_at = now
        self.payload = payload
        self.key = key
        self.kind = kind
        self.spec = spec              # the TaskSpec when it has options beyond the basics
        self.lease = 0
        self.started = 0
        self.deadline: int | None = None
        self.lst: int | None = None   # latest start time (deadline - estimate)
        self.est = 0
        self.tag: float | None = None   # fair-share start tag
        self.unmet = 0
        self.children: list[Edge] | None = None
        self.group: Group | None = None
        self.where = W_NONE
        self.x: Extra | None = None

    def extra(self) -> Extra:
        x = self.x
        if x is None:
            x = self.x = Extra()
        return x

    def __repr__(self) -> str:
        return f"<Entry {self.id} {self.status} pool={self.pool.name} class={CLASSES[self.cls]}>"


def pool_order(p: PoolState) -> int:
    return p.index


class Group:
    """The workers of a pool that carry exactly ``labels``."""

    __slots__ = ("labels", "capacity", "busy")

    def __init__(self, labels: Labels, capacity: int) -> None:
        self.labels = labels
        self.capacity = capacity
        self.busy = 0


class ShedIndex:
    """Waiting tasks of a shedding pool by class, oldest and newest first."""

    __slots__ = ("oldest", "newest")

    def __init__(self) -> None:
        self.oldest: list[list[int]] = [[], [], [], []]
        self.newest: list[list[int]] = [[], [], [], []]

    def add(self, e: Entry) -> None:
        heapq.heappush(self.oldest[e.cls], e.id)
        heapq.heappush(self.newest[e.cls], -e.id)

    def compact(self, c: int, live: Callable[[int], bool]) -> None:
        self.oldest[c] = [i for i in self.oldest[c] if live(i)]
        heapq.heapify(self.oldest[c])
        self.newest[c] = [i for i in self.newest[c] if live(-i)]
        heapq.heapify(self.newest[c])


class PoolState:
    """The engine's state of one pool."""

    # Slots keep attribute access fast on the hot paths (and the set closed).
    __slots__ = ("name", "index", "config", "queues", "unlabeled", "groups", "capacity", "busy", "held",
                 "pending", "pending_total", "inactive", "due_n", "due", "hold_waiters",
                 "label_waiters", "label_waiting", "held_label_waiters", "calendar", "reservation_limit",
                 "window", "runs", "scaler", "cost_rate", "max_class", "max_total", "bounded", "shed",
                 "retry", "max_attempts", "lease_ttl", "dirty", "started_fixed")

    def __init__(self, config: PoolConfig, cfg: CoreConfig, index: int, now: int) -> None:
        self.name = config.name
        self.index = index                # declaration order: the order pools dispatch in
        self.config = config
        self.queues: ReadyQueues[Entry] = ReadyQueues(cfg.priority, cfg.urgency, config.fair_share, config.tenant_weights)
        self.unlabeled = Group(frozenset(), config.initial)
        self.groups: dict[Labels, Group] = {frozenset(): self.unlabeled}
        self.capacity = config.initial
        self.busy = 0
        self.held = 0
        self.pending = [0, 0, 0, 0]       # per class: not running, not ended
        self.pending_total = 0
        self.inactive = [0, 0, 0, 0]      # blocked or scheduled, per class
        self.due_n = [0, 0, 0, 0]
        self.due: list[tuple[int, int, Entry]] = []   # heap (due time, id, entry)
        self.hold_waiters: deque[Entry] = deque()
        self.label_waiters: dict[Labels | None, deque[Entry]] = {}
        self.label_waiting = 0
        # Label waiters that hold a slot: they may start ahead of their label
        # set's head (which may have no slot). Few, and checked lazily.
        self.held_label_waiters: list[Entry] = []
        self.calendar = Calendar()
        self.reservation_limit = max(1, math.floor(config.max * config.reservable_fraction))
        self.window = PoolWindow(cfg.metrics_window_ns, cfg.metrics_buckets, now, config.initial)
        self.runs = RunStats()
        autoscale = config.autoscale
        self.scaler = (Autoscaler(autoscale, config.min, config.max, config.initial,
                                  config.default_duration_ns) if autoscale else None)
        self.cost_rate = autoscale.cost_per_worker_second if autoscale else 0.0
        self.max_class = config.max_pending_class
        self.max_total = config.max_pending_total
        self.bounded = self.max_total is not None or any(b is not None for b in self.max_class)
        self.shed = ShedIndex() if config.overflow.startswith("shed") else None
        self.retry: RetryPolicy = config.retry
        self.max_attempts = config.retry.max_attempts   # (a native int: a plain task ends without the policy)
        self.lease_ttl = config.lease_ttl_ns
        self.dirty = False                # in the engine's list of pools to dispatch
        self.started_fixed: set[int] = set()   # fixed-start tasks running on a booking

    @property
    def desired(self) -> int:
        return self.scaler.target if self.scaler is not None else self.capacity


class Plan:
    """One task of an admission being validated (see ``Core._admit``)."""

    __slots__ = ("index", "spec", "pool", "batch_parents", "live_parents", "ended_parents",
                 "awaits", "fixed", "entry")

    def __init__(self, index: int, spec: TaskSpec, pool: PoolState) -> None:
        self.index = index
        self.spec = spec
        self.pool = pool
        self.batch_parents: list[tuple[int, str]] = []          # (plan index, condition)
        self.live_parents: list[Edge] = []                      # (parent entry, condition)
        self.ended_parents: list[tuple[str | int, str, str]] = []   # (ref, its status, condition)
        self.awaits: list[tuple[str, str]] = []                 # (key, condition)
        self.fixed: tuple[int, int, int, int] | None = None     # (start, tolerance, lo, hi)
        self.entry: Entry | None = None
