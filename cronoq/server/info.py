"""What the serving leader remembers beside the engine: the info cache of
recent tasks (``InfoCache``, kept up to date by the status events) and the
buffered feeds of push streams (``LiveFeed``)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from typing import Any

from ..core.types import TERMINAL, TaskSpec

__all__ = ["InfoCache", "TaskMeta", "LiveFeed", "RecentEvents", "DEAD_LETTERS_KEPT", "ATTEMPTS_KEPT",
           "RECENT_EVENTS_KEPT"]


# ---------------------------------------------------------------- the info cache

# Dead-lettered tasks whose payload and options the leader keeps, to submit them again.
DEAD_LETTERS_KEPT = 1000
# Attempts of one task that Get reports (the latest ones).
ATTEMPTS_KEPT = 32


class TaskMeta:
    """What the serving leader remembers of a task beyond the engine's record."""

    __slots__ = ("pool", "key", "kind", "priority", "tenant", "tags", "max_attempts", "created_ns",
                 "started_ns", "finished_ns", "spec", "edges", "attempts", "labels")

    def __init__(self, spec: TaskSpec, pool: str, max_attempts: int, created_ns: int) -> None:
        # The submitted task (the engine holds the same object while the task
        # lives): kept after it ends only if it was dead-lettered, to submit it again.
        self.spec: TaskSpec | None = spec
        self.pool = pool
        self.key = spec.key
        self.kind = spec.kind
        self.priority = spec.priority
        self.tenant = spec.tenant
        self.tags = spec.tags
        self.max_attempts = max_attempts
        self.created_ns = created_ns
        self.started_ns: int | None = None
        self.finished_ns: int | None = None
        self.edges = spec.edges
        self.labels = spec.labels
        # [attempt, how it ended (None while it runs), message, started_ns, ended_ns], oldest first
        self.attempts: list[list[Any]] | None = None


# Tasks whose events arrived before their record was made (see InfoCache.early).
EARLY_KEPT = 4096
EARLY_EVENTS = 4 * ATTEMPTS_KEPT   # events kept of one such task


class InfoCache:
    """A bounded record of recent tasks (oldest forgotten first), kept up to
    date by the scheduler's status events.

    A task's first events can arrive before its record exists: with a store,
    the submit's answer and the events of the task's first attempt are
    released by the same commit, in no set order, and the record is made
    when the answer arrives. Such events wait in ``early`` (the newest
    ``EARLY_KEPT`` tasks' worth) and are applied when the record is put."""

    def __init__(self, limit: int, dead_letters: int = DEAD_LETTERS_KEPT) -> None:
        self.limit = limit
        self.entries: OrderedDict[int, TaskMeta] = OrderedDict()
        self.dead_letters = dead_letters
        self.dead: deque[int] = deque()     # dead-lettered tasks whose spec is kept, oldest first
        self.early: OrderedDict[int, list[tuple[str, int, int, str | None]]] = OrderedDict()
        # The reverse of the remembered tasks' edges: a dependency as written
        # (an id or a key) -> the remembered tasks that declared it, in id order.
        self.dependents: dict[int | str, list[int]] = {}

    def put(self, task_id: int, meta: TaskMeta) -> None:
        if not self.limit:
            return
        entries = self.entries
        old = entries.get(task_id)
        if old is not None:
            self._unlink(task_id, old)
        entries[task_id] = meta
        for ref, _ in meta.edges:
            self.dependents.setdefault(ref, []).append(task_id)
        if len(entries) > self.limit:
            oldest, gone = entries.popitem(last=False)
            self._unlink(oldest, gone)
        seen = self.early.pop(task_id, None)
        if seen is not None:
            for status, at_ns, attempt, message in seen:
                self.saw(task_id, status, at_ns, attempt, message)

    def _unlink(self, task_id: int, meta: TaskMeta) -> None:
        for ref, _ in meta.edges:
            ids = self.dependents.get(ref)
            if ids is not None:
                if task_id in ids:
                    ids.remove(task_id)
                if not ids:
                    del self.dependents[ref]

    def dependents_of(self, task_id: int, key: str | None) -> list[tuple[int, str]]:
        """The remembered tasks that declared a dependency on this task, by its
        id or by its key, as (id, condition) pairs in id order. A key is matched
        as written: a remembered task that named the key when another task held
        it is listed too."""
        found: dict[int, str] = {}
        for ref in (task_id, key):
            if ref is None:
                continue
            for child in self.dependents.get(ref, ()):
                meta = self.entries.get(child)
                if meta is None:
                    continue
                for edge_ref, cond in meta.edges:
                    if edge_ref == ref and child != task_id:
                        found.setdefault(child, cond)
        return sorted(found.items())

    def clear(self) -> None:
        self.entries.clear()
        self.early.clear()
        self.dependents.clear()

    def get(self, task_id: int) -> TaskMeta | None:
        return self.entries.get(task_id)

    def saw(self, task_id: int, status: str, at_ns: int, attempt: int = 0, message: str | None = None) -> None:
        meta = self.entries.get(task_id)
        if meta is None:
            if self.limit:
                early = self.early.get(task_id)
                if early is None:
                    early = self.early[task_id] = []
                    if len(self.early) > EARLY_KEPT:
                        self.early.popitem(last=False)
                if len(early) < EARLY_EVENTS:
                    early.append((status, at_ns, attempt, message))
            return
        attempts = meta.attempts
        if attempts and attempts[-1][4] is None:   # the attempt running ends with whatever comes next
            last = attempts[-1]
            last[4] = at_ns
            if status != "running":
                last[1] = status
                last[2] = message or ""
        if status == "running":
            meta.started_ns = at_ns
            if attempts is None:
                attempts = meta.attempts = []
            attempts.append([attempt, None, "", at_ns, None])
            if len(attempts) > ATTEMPTS_KEPT:
                del attempts[0]
        elif status in TERMINAL:
            meta.finished_ns = at_ns
            if status != "dead_lettered":
                meta.spec = None
            elif meta.spec is not None:
                self.dead.append(task_id)
                while len(self.dead) > self.dead_letters:
                    oldest = self.entries.get(self.dead.popleft())
                    if oldest is not None:
                        oldest.spec = None


