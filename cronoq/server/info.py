"""What the serving leader remembers beside the engine: the info cache of
recent tasks (``InfoCache``, kept up to date by the status events) and the
buffered feeds of push streams (``LiveFeed``)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from typing import Any

from ..core.types import TERMINAL, TaskSpec

__all__ = ["InfoCache", "TaskMeta", "LiveFeed", "RecentEvents", "DEAD_LETTERS_KEPT", "ATTEMPTS_KEPT",
           "TRACEBACK_KEPT", "TRACEBACKS_KEPT", "last_chars"]


# ---------------------------------------------------------------- the info cache

# Dead-lettered tasks whose payload and options the leader keeps, to submit them again.
DEAD_LETTERS_KEPT = 1000
# Attempts of one task that Get reports (the latest ones).
ATTEMPTS_KEPT = 32
# A traceback's last characters the leader keeps (its end names the error), and how many
# tracebacks it keeps in all (the oldest forgotten first): at most about 80 MB.
TRACEBACK_KEPT = 8192
TRACEBACKS_KEPT = 10_000


def last_chars(text: str, limit: int) -> str:
    """``text``'s last ``limit`` characters, marked as cut when it is longer."""
    if len(text) <= limit:
        return text
    return "\u2026" + text[len(text) - limit + 1:]


