"""Why a task waits, read from the engine's state (``Core.explain``).

Read-only: nothing here changes a queue, fires a timer or queues an action.
The answer is the task's status, its pool and class, its dispatch score (the
one the ready queues compare), its place among the pool's queued ready tasks
and every reason it is not running yet, each with a code from ``REASONS``.
Running and ended tasks get their status and no reasons. Times in the
answer are Unix seconds; a task's place is worked out by merging the pool's
queues the way ``ReadyQueues.take`` does, at ``now``, without taking anything.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Protocol

from . import timers as tm
from .errors import UnknownTask
from .model import W_DUE, W_LABEL, W_PARKED, W_QUEUE, Entry, Group, PoolState, Record
from .resources import ResourceState
from .timers import Timer
from .types import BLOCKED, CLASSES, NS, READY, RETRYING, RUNNING, SCHEDULED

__all__ = ["REASONS", "Reason", "Explanation", "Explained", "explain"]

# The closed set of reason codes, in the order they are reported.
REASONS = ("dependencies", "awaiting_key", "start_time", "labels", "resource", "hold", "fair_share",
           "pool_full", "next")


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason a task waits: ``code`` from ``REASONS``, a sentence, and
    its figures (plain JSON values: which parents, which labels, units...)."""

    code: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Explanation:
    """Where a task stands and why it is not running (see the module docstring).

    ``score`` and ``position`` are set for a ready task waiting in its pool's
    queues (``position`` 1: the next one the pool starts); ``queued`` is how
    many ready tasks wait in those queues. ``at``: the engine time (Unix s)."""

    id: int
    status: str
    pool: str
    priority: str
    key: str | None
    tenant: str | None
    at: float
    summary: str
    score: float | None = None
    position: int | None = None
    queued: int = 0
    reasons: tuple[Reason, ...] = ()

    @property
    def waiting(self) -> bool:
        return bool(self.reasons)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "pool": self.pool, "priority": self.priority,
                "key": self.key, "tenant": self.tenant, "at": self.at, "summary": self.summary,
                "score": self.score, "position": self.position, "queued": self.queued,
                "reasons": [{"code": r.code, "message": r.message, "detail": r.detail} for r in self.reasons]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Explanation:
        reasons = tuple(Reason(r["code"], r["message"], dict(r.get("detail") or {})) for r in data["reasons"])
        return cls(data["id"], data["status"], data["pool"], data["priority"], data.get("key"),
                   data.get("tenant"), data["at"], data["summary"], data.get("score"), data.get("position"),
                   data.get("queued", 0), reasons)


class Explained(Protocol):
    """The engine's state an explanation reads (a ``Core``)."""

    @property
    def now(self) -> int: ...
    @property
    def tasks(self) -> dict[int, Entry]: ...
    @property
    def keys(self) -> dict[str, int]: ...
    @property
    def retained(self) -> dict[int, Record]: ...
    @property
    def resources(self) -> dict[str, ResourceState[Entry]]: ...
    @property
    def timer_heap(self) -> list[Timer]: ...


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def _at(ns: int) -> float:
    return ns / NS