# ---------------------------------------------------------------- push streams


# Status events the leader keeps for new Watch streams to start with (WatchRequest.recent).
RECENT_EVENTS_KEPT = 200


class RecentEvents:
    """The leader's latest status events, oldest first: a sink of the
    scheduler, so that a stream subscribed in the same step as it copies them
    gets each event once, from the copy or live."""

    def __init__(self, limit: int = RECENT_EVENTS_KEPT) -> None:
        self.events: deque[Any] = deque(maxlen=limit)

    def deliver(self, event: Any) -> None:
        self.events.append(event)

    def end(self) -> None:
        pass


class LiveFeed:
    """The status events of one push stream (the gateway's Server-Sent
    Events): delivered on the scheduler's loop without ever blocking it,
    buffered up to ``capacity`` (the oldest dropped and counted in
    ``lagged``), taken in batches by the stream's writer."""

    def __init__(self, capacity: int, pools: frozenset[str] | None, tenant: str | None = None) -> None:
        self.capacity = capacity
        self.pools = pools
        self.tenant = tenant      # a pinned caller's: only its tasks' events
        self.events: deque[Any] = deque()
        self.lagged = 0
        self.ended = False
        self.wake = asyncio.Event()
        # With shards: those whose events this feed is missing now (said when it changes).
        self.unavailable: list[str] = []
        self.unavailable_changed = False

    def deliver(self, event: Any) -> None:
        if self.pools is not None and event.pool not in self.pools:
            return
        if self.tenant is not None and event.tenant != self.tenant:
            return
        self.events.append(event)
        if len(self.events) > self.capacity:
            self.events.popleft()
            self.lagged += 1
        self.wake.set()

    def end(self) -> None:
        self.ended = True
        self.wake.set()

    def shard_missing(self, shard: str, missing: bool) -> None:
        """``shard``'s events stopped (``missing``) or came back. A shard that
        comes back counts as a lag: what it did meanwhile was not seen."""
        if missing == (shard in self.unavailable):
            return
        if missing:
            self.unavailable = sorted([*self.unavailable, shard])
        else:
            self.unavailable = [name for name in self.unavailable if name != shard]
            self.lagged += 1
        self.unavailable_changed = True
        self.wake.set()

    def take(self) -> tuple[list[Any], int]:
        """Every buffered event, and how many were dropped since the last take."""
        events, lagged = list(self.events), self.lagged
        self.events.clear()
        self.lagged = 0
        self.wake.clear()
        return events, lagged
