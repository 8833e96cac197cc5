"""The deterministic scheduling engine.

``Core`` is a state machine without a clock, threads or I/O. Every call takes
the current time (``now``, integer Unix nanoseconds; a time earlier than one
seen before counts as that time), updates the state, and queues actions for a
driver: dispatch an attempt, abort one, persist a mutation, publish an event,
scale a pool. ``next_wakeup`` says when the engine next needs ``advance``.
Randomness (retry jitter) comes from a generator seeded by the configuration,
so the same inputs always give the same outputs.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import deque
from typing import Iterable, Sequence

from . import actions as act
from . import timers as tm
from .autoscale import Autoscaler
from .errors import (
    AdmissionError, Cycle, InvalidTask, QueueFull, ReservationConflict, ResourceExceedsCapacity,
    SchedulerError, UnknownDependency, UnknownPool, UnknownResource, UnknownTask,
)
from .metrics import Histogram, PoolWindow, RunStats
from .queues import ReadyQueues
from .persist import _SPEC_PAYLOAD, RestoredSchedule, RestoredTask
from .recurring import OVERLAP_POLICIES, CronSchedule, Recurring, rfc3339
from .reservations import Calendar
from .resources import ResourceState
from .snapshot import GroupSnapshot, PoolSnapshot, Snapshot, TaskInfo, TOTAL_FIELDS
from .timers import TimerHeap
from .types import (
    BLOCKED, CANCELLED, CANCELLED_OUTCOME, CLASSES, DEAD_LETTERED, FAILED, MISSED, NS, PERMANENT,
    READY, RETRYABLE, RETRYING, RUNNING, SCHEDULED, SHED, SKIPPED, SUCCEEDED, SUCCESS, TERMINAL,
    CoreConfig, PoolConfig, ResourceConfig, TaskSpec, check_name, to_ns,
)
from .types import KEY_LIMIT, RECURRING_KEY_LIMIT, check_length

__all__ = ["Core", "Entry"]

# Where a READY task waits.
W_NONE = 0      # not waiting in a queue (blocked, scheduled, running, retrying, ended)
W_QUEUE = 1     # the pool's ready queues
W_PARKED = 2    # parked on a resource
W_LABEL = 3     # waiting for a slot in a worker group with its labels
W_DUE = 4       # the pool's due queue (fixed starts and their retries)

ID_BITS = 44    # ids carry the store's epoch above these bits
_COMPACT_SLACK = 32   # stale timers tolerated beyond half the heap (small heaps are not scanned)

_FAILURES = (RETRYABLE, PERMANENT, CANCELLED_OUTCOME)   # outcomes of complete() besides success

_SATISFIES = {
    "success": frozenset({SUCCEEDED}),
    "failure": frozenset({FAILED, DEAD_LETTERED}),
    "complete": TERMINAL,
}

# Persisted mutations (the store layer interprets them).
MUT_SUBMIT = "submit"
MUT_STATUS = "status"
MUT_OUTPUT = "output"
MUT_RECURRING = "recurring"
MUT_RECURRING_REMOVED = "recurring_removed"
MUT_WITHDRAWN = "withdrawn"   # a submission taken back: the store deletes any row of it


class Extra:
    """Per-task state that most tasks never need."""

    __slots__ = ("parents", "awaits", "park_seq", "parked_on", "hb", "start", "tolerance",
                 "on_miss", "hold", "late", "guard", "recurring", "reoffered")

    def __init__(self) -> None:
        self.parents: tuple = ()          # live parent ids at admission (cycle checks)
        self.awaits: list | None = None   # keys this task waits to appear
        self.park_seq: int | None = None
        self.parked_on: ResourceState | None = None
        self.hb = 0                       # last heartbeat (lease TTL pools)
        self.start: int | None = None     # fixed start
        self.tolerance = 0
        self.on_miss = "run_late"
        self.hold = False                 # a slot is held for this task
        self.late = False                 # the start was missed and it runs late
        self.guard: int | None = None     # previous occurrence (recurring, overlap skip)
        self.recurring: str | None = None
        self.reoffered = False            # may take units ahead of a resource's waiters


class Entry:
    """A live task. Queues hold references to entries; ids order submissions."""

    __slots__ = ("id", "pool", "cls", "status", "attempt", "submitted", "ready_at", "payload",
                 "key", "kind", "spec", "lease", "started", "deadline", "lst", "est", "tag",
                 "unmet", "children", "group", "where", "x")

    def __init__(self, task_id: int, pool, cls: int, now: int, payload, key, kind: str, spec) -> None:
        self.id = task_id
        self.pool = pool
        self.cls = cls
        self.status = READY
        self.attempt = 0
        self.submitted = now
        self.ready_at = now
        self.payload = payload
        self.key = key
        self.kind = kind
        self.spec = spec              # the TaskSpec when it has options beyond the basics
        self.lease = 0
        self.started = 0
        self.deadline = None
        self.lst = None
        self.est = 0
        self.tag = None
        self.unmet = 0
        self.children = None          # [(child entry, condition)]
        self.group = None
        self.where = W_NONE
        self.x = None                 # Extra

    def extra(self) -> Extra:
        x = self.x
        if x is None:
            x = self.x = Extra()
        return x

    def __repr__(self) -> str:
        return f"<Entry {self.id} {self.status} pool={self.pool.name} class={CLASSES[self.cls]}>"


def _pool_order(p: PoolState) -> int:
    return p.index


class Group:
    __slots__ = ("labels", "capacity", "busy")

    def __init__(self, labels: frozenset, capacity: int) -> None:
        self.labels = labels
        self.capacity = capacity
        self.busy = 0


class ShedIndex:
    """Waiting tasks of a shedding pool by class, oldest and newest first."""

    __slots__ = ("oldest", "newest")

    def __init__(self) -> None:
        self.oldest: list[list[int]] = [[], [], [], []]
        self.newest: list[list[int]] = [[], [], [], []]

    def add(self, e) -> None:
        heapq.heappush(self.oldest[e.cls], e.id)
        heapq.heappush(self.newest[e.cls], -e.id)

    def compact(self, c: int, live) -> None:
        self.oldest[c] = [i for i in self.oldest[c] if live(i)]
        heapq.heapify(self.oldest[c])
        self.newest[c] = [i for i in self.newest[c] if live(-i)]
        heapq.heapify(self.newest[c])


class PoolState:
    """The engine's state of one pool."""

    # Slots keep attribute access fast on the hot paths (and the set closed).
    __slots__ = ("name", "index", "config", "queues", "unlabeled", "groups", "capacity", "busy", "held",
                 "pending", "pending_total", "inactive", "due_n", "due", "hold_waiters",
                 "label_waiters", "label_waiting", "held_label_waiters", "calendar", "reservation_limit", "window", "runs",
                 "scaler", "cost_rate", "max_class", "max_total", "bounded", "shed", "retry",
                 "lease_ttl", "dirty", "started_fixed")

    def __init__(self, config: PoolConfig, core: Core, now: int) -> None:
        cfg = core.config
        self.name = config.name
        self.index = len(core.pools)      # declaration order: the order pools dispatch in
        self.config = config
        self.queues = ReadyQueues(cfg.priority, cfg.urgency, config.fair_share, config.tenant_weights)
        self.unlabeled = Group(frozenset(), config.initial)
        self.groups: dict[frozenset, Group] = {frozenset(): self.unlabeled}
        self.capacity = config.initial
        self.busy = 0
        self.held = 0
        self.pending = [0, 0, 0, 0]
        self.pending_total = 0
        self.inactive = [0, 0, 0, 0]      # blocked or scheduled, per class
        self.due_n = [0, 0, 0, 0]
        self.due: list[tuple] = []        # heap (due time, id, entry)
        self.hold_waiters: deque = deque()
        self.label_waiters: dict[frozenset, deque] = {}
        self.label_waiting = 0
        # Label waiters that hold a slot: they may start ahead of their label
        # set's head (which may have no slot). Few, and checked lazily.
        self.held_label_waiters: list = []
        self.calendar = Calendar()
        self.reservation_limit = max(1, math.floor(config.max * config.reservable_fraction))
        self.window = PoolWindow(cfg.metrics_window_ns, cfg.metrics_buckets, now, config.initial)
        self.runs = RunStats()
        self.scaler = (Autoscaler(config.autoscale, config.min, config.max, config.initial,
                                  config.default_duration_ns) if config.autoscale else None)
        self.cost_rate = config.autoscale.cost_per_worker_second if config.autoscale else 0.0
        self.max_class = config.max_pending_class
        self.max_total = config.max_pending_total
        self.bounded = self.max_total is not None or any(b is not None for b in self.max_class)
        self.shed = ShedIndex() if config.overflow.startswith("shed") else None
        self.retry = config.retry
        self.lease_ttl = config.lease_ttl_ns
        self.dirty = False
        self.started_fixed: set[int] = set()   # fixed-start tasks running on a booking

    @property
    def desired(self) -> int:
        return self.scaler.target if self.scaler is not None else self.capacity


