"""The engine's internal consistency, checked from outside its rules.

``check_invariants`` recounts every cached count (pending, queued, busy,
held, per class and per group) from the live tasks, checks that every task
waits where it says it waits, that resources account for every unit, and a
liveness property: between calls, nothing waits for a slot it could take.
Tests call it after every engine step; the engine never calls it itself.
"""

from __future__ import annotations

from typing import Callable, Protocol

from .model import W_DUE, W_LABEL, W_NONE, W_PARKED, W_QUEUE, Edge, Entry, Labels, PoolState, Record
from .resources import ResourceState
from .types import BLOCKED, READY, RUNNING, SCHEDULED, TERMINAL, CoreConfig

__all__ = ["Inspected", "check_invariants"]


class Inspected(Protocol):
    """The engine's state these checks read (a ``Core``); declared here so
    that the engine may offer ``Core.check_invariants`` without a cycle."""

    @property
    def config(self) -> CoreConfig: ...
    @property
    def pools(self) -> dict[str, PoolState]: ...
    @property
    def resources(self) -> dict[str, ResourceState[Entry]]: ...
    @property
    def tasks(self) -> dict[int, Entry]: ...
    @property
    def running(self) -> dict[int, Entry]: ...
    @property
    def keys(self) -> dict[str, int]: ...
    @property
    def retained(self) -> dict[int, Record]: ...
    @property
    def awaiting(self) -> dict[str, list[Edge]]: ...
    @property
    def pending(self) -> int: ...
    @property
    def dispatching(self) -> bool: ...
    @property
    def settled(self) -> bool: ...


def _request(e: Entry) -> dict[str, int]:
    """The resource units a task asks for (one parked on a resource asks for some)."""
    assert e.spec is not None and e.spec.resources is not None
    return e.spec.resources


def check_invariants(core: Inspected) -> None:
    """Assert the engine's internal consistency (tests call this after every step)."""
    def check(condition: bool, message: str) -> None:
        if not condition:
            raise AssertionError(message)

    pending = 0
    for p in core.pools.values():
        counts = [0, 0, 0, 0]
        inactive = [0, 0, 0, 0]
        due = [0, 0, 0, 0]
        queued = [0, 0, 0, 0]
        busy = 0
        held = 0
        label_waiting = 0
        group_busy: dict[Labels, int] = {}
        for e in core.tasks.values():
            if e.pool is not p:
                continue
            check(e.status not in TERMINAL, f"{e} is ended but still live")
            if e.status is RUNNING:
                busy += 1
                check(e.group is not None, f"{e} is running in no worker group")
                labels = e.group.labels   # type: ignore[union-attr]
                group_busy[labels] = group_busy.get(labels, 0) + 1
                check(core.running.get(e.lease) is e, f"{e} is running without its lease")
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
                    waiters = e.x.parked_on.waiters   # type: ignore[union-attr]
                    check(e in waiters, f"{e} missing from its resource's waiters")
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
        if core.settled:
            _check_liveness(core, p, check)
    check(core.pending == pending, f"pending {core.pending} != {pending}")
    for lease, e in core.running.items():
        check(e.status is RUNNING and e.lease == lease, f"lease {lease} maps to {e}")
    for key, task_id in core.keys.items():
        check(task_id in core.tasks or task_id in core.retained, f"key {key!r} maps to a forgotten task")
    for e in core.tasks.values():
        if e.key is not None:
            check(core.keys.get(e.key) == e.id, f"{e} is not found by its key")
    check(len(core.retained) <= max(core.config.retention_max, 0), "retention over its bound")
    for r in core.resources.values():
        if r.semaphore:
            held_units = sum(e.spec.resources.get(r.name, 0) for e in core.running.values()
                             if e.spec is not None and e.spec.resources)
            check(r.available + held_units == r.capacity,
                  f"resource {r.name}: {r.available} free + {held_units} held != {r.capacity}")
            head = r.head()
            if head is not None and core.dispatching:
                need = _request(head)[r.name]
                # Liveness: free permits are either offered to tasks on their way
                # to a slot, or too few for the first waiter.
                offered = sum(e.spec.resources.get(r.name, 0) for e in core.tasks.values()
                              if e.status is READY and e.where != W_PARKED and e.x is not None
                              and e.x.reoffered and e.spec is not None and e.spec.resources)
                check(r.available - offered < need,
                      f"resource {r.name}: {r.available} permits free ({offered} offered) while "
                      f"{head} waits for {need}")
        else:
            check(r.tokens <= r.capacity + 1e-9, f"resource {r.name}: bucket over its burst")
    for key, waiting in core.awaiting.items():
        for child, _ in waiting:
            check(child.status in TERMINAL or (child.x is not None and key in (child.x.awaits or ())),
                  f"{child} awaits {key!r} without knowing it")


def _check_liveness(core: Inspected, p: PoolState, check: Callable[[bool, str], None]) -> None:
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
            check(core.tasks.get(e.id) is not e or e.attempt > 0 or e.status is RUNNING
                  or (e.x is not None and e.x.hold),
                  f"pool {p.name}: {e} waits for a hold while {free} slots are free")
    for e in core.tasks.values():
        if e.pool is not p or e.status is not READY:
            continue
        if not (free > 0 or (e.x is not None and e.x.hold)):
            continue
        if e.where == W_DUE:
            check(False, f"pool {p.name}: {e} is due and may take a slot, but waits")
        elif e.where == W_LABEL:
            # (a held fixed start without labels can wait here too)
            labels = (e.spec.labels if e.spec is not None else None) or frozenset()
            fits = [dict(g.labels) for g in open_groups if labels <= g.labels]
            check(not fits, f"pool {p.name}: {e} waits for labels {dict(labels)} "
                            f"while matching groups {fits} have free slots")
