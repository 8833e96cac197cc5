"""Why a task is waiting, worked out from the server's public API.

The API reports a task's status, class, attempt and times, its pool's
capacity, desire and backlog, and the other ready tasks of the pool; it does
not report a task's deadline, dependencies, resource requests or labels.
The gateway remembers those options for the tasks it submitted itself
(``Remembered``), so for them the explanation is complete; for other tasks
it says what it could not see. The score and the queue position follow the
engine's published formula (docs/concepts.md, priorities and deadlines) with
the default configuration, which is the one cronoq-server runs.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..client import TaskInfo
from ..core.types import CLASSES, PriorityConfig, UrgencyConfig
from .models import DependencyView, Explanation, PoolView, pool_view, task_view, unix

__all__ = ["Remembered", "Memory", "score", "explain"]

WAITING = ("blocked", "scheduled", "ready", "retrying")
_PRIORITY = PriorityConfig()
_URGENCY = UrgencyConfig()
DEFAULT_DURATION = 1.0   # a server pool's default_duration_s before it learns one


@dataclass(frozen=True)
class Remembered:
    """The options of a task this gateway submitted that the API does not show."""

    deadline: float | None = None          # Unix seconds
    start: float | None = None             # Unix seconds
    duration_hint: float | None = None
    deps: tuple[tuple[int | str, str], ...] = ()
    resources: dict[str, int] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


class Memory:
    """The options of the most recent ``capacity`` tasks this gateway submitted."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._items: OrderedDict[int, Remembered] = OrderedDict()

    def remember(self, task_id: int, options: Remembered) -> None:
        self._items[task_id] = options
        self._items.move_to_end(task_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, task_id: int) -> Remembered | None:
        return self._items.get(task_id)


def score(priority: str, created: float | None, now: float, deadline: float | None = None,
          duration: float | None = None) -> float:
    """The engine's dispatch score: class base, plus aging, plus deadline urgency."""
    cls = CLASSES.index(priority) if priority in CLASSES else CLASSES.index("normal")
    age = max(0.0, now - created) if created is not None else 0.0
    value = _PRIORITY.base[cls] + min(_PRIORITY.aging_rate[cls] * age, _PRIORITY.age_cap[cls])
    if deadline is not None:
        d = duration if duration is not None else DEFAULT_DURATION
        slack = deadline - d - now
        horizon = max(d, _URGENCY.window)
        if slack < 0:
            value += _URGENCY.peak + min(_URGENCY.overdue_rate * -slack, _URGENCY.overdue_cap)
        elif slack < horizon:
            value += _URGENCY.peak * (1 - slack / horizon)
    return value


def _rank(priority: str) -> int:
    return CLASSES.index(priority) if priority in CLASSES else CLASSES.index("normal")


def _seconds(value: float) -> str:
    value = abs(value)
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def explain(info: TaskInfo, *, now: float | None = None, memory: Memory | None = None,
            pool: dict[str, Any] | None = None, pool_error: str | None = None,
            ready: list[TaskInfo] | None = None, ready_truncated: bool = False,
            dependency_status: dict[int | str, str | None] | None = None) -> Explanation:
    """The explanation for ``info``. ``pool`` is its pool's snapshot entry (or
    ``pool_error`` says why there is none), ``ready`` the ready tasks of the
    pool (``ready_truncated`` when the scan stopped early), and
    ``dependency_status`` the status of each remembered dependency."""
    now = time.time() if now is None else now
    known = memory.get(info.id) if memory is not None else None
    pool_state: PoolView | None = pool_view(pool) if pool is not None else None
    reasons: list[str] = []
    unknown: list[str] = []
    deps: list[DependencyView] = []
    task_score: float | None = None
    position: int | None = None

    if known is None:
        unknown.append("its deadline, dependencies, resource requests, labels and fixed start: the API does not "
                       "show them and this gateway did not submit it")
    if pool_error is not None:
        unknown.append(f"its pool's capacity and backlog: {pool_error}")

    status = info.status
    if status == "running":
        since = f" since {unix(info.started):%Y-%m-%d %H:%M:%S} UTC" if info.started is not None else ""
        summary = f"It is not waiting: attempt {info.attempt} of {info.max_attempts} is running{since}."
    elif status not in WAITING:
        summary = f"It is not waiting: it finished as {status}" + (f" ({info.message})." if info.message else ".")
    elif status == "blocked":
        if known is not None and known.deps:
            statuses = dependency_status or {}
            for ref, on in known.deps:
                deps.append(DependencyView(task=ref, on=on, status=statuses.get(ref)))
            pending = [d for d in deps if d.status is None or d.status in WAITING or d.status == "running"]
            for d in pending:
                reasons.append(f"it waits for task {d.task!r} to {'succeed' if d.on == 'success' else 'finish'}"
                               f" (now {d.status or 'unknown to the server'})")
            for d in deps:
                if d not in pending:
                    reasons.append(f"dependency {d.task!r} finished as {d.status} (condition: {d.on})")
            summary = (f"It is blocked on {len(pending)} unfinished dependenc{'y' if len(pending) == 1 else 'ies'}."
                       if pending else "It is blocked, but every dependency has finished: it is about to be "
                                       "released (or skipped, if a condition failed).")
        else:
            summary = "It is blocked: it waits for dependencies to finish."
            reasons.append("which dependencies is not shown by the API")
    elif status == "scheduled":
        if known is not None and known.start is not None:
            left = known.start - now
            summary = (f"It has a fixed start at {unix(known.start):%Y-%m-%d %H:%M:%S} UTC, "
                       + (f"in {_seconds(left)}." if left > 0 else f"{_seconds(left)} ago: it starts at once."))
        else:
            summary = "It has a fixed start that has not come yet."
    elif status == "retrying":
        summary = (f"Attempt {info.attempt} of {info.max_attempts} failed"
                   + (f" ({info.message})" if info.message else "")
                   + "; it waits out the retry backoff before the next attempt.")
    else:
        summary, task_score, position = _ready(info, now, known, pool_state, ready, ready_truncated, memory,
                                               reasons, unknown)

    if status in WAITING and pool_state is not None:
        if pool_state.desired > pool_state.capacity:
            reasons.append(f"pool {pool_state.name} wants {pool_state.desired} slots but has {pool_state.capacity}: "
                           "it needs more workers")
        if pool_state.capacity == 0 and status != "ready":
            reasons.append(f"no worker serves pool {pool_state.name} now (capacity 0)")
    return Explanation(
        task=task_view(info), waiting=status in WAITING, summary=summary, reasons=reasons,
        score=None if task_score is None else round(task_score, 1),
        deadline=unix(known.deadline) if known is not None else None, position=position,
        ready_in_pool=len(ready) if ready is not None and status == "ready" else None, dependencies=deps,
        resources=(known.resources or None) if known is not None else None,
        labels=(known.labels or None) if known is not None else None,
        start_at=unix(known.start) if known is not None else None, pool=pool_state, unknown=unknown)


