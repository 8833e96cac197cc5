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
import random
from collections import deque
from typing import Any, Callable, ClassVar, Final, Iterable, Iterator, Sequence

from .._mypyc import mypyc_attr
from . import actions as act
from . import timers as tm
from .errors import (
    AdmissionError, Cycle, InvalidTask, QueueFull, ReservationConflict, ResourceExceedsCapacity,
    SchedulerError, UnknownDependency, UnknownPool, UnknownResource, UnknownTask,
)
from .explain import Explanation, explain
from .invariants import check_invariants
from .metrics import Histogram
from .model import (
    W_DUE, W_LABEL, W_NONE, W_PARKED, W_QUEUE, Edge, Entry, Extra, Group, Labels, Plan, PoolState, Record,
    pool_order,
)
from .mutations import (
    MUT_OUTPUT, MUT_RECURRING, MUT_RECURRING_REMOVED, MUT_STATUS, MUT_SUBMIT, MUT_WITHDRAWN,
)
from .persist import SPEC_PAYLOAD, RestoredSchedule, RestoredTask
from .recurring import OVERLAP_POLICIES, CronSchedule, Recurring, rfc3339
from .resources import ResourceState
from .snapshot import GroupSnapshot, PoolSnapshot, Reservation, Snapshot, TaskInfo, TOTAL_FIELDS
from .timers import TimerHeap
from .options import MISS_POLICIES
from .statuses import (   # (C statics when compiled: the engine's hot path reads them)
    BLOCKED, CANCELLED, CANCELLED_OUTCOME, DEAD_LETTERED, FAILED, MISSED, PERMANENT, READY, RETRYABLE,
    RETRYING, RUNNING, SCHEDULED, SHED, SKIPPED, SUCCEEDED, SUCCESS,
)
from .types import (
    CLASSES, KEY_LIMIT, NS, RECURRING_KEY_LIMIT, TERMINAL, CoreConfig, PoolConfig, ResourceConfig, RetryPolicy,
    Status, TaskSpec, check_length, check_name, first_id, to_ns,
)

__all__ = ["Core", "Entry", "MUT_SUBMIT", "MUT_STATUS", "MUT_OUTPUT", "MUT_RECURRING",
           "MUT_RECURRING_REMOVED", "MUT_WITHDRAWN", "W_NONE", "W_QUEUE", "W_PARKED", "W_LABEL", "W_DUE"]

_COMPACT_SLACK: Final = 32   # stale timers tolerated beyond half the heap (small heaps are not scanned)
_NEVER: Final = (1 << 62) - 1   # the expiry of no retained record (a native int when compiled)

_FAILURES: Final = (RETRYABLE, PERMANENT, CANCELLED_OUTCOME)   # outcomes of complete() besides success

# Which parent statuses satisfy a dependency edge, by its condition.
_SATISFIES: dict[str, frozenset[Status]] = {
    "success": frozenset({SUCCEEDED}),
    "failure": frozenset({FAILED, DEAD_LETTERED}),
    "complete": TERMINAL,
}

Action = tuple[Any, ...]   # a raw action tuple (layouts in cronoq.core.actions)
# (a C static when compiled: a name of the pure types module is a dictionary lookup at each use)
_TASK_SPEC: Final = TaskSpec
_PLAIN: Final[dict[str, str]] = {status: status.value for status in Status}
_SUCCEEDED_TEXT: Final = SUCCEEDED.value   # (the common ending, without the lookup)