def explain(core: Explained, ref: int | str, now: int) -> Explanation:
    """The explanation of task ``ref`` (id or key) at ``now``; ``UnknownTask``
    if the engine knows no such task, live or retained."""
    now = max(now, core.now)
    task_id = core.keys.get(ref) if isinstance(ref, str) else ref
    e = core.tasks.get(task_id) if task_id is not None else None
    if e is None:
        record = core.retained.get(task_id) if task_id is not None else None
        if record is None or task_id is None:
            raise UnknownTask(ref)
        status, pool, key, _kind, attempt, message, tenant, _max_attempts = record
        summary = f"It is not waiting: it ended {status}" + (f" ({message})." if message else ".")
        # (a retained record keeps no class)
        return Explanation(task_id, status, pool, "", key, tenant, _at(now), summary)
    spec = e.spec
    tenant = spec.tenant if spec is not None else None
    if e.status is RUNNING:
        return Explanation(e.id, e.status.value, e.pool.name, CLASSES[e.cls], e.key, tenant, _at(now),
                           f"It is not waiting: attempt {e.attempt} is running since {_at(e.started):.3f}.")
    reasons: list[Reason] = []
    p = e.pool
    score: float | None = None
    position: int | None = None
    queued = p.queues.total
    if e.status is BLOCKED:
        _dependencies(core, e, reasons)
    elif e.status is SCHEDULED:
        _fixed_start(e, now, reasons)
        _hold(e, reasons)
    elif e.status is RETRYING:
        _backoff(core, e, now, reasons)
    elif e.status is READY:
        if e.where == W_QUEUE:
            score = round(p.queues.score(e, now), 3)
            position = _position(p, e, now)
            _labels(p, e, reasons, waiting=False)
            _resources(core, e, now, reasons, parked=False)
            _fair_share(p, e, reasons)
            _pool_full(p, reasons)
        elif e.where == W_PARKED:
            _resources(core, e, now, reasons, parked=True)
        elif e.where == W_LABEL:
            _labels(p, e, reasons, waiting=True)
            _hold(e, reasons)
            if not (e.x is not None and e.x.hold):
                _pool_full(p, reasons)
        elif e.where == W_DUE:
            _fixed_start(e, now, reasons)
            _hold(e, reasons)
            if not (e.x is not None and e.x.hold):
                _pool_full(p, reasons)
        if not reasons:
            reasons.append(Reason("next", "Nothing holds it back: the pool starts it at its next dispatch step.",
                                  {"position": position}))
    reasons.sort(key=lambda r: REASONS.index(r.code))
    summary = _summary(e, reasons, position)
    return Explanation(e.id, e.status.value, p.name, CLASSES[e.cls], e.key, tenant, _at(now), summary,
                       score, position, queued, tuple(reasons))


def _summary(e: Entry, reasons: list[Reason], position: int | None) -> str:
    head = reasons[0].message if reasons else ""
    if e.status is READY and position is not None:
        place = "next in line" if position == 1 else f"number {position} in line"
        return f"Ready as {CLASSES[e.cls]}, {place}. {head}"
    return f"{e.status.value.capitalize()}. {head}"


# ---------------------------------------------------------------- the reasons


def _dependencies(core: Explained, e: Entry, reasons: list[Reason]) -> None:
    x = e.x
    unmet = []
    for parent_id in (x.parents if x is not None else ()):
        parent = core.tasks.get(parent_id)
        if parent is None:
            continue   # it ended, satisfying the edge (else this task would have been skipped)
        condition = "success"
        for child, cond in parent.children or ():
            if child is e:
                condition = cond
                break
        unmet.append({"id": parent.id, "key": parent.key, "status": parent.status.value, "condition": condition})
    if unmet:
        names = ", ".join(f"{d['key'] or d['id']} ({d['status']}, needs {d['condition']})" for d in unmet)
        reasons.append(Reason("dependencies", f"It waits for {_plural(len(unmet), 'dependency', 'dependencies')} "
                                              f"to end: {names}.", {"unmet": unmet}))
    awaits = x.awaits if x is not None else None
    if awaits:
        timeout = e.pool.config.await_timeout_ns
        reasons.append(Reason(
            "awaiting_key", f"It depends on {_plural(len(awaits), 'key')} no task has yet: {', '.join(awaits)}"
                            + (f" (it is skipped if they do not appear within {timeout / NS:g} s)." if timeout
                               else "."),
            {"keys": list(awaits), "timeout_s": None if timeout is None else timeout / NS}))


def _fixed_start(e: Entry, now: int, reasons: list[Reason]) -> None:
    x = e.x
    assert x is not None and x.start is not None
    detail = {"kind": "fixed_start", "at": _at(x.start), "tolerance_s": x.tolerance / NS, "on_miss": x.on_miss}
    if x.start > now:
        message = f"It has a fixed start at {_at(x.start):.3f}, in {(x.start - now) / NS:g} s."
    else:
        message = f"Its fixed start at {_at(x.start):.3f} has come ({(now - x.start) / NS:g} s ago)."
    reasons.append(Reason("start_time", message, detail))


