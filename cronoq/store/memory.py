"""An in-process store: the reference implementation of the store contract.

It keeps nothing across processes, so it is for tests: two schedulers given
the same ``MemoryDatabase`` behave like two processes sharing a database
(one leads, the other waits), and a "restart" is a new scheduler on the same
database. Faults can be injected: ``database.available = False`` makes
every call fail as unavailable until it is set back.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from typing import Any, Callable

from .. import realtime
from ..core.types import TERMINAL
from .base import (
    Batch, Fenced, LostCallback, Recovered, StoredCheckpoint, StoredSchedule, StoredTask, StoreRejected,
    StoreUnavailable, TaskRecord, TaskRow, seconds,
)

__all__ = ["MemoryDatabase", "InMemoryStore"]


class MemoryDatabase:
    def __init__(self) -> None:
        self.tasks: dict[int, dict[str, Any]] = {}
        self.outputs: dict[int, bytes] = {}
        self.checkpoints: dict[int, dict[str, StoredCheckpoint]] = {}
        self.schedules: dict[str, tuple[dict[str, Any], bytes]] = {}
        self.epoch = 0
        self.high_water = 0
        self.leader: object | None = None
        self.available = True
        self.commits = 0
        self.commit_delay = 0.0
        # Faults: a function of a TaskRow returning why the "database" refuses it (or None).
        self.reject: Callable[[TaskRow], str | None] | None = None


class InMemoryStore:
    """The store contract in memory (see the module documentation).

    ``retention`` (seconds, default 0): ended tasks recovery keeps at least
    this long. ``commit_timeout`` (default 30 s): a commit slower than this
    counts as unavailable for the callers waiting on it.
    """

    _names = itertools.count(1)

    def __init__(self, database: MemoryDatabase | None = None, *, lock_poll: float = 0.01,
                 retention: float = 0.0, commit_timeout: float = 30.0) -> None:
        self.database = database if database is not None else MemoryDatabase()
        self.lock_poll = seconds(lock_poll, "lock_poll")
        self.retention_ns = round(seconds(retention, "retention", positive=False) * 1_000_000_000)
        self.commit_timeout = seconds(commit_timeout, "commit_timeout")
        self.name = f"memory-{next(self._names)}"
        self.epoch: int | None = None
        self._lost: LostCallback | None = None

    def _check(self) -> MemoryDatabase:
        if not self.database.available:
            raise StoreUnavailable("the in-memory database is marked unavailable")
        return self.database

    async def acquire_leadership(self) -> int:
        while True:
            db = self.database
            if db.available and db.leader is None:
                db.leader = self
                db.epoch += 1
                self.epoch = db.epoch
                return db.epoch
            await realtime.sleep(self.lock_poll)

    async def recover(self, now_ns: int, retention_ns: int) -> Recovered:
        db = self._check()
        retention_ns = max(retention_ns, self.retention_ns)
        live_parents: set[int | str] = set()
        for row in db.tasks.values():
            if row["status"] not in TERMINAL and row["record"]:
                for ref, _ in row["record"].get("edges", ()):
                    live_parents.add(ref)
        tasks = []
        for row in db.tasks.values():
            ended = row["status"] in TERMINAL
            if ended and (row["finished_ns"] or 0) + retention_ns <= now_ns and \
                    row["id"] not in live_parents and row["key"] not in live_parents:
                continue
            tasks.append(StoredTask(row["id"], row["pool"], copy.deepcopy(row["record"]), row["payload"],
                                    row["status"], row["attempt"], row["message"], row["submitted_ns"],
                                    row["finished_ns"]))
        schedules = [StoredSchedule(name, copy.deepcopy(record), payload)
                     for name, (record, payload) in db.schedules.items()]
        return Recovered(tasks, schedules, db.high_water)

    async def commit(self, epoch: int, batch: Batch) -> None:
        db = self._check()
        if db.commit_delay:
            await realtime.sleep(db.commit_delay)
            db = self._check()
        if db.epoch != epoch or db.leader is not self:
            raise Fenced(f"epoch {epoch} was replaced by epoch {db.epoch}")
        if db.reject is not None:   # all or nothing, like a transaction
            for t in batch.tasks:
                reason = db.reject(t)
                if reason:
                    raise StoreRejected(f"the in-memory database refuses task {t.id}: {reason}")
        for t in batch.tasks:
            db.tasks[t.id] = {"id": t.id, "pool": t.pool, "kind": t.kind, "priority": t.priority,
                              "key": t.key, "record": copy.deepcopy(t.record), "payload": t.payload,
                              "status": "ready", "attempt": 0, "message": None,
                              "submitted_ns": t.submitted_ns, "finished_ns": None}
        for s in batch.statuses:
            row = db.tasks.get(s.id)
            if row is None:
                continue
            row["status"] = s.status
            row["attempt"] = s.attempt
            row["message"] = s.message
            if s.status in TERMINAL:
                row["finished_ns"] = s.at_ns
        for task_id, data in batch.outputs:
            db.outputs[task_id] = data
        for schedule in batch.schedules:
            db.schedules[schedule.name] = (copy.deepcopy(schedule.record), schedule.payload)
        for name in batch.removed_schedules:
            db.schedules.pop(name, None)
        for task_id in batch.withdrawn:
            db.tasks.pop(task_id, None)
            db.outputs.pop(task_id, None)
            db.checkpoints.pop(task_id, None)
        db.high_water = max(db.high_water, batch.high_water)
        db.commits += 1

    async def load_output(self, task_id: int) -> bytes | None:
        return self._check().outputs.get(task_id)

    def _fence(self, epoch: int) -> MemoryDatabase:
        db = self._check()
        if db.epoch != epoch or db.leader is not self:
            raise Fenced(f"epoch {epoch} was replaced by epoch {db.epoch}")
        return db

    async def save_checkpoint(self, epoch: int, task_id: int, stage: str, data: bytes, attempt: int,
                              saved_ns: int) -> None:
        db = self._fence(epoch)
        if task_id not in db.tasks:   # as a foreign key would: no checkpoint outlives its task
            raise StoreRejected(f"the in-memory database has no task {task_id} to checkpoint")
        stages = db.checkpoints.setdefault(task_id, {})
        stages.pop(stage, None)   # re-saved: now the newest
        stages[stage] = StoredCheckpoint(task_id, stage, bytes(data), attempt, saved_ns)

    async def load_checkpoints(self, task_id: int | None = None) -> list[StoredCheckpoint]:
        db = self._check()
        if task_id is not None:
            found = list(db.checkpoints.get(task_id, {}).values())
        else:
            found = [c for tid, stages in db.checkpoints.items()
                     if tid in db.tasks and db.tasks[tid]["status"] not in TERMINAL for c in stages.values()]
        return sorted(found, key=lambda c: (c.task_id, c.saved_ns))

    async def delete_checkpoints(self, epoch: int, task_id: int) -> int:
        db = self._fence(epoch)
        return len(db.checkpoints.pop(task_id, {}))

    # -- task records (as SqlStore.list_finished and find_task)

    def _record(self, row: dict[str, Any]) -> TaskRecord:
        record = row["record"] or {}
        retry = record.get("retry")
        tenant = record.get("tenant")
        return TaskRecord(row["id"], row["pool"], row["kind"], row["key"], row["priority"], row["status"],
                          row["attempt"], row["message"], row["submitted_ns"], row["finished_ns"],
                          row["id"] in self.database.outputs, tenant=tenant if isinstance(tenant, str) else None,
                          max_attempts=retry[0] if isinstance(retry, list) and retry else None)

    async def list_finished(self, *, pools: list[str] | None = None, statuses: list[str] | None = None,
                            after: int = 0, limit: int = 100, newest_first: bool = False,
                            before: int = 0) -> list[TaskRecord]:
        db = self._check()
        rows = sorted((row for row in db.tasks.values()
                       if row["finished_ns"] is not None and row["id"] > after and (not before or row["id"] < before)
                       and (pools is None or row["pool"] in pools)
                       and (statuses is None or row["status"] in statuses)), key=lambda row: row["id"],
                      reverse=newest_first)
        return [self._record(row) for row in rows[:limit]]

    async def find_task(self, ref: int | str) -> TaskRecord | None:
        db = self._check()
        if isinstance(ref, str):
            rows = [row for row in db.tasks.values() if row["key"] == ref]
            return self._record(max(rows, key=lambda row: row["id"])) if rows else None
        row = db.tasks.get(ref)
        return None if row is None else self._record(row)

    async def release_leadership(self) -> None:
        if self.database.leader is self:
            self.database.leader = None

    def on_lost(self, callback: LostCallback) -> None:
        self._lost = callback

    def depose(self, reason: str = "deposed by the test") -> None:
        """Take leadership away (as a lost lock or an expired lease would)."""
        if self.database.leader is self:
            self.database.leader = None
        if self._lost is not None:
            self._lost(reason)

    async def close(self) -> None:
        await self.release_leadership()