class Core:
    """The scheduling engine. See the module docstring for the contract."""

    __slots__ = ("config", "now", "pools", "default_pool", "resources", "tasks", "running", "keys",
                 "retained", "_retain_order", "awaiting", "recurring", "timers", "actions", "pending",
                 "_counts", "_submitted", "_dispatched", "_succeeded", "rng", "_next_id",
                 "_next_lease", "_park_seq", "_dirty", "_frozen", "_emit_all", "_persist",
                 "_max_total", "_retention", "_retain_max", "_retain_on", "_timer_heap",
                 "_timers_ended")

    def __init__(self, config: CoreConfig | None = None, pools: Sequence[PoolConfig] = (),
                 resources: Sequence[ResourceConfig] = (), *, now: int = 0) -> None:
        self.config = config = config or CoreConfig()
        self.now = now
        self.pools: dict[str, PoolState] = {}
        for pc in pools:
            if not isinstance(pc, PoolConfig):
                raise ValueError(f"pools must be PoolConfig objects, got {type(pc).__name__}")
            if pc.name in self.pools:
                raise ValueError(f"duplicate pool name {pc.name!r}")
            self.pools[pc.name] = PoolState(pc, self, now)
        if not self.pools:
            raise ValueError("a scheduler needs at least one pool")
        self.default_pool = self.pools.get("default") or next(iter(self.pools.values()))
        self.resources: dict[str, ResourceState] = {}
        for rc in resources:
            if not isinstance(rc, ResourceConfig):
                raise ValueError(f"resources must be ResourceConfig objects, got {type(rc).__name__}")
            if rc.name in self.resources:
                raise ValueError(f"duplicate resource name {rc.name!r}")
            self.resources[rc.name] = ResourceState(rc, now)
        self.tasks: dict[int, Entry] = {}
        self.running: dict[int, Entry] = {}       # lease -> entry
        self.keys: dict[str, int] = {}            # key -> id, live or retained
        self.retained: dict[int, tuple] = {}      # id -> (status, pool, key, kind, attempt, message)
        self._retain_order: deque = deque()       # (expiry, id)
        self.awaiting: dict[str, list] = {}       # key -> [(child entry, condition)]
        self.recurring: dict[str, Recurring] = {}
        self.timers = TimerHeap()
        self.actions: deque = deque()
        self.pending = 0
        self._counts = dict.fromkeys(TOTAL_FIELDS, 0)
        # The three counters every task moves are plain attributes (cheaper).
        self._submitted = self._dispatched = self._succeeded = 0
        self.rng = random.Random(config.seed)
        self._next_id = (config.epoch << ID_BITS) + 1
        self._next_lease = (config.epoch << ID_BITS) + 1
        self._park_seq = 0
        self._dirty: list[PoolState] = []
        self._frozen = False
        self._emit_all = config.emit_transitions
        self._persist = config.persist
        self._max_total = config.max_pending_total
        self._retention = config.retention_ns
        self._retain_max = config.retention_max
        self._retain_on = config.retention_ns > 0 and config.retention_max > 0
        self._timer_heap = self.timers.entries()
        self._timers_ended = 0   # timers made stale since the last compaction (an estimate)
        for p in self.pools.values():
            if p.scaler is not None:
                self._arm_scaler(p, now)

    # ================================================================ public API

    def submit(self, now: int, spec: TaskSpec) -> tuple[int, bool]:
        """Admit one task; returns ``(id, duplicate)``. Raises an AdmissionError
        (and changes nothing) when the task cannot be admitted."""
        if now < self.now:
            now = self.now
        else:
            self.now = now
        heap = self._timer_heap
        if heap and heap[0][0] <= now or self._retain_order and self._retain_order[0][0] <= now:
            self._enter(now)
        if type(spec) is TaskSpec and spec.plain and (
                (key := spec.key) is None or key not in self.awaiting):
            # No option beyond pool, kind, priority and key: nothing to plan.
            # (The pool is checked first, as _admit does: an unknown pool is
            # an error even for a key that exists.)
            p = self.default_pool if spec.pool is None else self._pool(spec.pool)
            if key is not None:
                existing = self._key_id(key, now)
                if existing is not None:
                    if self._dirty:
                        self._flush(now)
                    return (existing, True)
            if p.bounded or self._max_total is not None:
                self._make_room(p, spec.priority, now)
            task_id = self._admit_plain(p, spec, now)
            if self._dirty:
                self._flush(now)
            return (task_id, False)
        else:
            result = self._admit(now, (spec,), False)[0]
        if self._dirty:
            self._flush(now)
        return result

    def submit_batch(self, now: int, specs: Sequence[TaskSpec]) -> list[tuple[int, bool]]:
        """Admit several tasks atomically: all of them or, on error, none.
        The error's ``index`` names the offending task."""
        now = self._enter(now)
        specs = list(specs)
        if not specs:
            return []
        plain = self._max_total is None
        if plain:
            pools = self.pools
            for spec in specs:
                if type(spec) is not TaskSpec or not spec.plain or spec.key is not None or (
                        spec.pool is not None and spec.pool not in pools) or (
                        pools[spec.pool or self.default_pool.name].bounded):
                    plain = False
                    break
        if plain:
            # Nothing in the batch can be refused: admit without planning.
            default = self.default_pool
            results = [(self._admit_plain(default if spec.pool is None else self.pools[spec.pool],
                                          spec, now), False) for spec in specs]
        else:
            results = self._admit(now, specs, True)
        if self._dirty:
            self._flush(now)
        return results

    def _admit_plain(self, p: PoolState, spec: TaskSpec, now: int) -> int:
        """Admit a task with no option beyond pool, kind, priority and a new
        key, whose bounds were checked: it goes straight to its queue."""
        c = spec.priority
        task_id = self._next_id
        self._next_id = task_id + 1
        key = spec.key
        e = Entry(task_id, p, c, now, spec.payload, key, spec.kind, None)
        self.tasks[task_id] = e
        if key is not None:
            self.keys[key] = task_id
        p.pending[c] += 1
        p.pending_total += 1
        self.pending += 1
        self._submitted += 1
        if self._persist:
            self.actions.append((act.PERSIST, (MUT_SUBMIT, task_id, p.name, spec, now)))
        e.where = W_QUEUE
        p.queues.push(e)
        if p.shed is not None:
            self._index_shed(p, e)
        self._arrived(p, e, now)
        return task_id

    def complete(self, now: int, lease: int, outcome: str = SUCCESS, output=None,
                 message: str | None = None, retry_after_ns: int | None = None) -> bool:
        """Report the end of an attempt. Returns False for a stale report (the
        attempt was aborted, timed out, already reported, or never existed)."""
        if outcome != SUCCESS and outcome not in _FAILURES:
            # Checked before anything changes: a bad outcome must not end the attempt.
            raise ValueError(f"outcome must be success, retryable, permanent or cancelled, got {outcome!r}")
        if now < self.now:
            now = self.now
        else:
            self.now = now
        heap = self._timer_heap
        if heap and heap[0][0] <= now or self._retain_order and self._retain_order[0][0] <= now:
            self._enter(now)
        e = self.running.pop(lease, None)
        if e is None:
            self._counts["stale_completions"] += 1
            return False
        ok = outcome == SUCCESS
        self._end_attempt(e, now, ok)
        if ok:
            if self._persist:
                self.actions.append((act.PERSIST, (MUT_OUTPUT, e.id, output)))
            if e.x is None and e.children is None:
                # The common case, without dependents or extras to resolve.
                task_id = e.id
                p = e.pool
                e.status = SUCCEEDED
                del self.tasks[task_id]
                if self._retain_on:
                    self.retained[task_id] = (SUCCEEDED, p.name, e.key, e.kind, e.attempt, message)
                    self._retain_order.append((now + self._retention, task_id))
                    if len(self.retained) > self._retain_max:
                        self._expire_retained(now, True)
                elif e.key is not None:
                    self._forget_key(e)
                self._succeeded += 1
                self.actions.append((act.EVENT, task_id, p.name, e.key, SUCCEEDED, e.attempt, now, message))
                if self._persist:
                    self.actions.append((act.PERSIST, (MUT_STATUS, task_id, SUCCEEDED, e.attempt, now, message)))
            else:
                self._finish(e, SUCCEEDED, now, message)
        elif outcome == RETRYABLE:
            self._retry_or_dead(e, now, message, retry_after_ns)
        elif outcome == PERMANENT:
            self._finish(e, FAILED, now, message)
        elif outcome == CANCELLED_OUTCOME:
            self._finish(e, CANCELLED, now, message or "cancelled by the executor")
        else:
            raise ValueError(f"outcome must be success, retryable, permanent or cancelled, got {outcome!r}")
        if self._dirty:
            self._flush(now)
        elif self._timers_ended > (len(heap) >> 1) + _COMPACT_SLACK:
            self._compact_timers()
        return True

    def heartbeat(self, now: int, lease: int) -> bool:
        """Keep an attempt's lease alive; False when the lease is no longer live."""
        now = self._enter(now)
        e = self.running.get(lease)
        if e is None:
            return False
        e.extra().hb = now
        return True

    def cancel(self, now: int, ref: int | str) -> bool:
        """Cancel a task by id or key. True if this call cancelled it, False if
        it had already ended; ``UnknownTask`` if no such task is known."""
        now = self._enter(now)
        e = self._live(ref, now)
        if e is None:
            if self._retained_record(ref, now) is not None:
                return False
            raise UnknownTask(ref)
        self._finish(e, CANCELLED, now, "cancelled")
        if self._dirty:
            self._flush(now)
        elif self._timers_ended > (len(self._timer_heap) >> 1) + _COMPACT_SLACK:
            self._compact_timers()
        return True

    def withdraw(self, now: int, task_ids: Iterable[int], message: str) -> list[int]:
        """Take back submissions that were never acknowledged (the store could
        not make them durable), as if they had never been admitted.

        Each task ends as a cancel would end it (an attempt the engine started
        is aborted; dependents react as to a cancellation), then it is
        forgotten: no event, no retained record, its key free again, and a
        ``MUT_WITHDRAWN`` mutation asks the store to delete any row of it.
        Returns the ids withdrawn (those still live).
        """
        now = self._enter(now)
        actions = self.actions
        withdrawn = []
        for task_id in task_ids:
            e = self.tasks.get(task_id)
            if e is None:
                continue
            mark = len(actions)
            self._finish(e, CANCELLED, now, message)
            # Keep what its ending did to others (dependents skipped); drop its own traces.
            tail = [actions.pop() for _ in range(len(actions) - mark)]
            for raw in reversed(tail):
                kind = raw[0]
                if (kind == act.EVENT and raw[1] == task_id) or (kind == act.ABORT and raw[2] == task_id) or (
                        kind == act.PERSIST and raw[1][0] == MUT_STATUS and raw[1][1] == task_id):
                    continue
                actions.append(raw)
            self.retained.pop(task_id, None)
            if e.key is not None:
                self._forget_key(e)
            self._counts[CANCELLED] -= 1
            self._submitted -= 1
            if self._persist:
                actions.append((act.PERSIST, (MUT_WITHDRAWN, task_id)))
            withdrawn.append(task_id)
        if self._dirty:
            self._flush(now)
        return withdrawn

    def set_capacity(self, now: int, pool: str, capacity: int) -> None:
        """Set the capacity of a pool's unlabeled worker group."""
        now = self._enter(now)
        p = self._pool_by_name(pool)
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity must be an integer >= 0, got {capacity!r}")
        self._check_max(p, p.unlabeled, capacity)
        self._set_group(p, p.unlabeled, capacity, now)
        self._flush(now)

    def set_group_capacity(self, now: int, pool: str, labels: dict[str, str], capacity: int) -> None:
        """Set the capacity of the worker group with exactly ``labels``."""
        now = self._enter(now)
        p = self._pool_by_name(pool)
        if not isinstance(labels, dict):
            raise ValueError("labels must be a dict of strings")
        key = frozenset((check_name(k, "label name", error=ValueError),
                         check_name(v, "label value", error=ValueError)) for k, v in labels.items())
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity must be an integer >= 0, got {capacity!r}")
        group = p.groups.get(key)
        self._check_max(p, group, capacity)
        if group is None:
            group = p.groups[key] = Group(key, 0)
        self._set_group(p, group, capacity, now)
        self._flush(now)

    def _check_max(self, p: PoolState, group: Group | None, capacity: int) -> None:
        """The pool's max bounds its workers over all groups, labelled or not."""
        others = p.capacity - (group.capacity if group is not None else 0)
        if others + capacity > p.config.max:
            held = f" ({others} in its other worker groups)" if others else ""
            raise ValueError(f"capacity {capacity} would give pool {p.name!r} {others + capacity} workers"
                             f"{held}, above its max of {p.config.max}")

    def advance(self, now: int) -> None:
        """Fire every timer due at ``now`` and dispatch what can run."""
        now = self._enter(now)
        self._flush(now)

    def has_timers(self) -> bool:
        """Whether any timer is armed (live or not yet pruned): a cheap check
        before ``next_wakeup``."""
        return bool(self._timer_heap)

    def next_wakeup(self) -> int | None:
        """When the engine next needs ``advance``, or None if nothing is timed."""
        heap = self.timers.entries()
        while heap:
            when, _, kind, obj, token = heap[0]
            if self._timer_live(kind, obj, token):
                return when
            heapq.heappop(heap)
        return None

    def poll_action(self):
        """The next action as a typed object, or None."""
        if self.actions:
            return act.typed(self.actions.popleft())
        return None

    def take_actions(self) -> deque:
        """All queued actions as raw tuples (see ``cronoq.core.actions``)."""
        taken = self.actions
        self.actions = deque()
        return taken

    def status(self, ref: int | str, now: int | None = None) -> str:
        return self.info(ref, now).status

    def info(self, ref: int | str, now: int | None = None) -> TaskInfo:
        """What is known of a live or retained task; ``UnknownTask`` otherwise."""
        now = self.now if now is None else max(now, self.now)
        e = self._live(ref, now)
        if e is not None:
            return TaskInfo(e.id, e.status, e.pool.name, e.key, e.kind, e.attempt, None)
        record = self._retained_record(ref, now)
        if record is None:
            raise UnknownTask(ref)
        task_id = ref if isinstance(ref, int) else self.keys[ref]
        status, pool, key, kind, attempt, message = record
        return TaskInfo(task_id, status, pool, key, kind, attempt, message)

    @property
    def totals(self) -> dict[str, int]:
        """Counters since start (a copy): submitted, dispatched, succeeded, ..."""
        totals = dict(self._counts)
        totals["submitted"] = self._submitted
        totals["dispatched"] = self._dispatched
        totals["succeeded"] = self._succeeded
        return totals

    def overflow_policy(self, pool: str | None) -> str:
        return self._pool(pool).config.overflow

    # ================================================================ time

    def _enter(self, now: int) -> int:
        if now < self.now:
            now = self.now
        else:
            self.now = now
        order = self._retain_order
        if order and order[0][0] <= now:
            self._expire_retained(now)
        timers = self.timers
        while True:
            t = timers.pop_due(now)
            if t is None:
                break
            self._fire(t[0], t[2], t[3], t[4])
        if self._dirty:
            # Dispatch what the timers freed or readied now, as advance(now)
            # would: a call that then returns early or raises (a stale
            # completion, a heartbeat, a refused submission) must not leave
            # a free slot idle with no wakeup armed.
            self._flush(now)
        return now

    def _compact_timers(self) -> None:
        self._timers_ended = 0
        self.timers.compact(self._timer_gone)

    def _timer_gone(self, kind: int, obj, token) -> bool:
        """True for a timer that can never matter again (unlike ``_timer_live``,
        which may be false for a while: a held task's hold timer)."""
        if kind == tm.TIMEOUT or kind == tm.LEASE:
            return self.running.get(token) is not obj     # leases are never reused
        if kind == tm.RECUR:
            return self.recurring.get(obj.name) is not obj
        if kind == tm.REFILL or kind == tm.AUTOSCALE:
            return False   # one per resource or pool, and due soon
        if self.tasks.get(obj.id) is not obj:
            return True    # the task ended
        return kind == tm.RETRY and obj.attempt != token   # attempts only grow

    def _timer_live(self, kind: int, obj, token) -> bool:
        if kind == tm.TIMEOUT or kind == tm.LEASE:
            return self.running.get(token) is obj
        if kind == tm.REFILL:
            return obj.refill_at == token
        if kind == tm.AUTOSCALE:
            return obj.scaler.armed == token
        if kind == tm.RECUR:
            return self.recurring.get(obj.name) is obj and obj.timer_at == token
        if kind == tm.RETRY:
            return obj.status is RETRYING and obj.attempt == token and self.tasks.get(obj.id) is obj
        if self.tasks.get(getattr(obj, "id", None)) is not obj:
            return False
        if kind == tm.START:
            return obj.status is SCHEDULED or obj.status is BLOCKED
        if kind == tm.MISS:
            return obj.attempt == 0 and obj.status is not RUNNING
        if kind == tm.HOLD:
            return obj.attempt == 0 and obj.status is not RUNNING and not obj.x.hold
        if kind == tm.AWAIT:
            return bool(obj.x.awaits)
        return True

    def _fire(self, when: int, kind: int, obj, token) -> None:
        if not self._timer_live(kind, obj, token):
            return
        now = self.now
        if kind == tm.RETRY:
            self._to_ready(obj, now)
        elif kind == tm.TIMEOUT:
            self._counts["timeouts"] += 1
            self._abort_attempt(obj, now, "timeout", "attempt timed out")
        elif kind == tm.LEASE:
            x = obj.x
            ttl = obj.pool.config.lease_ttl_ns
            if x.hb + ttl > now:
                self.timers.push(x.hb + ttl, tm.LEASE, obj, token)
            else:
                self._counts["lease_expiries"] += 1
                self._abort_attempt(obj, now, "lease expired", "lease expired (no heartbeat)")
        elif kind == tm.AWAIT:
            if obj.x.awaits:
                keys = ", ".join(repr(k) for k in obj.x.awaits)
                self._finish(obj, SKIPPED, now, f"dependency key {keys} was never submitted")
        elif kind == tm.HOLD:
            self._check_hold(obj, now)
        elif kind == tm.START:
            self._on_start(obj, now)
        elif kind == tm.MISS:
            self._on_miss(obj, now)
        elif kind == tm.REFILL:
            obj.refill_at = None
            self._reoffer(obj, now)
        elif kind == tm.AUTOSCALE:
            self._autoscale(obj, now)
        elif kind == tm.RECUR:
            obj.timer_at = None
            self._recur(obj, now)

    # ================================================================ admission

    def _pool(self, name: str | None) -> PoolState:
        if name is None:
            return self.default_pool
        p = self.pools.get(name)
        if p is None:
            raise UnknownPool(f"no pool named {name!r} (pools: {', '.join(self.pools)})")
        return p

    def _pool_by_name(self, name: str) -> PoolState:
        p = self.pools.get(name)
        if p is None:
            raise ValueError(f"no pool named {name!r}")
        return p

    def _create(self, p: PoolState, spec: TaskSpec, now: int) -> Entry:
        task_id = self._next_id
        self._next_id = task_id + 1
        e = Entry(task_id, p, spec.priority, now, spec.payload, spec.key, spec.kind,
                  None if spec.plain else spec)
        self.tasks[task_id] = e
        if spec.key is not None:
            self.keys[spec.key] = task_id
        p.pending[e.cls] += 1
        p.pending_total += 1
        self.pending += 1
        self._submitted += 1
        if self._persist:
            self.actions.append((act.PERSIST, (MUT_SUBMIT, task_id, p.name, spec, now)))
        return e

    def _admit(self, now: int, specs: Sequence[TaskSpec], batch: bool) -> list:
        """Validate every spec, then apply them all; nothing changes on error."""
        n = len(specs)
        results: list = [None] * n
        plans: list[_Plan] = []
        batch_keys: dict[str, int] = {}
        for i, spec in enumerate(specs):
            try:
                if not isinstance(spec, TaskSpec):
                    raise InvalidTask(f"expected a Task, got {type(spec).__name__}")
                p = self._pool(spec.pool)
                key = spec.key
                if key is not None:
                    existing = self._key_id(key, now)
                    if existing is not None:
                        results[i] = (existing, True)
                        continue
                    if key in batch_keys:
                        results[i] = batch_keys[key]   # filled in once that task has an id
                        continue
                    batch_keys[key] = len(plans)
                plan = _Plan(i, spec, p)
                if spec.resources:
                    for name, units in spec.resources.items():
                        r = self.resources.get(name)
                        if r is None:
                            raise UnknownResource(f"no resource named {name!r}")
                        if units > r.capacity:
                            raise ResourceExceedsCapacity(
                                f"resource {name!r} has capacity {r.capacity}, the task asks for {units}")
                plans.append(plan)
            except AdmissionError as exc:
                raise exc.at_index(i) if batch else exc
        if plans:
            self._resolve_edges(now, plans, batch_keys, batch)
            self._check_reservations(now, plans, batch)
            victims = self._check_bounds(now, plans, batch)
            for victim in victims:
                self._shed(victim, now)
            self._apply(now, plans)
        for i in range(n):
            r = results[i]
            if isinstance(r, int):       # an in-batch duplicate: same id as its first
                results[i] = (plans[r].entry.id, True)
            elif r is None:
                results[i] = None
        for plan in plans:
            results[plan.index] = (plan.entry.id, False)
        return results

    def _resolve_edges(self, now: int, plans: list, batch_keys: dict, batch: bool) -> None:
        for plan in plans:
            spec = plan.spec
            if not spec.edges:
                continue
            try:
                for ref, cond in spec.edges:
                    if isinstance(ref, str):
                        if ref == spec.key:
                            raise Cycle(f"the task depends on its own key {ref!r}")
                        j = batch_keys.get(ref)
                        if j is not None:
                            plan.batch_parents.append((j, cond))
                            continue
                        e = self._live(ref, now)
                        if e is not None:
                            plan.live_parents.append((e, cond))
                            continue
                        record = self._retained_record(ref, now)
                        if record is not None:
                            plan.ended_parents.append((ref, record[0], cond))
                        elif plan.pool.config.unknown_dependency == "await":
                            plan.awaits.append((ref, cond))
                        else:
                            raise UnknownDependency(f"no task with key {ref!r}")
                    else:
                        e = self.tasks.get(ref)
                        if e is not None:
                            plan.live_parents.append((e, cond))
                            continue
                        record = self._retained_record(ref, now)
                        if record is None:
                            raise UnknownDependency(f"no task with id {ref}")
                        plan.ended_parents.append((ref, record[0], cond))
            except AdmissionError as exc:
                raise exc.at_index(plan.index) if batch else exc
        # Cycles within the batch.
        state = [0] * len(plans)   # 0 new, 1 on the path, 2 done
        for start in range(len(plans)):
            if state[start]:
                continue
            stack = [(start, iter(plans[start].batch_parents))]
            state[start] = 1
            while stack:
                node, parents = stack[-1]
                for j, _ in parents:
                    if state[j] == 1:
                        exc = Cycle(f"the batch's dependencies form a cycle through task {plans[j].index}")
                        raise exc.at_index(plans[j].index) if batch else exc
                    if state[j] == 0:
                        state[j] = 1
                        stack.append((j, iter(plans[j].batch_parents)))
                        break
                else:
                    state[node] = 2
                    stack.pop()
        # Cycles closed through tasks awaiting a key this submission defines.
        for k, plan in enumerate(plans):
            key = plan.spec.key
            if key is None or key not in self.awaiting:
                continue
            waiting = {child.id for child, _ in self.awaiting[key] if child.status not in TERMINAL}
            if waiting and self._reaches(plans, k, waiting):
                exc = Cycle(f"a task awaiting key {key!r} is among this task's own dependencies")
                raise exc.at_index(plan.index) if batch else exc

    def _reaches(self, plans: list, k: int, targets: set[int]) -> bool:
        """Does plan k depend, directly or not, on a live task in ``targets``?"""
        seen_plans = {k}
        seen_ids: set[int] = set()
        plan_stack = [k]
        entry_stack: list = []
        while plan_stack or entry_stack:
            if plan_stack:
                plan = plans[plan_stack.pop()]
                for j, _ in plan.batch_parents:
                    if j not in seen_plans:
                        seen_plans.add(j)
                        plan_stack.append(j)
                for e, _ in plan.live_parents:
                    entry_stack.append(e)
                continue
            e = entry_stack.pop()
            if e.id in seen_ids:
                continue
            seen_ids.add(e.id)
            if e.id in targets:
                return True
            if e.x is not None:
                for pid in e.x.parents:
                    parent = self.tasks.get(pid)
                    if parent is not None:
                        entry_stack.append(parent)
        return False

    def _check_reservations(self, now: int, plans: list, batch: bool) -> None:
        extra: dict[str, list] = {}
        for plan in plans:
            spec = plan.spec
            if spec.start_at_ns is None and spec.start_in_ns is None:
                continue
            p = plan.pool
            start = spec.start_at_ns if spec.start_at_ns is not None else now + spec.start_in_ns
            tol = spec.tolerance_ns if spec.tolerance_ns is not None else NS
            est = self._estimate(p, spec)
            lo, hi = start - tol, start + est + tol
            mine = extra.setdefault(p.name, [])
            if not p.calendar.fits(lo, hi, p.reservation_limit, mine):
                exc = ReservationConflict(
                    f"pool {p.name!r} allows {p.reservation_limit} overlapping reservations and "
                    f"[{rfc3339(lo)}, {rfc3339(hi)}] would exceed it")
                raise exc.at_index(plan.index) if batch else exc
            mine.append((lo, hi))
            plan.fixed = (start, tol, lo, hi)

    def _check_bounds(self, now: int, plans: list, batch: bool) -> list:
        """Raise QueueFull if the plans do not fit; for a single task of a
        shedding pool, return the tasks to evict instead."""
        bounded = self._max_total is not None or any(plan.pool.bounded for plan in plans)
        if not bounded:
            return []
        add_class: dict[tuple, int] = {}
        add_pool: dict[str, int] = {}
        total = self.pending
        for plan in plans:
            p = plan.pool
            c = plan.spec.priority
            ck = (p.name, c)
            add_class[ck] = add_class.get(ck, 0) + 1
            add_pool[p.name] = add_pool.get(p.name, 0) + 1
            total += 1
            limit_c = p.max_class[c]
            if limit_c is not None and p.pending[c] + add_class[ck] > limit_c:
                raise self._full(plan, batch, f"pool {p.name!r} holds at most {limit_c} pending "
                                              f"{CLASSES[c]} tasks", add_class[ck] > limit_c)
            over_pool = p.max_total is not None and p.pending_total + add_pool[p.name] > p.max_total
            over_all = self._max_total is not None and total > self._max_total
            if over_pool or over_all:
                what = (f"pool {p.name!r} holds at most {p.max_total} pending tasks" if over_pool
                        else f"the scheduler holds at most {self._max_total} pending tasks")
                if batch or p.shed is None:
                    never = (add_pool[p.name] > p.max_total if over_pool
                             else total - self.pending > self._max_total)
                    raise self._full(plan, batch, what, never)
                victim = self._victim(p, c)
                if victim is None:
                    raise self._full(plan, batch, what + " and no lower-class task can be shed")
                return [victim]
        return []

    def _full(self, plan, batch: bool, what: str, never: bool = False) -> QueueFull:
        """QueueFull; ``never`` marks a submission larger than the bound itself,
        which waiting for room cannot help."""
        exc = QueueFull(what + (" (the submission alone exceeds it)" if never else ""))
        if batch:
            exc = exc.at_index(plan.index)
        exc.never = never
        return exc

    def _make_room(self, p: PoolState, c: int, now: int) -> None:
        """Bounds for the plain fast path (a single task without options)."""
        limit_c = p.max_class[c]
        if limit_c is not None and p.pending[c] + 1 > limit_c:
            raise QueueFull(f"pool {p.name!r} holds at most {limit_c} pending {CLASSES[c]} tasks")
        over_pool = p.max_total is not None and p.pending_total + 1 > p.max_total
        over_all = self._max_total is not None and self.pending + 1 > self._max_total
        if over_pool or over_all:
            what = (f"pool {p.name!r} holds at most {p.max_total} pending tasks" if over_pool
                    else f"the scheduler holds at most {self._max_total} pending tasks")
            if p.shed is None:
                raise QueueFull(what)
            victim = self._victim(p, c)
            if victim is None:
                raise QueueFull(what + " and no lower-class task can be shed")
            self._shed(victim, now)

    def _sheddable(self, task_id: int) -> bool:
        e = self.tasks.get(task_id)
        return (e is not None and e.status is READY and W_QUEUE <= e.where <= W_LABEL
                and (e.x is None or e.x.start is None))

    def _victim(self, p: PoolState, c: int):
        """The task a shedding pool evicts to admit one of class c, or None.

        shed_lowest takes the newest task of the lowest class below c;
        shed_oldest the oldest task of the lowest class at or below c.
        """
        index = p.shed
        oldest = p.config.overflow == "shed_oldest"
        floor = c if oldest else c + 1
        for k in range(3, floor - 1, -1):
            heap = index.oldest[k] if oldest else index.newest[k]
            while heap:
                task_id = heap[0] if oldest else -heap[0]
                if self._sheddable(task_id):
                    return self.tasks[task_id]
                heapq.heappop(heap)
        return None

    def _shed(self, e: Entry, now: int) -> None:
        self._finish(e, SHED, now, "shed to admit more important work")

    def _apply(self, now: int, plans: list) -> None:
        entries = []
        for plan in plans:
            e = self._create(plan.pool, plan.spec, now)
            plan.entry = e
            entries.append(e)
            spec = plan.spec
            if spec.deadline_in_ns is not None or spec.deadline_at_ns is not None:
                deadline = spec.deadline_at_ns if spec.deadline_at_ns is not None else now + spec.deadline_in_ns
                e.deadline = deadline
                e.est = self._estimate(plan.pool, spec)
                e.lst = deadline - e.est
        doomed: list[tuple] = []
        for plan in plans:
            e = plan.entry
            parents = []
            for j, cond in plan.batch_parents:
                parent = plans[j].entry
                e.unmet += 1
                if parent.children is None:
                    parent.children = []
                parent.children.append((e, cond))
                parents.append(parent.id)
            for parent, cond in plan.live_parents:
                if parent.status in TERMINAL:
                    # Shed to make room for this very task: resolve the edge
                    # from its status, as for any parent that already ended.
                    if parent.status not in _SATISFIES[cond]:
                        doomed.append((e, f"dependency {parent.key or parent.id!r} ended {parent.status}"))
                    continue
                e.unmet += 1
                if parent.children is None:
                    parent.children = []
                parent.children.append((e, cond))
                parents.append(parent.id)
            for ref, status, cond in plan.ended_parents:
                if status not in _SATISFIES[cond]:
                    doomed.append((e, f"dependency {ref!r} ended {status}"))
            if plan.awaits:
                x = e.extra()
                x.awaits = []
                for key, cond in plan.awaits:
                    e.unmet += 1
                    x.awaits.append(key)
                    self.awaiting.setdefault(key, []).append((e, cond))
                timeout = plan.pool.config.await_timeout_ns
                if timeout is not None:
                    self.timers.push(now + timeout, tm.AWAIT, e)
            if parents:
                e.extra().parents = tuple(parents)
            if plan.fixed is not None:
                start, tol, lo, hi = plan.fixed
                x = e.extra()
                x.start = start
                x.tolerance = tol
                x.on_miss = plan.spec.on_miss
                plan.pool.calendar.add(lo, hi, e.id)
                scaler = plan.pool.scaler
                if scaler is not None and (scaler.armed is None or scaler.armed > lo - int(
                        scaler.config.reservation_horizon * NS)):
                    # An idle pool's evaluation must come back for this booking's
                    # pre-warming (it re-arms itself for the horizon's edge).
                    self._arm_scaler(plan.pool, now)
        # Children that were waiting for a key defined now attach to its task.
        for e in entries:
            if e.key is not None and e.key in self.awaiting:
                for child, cond in self.awaiting.pop(e.key):
                    if child.status in TERMINAL:
                        continue
                    child.x.awaits.remove(e.key)
                    if e.children is None:
                        e.children = []
                    e.children.append((child, cond))
                    child.x.parents = child.x.parents + (e.id,)
        doomed_ids = {e.id for e, _ in doomed}
        for e in entries:
            if e.id in doomed_ids:
                continue   # ends as skipped below, without ever queueing
            if e.x is not None and e.x.start is not None:
                self._arm_fixed(e, now)
            if e.unmet:
                self._set_inactive(e, BLOCKED, now)
            elif e.x is not None and e.x.start is not None and e.x.start > now:
                self._set_inactive(e, SCHEDULED, now)
            else:
                self._to_ready(e, now)
        for e, message in doomed:
            if e.status not in TERMINAL:
                self._finish(e, SKIPPED, now, message)

    # ================================================================ readiness

    def _set_inactive(self, e: Entry, status: str, now: int) -> None:
        e.status = status
        e.pool.inactive[e.cls] += 1
        if self._emit_all:
            self._event(e, status, now, None)

    def _to_ready(self, e: Entry, now: int) -> None:
        """A task can run: queue it (fixed starts go to the due queue)."""
        p = e.pool
        status = e.status
        x = e.x
        if x is not None and x.start is not None and e.attempt == 0 and x.start > now:
            if status is BLOCKED:
                p.inactive[e.cls] -= 1
                self._set_inactive(e, SCHEDULED, now)
                if now >= x.start - self.config.max_hold_ns:
                    self._check_hold(e, now)   # its hold checks were skipped while blocked
            return
        if status is BLOCKED or status is SCHEDULED:
            p.inactive[e.cls] -= 1
        if x is not None and x.start is not None:
            e.status = READY
            e.ready_at = now
            e.where = W_DUE
            heapq.heappush(p.due, (x.start if e.attempt == 0 else now, e.id, e))
            p.due_n[e.cls] += 1
        else:
            e.status = READY
            e.ready_at = now
            e.where = W_QUEUE
            p.queues.push(e)
            if p.shed is not None:
                self._index_shed(p, e)
        self._arrived(p, e, now)

    def _arrived(self, p: PoolState, e: Entry, now: int) -> None:
        """``e`` just became ready: an arrival for the autoscaler, and work
        to dispatch if a slot is free (or, for a due fixed start, held)."""
        scaler = p.scaler
        if scaler is not None:
            scaler.arrivals += 1
            if scaler.armed is None:
                self._arm_scaler(p, now)
        if not p.dirty and (e.where == W_DUE or p.capacity - p.busy - p.held > 0):
            p.dirty = True
            self._dirty.append(p)
        if self._emit_all:
            self._event(e, READY, now, None)

    def _index_shed(self, p: PoolState, e: Entry) -> None:
        index = p.shed
        index.add(e)
        heap = index.oldest[e.cls]
        if len(heap) > 2 * p.pending_total + 64:
            index.compact(e.cls, self._sheddable)

    def _to_ready_again(self, e: Entry, now: int) -> None:
        """A parked task goes back to its queue, keeping its place."""
        p = e.pool
        x = e.x
        e.status = READY
        if x is not None and x.start is not None:
            e.where = W_DUE
            heapq.heappush(p.due, (x.start if e.attempt == 0 else e.ready_at, e.id, e))
            p.due_n[e.cls] += 1
        else:
            e.where = W_QUEUE
            p.queues.push(e)
        if not p.dirty:
            p.dirty = True
            self._dirty.append(p)

    # ================================================================ dispatch

    def stop_dispatching(self) -> None:
        """Start nothing new from now on (shutdown): queued tasks stay queued."""
        self._frozen = True

    def _flush(self, now: int) -> None:
        if self._timers_ended > (len(self._timer_heap) >> 1) + _COMPACT_SLACK:
            self._compact_timers()
        dirty = self._dirty
        if self._frozen:
            for p in dirty:
                p.dirty = False
            dirty.clear()
            return
        if len(dirty) > 1:
            # Pools that compete for shared resources dispatch in declaration
            # order, whichever became dirty first (the run must not depend on
            # which path marked them).
            dirty.sort(key=_pool_order, reverse=True)
        while dirty:
            p = dirty.pop()
            p.dirty = False
            self._dispatch(p, now)

    def _dispatch(self, p: PoolState, now: int) -> None:
        if p.due or p.hold_waiters:
            self._serve_fixed(p, now)
        if p.label_waiting:
            self._serve_labels(p, now)
        q = p.queues
        while q.total and p.capacity - p.busy - p.held > 0:
            e = q.take(now)
            spec = e.spec
            group = p.unlabeled
            if spec is not None:
                if spec.labels is not None:
                    group = self._group_for(p, spec.labels)
                    if group is None:
                        self._label_park(p, e)
                        continue
                elif group.busy >= group.capacity:
                    group = self._group_for(p, None)
                if spec.resources and not self._acquire(e, now):
                    continue
            elif group.busy >= group.capacity:
                group = self._group_for(p, None)
            self._start(p, e, now, group)

    def _group_for(self, p: PoolState, labels: frozenset | None) -> Group | None:
        if labels is None:
            g = p.unlabeled
            if g.busy < g.capacity:
                return g
            for g in p.groups.values():
                if g.busy < g.capacity:
                    return g
            return None
        for g in p.groups.values():
            if g.busy < g.capacity and labels <= g.labels:
                return g
        return None

    def _start(self, p: PoolState, e: Entry, now: int, group: Group) -> None:
        lease = self._next_lease
        self._next_lease = lease + 1
        attempt = e.attempt + 1
        e.attempt = attempt
        e.status = RUNNING
        e.lease = lease
        e.started = now
        e.where = W_NONE
        e.group = group
        self.running[lease] = e
        w = p.window
        if now > w._last_t:
            w.integrate(now)
        p.busy += 1
        group.busy += 1
        w.busy = p.busy
        b = w._current if now < w._current_end else w.bucket(now)
        b.dispatched += 1
        wait = now - e.ready_at   # recorded inline: this runs on every dispatch
        if wait < 16:
            index = wait if wait > 0 else 0
        else:
            shift = wait.bit_length() - 4
            index = (shift << 3) + (wait >> shift)
        counts = b.waits.counts
        counts[index] = counts.get(index, 0) + 1
        c = e.cls
        if c:
            count = p.queues.count   # a more important class is waiting: an inversion
            if count[0] or (c > 1 and (count[1] or (c > 2 and count[2]))):
                b.inversions += 1
        p.pending[c] -= 1
        p.pending_total -= 1
        self.pending -= 1
        self._dispatched += 1
        spec = e.spec
        if spec is not None:
            x = e.x
            if x is not None:
                x.reoffered = False
                if x.start is not None and attempt == 1:
                    b.fixed_total += 1
                    if abs(now - x.start) <= x.tolerance:
                        b.fixed_hits += 1
                    p.started_fixed.add(e.id)
            if spec.timeout_ns is not None:
                self.timers.push(now + spec.timeout_ns, tm.TIMEOUT, e, lease)
        ttl = p.lease_ttl
        if ttl is not None:
            e.extra().hb = now
            self.timers.push(now + ttl, tm.LEASE, e, lease)
        if self._persist:   # before the dispatch: the driver holds it until this is durable
            self.actions.append((act.PERSIST, (MUT_STATUS, e.id, RUNNING, attempt, now, None)))
        self.actions.append((act.DISPATCH, e, lease, attempt))
        if self._emit_all:
            self._event(e, RUNNING, now, None)

    def _end_attempt(self, e: Entry, now: int, ok: bool) -> None:
        """The running attempt of ``e`` is over: free its slot and semaphores."""
        p = e.pool
        w = p.window
        if now > w._last_t:
            w.integrate(now)
        busy = p.busy - 1
        p.busy = busy
        w.busy = busy
        e.group.busy -= 1
        run = now - e.started
        b = w._current if now < w._current_end else w.bucket(now)
        b.attempt_time += run
        x = e.x
        regular = x is None or x.start is None
        if ok:
            b.good_time += run
            b.succeeded += 1
            runs = p.runs
            n = runs.records = runs.records + 1
            if n & 7 == 0 or n < 4096 or not regular:
                # Learning samples every run at first, then one run in eight:
                # enough for medians, and cheaper at high completion rates.
                runs.record(e.kind, run, regular)
        else:
            b.failed += 1
        if not regular:
            p.started_fixed.discard(e.id)
        if p.scaler is not None:
            p.scaler.observe_run(run)
        if p.lease_ttl is not None:
            self._timers_ended += 1
        spec = e.spec
        if spec is not None and spec.timeout_ns is not None:
            self._timers_ended += 1
        if spec is not None and spec.resources:
            for name, units in spec.resources.items():
                r = self.resources[name]
                if r.semaphore:
                    r.give(units)
                    self._reoffer(r, now)
        if not p.dirty and (p.queues.total or p.due or p.label_waiting or p.hold_waiters):
            p.dirty = True   # a slot freed and work waits for one
            self._dirty.append(p)

    def _abort_attempt(self, e: Entry, now: int, reason: str, message: str) -> None:
        del self.running[e.lease]
        self.actions.append((act.ABORT, e.lease, e.id, reason))
        self._end_attempt(e, now, False)
        self._retry_or_dead(e, now, message, None)

    def _retry_or_dead(self, e: Entry, now: int, message: str | None, retry_after_ns: int | None) -> None:
        policy = e.spec.retry if e.spec is not None and e.spec.retry is not None else e.pool.retry
        if e.attempt >= policy.max_attempts:
            text = f"gave up after {e.attempt} attempt{'s' if e.attempt != 1 else ''}"
            self._finish(e, DEAD_LETTERED, now, f"{text}: {message}" if message else text)
            return
        delay = policy.backoff_ns(e.attempt + 1)
        if policy.jitter and delay:
            delay = int(self.rng.random() * delay)
        if retry_after_ns is not None and retry_after_ns > delay:
            delay = retry_after_ns
        e.status = RETRYING
        p = e.pool
        p.pending[e.cls] += 1
        p.pending_total += 1
        self.pending += 1
        self._counts["retries"] += 1
        self.timers.push(now + delay, tm.RETRY, e, e.attempt)
        if self._persist:
            self.actions.append((act.PERSIST, (MUT_STATUS, e.id, RETRYING, e.attempt, now, message)))
        if self._emit_all:
            self._event(e, RETRYING, now, message)

    # ================================================================ attempts that never started

    def give_back(self, now: int, lease: int, delay_ns: int = 0, message: str | None = None) -> bool:
        """The driver could not start the attempt under ``lease`` (no thread
        for it, or it is stopping): undo the dispatch without using an attempt.

        The slot (and semaphore units) are freed, the attempt number goes
        back, and the task waits again: ready at once, or after ``delay_ns``
        (as a retry that keeps its attempt count, so that a start that keeps
        failing does not spin). Nothing counts as failed. False if the lease
        is not live (the attempt already ended).
        """
        if isinstance(delay_ns, bool) or not isinstance(delay_ns, int) or delay_ns < 0:
            raise ValueError(f"delay_ns must be an integer >= 0, got {delay_ns!r}")
        now = self._enter(now)
        e = self.running.pop(lease, None)
        if e is None:
            return False
        p = e.pool
        w = p.window
        if now > w._last_t:
            w.integrate(now)
        p.busy -= 1
        w.busy = p.busy
        e.group.busy -= 1
        spec = e.spec
        if spec is not None and spec.resources:
            for name, units in spec.resources.items():
                r = self.resources[name]
                if r.semaphore:
                    r.give(units)
                    self._reoffer(r, now)
        if e.x is not None:
            p.started_fixed.discard(e.id)
        e.attempt -= 1
        p.pending[e.cls] += 1
        p.pending_total += 1
        self.pending += 1
        if delay_ns:
            e.status = RETRYING
            self.timers.push(now + delay_ns, tm.RETRY, e, e.attempt)
            if self._persist:
                self.actions.append((act.PERSIST, (MUT_STATUS, e.id, RETRYING, e.attempt, now, message)))
            if self._emit_all:
                self._event(e, RETRYING, now, message)
            if not p.dirty and (p.queues.total or p.due or p.label_waiting or p.hold_waiters):
                p.dirty = True   # the slot it held is free for others
                self._dirty.append(p)
        else:
            ready_at = e.ready_at
            self._to_ready(e, now)
            e.ready_at = ready_at   # it keeps its age in line
            if self._persist:
                self.actions.append((act.PERSIST, (MUT_STATUS, e.id, READY, e.attempt, now, message)))
        if self._dirty:
            self._flush(now)
        return True

    # ================================================================ endings

    def _leave_waiting(self, e: Entry) -> None:
        """Take a task that has not started out of wherever it waits."""
        p = e.pool
        status = e.status
        c = e.cls
        if status is BLOCKED or status is SCHEDULED:
            p.inactive[c] -= 1
        elif status is READY:
            where = e.where
            if where == W_QUEUE:
                p.queues.discard(e)
            elif where == W_DUE:
                p.due_n[c] -= 1
            elif where == W_LABEL:
                p.label_waiting -= 1
            e.where = W_NONE
        if status is not RUNNING:
            p.pending[c] -= 1
            p.pending_total -= 1
            self.pending -= 1

    def _finish(self, e: Entry, status: str, now: int, message: str | None) -> None:
        """End a task (and, transitively, the dependents it dooms)."""
        stack = [(e, status, message)]
        while stack:
            e, status, message = stack.pop()
            if e.status in TERMINAL:
                continue
            p = e.pool
            if e.status is RUNNING:
                if self.running.get(e.lease) is e:   # still running: abort it
                    del self.running[e.lease]
                    self.actions.append((act.ABORT, e.lease, e.id, status))
                    self._end_attempt(e, now, False)
            else:
                if e.status is RETRYING:
                    self._timers_ended += 1
                self._leave_waiting(e)
            x = e.x
            if x is not None:
                # Its start, hold and miss timers, or its await timeout, are stale now.
                self._timers_ended += 3 if x.start is not None else 1
                if x.hold:
                    x.hold = False
                    p.held -= 1
                    if not p.dirty:
                        p.dirty = True
                        self._dirty.append(p)
                if x.start is not None:
                    p.calendar.remove(e.id)
                    p.started_fixed.discard(e.id)
                if x.awaits:
                    for key in x.awaits:
                        waiting = self.awaiting.get(key)
                        if waiting is not None:
                            waiting[:] = [item for item in waiting if item[0] is not e]
                            if not waiting:
                                del self.awaiting[key]
                    x.awaits = None
                parked = x.parked_on
                if parked is not None:
                    x.parked_on = None
                    # The waiters behind it may fit now (free units, or a bucket
                    # timer that was set for this task's larger need).
                    self._reoffer(parked, now)
                elif x.reoffered:
                    # It was offered units it never took: offer them again.
                    self._give_up_offer(e, None, now)
            e.status = status
            e.where = W_NONE
            del self.tasks[e.id]
            self._retain(e, status, now, message)
            if status is SUCCEEDED:
                self._succeeded += 1
            else:
                self._counts[status] += 1
            self.actions.append((act.EVENT, e.id, p.name, e.key, status, e.attempt, now, message))
            if self._persist:
                self.actions.append((act.PERSIST, (MUT_STATUS, e.id, status, e.attempt, now, message)))
            children = e.children
            if children:
                e.children = None
                satisfied = None
                for child, cond in children:
                    if child.status in TERMINAL:
                        continue
                    if status in _SATISFIES[cond]:
                        child.unmet -= 1
                        if child.unmet == 0 and child.status is BLOCKED:
                            if satisfied is None:
                                satisfied = []
                            satisfied.append(child)
                    else:
                        stack.append((child, SKIPPED, f"dependency {e.key or e.id!r} ended {status}"))
                if satisfied:
                    for child in satisfied:
                        if child.status is BLOCKED:
                            self._to_ready(child, now)

    def _retain(self, e: Entry, status: str, now: int, message: str | None) -> None:
        if not self._retain_on:
            if e.key is not None:
                self._forget_key(e)
            return
        self.retained[e.id] = (status, e.pool.name, e.key, e.kind, e.attempt, message)
        self._retain_order.append((now + self._retention, e.id))
        if len(self.retained) > self._retain_max:
            self._expire_retained(now, force=True)

    def _forget_key(self, e: Entry) -> None:
        if self.keys.get(e.key) == e.id:
            del self.keys[e.key]

    def _expire_retained(self, now: int, force: bool = False) -> None:
        order = self._retain_order
        retained = self.retained
        limit = self._retain_max
        while order and (order[0][0] <= now or (force and len(retained) > limit)):
            _, task_id = order.popleft()
            record = retained.pop(task_id, None)
            if record is not None and record[2] is not None and self.keys.get(record[2]) == task_id:
                del self.keys[record[2]]

    # ================================================================ lookups

    def _live(self, ref, now: int) -> Entry | None:
        if isinstance(ref, str):
            task_id = self.keys.get(ref)
            if task_id is None:
                return None
            return self.tasks.get(task_id)
        if isinstance(ref, bool) or not isinstance(ref, int):
            raise TypeError(f"a task reference is an id (int) or a key (str), got {type(ref).__name__}")
        return self.tasks.get(ref)

    def _retained_record(self, ref, now: int):
        task_id = self.keys.get(ref) if isinstance(ref, str) else ref
        if task_id is None:
            return None
        return self.retained.get(task_id)

    def _key_id(self, key: str, now: int) -> int | None:
        task_id = self.keys.get(key)
        if task_id is None:
            return None
        if task_id in self.tasks or task_id in self.retained:
            return task_id
        return None

    # ================================================================ events

    def _event(self, e: Entry, status: str, now: int, message: str | None) -> None:
        self.actions.append((act.EVENT, e.id, e.pool.name, e.key, status, e.attempt, now, message))

    # ================================================================ estimates

    def _estimate(self, p: PoolState, spec: TaskSpec) -> int:
        """Duration estimate: hint, learned median of the kind, of the pool, or the default."""
        if spec.duration_hint_ns is not None:
            return spec.duration_hint_ns
        median = p.runs.kind_median(spec.kind)
        if median is None:
            median = p.runs.pool_percentile(0.5)
        if median is not None:
            return int(median)
        return p.config.default_duration_ns

    # ================================================================ resources

    def _acquire(self, e: Entry, now: int) -> bool:
        """Take every unit ``e`` asks for, or park it on the first short resource."""
        resources = self.resources
        request = e.spec.resources
        x = e.x
        reoffered = x is not None and x.reoffered
        short = None
        for name, units in request.items():
            r = resources[name]
            if r.level(now) < units or (not reoffered and r.head() is not None):
                short = r
                break
        if short is None:
            for name, units in request.items():
                resources[name].take(units)
            return True
        x = e.extra()
        if reoffered:
            # Parked on ``short``: the units offered on the others go back to their lines.
            self._give_up_offer(e, short, now)
        if x.park_seq is None:
            self._park_seq += 1
            x.park_seq = self._park_seq
        x.parked_on = short
        e.where = W_PARKED
        short.park(e)
        if not short.semaphore:
            self._arm_refill(short, now)
        elif short.level(now) >= request[short.name]:
            # Units are free but earlier waiters come first: let them go now.
            self._reoffer(short, now)
        return False

    def _give_up_offer(self, e: Entry, keep: ResourceState | None, now: int) -> None:
        """``e`` was sent back to its queue with units in view and will not
        take them (it ended, or parked on another resource): the waiters of
        those resources may use them."""
        e.x.reoffered = False
        for name in e.spec.resources:
            r = self.resources[name]
            if r is not keep and r.waiters:
                self._reoffer(r, now)

    def _arm_refill(self, r: ResourceState, now: int, promised: float = 0.0) -> None:
        """Wake up when the head waiter's tokens (beyond ``promised`` ones) are there."""
        head = r.head()
        if head is None:
            return
        at = now + r.ready_in(head.spec.resources[r.name] + promised, now)
        if r.refill_at is None or at < r.refill_at:
            r.refill_at = at
            self.timers.push(at, tm.REFILL, r, at)

    def _reoffer(self, r: ResourceState, now: int) -> None:
        """Send parked waiters back to their queues while the units last (FIFO)."""
        level = budget = r.level(now)
        while True:
            e = r.head()
            if e is None:
                return
            need = e.spec.resources[r.name]
            if need > budget:
                break
            budget -= need
            r.waiters.popleft()
            x = e.x
            x.parked_on = None
            x.reoffered = True
            self._to_ready_again(e, now)
        if not r.semaphore:
            self._arm_refill(r, now, level - budget)

    # ================================================================ labels

    def _label_park(self, p: PoolState, e: Entry) -> None:
        labels = e.spec.labels
        waiters = p.label_waiters.get(labels)
        if waiters is None:
            waiters = p.label_waiters[labels] = deque()
        e.where = W_LABEL
        p.label_waiting += 1
        if not waiters or waiters[-1].id < e.id:
            waiters.append(e)
        else:
            waiters.insert(bisect.bisect_left(waiters, e.id, key=lambda item: item.id), e)
        if e.x is not None and e.x.hold:
            p.held_label_waiters.append(e)

    def _serve_labels(self, p: PoolState, now: int) -> None:
        """Label waiters take free matching slots first, oldest first. A waiter
        holding a slot competes whether or not a slot is free, wherever it
        stands in its label set's line."""
        while p.label_waiting:
            best = None
            best_group = None
            if p.capacity - p.busy - p.held > 0:
                for labels, waiters in p.label_waiters.items():
                    while waiters and (waiters[0].status is not READY or waiters[0].where != W_LABEL):
                        waiters.popleft()
                    if not waiters:
                        continue
                    head = waiters[0]
                    if best is not None and head.id > best.id:
                        continue
                    group = self._group_for(p, labels)
                    if group is not None:
                        best = head
                        best_group = group
            if p.held_label_waiters:
                held = [e for e in p.held_label_waiters
                        if e.status is READY and e.where == W_LABEL and e.x.hold]
                p.held_label_waiters = held
                for e in held:
                    if best is not None and e.id > best.id:
                        continue
                    group = self._group_for(p, e.spec.labels)
                    if group is not None:
                        best = e
                        best_group = group
            if best is None:
                return
            waiters = p.label_waiters[best.spec.labels]
            if waiters[0] is best:
                waiters.popleft()
            else:
                waiters.remove(best)   # a held waiter from the middle of its line
            if best.x is not None and best.x.hold:
                p.held_label_waiters.remove(best)
            p.label_waiting -= 1
            best.where = W_NONE
            if best.spec.resources and not self._acquire(best, now):
                continue
            self._release_hold(p, best)
            self._start(p, best, now, best_group)

    # ================================================================ fixed starts

    def _arm_fixed(self, e: Entry, now: int) -> None:
        x = e.x
        start = x.start
        self.timers.push(max(now, start - self.config.max_hold_ns), tm.HOLD, e)
        self.timers.push(start, tm.START, e)
        self.timers.push(start + x.tolerance, tm.MISS, e)

    def _hold_lead(self, p: PoolState, tolerance: int) -> int:
        p90 = p.runs.pool_percentile(0.9)
        lead = max(tolerance, int(p90) if p90 is not None else 0)
        return min(lead, self.config.max_hold_ns)

    def _check_hold(self, e: Entry, now: int) -> None:
        x = e.x
        if x.hold or e.attempt > 0 or e.status is RUNNING:
            return
        if e.status is BLOCKED:
            # No hold before the dependencies are met: the slot may be the one a
            # parent needs. _to_ready checks again when the task is unblocked.
            return
        lead = self._hold_lead(e.pool, x.tolerance)
        if now < x.start - lead:
            self.timers.push(x.start - lead, tm.HOLD, e)
            return
        p = e.pool
        if p.capacity - p.busy - p.held > 0:
            self._grant_hold(p, e)
        else:
            p.hold_waiters.append(e)

    def _grant_hold(self, p: PoolState, e: Entry) -> None:
        e.x.hold = True
        p.held += 1
        if e.status is READY and e.where == W_LABEL:
            p.held_label_waiters.append(e)   # already waiting for a labelled slot

    def _release_hold(self, p: PoolState, e: Entry) -> None:
        x = e.x
        if x is not None and x.hold:
            x.hold = False
            p.held -= 1

    def _on_start(self, e: Entry, now: int) -> None:
        guard = e.x.guard
        if guard is not None and guard in self.tasks:
            rec = self.recurring.get(e.x.recurring)
            if rec is not None and rec.last_task == e.id:
                rec.last_task = guard   # the next occurrence must also wait for that run
            self._finish(e, SKIPPED, now, f"the previous occurrence (task {guard}) is still running")
            return
        if e.status is SCHEDULED:
            self._to_ready(e, now)

    def _on_miss(self, e: Entry, now: int) -> None:
        if e.attempt > 0 or e.status is RUNNING:
            return
        if e.status is READY and e.where == W_DUE:
            # Due in this same step (a zero tolerance fires its start and its
            # miss together): it may still start now, on the first step at
            # or after its time, before the miss policy applies.
            self._serve_fixed(e.pool, now)
            if e.status is RUNNING:
                return
        x = e.x
        x.late = True
        if x.on_miss == "run_late":
            return
        p = e.pool
        w = p.window
        b = w.bucket(now)
        b.fixed_total += 1
        message = f"did not start within {x.tolerance / NS:g} s of its start time"
        if x.on_miss == "skip":
            self._finish(e, MISSED, now, message)
        else:
            self._finish(e, FAILED, now, message)

    def _serve_fixed(self, p: PoolState, now: int) -> None:
        # Holds go to the first slots that free up, before any queued task.
        waiters = p.hold_waiters
        while waiters and p.capacity - p.busy - p.held > 0:
            e = waiters.popleft()
            x = e.x
            if e.status in TERMINAL or e.status is RUNNING or e.attempt > 0 or x.hold:
                continue
            if self.tasks.get(e.id) is not e:
                continue
            self._grant_hold(p, e)
        due = p.due
        if not due:
            return
        # Serving may send parked tasks back to the due queue (a resource's
        # reoffer): they go to a fresh heap, which the kept items then join.
        p.due = []
        live = []
        for item in due:
            e = item[2]
            if e.status is READY and e.where == W_DUE:
                live.append(item)
        live.sort()
        keep = []
        for item in live:
            e = item[2]
            x = e.x
            held = x.hold
            if not held and p.capacity - p.busy - p.held <= 0:
                keep.append(item)
                continue
            spec = e.spec
            group = self._group_for(p, spec.labels)
            p.due_n[e.cls] -= 1
            if group is None:
                e.where = W_NONE
                self._label_park(p, e)
                continue
            e.where = W_NONE
            if spec.resources and not self._acquire(e, now):
                continue
            self._release_hold(p, e)
            self._start(p, e, now, group)
        p.due.extend(keep)
        heapq.heapify(p.due)

    # ================================================================ capacity

    def _set_group(self, p: PoolState, group: Group, capacity: int, now: int) -> None:
        w = p.window
        w.integrate(now)
        group.capacity = capacity
        p.capacity = sum(g.capacity for g in p.groups.values())
        w.capacity = p.capacity
        if not p.dirty:
            p.dirty = True
            self._dirty.append(p)

    def _arm_scaler(self, p: PoolState, now: int) -> None:
        scaler = p.scaler
        at = now
        if scaler.last_tick is not None:
            at = max(now, scaler.last_tick + scaler.interval)
        scaler.armed = at
        self.timers.push(at, tm.AUTOSCALE, p, at)

    def _backlog(self, p: PoolState) -> list[int]:
        backlog = [p.pending[c] - p.inactive[c] - p.due_n[c] for c in range(4)]
        backlog[0] += sum(p.due_n)
        return backlog

    def _reserved(self, p: PoolState, now: int) -> int:
        if not len(p.calendar):
            return 0
        horizon = int(p.scaler.config.reservation_horizon * NS)
        return p.calendar.peak(now, now + horizon, exclude=p.started_fixed)

    def _autoscale(self, p: PoolState, now: int) -> None:
        scaler = p.scaler
        scaler.armed = None
        reserved = self._reserved(p, now)
        before = scaler.target
        backlog = self._backlog(p)
        target = scaler.evaluate(now, backlog, p.busy, reserved)
        if target != before or target != p.capacity:
            labeled = p.capacity - p.unlabeled.capacity
            self._set_group(p, p.unlabeled, max(0, target - labeled), now)
            self.actions.append((act.SCALE, p.name, target))
        if scaler.settled(sum(backlog), p.busy, reserved):
            # (Blocked and scheduled tasks are not backlog: they arm the
            # evaluation again when they become ready.)
            # Idle: no evaluation until work arrives or a reservation nears.
            upcoming = p.calendar.next_start_after(now)
            if upcoming is not None:
                horizon = int(scaler.config.reservation_horizon * NS)
                at = max(now + scaler.interval, upcoming - horizon)
                scaler.armed = at
                self.timers.push(at, tm.AUTOSCALE, p, at)
            return
        at = now + scaler.interval
        scaler.armed = at
        self.timers.push(at, tm.AUTOSCALE, p, at)

    # ================================================================ recovery

    def restore(self, now: int, tasks: Iterable[RestoredTask],
                schedules: Iterable[RestoredSchedule] = (), next_id: int = 0) -> list[int]:
        """Reload the state a store recovered, before any other call.

        Tasks keep their ids, submission times (so their place in line) and
        attempt counts. An attempt that was running counts as used: the task
        is retried after a backoff, or dead-lettered. Rows that cannot run
        here (undecodable, or naming a pool or resource this configuration
        lacks) are quarantined as failed. Returns the quarantined ids.

        ``tasks`` is consumed once, lazily: a recovery hands a generator, so
        each row can be freed as soon as its task is built. Live tasks are
        expected in id order (they are sorted otherwise).
        """
        now = self._enter(now)
        quarantined: list[int] = []
        ended: list[RestoredTask] = []
        entries: list[Entry] = []            # live, in id order
        interrupted: dict[int, str] = {}     # live ids stored as running or retrying
        pools = self.pools
        resources = self.resources
        live_tasks = self.tasks
        keys = self.keys
        top = next_id
        last = -1
        ordered = True
        for t in tasks:
            task_id = t.id
            if task_id > top:
                top = task_id
            status = t.status
            if status in TERMINAL:
                ended.append(t)
                continue
            spec = t.spec
            p = pools.get(t.pool)
            problem = t.error
            if problem is None:
                if p is None:
                    problem = f"pool {t.pool!r} is not configured"
                elif spec.resources:
                    missing = [name for name in spec.resources if name not in resources]
                    if missing:
                        problem = f"resource {missing[0]!r} is not configured"
            if problem is not None:
                quarantined.append(task_id)
                message = f"quarantined at recovery: {problem}"
                ended.append(RestoredTask(task_id, t.pool, spec, t.submitted_ns, FAILED, t.attempt,
                                          message, now))
                self.actions.append((act.EVENT, task_id, t.pool, None, FAILED, t.attempt, now, message))
                if self._persist:
                    self.actions.append((act.PERSIST, (MUT_STATUS, task_id, FAILED, t.attempt, now, message)))
                continue
            payload = t.payload
            if payload is _SPEC_PAYLOAD:
                payload = spec.payload
            key = spec.key
            e = Entry(task_id, p, spec.priority, t.submitted_ns, payload, key, spec.kind,
                      None if spec.plain else spec)
            e.attempt = t.attempt
            live_tasks[task_id] = e
            if key is not None:
                keys[key] = task_id
            p.pending[e.cls] += 1
            p.pending_total += 1
            self.pending += 1
            if status == RUNNING or status == RETRYING:
                interrupted[task_id] = RUNNING if status == RUNNING else RETRYING
            if not spec.plain:
                if spec.deadline_at_ns is not None:
                    e.deadline = spec.deadline_at_ns
                    e.est = self._estimate(p, spec)
                    e.lst = e.deadline - e.est
                if spec.start_at_ns is not None:
                    x = e.extra()
                    x.start = spec.start_at_ns
                    x.tolerance = spec.tolerance_ns if spec.tolerance_ns is not None else NS
                    x.on_miss = spec.on_miss
                    if spec.tags and "cronoq.recurring" in spec.tags:
                        x.recurring = spec.tags["cronoq.recurring"]
                    est = self._estimate(p, spec)
                    p.calendar.add(x.start - x.tolerance, x.start + est + x.tolerance, task_id)
            if task_id < last:
                ordered = False
            last = task_id
            entries.append(e)
        if not ordered:
            entries.sort(key=lambda e: e.id)
            for e in entries:   # the task table in id order too
                live_tasks[e.id] = live_tasks.pop(e.id)
        if self._retain_on:
            ended.sort(key=lambda t: (t.finished_ns or now, t.id))
            for t in ended:
                expires = (t.finished_ns or now) + self._retention
                if expires <= now:
                    continue
                key = t.spec.key if t.spec is not None else None
                kind = t.spec.kind if t.spec is not None else None
                self.retained[t.id] = (t.status, t.pool, key, kind, t.attempt, t.message)
                self._retain_order.append((expires, t.id))
                if key is not None and keys.get(key) not in live_tasks:   # a live task keeps its key
                    keys[key] = t.id
        del ended
        doomed: dict[int, str] = {}
        for e in entries:
            spec = e.spec
            if spec is None or not spec.edges:
                continue
            parents = []
            for ref, cond in spec.edges:
                task_id = keys.get(ref) if isinstance(ref, str) else ref
                parent = live_tasks.get(task_id) if task_id is not None else None
                if parent is not None and parent is not e:
                    e.unmet += 1
                    if parent.children is None:
                        parent.children = []
                    parent.children.append((e, cond))
                    parents.append(parent.id)
                    continue
                record = self.retained.get(task_id) if task_id is not None else None
                if record is not None:
                    if record[0] not in _SATISFIES[cond]:
                        doomed.setdefault(e.id, f"dependency {ref!r} ended {record[0]}")
                elif isinstance(ref, str) and e.pool.config.unknown_dependency == "await" \
                        and task_id is None:
                    x = e.extra()
                    if x.awaits is None:
                        x.awaits = []
                    x.awaits.append(ref)
                    e.unmet += 1
                    self.awaiting.setdefault(ref, []).append((e, cond))
                # Otherwise the parent finished before the retention window: satisfied.
            if parents:
                e.extra().parents = tuple(parents)
            if e.x is not None and e.x.awaits and e.pool.config.await_timeout_ns is not None:
                self.timers.push(now + e.pool.config.await_timeout_ns, tm.AWAIT, e)
        for e in entries:
            if doomed or interrupted:
                if e.status in TERMINAL:   # skipped meanwhile: a parent that ended doomed it
                    continue
                if e.id in doomed:
                    self._finish(e, SKIPPED, now, doomed[e.id])
                    continue
            stored = interrupted.get(e.id) if interrupted else None
            if stored is not None:
                policy = e.spec.retry if e.spec is not None and e.spec.retry is not None else e.pool.retry
                if stored is RUNNING and e.attempt >= policy.max_attempts:
                    self._finish(e, DEAD_LETTERED, now,
                                 f"attempt {e.attempt} was interrupted by a scheduler restart and no "
                                 f"attempts remain")
                    continue
                delay = 0
                if stored is RUNNING:
                    delay = policy.backoff_ns(e.attempt + 1)
                    if policy.jitter and delay:
                        delay = int(self.rng.random() * delay)
                    self._counts["retries"] += 1
                    if self._persist:
                        self.actions.append((act.PERSIST, (MUT_STATUS, e.id, RETRYING, e.attempt, now,
                                                           "interrupted by a scheduler restart")))
                e.status = RETRYING
                self.timers.push(now + delay, tm.RETRY, e, e.attempt)
                continue
            x = e.x
            if x is not None and x.start is not None:
                self._arm_fixed(e, now)
            if e.unmet:
                self._set_inactive(e, BLOCKED, now)
            elif x is not None and x.start is not None and x.start > now and e.attempt == 0:
                self._set_inactive(e, SCHEDULED, now)
            else:
                self._to_ready(e, now)
        for s in schedules:
            self._restore_schedule(s, now)
        first = (self.config.epoch << ID_BITS) + 1
        self._next_id = max(self._next_id, top + 1, first)
        self._flush(now)
        return quarantined

    def _restore_schedule(self, s: RestoredSchedule, now: int) -> None:
        template = s.template
        problem = s.error
        if problem is None and template is not None:
            pool = template.pool or self.default_pool.name
            if pool not in self.pools:
                problem = f"pool {pool!r} is not configured"
            elif template.resources and any(name not in self.resources for name in template.resources):
                problem = "a resource of its template is not configured"
        if problem is not None or template is None:
            self._counts["recurring_invalid"] += 1
            return
        try:
            cron = CronSchedule(s.cron, s.tz)
        except ValueError:
            self._counts["recurring_invalid"] += 1
            return
        rec = Recurring(s.name, cron, template, s.overlap, s.tolerance_ns, s.on_miss, s.key)
        rec.last_task = s.last_task
        rec.last_start = s.last_start_ns
        rec.next_start = s.next_start_ns if s.next_start_ns is not None else cron.next_after(now)
        self.recurring[s.name] = rec
        self._arm_recurring(rec, self._pool(template.pool), now)

    # ================================================================ recurring

    def add_recurring(self, now: int, name: str, cron: str, template: TaskSpec, *, tz: str = "UTC",
                      overlap: str = "skip", tolerance: float | None = None,
                      on_miss: str | None = None) -> None:
        """Register (or replace) a recurring schedule of fixed-start occurrences."""
        now = self._enter(now)
        check_name(name, "schedule name", error=ValueError)
        check_length(name, "schedule name", KEY_LIMIT)
        if isinstance(template, TaskSpec) and template.key is not None:
            check_length(template.key, "a recurring schedule's key", RECURRING_KEY_LIMIT)
        schedule = CronSchedule(cron, tz)
        if overlap not in OVERLAP_POLICIES:
            raise ValueError(f"overlap must be one of {', '.join(OVERLAP_POLICIES)}, got {overlap!r}")
        if not isinstance(template, TaskSpec):
            raise ValueError("template must be a Task")
        for field, bad in (("deadline_at", template.deadline_at_ns is not None),
                           ("start_at", template.start_at_ns is not None),
                           ("start_in", template.start_in_ns is not None),
                           ("after/deps", bool(template.edges))):
            if bad:
                raise SchedulerError(f"a recurring template may not set {field}: it describes a single task")
        p = self._pool(template.pool)
        if template.resources:
            for rname, units in template.resources.items():
                r = self.resources.get(rname)
                if r is None:
                    raise UnknownResource(f"no resource named {rname!r}")
                if units > r.capacity:
                    raise ResourceExceedsCapacity(
                        f"resource {rname!r} has capacity {r.capacity}, the template asks for {units}")
        tol = to_ns(tolerance, "tolerance", error=ValueError) if tolerance is not None else (
            template.tolerance_ns if template.tolerance_ns is not None else NS)
        miss = on_miss if on_miss is not None else template.on_miss
        if miss not in ("run_late", "skip", "fail"):
            raise ValueError(f"on_miss must be run_late, skip or fail, got {miss!r}")
        rec = Recurring(name, schedule, template, overlap, tol, miss, template.key)
        old = self.recurring.get(name)
        after = now
        if old is not None:
            self._timers_ended += 1   # the replaced schedule's timer
            rec.last_task = old.last_task
            rec.last_start = old.last_start
            if old.last_start is not None:
                after = max(after, old.last_start)
        rec.next_start = schedule.next_after(after)
        self.recurring[name] = rec
        if self._persist:
            self.actions.append((act.PERSIST, (MUT_RECURRING, name, rec)))
        self._arm_recurring(rec, p, now)
        self._flush(now)

    def remove_recurring(self, now: int, name: str) -> bool:
        """Stop a schedule; an occurrence already created is left alone."""
        now = self._enter(now)
        rec = self.recurring.pop(name, None)
        if rec is None:
            return False
        rec.timer_at = None
        self._timers_ended += 1
        if self._persist:
            self.actions.append((act.PERSIST, (MUT_RECURRING_REMOVED, name)))
        return True

    def _arm_recurring(self, rec: Recurring, p: PoolState, now: int) -> None:
        if rec.next_start is None:
            return
        lead = min(self._hold_lead(p, rec.tolerance_ns) + rec.tolerance_ns, self.config.max_hold_ns)
        at = max(now, rec.next_start - lead)
        if rec.last_start is not None and at < rec.last_start:
            at = rec.last_start   # one occurrence ahead at a time
        rec.timer_at = at
        self.timers.push(at, tm.RECUR, rec, at)

    def _recur(self, rec: Recurring, now: int) -> None:
        """Create the schedule's next occurrence, then arm the one after."""
        start = rec.next_start
        p = self._pool(rec.template.pool)
        if start is None:
            return
        if now > start + rec.tolerance_ns:
            # Skipped ahead (downtime): one late occurrence at most, then resume.
            if rec.on_miss != "run_late":
                self._counts["missed"] += 1
                start = None
        if start is not None:
            self._create_occurrence(rec, p, start, now)
        nxt = rec.cron.next_after(max(now, rec.next_start))
        rec.next_start = nxt
        if self._persist:
            self.actions.append((act.PERSIST, (MUT_RECURRING, rec.name, rec)))
        self._arm_recurring(rec, p, now)

    def _create_occurrence(self, rec: Recurring, p: PoolState, start: int, now: int) -> None:
        t = rec.template
        spec = TaskSpec.__new__(type(t))
        spec.__dict__.update(t.__dict__)
        spec.plain = False
        spec.start_at_ns = start
        spec.start_in_ns = None
        spec.tolerance_ns = rec.tolerance_ns
        spec.on_miss = rec.on_miss
        if t.deadline_in_ns is not None:
            spec.deadline_at_ns = start + t.deadline_in_ns
            spec.deadline_in_ns = None
        tags = dict(t.tags or {})
        tags["cronoq.recurring"] = rec.name
        spec.tags = tags
        if rec.key is not None:
            spec.key = f"{rec.key}@{rfc3339(start)}"
        prev = rec.last_task
        prev_live = prev is not None and prev in self.tasks
        if rec.overlap in ("queue", "queue_on_success") and prev is not None and (
                prev_live or prev in self.retained) and not (
                rec.overlap == "queue_on_success" and not prev_live
                and self.retained[prev][0] is SKIPPED):
            # (queue_on_success: an occurrence skipped after a failure does not
            # doom the next one too; the chain resumes.)
            spec.edges = ((prev, "complete" if rec.overlap == "queue" else "success"),)
        try:
            task_id, duplicate = self._admit(now, (spec,), False)[0]
        except ReservationConflict:
            self._counts["recurring_conflicts"] += 1
            return
        except AdmissionError:
            self._counts["recurring_invalid"] += 1
            return
        if duplicate:
            return
        e = self.tasks.get(task_id)
        if e is not None:
            x = e.extra()
            x.recurring = rec.name
            if rec.overlap == "skip" and prev_live:
                x.guard = prev
        rec.last_task = task_id
        rec.last_start = start

    # ================================================================ snapshot

    def snapshot(self, now: int) -> Snapshot:
        """Every pool's state and window metrics, and totals since start."""
        now = self._enter(now)
        self._flush(now)
        pools = [self._pool_snapshot(p, now) for p in self.pools.values()]
        return Snapshot(pools, self.totals, len(self.tasks), len(self.running), self.pending,
                        now / NS)

    def _pool_snapshot(self, p: PoolState, now: int) -> PoolSnapshot:
        w = p.window
        w.integrate(now)
        dispatched = succeeded = failed = inversions = hits = fixed = 0
        busy_time = capacity_time = good = attempt_time = 0
        waits = Histogram()
        for b in w.live(now):
            dispatched += b.dispatched
            succeeded += b.succeeded
            failed += b.failed
            inversions += b.inversions
            hits += b.fixed_hits
            fixed += b.fixed_total
            busy_time += b.busy_time
            capacity_time += b.capacity_time
            good += b.good_time
            attempt_time += b.attempt_time
            waits.merge(b.waits)

        def seconds(v):
            return None if v is None else v / NS

        cost_rate = p.cost_rate
        worker_seconds = w.worker_time / NS
        return PoolSnapshot(
            name=p.name,
            capacity=p.capacity,
            busy=p.busy,
            held=p.held,
            desired=p.desired,
            pending=p.pending_total,
            pending_by_class={CLASSES[c]: p.pending[c] for c in range(4)},
            reservations=len(p.calendar),
            dispatched=dispatched,
            succeeded=succeeded,
            failed=failed,
            priority_adherence=1.0 - inversions / dispatched if dispatched else 1.0,
            fixed_start_hit_rate=hits / fixed if fixed else 1.0,
            utilization=busy_time / capacity_time if capacity_time else 0.0,
            schedule_efficiency=good / attempt_time if attempt_time else 1.0,
            wait_p50=seconds(waits.percentile(0.5)) or 0.0,
            wait_p90=seconds(waits.percentile(0.9)) or 0.0,
            wait_p99=seconds(waits.percentile(0.99)) or 0.0,
            worker_seconds=worker_seconds,
            cost=worker_seconds * cost_rate,
            groups=[GroupSnapshot(dict(g.labels), g.capacity, g.busy)
                    for g in sorted(p.groups.values(), key=lambda g: (len(g.labels), sorted(g.labels)))],
        )

    # ================================================================ invariants

    def check_invariants(self) -> None:
        """Assert the engine's internal consistency (tests call this after every step)."""
        def check(condition: bool, message: str) -> None:
            if not condition:
                raise AssertionError(message)

        pending = 0
        for p in self.pools.values():
            counts = [0, 0, 0, 0]
            inactive = [0, 0, 0, 0]
            due = [0, 0, 0, 0]
            queued = [0, 0, 0, 0]
            busy = 0
            held = 0
            label_waiting = 0
            group_busy: dict = {}
            for e in self.tasks.values():
                if e.pool is not p:
                    continue
                check(e.status not in TERMINAL, f"{e} is ended but still live")
                if e.status is RUNNING:
                    busy += 1
                    group_busy[e.group.labels] = group_busy.get(e.group.labels, 0) + 1
                    check(self.running.get(e.lease) is e, f"{e} is running without its lease")
                else:
                    counts[e.cls] += 1
                if e.status in (BLOCKED, SCHEDULED):
                    inactive[e.cls] += 1
                if e.status is BLOCKED:
                    check(e.unmet > 0, f"{e} is blocked with no unmet dependency")
                if e.status is READY:
                    check(e.unmet == 0, f"{e} is ready with {e.unmet} unmet dependencies")
                    check(e.where != W_NONE, f"{e} is ready but waits nowhere")
                    if e.where == W_DUE:
                        due[e.cls] += 1
                    elif e.where == W_QUEUE:
                        queued[e.cls] += 1
                    elif e.where == W_LABEL:
                        label_waiting += 1
                    elif e.where == W_PARKED:
                        check(e.x is not None and e.x.parked_on is not None, f"{e} parked on nothing")
                        check(e in e.x.parked_on.waiters, f"{e} missing from its resource's waiters")
                if e.x is not None and e.x.hold:
                    held += 1
                if e.x is not None and e.x.start is not None:
                    check(e.id in p.calendar, f"{e} lost its reservation")
            check(p.pending == counts, f"pool {p.name}: pending {p.pending} != {counts}")
            check(p.pending_total == sum(counts), f"pool {p.name}: pending_total off")
            check(p.inactive == inactive, f"pool {p.name}: inactive {p.inactive} != {inactive}")
            check(p.due_n == due, f"pool {p.name}: due {p.due_n} != {due}")
            check(p.queues.count == queued, f"pool {p.name}: queued {p.queues.count} != {queued}")
            check(p.queues.total == sum(queued), f"pool {p.name}: queue total off")
            check(p.busy == busy, f"pool {p.name}: busy {p.busy} != {busy}")
            check(p.held == held, f"pool {p.name}: held {p.held} != {held}")
            check(p.label_waiting == label_waiting, f"pool {p.name}: label waiters off")
            check(p.capacity == sum(g.capacity for g in p.groups.values()), f"pool {p.name}: capacity off")
            for labels, g in p.groups.items():
                check(g.busy == group_busy.get(labels, 0), f"pool {p.name}: group {dict(labels)} busy off")
            live_queue = sum(1 for _ in p.queues.live_entries())
            check(live_queue == sum(queued), f"pool {p.name}: queues hold {live_queue} live entries")
            pending += sum(counts)
            if not self._dirty and not self._frozen:
                self._check_liveness(p, check)
        check(self.pending == pending, f"pending {self.pending} != {pending}")
        for lease, e in self.running.items():
            check(e.status is RUNNING and e.lease == lease, f"lease {lease} maps to {e}")
        for key, task_id in self.keys.items():
            check(task_id in self.tasks or task_id in self.retained, f"key {key!r} maps to a forgotten task")
        for e in self.tasks.values():
            if e.key is not None:
                check(self.keys.get(e.key) == e.id, f"{e} is not found by its key")
        check(len(self.retained) <= max(self.config.retention_max, 0), "retention over its bound")
        for r in self.resources.values():
            if r.semaphore:
                held_units = sum(e.spec.resources.get(r.name, 0) for e in self.running.values()
                                 if e.spec is not None and e.spec.resources)
                check(r.available + held_units == r.capacity,
                      f"resource {r.name}: {r.available} free + {held_units} held != {r.capacity}")
                head = r.head()
                if head is not None and not self._frozen:
                    # Liveness: free permits are either offered to tasks on their way
                    # to a slot, or too few for the first waiter.
                    offered = sum(e.spec.resources.get(r.name, 0) for e in self.tasks.values()
                                  if e.status is READY and e.where != W_PARKED and e.x is not None
                                  and e.x.reoffered and e.spec is not None and e.spec.resources)
                    check(r.available - offered < head.spec.resources[r.name],
                          f"resource {r.name}: {r.available} permits free ({offered} offered) while "
                          f"{head} waits for {head.spec.resources[r.name]}")
            else:
                check(r.tokens <= r.capacity + 1e-9, f"resource {r.name}: bucket over its burst")
        for key, waiting in self.awaiting.items():
            for child, _ in waiting:
                check(child.status in TERMINAL or key in (child.x.awaits or ()),
                      f"{child} awaits {key!r} without knowing it")


    def _check_liveness(self, p: PoolState, check) -> None:
        """Nothing waits while a slot it may take is free (between calls).

        A ready task may take a slot when the pool has one free, or when one
        is held for it; it fits a group whose labels include its own and
        whose busy count is under its capacity. Tasks parked on a resource
        wait for the resource, not for a slot, and are not checked here.
        """
        free = p.capacity - p.busy - p.held
        open_groups = [g for g in p.groups.values() if g.busy < g.capacity]
        if free > 0:
            check(not p.queues.total, f"pool {p.name}: {p.queues.total} tasks queued with free slots")
            for e in p.hold_waiters:
                check(self.tasks.get(e.id) is not e or e.attempt > 0 or e.status is RUNNING or e.x.hold,
                      f"pool {p.name}: {e} waits for a hold while {free} slots are free")
        for e in self.tasks.values():
            if e.pool is not p or e.status is not READY:
                continue
            if not (free > 0 or (e.x is not None and e.x.hold)):
                continue
            if e.where == W_DUE:
                check(False, f"pool {p.name}: {e} is due and may take a slot, but waits")
            elif e.where == W_LABEL:
                labels = e.spec.labels or frozenset()   # (a held unlabeled task can wait here too)
                fits = [dict(g.labels) for g in open_groups if labels <= g.labels]
                check(not fits, f"pool {p.name}: {e} waits for labels {dict(labels)} "
                                f"while matching groups {fits} have free slots")


class _Plan:
    """One task of an admission being validated."""

    __slots__ = ("index", "spec", "pool", "batch_parents", "live_parents", "ended_parents",
                 "awaits", "fixed", "entry")

    def __init__(self, index: int, spec: TaskSpec, pool: PoolState) -> None:
        self.index = index
        self.spec = spec
        self.pool = pool
        self.batch_parents: list = []
        self.live_parents: list = []
        self.ended_parents: list = []
        self.awaits: list = []
        self.fixed = None
        self.entry = None