def _hold(e: Entry, reasons: list[Reason]) -> None:
    x = e.x
    if x is not None and x.hold:
        reasons.append(Reason("hold", "A slot of its pool is held for its fixed start.", {"held": True}))
    elif e.status is SCHEDULED and any(w is e for w in e.pool.hold_waiters):
        reasons.append(Reason("hold", "Its fixed start is near, but no slot of its pool is free to hold for it "
                                      "yet: it gets the first one that frees up.", {"held": False}))


def _retry_at(core: Explained, e: Entry) -> int | None:
    """When the retry timer of ``e`` fires (the live one: its token is the attempt)."""
    at = None
    for when, _seq, kind, obj, token in core.timer_heap:
        if kind == tm.RETRY and obj is e and token == e.attempt and (at is None or when < at):
            at = when
    return at


def _backoff(core: Explained, e: Entry, now: int, reasons: list[Reason]) -> None:
    at = _retry_at(core, e)
    detail: dict[str, Any] = {"kind": "retry", "attempt": e.attempt, "at": None if at is None else _at(at)}
    if at is None:
        message = f"Attempt {e.attempt} failed; it waits out its retry backoff."
    else:
        message = f"Attempt {e.attempt} failed; it is ready again in {max(0, at - now) / NS:g} s (retry backoff)."
    reasons.append(Reason("start_time", message, detail))


def _matching(p: PoolState, labels: frozenset[tuple[str, str]]) -> list[Group]:
    return [g for g in p.groups.values() if labels <= g.labels and g.capacity > 0]


def _labels(p: PoolState, e: Entry, reasons: list[Reason], waiting: bool) -> None:
    spec = e.spec
    if spec is None or spec.labels is None:
        if waiting:   # a held fixed start without labels, waiting for any slot
            reasons.append(Reason("labels", "It waits for any free worker slot of its pool.", {"labels": {}}))
        return
    asked = dict(sorted(spec.labels))
    text = ", ".join(f"{k}={v}" for k, v in asked.items())
    groups = _matching(p, spec.labels)
    detail: dict[str, Any] = {"labels": asked, "groups": [
        {"labels": dict(sorted(g.labels)), "capacity": g.capacity, "busy": g.busy} for g in groups]}
    if waiting:
        line = p.label_waiters.get(spec.labels) or ()
        ahead = sum(1 for w in line if w.id < e.id and w.status is READY and w.where == W_LABEL)
        detail["position"] = ahead + 1
    if not groups:
        reasons.append(Reason("labels", f"No connected worker of pool {p.name} carries the labels {text}.", detail))
    elif all(g.busy >= g.capacity for g in groups):
        slots = sum(g.capacity for g in groups)
        reasons.append(Reason("labels", f"Every worker slot with the labels {text} is busy "
                                        f"({_plural(slots, 'slot')}).", detail))
    elif waiting:
        reasons.append(Reason("labels", f"It waits for a worker slot with the labels {text}.", detail))


def _resources(core: Explained, e: Entry, now: int, reasons: list[Reason], parked: bool) -> None:
    spec = e.spec
    if spec is None or not spec.resources:
        return
    x = e.x
    for name, units in spec.resources.items():
        r = core.resources[name]
        if parked and (x is None or x.parked_on is not r):
            continue
        level = r.available if r.semaphore else _bucket_level(r, now)
        waiters = [w for w in r.waiters if w.status is READY and w.x is not None and w.x.parked_on is r]
        if not parked and level >= units and not waiters:
            continue
        detail: dict[str, Any] = {"resource": name, "kind": "semaphore" if r.semaphore else "token_bucket",
                                  "units": units, "available": level, "capacity": r.capacity,
                                  "parked": parked, "waiting": len(waiters)}
        if parked:
            position = next((i for i, w in enumerate(waiters, 1) if w is e), None)
            detail["position"] = position
            message = (f"It is parked on resource {name}: it asks for {units} "
                       f"{'unit' if units == 1 else 'units'}, {level:g} of {r.capacity} are free"
                       f" (number {position} of {len(waiters)} in its line).")
        else:
            message = (f"Resource {name} cannot give it {units} {'unit' if units == 1 else 'units'} now "
                       f"({level:g} of {r.capacity} free, {_plural(len(waiters), 'task')} parked): "
                       "it parks there when its turn comes.")
        reasons.append(Reason("resource", message, detail))