# (subclasses in Python: the differential test's general engine)
@mypyc_attr(allow_interpreted_subclasses=True)
class Core:
    """The scheduling engine. See the module docstring for the contract."""

    __slots__ = ("config", "now", "pools", "default_pool", "resources", "tasks", "running", "keys",
                 "retained", "_retain_order", "awaiting", "recurring", "timers", "actions", "pending",
                 "_counts", "_submitted", "_dispatched", "_succeeded", "rng", "_next_id",
                 "_next_lease", "_park_seq", "_dirty", "_frozen", "_emit_all", "_persist",
                 "_max_total", "_retention", "_retain_max", "_retain_on", "timer_heap",
                 "_timers_ended", "_fast", "_retain_due", "_push_action", "_push_retained")

    # The deliberate shortcuts of the hot paths (plain submissions, the end of
    # a task with nothing to resolve, the time check on entry). A subclass
    # that sets this False runs the general path they shortcut; the
    # differential test compares the two.
    fast_paths: ClassVar[bool] = True

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
            self.pools[pc.name] = PoolState(pc, config, len(self.pools), now)
        if not self.pools:
            raise ValueError("a scheduler needs at least one pool")
        self.default_pool = self.pools.get("default") or next(iter(self.pools.values()))
        self.resources: dict[str, ResourceState[Entry]] = {}
        for rc in resources:
            if not isinstance(rc, ResourceConfig):
                raise ValueError(f"resources must be ResourceConfig objects, got {type(rc).__name__}")
            if rc.name in self.resources:
                raise ValueError(f"duplicate resource name {rc.name!r}")
            self.resources[rc.name] = ResourceState(rc, now)
        self.tasks: dict[int, Entry] = {}
        self.running: dict[int, Entry] = {}       # lease -> entry
        self.keys: dict[str, int] = {}            # key -> id, live or retained
        self.retained: dict[int, Record] = {}     # id -> (status, pool, key, kind, attempt, message, tenant, ...)
        self._retain_order: deque[tuple[int, int]] = deque()   # (expiry, id)
        self._retain_due = _NEVER   # the expiry at the head of _retain_order: one int to compare on entry
        self.awaiting: dict[str, list[Edge]] = {}  # key -> [(child entry, condition)]
        self.recurring: dict[str, Recurring] = {}
        self.timers = TimerHeap()
        self.actions: deque[Action] = deque()
        # Bound once: a call each on the hot path instead of a method lookup and a call.
        self._push_action: Callable[[Action], None] = self.actions.append
        self._push_retained: Callable[[tuple[int, int]], None] = self._retain_order.append
        self.pending = 0
        self._counts = dict.fromkeys(TOTAL_FIELDS, 0)
        # The three counters every task moves are plain attributes (cheaper).
        self._submitted = self._dispatched = self._succeeded = 0
        self.rng = random.Random(config.seed)
        self._next_id = self._first_id()
        self._next_lease = self._first_id()
        self._park_seq = 0
        self._dirty: list[PoolState] = []
        self._frozen = False
        self._emit_all = config.emit_transitions
        self._persist = config.persist
        self._max_total = config.max_pending_total
        self._retention = config.retention_ns
        self._retain_max = config.retention_max
        self._retain_on = config.retention_ns > 0 and config.retention_max > 0
        self.timer_heap = self.timers.entries()   # read-only for drivers: empty when no timer is armed
        self._timers_ended = 0   # timers made stale since the last compaction (an estimate)
        self._fast = self.fast_paths   # (a slot reads faster than a class attribute)
        for p in self.pools.values():
            if p.scaler is not None:
                self._arm_scaler(p, now)

    def _first_id(self) -> int:
        """Ids and leases carry the store's epoch, so that a new leader never reuses one."""
        return first_id(self.config.shard, self.config.epoch)

    # ================================================================ public API

    def submit(self, now: int, spec: TaskSpec) -> tuple[int, bool]:
        """Admit one task; returns ``(id, duplicate)``. Raises an AdmissionError
        (and changes nothing) when the task cannot be admitted."""
        if now < self.now:   # _enter, inlined: usually nothing is due
            now = self.now
        else:
            self.now = now
        heap = self.timer_heap
        if heap and heap[0][0] <= now or self._retain_due <= now:
            self._enter(now)
        if type(spec) is _TASK_SPEC and spec.plain and self._fast and (
                (key := spec.key) is None or key not in self.awaiting):
            # No option beyond pool, kind, priority and key: nothing to plan.
            # (The pool is checked first, as _admit does: an unknown pool is
            # an error even for a key that exists.)
            p = self.default_pool if spec.pool is None else self._pool(spec.pool)
            if key is not None:
                existing = self._key_id(key)
                if existing is not None:
                    if self._dirty:
                        self._flush(now)
                    return (existing, True)
            if p.bounded or self._max_total is not None:
                for victim in self._check_bounds([Plan(0, spec, p)], False):
                    self._shed(victim, now)
            task_id = self._admit_plain(p, spec, key, now)
            if self._dirty:
                self._flush(now)
            return (task_id, False)
        result = self._admit(now, (spec,), False)[0]
        if self._dirty:
            self._flush(now)
        return result

    def submit_batch(self, now: int, specs: Iterable[TaskSpec]) -> list[tuple[int, bool]]:
        """Admit several tasks atomically: all of them or, on error, none.
        The error's ``index`` names the offending task."""
        now = self._enter(now)
        specs = list(specs)
        if not specs:
            return []
        plain = self._max_total is None and self._fast
        if plain:
            pools = self.pools
            for spec in specs:
                if type(spec) is not TaskSpec or not spec.plain or spec.key is not None or (
                        spec.pool is not None and spec.pool not in pools) or (
                        pools[spec.pool or self.default_pool.name].bounded):
                    plain = False
                    break
        if plain:
            # Nothing in the batch can be refused: admit without planning
            # (creating all, then queueing all, as planning does).
            default = self.default_pool
            entries = [self._create(default if spec.pool is None else self.pools[spec.pool], spec, now)
                       for spec in specs]
            for e in entries:
                self._to_ready(e, now)
            results = [(e.id, False) for e in entries]
        else:
            results = self._admit(now, specs, True)
        if self._dirty:
            self._flush(now)
        return results

    def complete(self, now: int, lease: int, outcome: str = SUCCESS, output: Any = None,
                 message: str | None = None, retry_after_ns: int | None = None) -> bool:
        """Report the end of an attempt. Returns False for a stale report (the
        attempt was aborted, timed out, already reported, or never existed)."""
        if outcome is not SUCCESS and outcome != SUCCESS and outcome not in _FAILURES:
            # Checked before anything changes: a bad outcome must not end the attempt.
            raise ValueError(f"outcome must be success, retryable, permanent or cancelled, got {outcome!r}")
        if now < self.now:   # _enter, inlined: usually nothing is due
            now = self.now
        else:
            self.now = now
        heap = self.timer_heap
        if heap and heap[0][0] <= now or self._retain_due <= now:
            self._enter(now)
        e = self.running.pop(lease, None)
        if e is None:
            self._counts["stale_completions"] += 1
            return False
        ok = outcome is SUCCESS or outcome == SUCCESS
        self._end_attempt(e, now, ok)
        if ok:
            if self._persist:
                self.actions.append((act.PERSIST, (MUT_OUTPUT, e.id, output)))
            if e.x is None and e.children is None and self._fast:
                # The common case: no extras to clean up, no dependents to resolve.
                self._ended(e, SUCCEEDED, now, message)
            else:
                self._finish(e, SUCCEEDED, now, message)
        elif outcome == RETRYABLE:
            self._retry_or_dead(e, now, message, retry_after_ns)
        elif outcome == PERMANENT:
            self._finish(e, FAILED, now, message)
        else:
            self._finish(e, CANCELLED, now, message or "cancelled by the executor")
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
        e = self._live(ref)
        if e is None:
            if self._retained_record(ref) is not None:
                return False
            raise UnknownTask(ref)
        self._finish(e, CANCELLED, now, "cancelled")
        if self._dirty:
            self._flush(now)
        elif self._timers_ended > (len(self.timer_heap) >> 1) + _COMPACT_SLACK:
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

    @property
    def dispatching(self) -> bool:
        """False once ``stop_dispatching()`` was called."""
        return not self._frozen

    @property
    def settled(self) -> bool:
        """No pool waits to be offered its free slots, and dispatching is on:
        the state in which liveness must hold (check_invariants)."""
        return not self._dirty and not self._frozen

    def has_timers(self) -> bool:
        """Whether any timer is armed (live or not yet pruned): a cheap check
        before ``next_wakeup``."""
        return bool(self.timer_heap)

    def next_wakeup(self) -> int | None:
        """When the engine next needs ``advance``, or None if nothing is timed."""
        heap = self.timer_heap
        while heap:
            when, _, kind, obj, token = heap[0]
            if self._timer_live(kind, obj, token):
                return int(when)
            heapq.heappop(heap)
        return None

    def poll_action(self) -> act.Dispatch | act.Abort | act.StatusEvent | act.Persist | act.Scale | None:
        """The next action as a typed object, or None. (A driver that cares
        about speed pops the raw tuples from ``actions`` itself.)"""
        if self.actions:
            return act.typed(self.actions.popleft())
        return None

    def status(self, ref: int | str) -> str:
        return self.info(ref).status

    def info(self, ref: int | str) -> TaskInfo:
        """What is known of a live or retained task; ``UnknownTask`` otherwise."""
        e = self._live(ref)
        if e is not None:
            spec = e.spec
            stages = list(spec.stages) if spec is not None and spec.stages else None
            return TaskInfo(e.id, e.status, e.pool.name, e.key, e.kind, e.attempt, None, stages,
                            tenant=None if spec is None else spec.tenant, max_attempts=self._policy(e).max_attempts)
        record = self._retained_record(ref)
        if record is None:
            raise UnknownTask(ref)
        task_id = ref if isinstance(ref, int) else self.keys[ref]
        status, pool, key, kind, attempt, message, tenant, max_attempts = record
        return TaskInfo(task_id, Status(status), pool, key, kind, attempt, message, tenant=tenant,
                        max_attempts=max_attempts)

    def explain(self, ref: int | str, now: int) -> Explanation:
        """Why task ``ref`` waits (read-only; see ``cronoq.core.explain``)."""
        return explain(self, ref, now)

    def dependents(self, ref: int | str) -> list[tuple[int, str]]:
        """The tasks that wait on task ``ref`` through a live dependency edge,
        as (id, condition) pairs in the order they were linked: those of a
        live task (its children: edges are kept until it ends, and dependents
        that ended first stay listed). A task that ended resolved its edges and
        forgot them: none. ``UnknownTask`` if ``ref`` is neither live nor
        retained."""
        e = self._live(ref)
        if e is None:
            if self._retained_record(ref) is None:
                raise UnknownTask(ref)
            return []
        children = e.children
        if not children:
            return []
        return [(child.id, cond) for child, cond in children]

    def check_invariants(self) -> None:
        """Assert the engine's internal consistency (tests call this after every step)."""
        check_invariants(self)

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
        if self._retain_due <= now:
            self._expire_retained(now)
        timers = self.timers
        while True:
            t = timers.pop_due(now)
            if t is None:
                break
            self._fire(t[2], t[3], t[4])
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

    def _timer_gone(self, kind: int, obj: Any, token: Any) -> bool:
        """True for a timer that can never matter again (unlike ``_timer_live``,
        which may be false for a while: a held task's hold timer)."""
        if kind == tm.TIMEOUT or kind == tm.LEASE:
            return self.running.get(token) is not obj     # leases are never reused
        if kind == tm.RECUR:
            return self.recurring.get(obj.name) is not obj
        if kind == tm.REFILL or kind == tm.AUTOSCALE:
            return False   # one per resource or pool, and due soon
        e: Entry = obj
        if self.tasks.get(e.id) is not e:
            return True    # the task ended
        return kind == tm.RETRY and e.attempt != token   # attempts only grow

    def _timer_live(self, kind: int, obj: Any, token: Any) -> bool:
        if kind == tm.TIMEOUT or kind == tm.LEASE:
            return self.running.get(token) is obj
        if kind == tm.REFILL:
            return bool(obj.refill_at == token)
        if kind == tm.AUTOSCALE:
            return bool(obj.scaler.armed == token)
        if kind == tm.RECUR:
            rec: Recurring = obj
            return self.recurring.get(rec.name) is rec and rec.timer_at == token
        e: Entry = obj
        if kind == tm.RETRY:
            return e.status is RETRYING and e.attempt == token and self.tasks.get(e.id) is e
        if self.tasks.get(e.id) is not e:
            return False
        if kind == tm.START:
            return e.status is SCHEDULED or e.status is BLOCKED
        if kind == tm.MISS:
            return e.attempt == 0 and e.status is not RUNNING
        x = _extra(e)
        if kind == tm.HOLD:
            return e.attempt == 0 and e.status is not RUNNING and not x.hold
        if kind == tm.AWAIT:
            return bool(x.awaits)
        return True

    def _fire(self, kind: int, obj: Any, token: Any) -> None:
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

    def _create(self, p: PoolState, spec: TaskSpec, now: int, row: RestoredTask | None = None) -> Entry:
        """A task becomes live: its entry, its key and the pending counts. A
        new submission takes the next id and is counted and persisted; a
        recovered ``row`` keeps its id, submission time, payload and attempts."""
        key = spec.key
        if row is None:
            task_id = self._next_id
            self._next_id = task_id + 1
            e = Entry(task_id, p, spec.priority, now, spec.payload, key, spec.kind,
                      None if spec.plain else spec)
            self._submitted += 1
            if self._persist:
                self.actions.append((act.PERSIST, (MUT_SUBMIT, task_id, p.name, spec, now)))
        else:
            task_id = row.id
            payload = spec.payload if row.payload is SPEC_PAYLOAD else row.payload
            e = Entry(task_id, p, spec.priority, row.submitted_ns, payload, key, spec.kind,
                      None if spec.plain else spec)
            e.attempt = row.attempt
        self._register(p, e)
        return e

    def _register(self, p: PoolState, e: Entry) -> None:
        """A new entry is live: its id, its key and the pending counts."""
        self.tasks[e.id] = e
        key = e.key
        if key is not None:
            self.keys[key] = e.id
        pending = p.pending
        c = e.cls
        pending[c] = pending[c] + 1   # (not +=: compiled, that is a generic in-place add on a list item)
        p.pending_total += 1
        self.pending += 1

    def _admit_plain(self, p: PoolState, spec: TaskSpec, key: str | None, now: int) -> int:
        """Admit a task with no option beyond pool, kind, priority and a new
        ``key``, whose bounds were checked: it goes straight to its queue.
        (As _create, without reading the spec's key and plainness again.)"""
        task_id = self._next_id
        self._next_id = task_id + 1
        e = Entry(task_id, p, spec.priority, now, spec.payload, key, spec.kind, None)
        self._submitted += 1
        if self._persist:
            self.actions.append((act.PERSIST, (MUT_SUBMIT, task_id, p.name, spec, now)))
        self._register(p, e)
        e.where = W_QUEUE   # (as _to_ready queues a task without a fixed start)
        p.queues.push(e)
        if p.shed is not None:
            self._index_shed(p, e)
        self._arrived(p, e, now)
        return task_id

    def _admit(self, now: int, specs: Sequence[TaskSpec], batch: bool) -> list[tuple[int, bool]]:
        """Validate every spec, then apply them all; nothing changes on error."""
        n = len(specs)
        results: list[tuple[int, bool] | int | None] = [None] * n
        plans: list[Plan] = []
        batch_keys: dict[str, int] = {}
        for i, spec in enumerate(specs):
            try:
                if not isinstance(spec, TaskSpec):
                    raise InvalidTask(f"expected a Task, got {type(spec).__name__}")
                p = self._pool(spec.pool)
                key = spec.key
                if key is not None:
                    existing = self._key_id(key)
                    if existing is not None:
                        results[i] = (existing, True)
                        continue
                    if key in batch_keys:
                        results[i] = batch_keys[key]   # filled in once that task has an id
                        continue
                    batch_keys[key] = len(plans)
                if spec.resources:
                    self._check_resources(spec.resources, "the task")
                plans.append(Plan(i, spec, p))
            except AdmissionError as exc:
                raise exc.at_index(i) if batch else exc
        if plans:
            self._resolve_edges(plans, batch_keys, batch)
            self._check_reservations(now, plans, batch)
            victims = self._check_bounds(plans, batch)
            for victim in victims:
                self._shed(victim, now)
            self._apply(now, plans)
        for plan in plans:
            results[plan.index] = (_entry(plan).id, False)
        out: list[tuple[int, bool]] = []
        for r in results:
            if isinstance(r, int):       # an in-batch duplicate: same id as its first
                out.append((_entry(plans[r]).id, True))
            else:
                assert r is not None
                out.append(r)
        return out

    def _check_resources(self, request: dict[str, int], asker: str) -> None:
        """Every resource a task (or template) asks for exists and can ever grant the units."""
        for name, units in request.items():
            r = self.resources.get(name)
            if r is None:
                raise UnknownResource(f"no resource named {name!r}")
            if units > r.capacity:
                raise ResourceExceedsCapacity(
                    f"resource {name!r} has capacity {r.capacity}, {asker} asks for {units}")

    def _unconfigured(self, pool: str, spec: TaskSpec) -> str | None:
        """What a recovered task or schedule needs that this configuration lacks."""
        if pool not in self.pools:
            return f"pool {pool!r} is not configured"
        for name in spec.resources or ():
            if name not in self.resources:
                return f"resource {name!r} is not configured"
        return None

    def _resolve_edges(self, plans: list[Plan], batch_keys: dict[str, int], batch: bool) -> None:
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
                        e = self._live(ref)
                        if e is not None:
                            plan.live_parents.append((e, cond))
                            continue
                        record = self._retained_record(ref)
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
                        record = self._retained_record(ref)
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
            stack: list[tuple[int, Iterator[tuple[int, str]]]] = [(start, iter(plans[start].batch_parents))]
            state[start] = 1
            while stack:
                node, parents = stack[-1]
                for j, _ in parents:
                    if state[j] == 1:
                        cycle = Cycle(f"the batch's dependencies form a cycle through task {plans[j].index}")
                        raise cycle.at_index(plans[j].index) if batch else cycle
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
                cycle = Cycle(f"a task awaiting key {key!r} is among this task's own dependencies")
                raise cycle.at_index(plan.index) if batch else cycle

    def _reaches(self, plans: list[Plan], k: int, targets: set[int]) -> bool:
        """Does plan k depend, directly or not, on a live task in ``targets``?"""
        seen_plans = {k}
        seen_ids: set[int] = set()
        plan_stack = [k]
        entry_stack: list[Entry] = []
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

    def _check_reservations(self, now: int, plans: list[Plan], batch: bool) -> None:
        extra: dict[str, list[tuple[int, int]]] = {}
        for plan in plans:
            spec = plan.spec
            if spec.start_at_ns is None and spec.start_in_ns is None:
                continue
            p = plan.pool
            start = spec.start_at_ns if spec.start_at_ns is not None else now + (spec.start_in_ns or 0)
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

    def _check_bounds(self, plans: list[Plan], batch: bool) -> list[Entry]:
        """Raise QueueFull if the plans do not fit; for a single task of a
        shedding pool, return the tasks to evict instead."""
        bounded = self._max_total is not None or any(plan.pool.bounded for plan in plans)
        if not bounded:
            return []
        add_class: dict[tuple[str, int], int] = {}
        add_pool: dict[str, int] = {}
        total = self.pending
        for plan in plans:
            p = plan.pool
            c = plan.spec.priority
            ck = (p.name, c)
            add_class[ck] = add_class.get(ck, 0) + 1
            add_pool[p.name] = add_pool.get(p.name, 0) + 1
            total += 1
            limit_c: int | None = p.max_class[c]
            if limit_c is not None and p.pending[c] + add_class[ck] > limit_c:
                raise self._full(plan, batch, f"pool {p.name!r} holds at most {limit_c} pending "
                                              f"{CLASSES[c]} tasks", add_class[ck] > limit_c)
            over_pool = p.max_total is not None and p.pending_total + add_pool[p.name] > p.max_total
            over_all = self._max_total is not None and total > self._max_total
            if over_pool or over_all:
                what = (f"pool {p.name!r} holds at most {p.max_total} pending tasks" if over_pool
                        else f"the scheduler holds at most {self._max_total} pending tasks")
                if batch or p.shed is None:
                    bound = p.max_total if over_pool else self._max_total
                    assert bound is not None
                    never = (add_pool[p.name] if over_pool else total - self.pending) > bound
                    raise self._full(plan, batch, what, never)
                victim = self._victim(p, c)
                if victim is None:
                    raise self._full(plan, batch, what + " and no lower-class task can be shed")
                return [victim]
        return []

    def _full(self, plan: Plan, batch: bool, what: str, never: bool = False) -> QueueFull:
        """QueueFull; ``never`` marks a submission larger than the bound itself,
        which waiting for room cannot help."""
        exc = QueueFull(what + (" (the submission alone exceeds it)" if never else ""))
        if batch:
            exc = exc.at_index(plan.index)
        exc.never = never
        return exc

    def _sheddable(self, task_id: int) -> bool:
        e = self.tasks.get(task_id)
        return (e is not None and e.status is READY and W_QUEUE <= e.where <= W_LABEL
                and (e.x is None or e.x.start is None))

    def _victim(self, p: PoolState, c: int) -> Entry | None:
        """The task a shedding pool evicts to admit one of class c, or None.

        shed_lowest takes the newest task of the lowest class below c;
        shed_oldest the oldest task of the lowest class at or below c.
        """
        index = p.shed
        assert index is not None
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

    def _apply(self, now: int, plans: list[Plan]) -> None:
        entries = []
        for plan in plans:
            e = plan.entry = self._create(plan.pool, plan.spec, now)
            entries.append(e)
            spec = plan.spec
            if spec.deadline_at_ns is not None:
                self._set_deadline(e, spec, spec.deadline_at_ns)
            elif spec.deadline_in_ns is not None:
                self._set_deadline(e, spec, now + spec.deadline_in_ns)
        doomed: list[tuple[Entry, str]] = []
        for plan in plans:
            e = _entry(plan)
            parents = []
            for j, cond in plan.batch_parents:
                parent = _entry(plans[j])
                self._link(parent, e, cond)
                parents.append(parent.id)
            for parent, cond in plan.live_parents:
                if parent.status in TERMINAL:
                    # Shed to make room for this very task: resolve the edge
                    # from its status, as for any parent that already ended.
                    reason = _unmet(parent.key or parent.id, parent.status, cond)
                    if reason is not None:
                        doomed.append((e, reason))
                    continue
                self._link(parent, e, cond)
                parents.append(parent.id)
            for ref, status, cond in plan.ended_parents:
                reason = _unmet(ref, status, cond)
                if reason is not None:
                    doomed.append((e, reason))
            if plan.awaits:
                self._await_keys(e, plan.awaits, now)
            if parents:
                e.extra().parents = tuple(parents)
            if plan.fixed is not None:
                start, tol, lo, hi = plan.fixed
                self._book(e, start, tol, plan.spec.on_miss, lo, hi)
                scaler = plan.pool.scaler
                if scaler is not None and (scaler.armed is None or scaler.armed > lo - int(
                        scaler.config.reservation_horizon * NS)):
                    # An idle pool's evaluation must come back for this booking's
                    # pre-warming (it re-arms itself for the horizon's edge).
                    self._arm_scaler(plan.pool, now)
        # Children that were waiting for a key defined now depend on its task.
        for e in entries:
            if e.key is not None and e.key in self.awaiting:
                for child, cond in self.awaiting.pop(e.key):
                    if child.status in TERMINAL:
                        continue
                    x = _extra(child)
                    assert x.awaits is not None
                    x.awaits.remove(e.key)
                    child.unmet -= 1   # the wait for the key becomes a wait for its task
                    self._link(e, child, cond)
                    x.parents = x.parents + (e.id,)
        doomed_ids = {e.id for e, _ in doomed}
        for e in entries:
            if e.id not in doomed_ids:   # (a doomed task ends as skipped below, never queued)
                self._place(e, now)
        for e, message in doomed:
            if e.status not in TERMINAL:
                self._finish(e, SKIPPED, now, message)

    def _set_deadline(self, e: Entry, spec: TaskSpec, deadline: int) -> None:
        """Deadline, estimate and latest start (the urgency of the ready queues)."""
        e.deadline = deadline
        e.est = self._estimate(e.pool, spec)
        e.lst = deadline - e.est

    def _book(self, e: Entry, start: int, tolerance: int, on_miss: str, lo: int, hi: int) -> None:
        """A fixed start, with its booking [lo, hi) in the pool's calendar."""
        x = e.extra()
        x.start = start
        x.tolerance = tolerance
        x.on_miss = on_miss
        e.pool.calendar.add(lo, hi, e.id)

    def _link(self, parent: Entry, child: Entry, cond: str) -> None:
        """A live dependency edge: ``child`` waits until ``parent`` ends (satisfying ``cond``)."""
        child.unmet += 1
        if parent.children is None:
            parent.children = [(child, cond)]
        else:
            parent.children.append((child, cond))

    def _await_keys(self, e: Entry, awaits: list[tuple[str, str]], now: int) -> None:
        """``e`` waits for tasks with these keys to be submitted (for at most the
        pool's await timeout)."""
        x = e.extra()
        if x.awaits is None:
            x.awaits = []
        for key, cond in awaits:
            e.unmet += 1
            x.awaits.append(key)
            self.awaiting.setdefault(key, []).append((e, cond))
        timeout = e.pool.config.await_timeout_ns
        if timeout is not None:
            self.timers.push(now + timeout, tm.AWAIT, e)

    def _place(self, e: Entry, now: int) -> None:
        """Where a new or recovered task waits: blocked on its dependencies,
        scheduled for its start, or ready."""
        x = e.x
        if x is not None and x.start is not None:
            self._arm_fixed(e, now)
        if e.unmet:
            self._set_inactive(e, BLOCKED, now)
        elif x is not None and x.start is not None and x.start > now and e.attempt == 0:
            self._set_inactive(e, SCHEDULED, now)
        else:
            self._to_ready(e, now)

    # ================================================================ readiness

    def _set_inactive(self, e: Entry, status: Status, now: int) -> None:
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
        e.status = READY
        e.ready_at = now
        if x is not None and x.start is not None:
            self._enqueue_due(p, e, x.start if e.attempt == 0 else now)
        else:
            e.where = W_QUEUE
            p.queues.push(e)
            if p.shed is not None:
                self._index_shed(p, e)
        self._arrived(p, e, now)

    def _enqueue_due(self, p: PoolState, e: Entry, due: int) -> None:
        """A fixed start waits in the due queue, in line from ``due`` (its
        start, or for a retry the time it became ready)."""
        e.where = W_DUE
        heapq.heappush(p.due, (due, e.id, e))
        p.due_n[e.cls] += 1

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
        assert index is not None
        index.add(e)
        heap = index.oldest[e.cls]
        if len(heap) > 2 * p.pending_total + 64:
            index.compact(e.cls, self._sheddable)

    def _to_ready_again(self, e: Entry) -> None:
        """A parked task goes back to its queue, keeping its place."""
        p = e.pool
        x = e.x
        e.status = READY
        if x is not None and x.start is not None:
            self._enqueue_due(p, e, x.start if e.attempt == 0 else e.ready_at)
        else:
            e.where = W_QUEUE
            p.queues.push(e)
        self._mark_dirty(p)

    def _mark_dirty(self, p: PoolState) -> None:
        """``p`` may have work to start: dispatch it before the call returns."""
        if not p.dirty:
            p.dirty = True
            self._dirty.append(p)

    # ================================================================ dispatch

    def stop_dispatching(self) -> None:
        """Start nothing new from now on (shutdown): queued tasks stay queued."""
        self._frozen = True

    def _flush(self, now: int) -> None:
        if self._timers_ended > (len(self.timer_heap) >> 1) + _COMPACT_SLACK:
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
            dirty.sort(key=pool_order, reverse=True)
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
            assert e is not None
            spec = e.spec
            unlabeled = p.unlabeled
            group: Group | None = unlabeled
            if spec is not None:
                if spec.labels is not None:
                    group = self._group_for(p, spec.labels)
                    if group is None:
                        self._label_park(p, e)
                        continue
                elif unlabeled.busy >= unlabeled.capacity:
                    group = self._group_for(p, None)
                if spec.resources and not self._acquire(e, now):
                    continue
            elif unlabeled.busy >= unlabeled.capacity:
                group = self._group_for(p, None)
            assert group is not None   # (a slot is free, so some group has one)
            self._start(p, e, now, group)

    def _group_for(self, p: PoolState, labels: Labels | None) -> Group | None:
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
        if now > w.last_t:
            w.integrate(now)
        p.busy += 1
        group.busy += 1
        w.busy = p.busy
        b = w.current if now < w.current_end else w.bucket(now)
        b.dispatched += 1
        c = e.cls
        wait = now - e.ready_at   # into the window's histogram of its class
        if wait:
            b.waits[c].record(wait)
        else:
            b.waits[c].zero += 1   # (no wait, the common case)
        if c:
            count = p.queues.count   # a more important class is waiting: an inversion
            if count[0] or (c > 1 and (count[1] or (c > 2 and count[2]))):
                b.inversions += 1
        pending = p.pending
        pending[c] = pending[c] - 1   # (not -=, as in _register)
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
        self._push_action((act.DISPATCH, e, lease, attempt))
        if self._emit_all:
            self._event(e, RUNNING, now, None)

    def _end_attempt(self, e: Entry, now: int, ok: bool | None) -> None:
        """The attempt of ``e`` stops holding its slot and semaphores. ``ok``
        says how it ran, for the metrics; None: it never started (given back)."""
        p = e.pool
        w = p.window
        if now > w.last_t:
            w.integrate(now)
        busy = p.busy - 1
        p.busy = busy
        w.busy = busy
        group = e.group
        assert group is not None
        group.busy -= 1
        x = e.x
        regular = x is None or x.start is None
        if ok is not None:
            run = now - e.started
            b = w.current if now < w.current_end else w.bucket(now)
            b.attempt_time += run
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
            if p.scaler is not None:
                p.scaler.observe_run(run)
        if not regular:
            p.started_fixed.discard(e.id)
        if p.lease_ttl is not None:
            self._timers_ended += 1
        spec = e.spec
        if spec is not None:
            if spec.timeout_ns is not None:
                self._timers_ended += 1
            if spec.resources:
                resources = self.resources
                for name, units in spec.resources.items():
                    r = resources[name]
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
        policy = self._policy(e)
        if e.attempt >= policy.max_attempts:
            text = f"gave up after {e.attempt} attempt{'s' if e.attempt != 1 else ''}"
            self._finish(e, DEAD_LETTERED, now, f"{text}: {message}" if message else text)
            return
        delay = self._backoff(policy, e.attempt)
        if retry_after_ns is not None and retry_after_ns > delay:
            delay = retry_after_ns
        self._count_pending(e)
        self._counts["retries"] += 1
        self._wait_retry(e, now, delay)
        self._announce(e, RETRYING, now, message)

    def max_attempts(self, e: Entry) -> int:
        """The attempts a live task's retry policy allows."""
        return self._policy(e).max_attempts

    def _policy(self, e: Entry) -> RetryPolicy:
        spec = e.spec
        return spec.retry if spec is not None and spec.retry is not None else e.pool.retry

    def _backoff(self, policy: RetryPolicy, attempt: int) -> int:
        """The wait after attempt number ``attempt``: the policy's backoff or,
        with jitter, a uniformly random fraction of it."""
        delay = policy.backoff_ns(attempt + 1)
        if policy.jitter and delay:
            delay = int(self.rng.random() * delay)
        return delay

    def _count_pending(self, e: Entry) -> None:
        """``e`` stopped running without ending: it is pending again."""
        p = e.pool
        p.pending[e.cls] += 1
        p.pending_total += 1
        self.pending += 1

    def _wait_retry(self, e: Entry, now: int, delay: int) -> None:
        """``e`` becomes ready again after ``delay``, with its attempt count as it is."""
        e.status = RETRYING
        self.timers.push(now + delay, tm.RETRY, e, e.attempt)

    def _announce(self, e: Entry, status: Status, now: int, message: str | None) -> None:
        """A transition that is not an ending: persisted, and an event if transitions are emitted."""
        if self._persist:
            self.actions.append((act.PERSIST, (MUT_STATUS, e.id, status, e.attempt, now, message)))
        if self._emit_all:
            self._event(e, status, now, message)

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
        self._end_attempt(e, now, None)
        e.attempt -= 1
        self._count_pending(e)
        if delay_ns:
            self._wait_retry(e, now, delay_ns)
            self._announce(e, RETRYING, now, message)
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

    def _finish(self, e: Entry, status: Status, now: int, message: str | None) -> None:
        """End a task (and, transitively, the dependents it dooms)."""
        stack = [(e, status, message)]
        while stack:
            e, status, message = stack.pop()
            if e.status in TERMINAL:
                continue
            self._leave(e, status, now)
            self._ended(e, status, now, message)
            children = e.children
            if children:
                e.children = None
                satisfied = None
                for child, cond in children:
                    if child.status in TERMINAL:
                        continue
                    reason = _unmet(e.key or e.id, status, cond)
                    if reason is None:
                        child.unmet -= 1
                        if child.unmet == 0 and child.status is BLOCKED:
                            if satisfied is None:
                                satisfied = []
                            satisfied.append(child)
                    else:
                        stack.append((child, SKIPPED, reason))
                if satisfied:
                    for child in satisfied:
                        if child.status is BLOCKED:
                            self._to_ready(child, now)

    def _leave(self, e: Entry, ending: Status, now: int) -> None:
        """A task about to end lets go of everything it holds or waits in:
        its attempt, its place in line, a held slot, its booking, its awaited
        keys, the resource units it was parked for or offered."""
        p = e.pool
        status = e.status
        c = e.cls
        if status is RUNNING:
            if self.running.get(e.lease) is e:   # still running: abort it
                del self.running[e.lease]
                self.actions.append((act.ABORT, e.lease, e.id, ending))
                self._end_attempt(e, now, False)
        else:
            if status is BLOCKED or status is SCHEDULED:
                p.inactive[c] -= 1
            elif status is RETRYING:
                self._timers_ended += 1
            elif status is READY:
                where = e.where
                if where == W_QUEUE:
                    p.queues.discard(e)
                elif where == W_DUE:
                    p.due_n[c] -= 1
                elif where == W_LABEL:
                    p.label_waiting -= 1
            p.pending[c] -= 1
            p.pending_total -= 1
            self.pending -= 1
        e.where = W_NONE
        x = e.x
        if x is None:
            return
        # Its start, hold and miss timers, or its await timeout, are stale now.
        self._timers_ended += 3 if x.start is not None else 1
        if x.hold:
            x.hold = False
            p.held -= 1
            self._mark_dirty(p)
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

    def _ended(self, e: Entry, status: Status, now: int, message: str | None) -> None:
        """The bookkeeping of an ending: the task is no longer live, its record
        is retained (or its key forgotten), counted, announced and persisted."""
        task_id = e.id
        e.status = status
        del self.tasks[task_id]
        spec = e.spec
        p = e.pool
        if spec is None:
            tenant = None
            max_attempts = p.max_attempts
        else:
            tenant = spec.tenant
            max_attempts = self._policy(e).max_attempts
        if self._retain_on:
            self.retained[task_id] = (_SUCCEEDED_TEXT if status is SUCCEEDED else _PLAIN[status], p.name, e.key,
                                      e.kind, e.attempt, message, tenant, max_attempts)
            expiry = now + self._retention
            if self._retain_due == _NEVER:   # (the order was empty)
                self._retain_due = expiry
            self._push_retained((expiry, task_id))
            if len(self.retained) > self._retain_max:
                self._expire_retained(now, True)
        elif e.key is not None:
            self._forget_key(e)
        if status is SUCCEEDED:
            self._succeeded += 1
        else:
            self._counts[status] += 1
        self._push_action((act.EVENT, task_id, p.name, e.key, status, e.attempt, now, message, tenant,
                           max_attempts))
        if self._persist:
            self.actions.append((act.PERSIST, (MUT_STATUS, task_id, status, e.attempt, now, message)))

    def _forget_key(self, e: Entry) -> None:
        key = e.key
        if key is not None and self.keys.get(key) == e.id:
            del self.keys[key]

    def _expire_retained(self, now: int, force: bool = False) -> None:
        order = self._retain_order
        retained = self.retained
        limit = self._retain_max
        while order and (order[0][0] <= now or (force and len(retained) > limit)):
            _, task_id = order.popleft()
            record = retained.pop(task_id, None)
            if record is not None and record[2] is not None and self.keys.get(record[2]) == task_id:
                del self.keys[record[2]]
        self._retain_due = order[0][0] if order else _NEVER

    # ================================================================ lookups

    def _live(self, ref: int | str) -> Entry | None:
        if isinstance(ref, str):
            task_id = self.keys.get(ref)
            if task_id is None:
                return None
            return self.tasks.get(task_id)
        if isinstance(ref, bool) or not isinstance(ref, int):
            raise TypeError(f"a task reference is an id (int) or a key (str), got {type(ref).__name__}")
        return self.tasks.get(ref)

    def _retained_record(self, ref: int | str) -> Record | None:
        task_id = self.keys.get(ref) if isinstance(ref, str) else ref
        if task_id is None:
            return None
        return self.retained.get(task_id)

    def _key_id(self, key: str) -> int | None:
        task_id = self.keys.get(key)
        if task_id is None:
            return None
        if task_id in self.tasks or task_id in self.retained:
            return task_id
        return None

    # ================================================================ events

    def _event(self, e: Entry, status: Status, now: int, message: str | None) -> None:
        spec = e.spec
        self.actions.append((act.EVENT, e.id, e.pool.name, e.key, status, e.attempt, now, message,
                             None if spec is None else spec.tenant, self._policy(e).max_attempts))

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
        spec = e.spec
        assert spec is not None and spec.resources is not None
        request = spec.resources
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

    def _give_up_offer(self, e: Entry, keep: ResourceState[Entry] | None, now: int) -> None:
        """``e`` was sent back to its queue with units in view and will not
        take them (it ended, or parked on another resource): the waiters of
        those resources may use them."""
        _extra(e).reoffered = False
        for name in _request(e):
            r = self.resources[name]
            if r is not keep and r.waiters:
                self._reoffer(r, now)

    def _arm_refill(self, r: ResourceState[Entry], now: int, promised: float = 0.0) -> None:
        """Wake up when the head waiter's tokens (beyond ``promised`` ones) are there."""
        head = r.head()
        if head is None:
            return
        at = now + r.ready_in(_request(head)[r.name] + promised, now)
        if r.refill_at is None or at < r.refill_at:
            r.refill_at = at
            self.timers.push(at, tm.REFILL, r, at)

    def _reoffer(self, r: ResourceState[Entry], now: int) -> None:
        """Send parked waiters back to their queues while the units last (FIFO)."""
        level = budget = r.level(now)
        while True:
            e = r.head()
            if e is None:
                return
            spec = e.spec
            x = e.x
            assert spec is not None and spec.resources is not None and x is not None
            need = spec.resources[r.name]
            if need > budget:
                break
            budget -= need
            r.waiters.popleft()
            x.parked_on = None
            x.reoffered = True
            self._to_ready_again(e)
        if not r.semaphore:
            self._arm_refill(r, now, level - budget)

    # ================================================================ labels

    def _label_park(self, p: PoolState, e: Entry) -> None:
        labels = _labels(e)
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
                        if e.status is READY and e.where == W_LABEL and _extra(e).hold]
                p.held_label_waiters = held
                for e in held:
                    if best is not None and e.id > best.id:
                        continue
                    group = self._group_for(p, _labels(e))
                    if group is not None:
                        best = e
                        best_group = group
            if best is None or best_group is None:
                return
            waiters = p.label_waiters[_labels(best)]
            if waiters[0] is best:
                waiters.popleft()
            else:
                waiters.remove(best)   # a held waiter from the middle of its line
            if best.x is not None and best.x.hold:
                p.held_label_waiters.remove(best)
            p.label_waiting -= 1
            best.where = W_NONE
            if best.spec is not None and best.spec.resources and not self._acquire(best, now):
                continue
            self._release_hold(p, best)
            self._start(p, best, now, best_group)

    # ================================================================ fixed starts

    def _arm_fixed(self, e: Entry, now: int) -> None:
        x = _extra(e)
        start = x.start
        assert start is not None
        self.timers.push(max(now, start - self.config.max_hold_ns), tm.HOLD, e)
        self.timers.push(start, tm.START, e)
        self.timers.push(start + x.tolerance, tm.MISS, e)

    def _hold_lead(self, p: PoolState, tolerance: int) -> int:
        p90 = p.runs.pool_percentile(0.9)
        lead = max(tolerance, int(p90) if p90 is not None else 0)
        return min(lead, self.config.max_hold_ns)

    def _check_hold(self, e: Entry, now: int) -> None:
        x = _extra(e)
        if x.hold or e.attempt > 0 or e.status is RUNNING:
            return
        if e.status is BLOCKED:
            # No hold before the dependencies are met: the slot may be the one a
            # parent needs. _to_ready checks again when the task is unblocked.
            return
        lead = self._hold_lead(e.pool, x.tolerance)
        assert x.start is not None
        if now < x.start - lead:
            self.timers.push(x.start - lead, tm.HOLD, e)
            return
        p = e.pool
        if p.capacity - p.busy - p.held > 0:
            self._grant_hold(p, e)
        else:
            p.hold_waiters.append(e)

    def _grant_hold(self, p: PoolState, e: Entry) -> None:
        _extra(e).hold = True
        p.held += 1
        if e.status is READY and e.where == W_LABEL:
            p.held_label_waiters.append(e)   # already waiting for a labelled slot

    def _release_hold(self, p: PoolState, e: Entry) -> None:
        x = e.x
        if x is not None and x.hold:
            x.hold = False
            p.held -= 1

    def _on_start(self, e: Entry, now: int) -> None:
        x = _extra(e)
        guard = x.guard
        if guard is not None and guard in self.tasks:
            rec = self.recurring.get(x.recurring) if x.recurring is not None else None
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
        x = _extra(e)
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
            if e.status in TERMINAL or e.status is RUNNING or e.attempt > 0 or _extra(e).hold:
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
            held = _extra(e).hold
            if not held and p.capacity - p.busy - p.held <= 0:
                keep.append(item)
                continue
            group = self._group_for(p, _labels(e))
            p.due_n[e.cls] -= 1
            if group is None:
                e.where = W_NONE
                self._label_park(p, e)
                continue
            e.where = W_NONE
            if e.spec is not None and e.spec.resources and not self._acquire(e, now):
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
        assert scaler is not None
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
        assert p.scaler is not None
        horizon = int(p.scaler.config.reservation_horizon * NS)
        return p.calendar.peak(now, now + horizon, exclude=p.started_fixed)

    def _autoscale(self, p: PoolState, now: int) -> None:
        scaler = p.scaler
        assert scaler is not None
        scaler.armed = None
        reserved = self._reserved(p, now)
        before = scaler.target
        backlog = self._backlog(p)
        target = scaler.evaluate(now, backlog, p.busy, reserved)
        if p.config.external_capacity:
            if target != before:   # asked for; capacity changes when workers come or go
                self.actions.append((act.SCALE, p.name, target))
        elif target != before or target != p.capacity:
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
        interrupted: dict[int, Status] = {}  # live ids stored as running or retrying
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
            problem = t.error
            if problem is None:
                assert spec is not None   # (only an undecodable row has none, with its error)
                problem = self._unconfigured(t.pool, spec)
            if problem is not None:
                quarantined.append(task_id)
                message = f"quarantined at recovery: {problem}"
                ended.append(RestoredTask(task_id, t.pool, spec, t.submitted_ns, FAILED, t.attempt,
                                          message, now))
                self.actions.append((act.EVENT, task_id, t.pool, None, FAILED, t.attempt, now, message,
                                     None if spec is None else spec.tenant, None))
                if self._persist:
                    self.actions.append((act.PERSIST, (MUT_STATUS, task_id, FAILED, t.attempt, now, message)))
                continue
            assert spec is not None
            p = self.pools[t.pool]
            e = self._create(p, spec, now, t)
            if status == RUNNING or status == RETRYING:
                interrupted[task_id] = RUNNING if status == RUNNING else RETRYING
            if not spec.plain:
                if spec.deadline_at_ns is not None:
                    self._set_deadline(e, spec, spec.deadline_at_ns)
                if spec.start_at_ns is not None:
                    start = spec.start_at_ns
                    tol = spec.tolerance_ns if spec.tolerance_ns is not None else NS
                    est = self._estimate(p, spec)
                    self._book(e, start, tol, spec.on_miss, start - tol, start + est + tol)
                    if spec.tags and "cronoq.recurring" in spec.tags:
                        _extra(e).recurring = spec.tags["cronoq.recurring"]
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
                tenant = t.spec.tenant if t.spec is not None else None
                pool = self.pools.get(t.pool)
                retry = t.spec.retry if t.spec is not None and t.spec.retry is not None else \
                    pool.retry if pool is not None and t.spec is not None else None
                self.retained[t.id] = (_PLAIN[t.status], t.pool, key, kind, t.attempt, t.message, tenant,
                                       None if retry is None else retry.max_attempts)
                self._retain_order.append((expires, t.id))
                if key is not None and keys.get(key) not in live_tasks:   # a live task keeps its key
                    keys[key] = t.id
            self._retain_due = self._retain_order[0][0] if self._retain_order else _NEVER
        del ended
        doomed: dict[int, str] = {}
        for e in entries:
            spec = e.spec
            if spec is None or not spec.edges:
                continue
            parents = []
            awaits: list[tuple[str, str]] = []
            for ref, cond in spec.edges:
                parent_id = keys.get(ref) if isinstance(ref, str) else ref
                parent = live_tasks.get(parent_id) if parent_id is not None else None
                if parent is not None and parent is not e:
                    self._link(parent, e, cond)
                    parents.append(parent.id)
                    continue
                record = self.retained.get(parent_id) if parent_id is not None else None
                if record is not None:
                    reason = _unmet(ref, record[0], cond)
                    if reason is not None:
                        doomed.setdefault(e.id, reason)
                elif isinstance(ref, str) and e.pool.config.unknown_dependency == "await" \
                        and parent_id is None:
                    awaits.append((ref, cond))
                # Otherwise the parent finished before the retention window: satisfied.
            if parents:
                e.extra().parents = tuple(parents)
            if awaits:
                self._await_keys(e, awaits, now)
        for e in entries:
            if doomed or interrupted:
                if e.status in TERMINAL:   # skipped meanwhile: a parent that ended doomed it
                    continue
                if e.id in doomed:
                    self._finish(e, SKIPPED, now, doomed[e.id])
                    continue
            stored = interrupted.get(e.id) if interrupted else None
            if stored is None:
                self._place(e, now)
                continue
            policy = self._policy(e)
            if stored is RUNNING and e.attempt >= policy.max_attempts:
                self._finish(e, DEAD_LETTERED, now,
                             f"attempt {e.attempt} was interrupted by a scheduler restart and no "
                             f"attempts remain")
                continue
            delay = 0
            if stored is RUNNING:
                delay = self._backoff(policy, e.attempt)
                self._counts["retries"] += 1
                if self._persist:
                    self.actions.append((act.PERSIST, (MUT_STATUS, e.id, RETRYING, e.attempt, now,
                                                       "interrupted by a scheduler restart")))
            self._wait_retry(e, now, delay)
        for s in schedules:
            self._restore_schedule(s, now)
        self._next_id = max(self._next_id, top + 1, self._first_id())
        self._flush(now)
        return quarantined

    def _restore_schedule(self, s: RestoredSchedule, now: int) -> None:
        template = s.template
        problem = s.error
        if problem is None and template is not None:
            problem = self._unconfigured(template.pool or self.default_pool.name, template)
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
            self._check_resources(template.resources, "the template")
        tol = to_ns(tolerance, "tolerance", error=ValueError) if tolerance is not None else (
            template.tolerance_ns if template.tolerance_ns is not None else NS)
        miss = on_miss if on_miss is not None else template.on_miss
        if miss not in MISS_POLICIES:
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
        due = rec.next_start
        p = self._pool(rec.template.pool)
        if due is None:
            return
        start: int | None = due
        if now > due + rec.tolerance_ns:
            # Skipped ahead (downtime): one late occurrence at most, then resume.
            if rec.on_miss != "run_late":
                self._counts["missed"] += 1
                start = None
        if start is not None:
            self._create_occurrence(rec, start, now)
        nxt = rec.cron.next_after(max(now, due))
        rec.next_start = nxt
        if self._persist:
            self.actions.append((act.PERSIST, (MUT_RECURRING, rec.name, rec)))
        self._arm_recurring(rec, p, now)

    def _create_occurrence(self, rec: Recurring, start: int, now: int) -> None:
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
                and self.retained[prev][0] == SKIPPED):
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
                        now / NS, window=self.config.metrics_window_ns / NS)

    def reservations(self, now: int, ahead_ns: int, pools: Iterable[str] | None = None) -> list[Reservation]:
        """The fixed-start tasks of ``pools`` (None: every pool) that have not
        started yet and start before ``now + ahead_ns`` or already hold a slot,
        by start time (read-only). Only each pool's calendar is read, up to
        the bookings that begin past that horizon (a hold begins at most
        max_hold before its start): not the other tasks."""
        chosen = self.pools.values() if pools is None else [self.pools[n] for n in pools if n in self.pools]
        until = now + ahead_ns
        scan = now + max(ahead_ns, self.config.max_hold_ns)
        out = []
        for p in chosen:
            for _, _, task_id in p.calendar.booked_before(scan):
                e = self.tasks.get(task_id)
                if e is None or e.attempt > 0 or e.status is RUNNING or e.status in TERMINAL:
                    continue
                x = e.x
                if x is None or x.start is None or not (x.start < until or x.hold):
                    continue
                out.append(Reservation(e.id, p.name, e.key, e.kind, x.start, x.tolerance, x.hold, e.deadline))
        out.sort(key=lambda r: (r.start, r.id))
        return out

    def _pool_snapshot(self, p: PoolState, now: int) -> PoolSnapshot:
        w = p.window
        w.integrate(now)
        dispatched = succeeded = failed = inversions = hits = fixed = 0
        busy_time = capacity_time = good = attempt_time = 0
        by_class = [Histogram() for _ in range(4)]
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
            for merged, waits_of_class in zip(by_class, b.waits):
                merged.merge(waits_of_class)
        waits = Histogram()
        for merged in by_class:
            waits.merge(merged)

        def seconds(v: float | None) -> float | None:
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
            wait_p50_s_by_class=[seconds(h.percentile(0.5)) or 0.0 for h in by_class],
            wait_p99_s_by_class=[seconds(h.percentile(0.99)) or 0.0 for h in by_class],
            worker_seconds=worker_seconds,
            cost=worker_seconds * cost_rate,
            groups=[GroupSnapshot(dict(g.labels), g.capacity, g.busy)
                    for g in sorted(p.groups.values(), key=lambda g: (len(g.labels), sorted(g.labels)))],
        )

def _entry(plan: Plan) -> Entry:
    """The entry an applied plan created."""
    e = plan.entry
    assert e is not None
    return e


def _extra(e: Entry) -> Extra:
    """The extras of a task known to have them (a fixed start, an awaited key, a parked task)."""
    x = e.x
    assert x is not None
    return x


def _request(e: Entry) -> dict[str, int]:
    """The resource units of a task known to ask for some."""
    spec = e.spec
    assert spec is not None and spec.resources is not None
    return spec.resources


def _labels(e: Entry) -> Labels | None:
    """The labels of a task that waits for a labelled slot (None: a held
    fixed start without labels, waiting for any slot)."""
    spec = e.spec
    return spec.labels if spec is not None else None


def _unmet(ref: object, status: str, cond: str) -> str | None:
    """Why an edge on a parent that ended with ``status`` can never be satisfied, or None if it is."""
    if status in _SATISFIES[cond]:
        return None
    return f"dependency {ref!r} ended {status}"