class TaskMeta:
    """What the serving leader remembers of a task beyond the engine's record."""

    __slots__ = ("pool", "key", "kind", "priority", "tenant", "tags", "max_attempts", "created_ns",
                 "started_ns", "finished_ns", "spec", "edges", "attempts", "labels", "payload_preview",
                 "payload_size", "payload_type", "traceback", "deadline_ns", "worker")

    def __init__(self, spec: TaskSpec, pool: str, max_attempts: int, created_ns: int,
                 preview_bytes: int = 0) -> None:
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
        # [attempt, how it ended (None while it runs), message, started_ns, ended_ns, traceback, worker id,
        # worker name] (the worker None until its lease is sent, and for attempts not run by a remote worker),
        # oldest first
        self.attempts: list[list[Any]] | None = None
        # Kept apart from the spec, which is let go when the task ends.
        self.deadline_ns: int | None = spec.deadline_at_ns if spec.deadline_at_ns is not None else (
            created_ns + spec.deadline_in_ns if spec.deadline_in_ns is not None else None)
        # (attempt, worker id, worker name) of the latest lease sent: its attempt may not be recorded yet
        self.worker: tuple[int, int, str] | None = None
        # The payload's first preview_bytes (kept after the task ended), its size and content type.
        payload = spec.payload
        data = getattr(payload, "data", None)
        if isinstance(data, bytes) and preview_bytes > 0:
            self.payload_preview: bytes | None = data[:preview_bytes]
            self.payload_size = len(data)
            self.payload_type: str = getattr(payload, "content_type", "")
        else:
            self.payload_preview = None
            self.payload_size = 0
            self.payload_type = ""
        # (attempt, traceback) a worker sent before the leader saw that attempt start
        self.traceback: tuple[int, str] | None = None


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

    def __init__(self, limit: int, dead_letters: int = DEAD_LETTERS_KEPT, preview_bytes: int = 0,
                 tracebacks: int = TRACEBACKS_KEPT) -> None:
        self.limit = limit
        self.preview_bytes = preview_bytes   # outputs.payload_preview_bytes
        self.tracebacks = tracebacks
        self.with_traceback: deque[list[Any]] = deque()   # attempt entries holding a traceback, oldest first
        self.entries: OrderedDict[int, TaskMeta] = OrderedDict()
        self.dead_letters = dead_letters
        self.dead: deque[int] = deque()     # dead-lettered tasks whose spec is kept, oldest first
        self.early: OrderedDict[int, list[tuple[str, int, int, str | None]]] = OrderedDict()
        # Leases sent before the task's record was made: (attempt, worker id, worker name).
        self.early_workers: OrderedDict[int, tuple[int, int, str]] = OrderedDict()
        # The timeline's index: tasks by their latest attempt start or end (the latest last), and the tasks
        # with an attempt running, so that a window's attempts are found without reading every entry.
        self.touched: OrderedDict[int, int] = OrderedDict()
        self.running: set[int] = set()
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
        worker = self.early_workers.pop(task_id, None)
        if worker is not None:
            meta.worker = worker
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
        self.early_workers.clear()
        self.touched.clear()
        self.running.clear()
        self.with_traceback.clear()
        self.dependents.clear()

    def failed_with(self, task_id: int, attempt: int, traceback: str) -> None:
        """A worker's traceback of the failure of ``attempt`` (sent with its Fail,
        before the engine's event of the attempt's end)."""
        meta = self.entries.get(task_id)
        if meta is None or not traceback:
            return
        traceback = last_chars(traceback, TRACEBACK_KEPT)
        for entry in reversed(meta.attempts or ()):
            if entry[0] == attempt:
                self._keep_traceback(entry, traceback)
                return
        meta.traceback = (attempt, traceback)   # its start is not seen yet

    def _keep_traceback(self, entry: list[Any], traceback: str) -> None:
        if not entry[5]:
            self.with_traceback.append(entry)
        entry[5] = traceback
        while len(self.with_traceback) > self.tracebacks:
            self.with_traceback.popleft()[5] = ""

    def get(self, task_id: int) -> TaskMeta | None:
        return self.entries.get(task_id)

    def _touch(self, task_id: int, at_ns: int) -> None:
        touched = self.touched
        touched[task_id] = at_ns
        touched.move_to_end(task_id)
        if len(touched) > self.limit:
            touched.popitem(last=False)

    def active_since(self, since_ns: int, most: int) -> list[tuple[int, TaskMeta]]:
        """Up to ``most`` tasks with an attempt running now or one that
        started or ended at or after ``since_ns`` (the latest first), read
        from the index, not from every entry."""
        out: list[tuple[int, TaskMeta]] = []
        entries = self.entries
        seen: set[int] = set()
        for task_id in list(self.running):
            meta = entries.get(task_id)
            if meta is None:
                self.running.discard(task_id)   # forgotten by the cache
                continue
            seen.add(task_id)
            out.append((task_id, meta))
        for task_id in reversed(self.touched):
            if len(out) >= most:
                break
            if self.touched[task_id] < since_ns:
                break
            if task_id in seen:
                continue
            meta = entries.get(task_id)
            if meta is not None:
                out.append((task_id, meta))
        return out[:most]

    def leased(self, task_id: int, attempt: int, worker_id: int, worker_name: str) -> None:
        """Attempt ``attempt`` of the task was leased to that worker (again, to
        another one, when a worker gave it back): before or after its running
        event arrives."""
        meta = self.entries.get(task_id)
        if meta is None:
            if self.limit:
                self.early_workers[task_id] = (attempt, worker_id, worker_name)
                self.early_workers.move_to_end(task_id)
                if len(self.early_workers) > EARLY_KEPT:
                    self.early_workers.popitem(last=False)
            return
        meta.worker = (attempt, worker_id, worker_name)
        attempts = meta.attempts
        if attempts and attempts[-1][0] == attempt and attempts[-1][4] is None:
            attempts[-1][6] = worker_id
            attempts[-1][7] = worker_name

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
            self._touch(task_id, at_ns)
            self.running.discard(task_id)
        if status == "running":
            self._touch(task_id, at_ns)
            self.running.add(task_id)
            meta.started_ns = at_ns
            if attempts is None:
                attempts = meta.attempts = []
            worker = meta.worker
            if worker is not None and worker[0] == attempt:
                entry = [attempt, None, "", at_ns, None, "", worker[1], worker[2]]
            else:
                entry = [attempt, None, "", at_ns, None, "", None, None]
            attempts.append(entry)
            if meta.traceback is not None and meta.traceback[0] == attempt:
                self._keep_traceback(entry, meta.traceback[1])
                meta.traceback = None
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


class RecentEvents:
    """The leader's latest status events (the last ``history.events``), for
    new Watch and event streams to start with (``recent``), oldest first: a sink of the
    scheduler, so that a stream subscribed in the same step as it copies them
    gets each event once, from the copy or live."""

    def __init__(self, limit: int) -> None:   # (history.events)
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