def _bucket_level(r: ResourceState[Entry], now: int) -> float:
    """A token bucket's level at ``now`` without refilling it (read-only)."""
    if now <= r.last:
        return r.tokens
    return min(float(r.capacity), r.tokens + (now - r.last) * r.rate)


def _fair_share(p: PoolState, e: Entry, reasons: list[Reason]) -> None:
    q = p.queues
    if q.fair is None or e.lst is not None or e.tag is None:
        return
    tenant = e.spec.tenant if e.spec is not None else None
    # Over its share: another tenant's task of the class goes first by its tag.
    ahead = {(x.spec.tenant if x.spec is not None else None) for tag, _, x in q.fair[e.cls]
             if tag < e.tag and x.status is READY and x.where == W_QUEUE}
    ahead.discard(tenant)
    if not ahead:
        return
    weight = q.weights.get(tenant, 1.0)
    reasons.append(Reason(
        "fair_share", f"Its tenant {tenant or '(none)'} has taken more than its share of {CLASSES[e.cls]} work "
                      f"(weight {weight:g}): other tenants' tasks go first.",
        {"tenant": tenant, "weight": weight, "ahead": sorted(ahead, key=lambda t: (t is None, t or ""))}))


def _pool_full(p: PoolState, reasons: list[Reason]) -> None:
    free = p.capacity - p.busy - p.held
    if free > 0:
        return
    detail = {"capacity": p.capacity, "busy": p.busy, "held": p.held, "desired": p.desired}
    if p.capacity == 0:
        message = f"No worker serves pool {p.name}: its capacity is 0 (it wants {p.desired})."
    else:
        held = f", {p.held} held for fixed starts" if p.held else ""
        message = f"Pool {p.name} has no free slot: {p.busy} of {p.capacity} busy{held}."
    reasons.append(Reason("pool_full", message, detail))


# ---------------------------------------------------------------- the place in line


def _live(entries: Iterable[Entry]) -> Iterator[Entry]:
    seen: set[int] = set()
    for x in entries:
        if x.status is READY and x.where == W_QUEUE and x.id not in seen:
            seen.add(x.id)
            yield x


def _in_order(heap: list[tuple[Any, int, Entry]]) -> Iterator[Entry]:
    """A queue heap's entries in order, popped from a copy (the queue is left as it is)."""
    copy = list(heap)
    while copy:
        yield heapq.heappop(copy)[2]


def _sequences(p: PoolState, c: int) -> tuple[Iterator[Entry], Iterator[Entry]]:
    """Class ``c``'s queued ready tasks in the order its two queues give them
    (lazily: finding a task near the head reads little of a long backlog)."""
    q = p.queues
    first = _live(q.lanes[c]) if q.fair is None else _live(_in_order(q.fair[c]))
    return first, _live(_in_order(q.deadlines[c]))


def _position(p: PoolState, e: Entry, now: int) -> int:
    """1 + how many queued tasks ``ReadyQueues.take`` would return before ``e`` at ``now``."""
    q = p.queues
    heads: list[tuple[Entry, Iterator[Entry]]] = []   # each queue's next task, and the rest
    for c in range(4):
        if q.count[c]:
            for seq in _sequences(p, c):
                head = next(seq, None)
                if head is not None:
                    heads.append((head, seq))
    taken = 0
    while heads:
        best_i = -1
        best: Entry | None = None
        best_score = 0.0
        for i, (cand, _) in enumerate(heads):
            s = q.score(cand, now)
            if best is None or s > best_score or (s == best_score and (cand.cls < best.cls or (
                    cand.cls == best.cls and cand.id < best.id))):
                best, best_score, best_i = cand, s, i
        if best is e:
            return taken + 1
        taken += 1
        rest = heads[best_i][1]
        following = next(rest, None)
        if following is not None:
            heads[best_i] = (following, rest)
        else:
            heads.pop(best_i)
    return taken + 1   # (not found: it is not in the queues)