def _ready(info: TaskInfo, now: float, known: Remembered | None, pool: PoolView | None,
           ready: list[TaskInfo] | None, truncated: bool, memory: Memory | None,
           reasons: list[str], unknown: list[str]) -> tuple[str, float, int | None]:
    """A ready task: its score, its place in the queue and what holds it."""

    def task_score(t: TaskInfo) -> float:
        other = memory.get(t.id) if memory is not None else None
        if other is None:
            return score(t.priority, t.created, now)
        return score(t.priority, t.created, now, other.deadline, other.duration_hint)

    mine = task_score(info)
    ahead = 0
    if ready is not None:
        key = (-mine, _rank(info.priority), info.id)
        ahead = sum(1 for t in ready if t.id != info.id and (-task_score(t), _rank(t.priority), t.id) < key)
    position = ahead + 1 if ready is not None else None
    place = (f"{ahead} ready task{'' if ahead == 1 else 's'} of its pool score higher"
             + (" (among those scanned)" if truncated else "")) if ready is not None else ""
    unknown.append("the deadlines of ready tasks this gateway did not submit, and fair share between tenants: "
                   "the position is an estimate")

    if pool is None:
        return (f"It is ready ({info.priority}, score {mine:.0f}) and waits for a free slot"
                + (f"; {place}." if place else "."), mine, position)
    free = pool.capacity - pool.busy - pool.held
    if pool.capacity == 0:
        summary = f"No worker serves pool {pool.name}: its capacity is 0 (desired {pool.desired})."
        reasons.append(summary[:-1])
    elif known is not None and known.labels and not any(
            all(g.labels.get(k) == v for k, v in known.labels.items()) for g in pool.groups if g.capacity > 0):
        labels = ", ".join(f"{k}={v}" for k, v in sorted(known.labels.items()))
        summary = f"No connected worker of pool {pool.name} carries the labels {labels}."
        reasons.append(summary[:-1])
    elif free <= 0:
        held = f" ({pool.held} held for fixed starts)" if pool.held else ""
        summary = f"All {pool.capacity} slots of pool {pool.name} are busy{held}; {place or 'it waits its turn'}."
        reasons.append(f"pool {pool.name} is full: {pool.busy} busy of {pool.capacity}{held}")
    elif known is not None and known.resources:
        units = ", ".join(f"{k}={v}" for k, v in sorted(known.resources.items()))
        summary = (f"Pool {pool.name} has {free} free slot{'' if free == 1 else 's'}, so it is most likely parked "
                   f"on a resource: it needs {units} and other tasks hold the units.")
        reasons.append(f"it is parked until the resource units {units} are free")
    else:
        summary = (f"Pool {pool.name} has {free} free slot{'' if free == 1 else 's'}: it should start at the next "
                   "dispatch.")
        if known is None:
            reasons.append("if it stays ready, it may need worker labels no worker has, or resource units "
                           "other tasks hold (the API does not show either)")
    if place:
        reasons.append(f"it is ready as {info.priority} with score {mine:.0f}; {place} (position {position})")
    if pool.pending_by_class:
        backlog = ", ".join(f"{n} {c}" for c, n in pool.pending_by_class.items() if n)
        if backlog:
            reasons.append(f"pool {pool.name} has {pool.pending} pending: {backlog}")
    return summary, mine, position
