"""What the SQLite and PostgreSQL stores share: the write path, recovery,
outputs, pruning, and running blocking database work off the event loop.

All database work of a store runs on one dedicated worker thread (so the
event loop never blocks on I/O, and one connection serves the commits, one at
a time, as the group-commit runtime issues them). The dialects differ only in
how leadership is held and how a commit checks it (``_check_fence``).

Both stores write the same values: text columns never carry NUL (stored as
U+FFFD) or unpaired surrogates, records are ASCII JSON text (NUL inside a
record or payload is escaped by JSON), payloads and outputs are bytes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import secrets
import socket
import time
import weakref
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Callable, Generator, Iterator, TypeVar, overload

from sqlalchemy import delete, func, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import PoolProxiedConnection

from ..core.errors import SchedulerError
from ..core.types import TERMINAL
from .base import (
    Batch, Fenced, LostCallback, Recovered, StoredCheckpoint, StoredSchedule, StoredTask, StoreRejected,
    StoreUnavailable, TaskRecord, seconds,
)
from .cluster import ClusterTransport
from .schema import Tables
from .worker import Worker, fork_gate

__all__ = ["SqlStore", "clean_text"]

log = logging.getLogger("cronoq.store")

NS = 1_000_000_000
_CHUNK = 500   # ids or keys per IN (...) list
_SURROGATE = re.compile("[\ud800-\udfff]")


@overload
def clean_text(value: str) -> str: ...
@overload
def clean_text(value: None) -> None: ...
def clean_text(value: str | None) -> str | None:
    """Text as both stores write it: NUL and unpaired surrogates become U+FFFD."""
    if value is None:
        return None
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = _SURROGATE.sub("\ufffd", value)
    return value


_record_text = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode   # ASCII JSON


def _parse_record(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def _tenant_of(text: str | None) -> str | None:
    """The tenant a stored task's record names (None if none)."""
    if text is None or '"tenant"' not in text:   # (most records have none: no parse)
        return None
    record = _parse_record(text)
    tenant = None if record is None else record.get("tenant")
    return tenant if isinstance(tenant, str) else None


def _max_attempts_of(text: str | None) -> int | None:
    """The attempts a stored task's own retry policy allows (None if it has none)."""
    if text is None or '"retry"' not in text:
        return None
    record = _parse_record(text)
    retry = None if record is None else record.get("retry")
    return retry[0] if isinstance(retry, list) and retry and isinstance(retry[0], int) else None


def _record_parser() -> Callable[[str | None], dict[str, Any] | None]:
    """``_parse_record`` sharing one dict among equal records: a backlog of
    plain tasks repeats a handful of records. Records with a key are unique
    and are not kept."""
    cache: dict[str, dict[str, Any] | None] = {}

    def parse(text: str | None) -> dict[str, Any] | None:
        record = cache.get(text)   # type: ignore[arg-type]
        if record is None:
            record = _parse_record(text)
            if text is not None and len(cache) < 4096 and '"key"' not in text:
                cache[text] = record
        return record

    return parse


def _identity() -> str:
    """Who a store is, among the processes sharing the database (new in each fork)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


# Every store of this process: a fork's child gives each copy a fresh start (see SqlStore.after_fork).
_stores: weakref.WeakSet[SqlStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_stores):
        store.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def describe(exc: BaseException) -> str:
    """A short description of a database error (without the statement and its parameters)."""
    orig = getattr(exc, "orig", None)
    lines = str(orig if orig is not None else exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]


_T = TypeVar("_T")

_SLICE = 5000   # rows per step of a recovery


class _RowStream:
    """The task rows of a recovery, read slice by slice on the store's worker
    thread while the runtime restores the previous slice: a backlog of
    millions never sits in memory as rows, and what a slice allocated is
    reused by the next. Iterate it once."""

    def __init__(self, store: SqlStore, slices: Generator[list[StoredTask], None, None]) -> None:
        self._store = store
        self._slices: Generator[list[StoredTask], None, None] | None = slices

    def __iter__(self) -> Iterator[StoredTask]:
        store = self._store
        slices = self._slices
        if slices is None:
            raise RuntimeError("the recovered rows were already read")
        self._slices = None
        step = store._executor.submit(next, slices, None)
        try:
            while True:
                try:
                    rows = step.result()
                except store._db_errors as exc:
                    raise StoreUnavailable(f"the {store.dialect} store is unavailable: "
                                           f"{store._describe(exc)}") from exc
                if rows is None:
                    return
                step = store._executor.submit(next, slices, None)   # read ahead while these are restored
                yield from rows
                del rows
        finally:
            try:   # after any step under way: ends the read transaction
                store._executor.submit(slices.close)
            except RuntimeError:   # the store is closed: its connections are gone already
                pass


class SqlStore:
    """The common part of ``SqliteStore`` and ``PostgresStore`` (not used directly)."""

    dialect = "sql"

    def __init__(self, *, tables: Tables, lock_poll: float, retention: float, keep_finished: float,
                 commit_timeout: float, cluster: bool = True, cluster_poll: float = 0.01,
                 member_ttl: float = 10.0, request_timeout: float | None = None) -> None:
        self.lock_poll = seconds(lock_poll, "lock_poll")
        # Many processes, one scheduler (docs/architecture.md): see cluster_transport().
        self.cluster = bool(cluster)
        self.cluster_poll = seconds(cluster_poll, "cluster_poll")
        self.member_ttl = seconds(member_ttl, "member_ttl")
        self.member_heartbeat = min(1.0, self.member_ttl / 4)
        self.request_timeout = seconds(request_timeout, "request_timeout") if request_timeout is not None \
            else seconds(commit_timeout, "commit_timeout")
        self.retention = seconds(retention, "retention", positive=False)
        self.keep_finished = seconds(keep_finished, "keep_finished", positive=False)
        self.commit_timeout = seconds(commit_timeout, "commit_timeout")
        self.retention_ns = round(self.retention * NS)
        self.keep_finished_ns = round(self.keep_finished * NS)
        self.prune_every = max(1.0, min(self.keep_finished / 10, 600.0))
        self.identity = _identity()
        self.epoch: int | None = None
        self.engine: Engine | None = None   # the SQLAlchemy engine, created on first use
        self._t = tables
        self._executor = Worker(f"cronoq-{self.dialect}")
        self._closed = False
        self._lost_callback: LostCallback | None = None
        self._lost_reason: str | None = None
        self._watch: asyncio.Task[None] | None = None
        self._last_prune = 0.0
        self._sql: dict[str, str] = {}
        self._wconn: PoolProxiedConnection | None = None
        # What counts as the database failing (an outage, or a refusal of the data).
        self._db_errors: tuple[type[BaseException], ...] = (SQLAlchemyError, OSError, *self._driver_errors())
        _stores.add(self)

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        """The base classes of the DBAPI driver's own errors (raised by raw cursors)."""
        raise NotImplementedError

    # The leadership of each dialect.

    async def acquire_leadership(self) -> int:
        raise NotImplementedError

    async def try_leadership(self) -> int | None:
        """One attempt to lead, without waiting: the new epoch, or None when
        another process leads."""
        raise NotImplementedError

    async def release_leadership(self) -> None:
        raise NotImplementedError

    # ----------------------------------------------------------- plumbing

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run ``fn(*args)`` on the store's worker thread; database errors
        become ``StoreUnavailable``."""
        if self._closed:
            raise SchedulerError(f"the {self.dialect} store is closed")
        try:
            return await self._executor.call(fn, *args)
        except SchedulerError:
            raise
        except self._db_errors as exc:
            raise StoreUnavailable(f"the {self.dialect} store is unavailable: {self._describe(exc)}") from exc

    # SQLSTATE classes of errors about the data itself: data exception (22),
    # integrity constraint violation (23), program limit exceeded (54: an index
    # entry or a value too large). Everything else may pass: an outage.
    _REFUSED_STATES = ("22", "23", "54")

    def _refuses(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the database refuses the data (retrying the
        same rows cannot help), rather than that it is unavailable."""
        if isinstance(exc, (TypeError, ValueError, OverflowError)):
            return True   # a value the driver cannot bind
        orig = getattr(exc, "orig", None) or exc
        state = getattr(orig, "sqlstate", None)
        if isinstance(state, str) and state:
            return state[:2] in self._REFUSED_STATES
        dbapi = self.engine.dialect.loaded_dbapi if self.engine is not None else None
        return dbapi is not None and isinstance(orig, (dbapi.IntegrityError, dbapi.DataError))

    _secrets: tuple[str, ...] = ()   # text masked in error messages (a password)

    def _describe(self, exc: BaseException) -> str:
        """``describe(exc)`` with any secret of the connection masked."""
        text = describe(exc)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _ensure(self) -> Engine:
        """Connect and migrate (on the worker thread, once); the engine."""
        engine = self.engine
        if engine is None:
            engine = self._create_engine()
            try:
                self._migrate(engine)
            except BaseException:
                engine.dispose()
                raise
            self.engine = engine
            self._prepare(engine)
        return engine

    def _create_engine(self) -> Engine:
        raise NotImplementedError

    def _migrate(self, engine: Engine) -> None:
        raise NotImplementedError

    def _begin(self) -> AbstractContextManager[Connection]:
        """A write transaction."""
        return self._ensure().begin()

    def _begin_read(self) -> AbstractContextManager[Connection]:
        return self._ensure().begin()

    # Raw DBAPI cursors are typed Any: each driver has its own (psycopg's COPY, say).
    def _insert_rows(self, cursor: Any, rows: list[list[Any]]) -> None:
        cursor.executemany(self._sql["insert"], rows)

    # The columns of an inserted task row, in the order the write path builds them.
    INSERT_COLUMNS = ("id", "pool", "kind", "priority", "key", "record", "payload", "status", "attempt",
                      "message", "submitted_ns", "updated_ns", "finished_ns", "output")

    def _prepare(self, engine: Engine) -> None:
        """The statements of the write path, for the raw DBAPI cursor with
        positional parameters: the write path is the hot path, so it skips
        SQLAlchemy's per-statement work. Names come from the table definitions."""
        t = self._t
        q = engine.dialect.identifier_preparer
        p = self._placeholder
        tasks, schedules, meta = (q.format_table(table) for table in (t.tasks, t.schedules, t.meta))
        col = {name: q.quote(t.tasks.c[name].name) for name in self.INSERT_COLUMNS}
        meta_col = {name: q.quote(t.meta.c[name].name) for name in ("id", "epoch", "holder", "high_water")}
        sched_col = {name: q.quote(t.schedules.c[name].name) for name in ("name", "record", "payload")}
        s = self._sql
        s["insert"] = (f"INSERT INTO {tasks} ({', '.join(col.values())}) "
                       f"VALUES ({', '.join([p] * len(col))}) ON CONFLICT ({col['id']}) DO NOTHING")
        state = (f"{col['status']} = {p}, {col['attempt']} = {p}, {col['message']} = {p}, "
                 f"{col['updated_ns']} = {p}, {col['finished_ns']} = {p}")
        s["status"] = f"UPDATE {tasks} SET {state} WHERE {col['id']} = {p}"
        s["status_output"] = f"UPDATE {tasks} SET {state}, {col['output']} = {p} WHERE {col['id']} = {p}"
        s["output"] = f"UPDATE {tasks} SET {col['output']} = {p} WHERE {col['id']} = {p}"
        s["schedule"] = (f"INSERT INTO {schedules} ({', '.join(sched_col.values())}) VALUES ({p}, {p}, {p}) "
                         f"ON CONFLICT ({sched_col['name']}) DO UPDATE SET "
                         f"{sched_col['record']} = excluded.{sched_col['record']}, "
                         f"{sched_col['payload']} = excluded.{sched_col['payload']}")
        s["unschedule"] = f"DELETE FROM {schedules} WHERE {sched_col['name']} = {p}"
        s["withdraw"] = f"DELETE FROM {tasks} WHERE {col['id']} = {p}"
        checkpoints = q.format_table(t.checkpoints)
        ck = {name: q.quote(t.checkpoints.c[name].name)
              for name in ("task_id", "stage", "data", "attempt", "saved_ns")}
        s["withdraw_checkpoints"] = f"DELETE FROM {checkpoints} WHERE {ck['task_id']} = {p}"
        s["checkpoint"] = (f"INSERT INTO {checkpoints} ({', '.join(ck.values())}) "
                           f"VALUES ({p}, {p}, {p}, {p}, {p}) "
                           f"ON CONFLICT ({ck['task_id']}, {ck['stage']}) DO UPDATE SET "
                           + ", ".join(f"{ck[n]} = excluded.{ck[n]}" for n in ("data", "attempt", "saved_ns")))
        s["task_exists"] = f"SELECT 1 FROM {tasks} WHERE {col['id']} = {p}"
        s["fence"] = (f"SELECT {meta_col['epoch']}, {meta_col['holder']} FROM {meta} "
                      f"WHERE {meta_col['id']} = 1{self._fence_suffix}")

    _placeholder = "?"
    _fence_suffix = ""

    def _check_fence(self, row: Any, epoch: int) -> None:
        raise NotImplementedError

    def _tx_begin(self, cursor: Any) -> None:
        """Open the write transaction on a raw cursor (PostgreSQL: implicit)."""

    # ----------------------------------------------------------- the writer connection

    def _writer(self) -> PoolProxiedConnection:
        """The raw DBAPI connection of the write path (checked out of the pool
        while this store leads; returned on step-down, release and close)."""
        conn = self._wconn
        if conn is None:
            conn = self._wconn = self._ensure().raw_connection()
        return conn

    def _abandon_writer(self, conn: PoolProxiedConnection) -> None:
        """After a failed commit: roll back, or drop a broken connection."""
        try:
            conn.rollback()
        except Exception:
            try:
                conn.invalidate()
            except Exception:
                pass
            if self._wconn is conn:
                self._wconn = None

    def _drop_writer(self) -> None:
        conn, self._wconn = self._wconn, None
        if conn is not None:
            try:
                conn.close()   # back to the pool (rolled back there)
            except Exception:
                try:
                    conn.invalidate()
                except Exception:
                    pass

    def _drop_writer_later(self) -> None:
        """Return the writer connection from any thread (on the worker thread)."""
        if not self._closed:
            try:
                self._executor.submit(self._drop_writer)
            except RuntimeError:   # the executor is shut down
                pass

    def on_lost(self, callback: LostCallback) -> None:
        self._lost_callback = callback
        if self._lost_reason is not None:
            callback(self._lost_reason)

    def _signal_lost(self, reason: str) -> None:
        if self._lost_reason is not None:
            return
        self._lost_reason = reason
        self.epoch = None
        self._deposed()
        log.error("%s store: leadership lost: %s", self.dialect, reason, extra={"action": "leader_lost"})
        if self._lost_callback is not None:
            self._lost_callback(reason)

    def _stop_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None and not watch.done():
            try:
                watch.cancel()
            except RuntimeError:   # its loop is closed
                pass

    # ----------------------------------------------------------- commit

    async def commit(self, epoch: int, batch: Batch) -> None:
        """Write ``batch`` in one transaction that first checks ``epoch``
        (``Fenced`` if a newer leader exists, ``StoreUnavailable`` if the
        database cannot be reached: the runtime retries the same batch;
        ``StoreRejected`` if it refuses the data: the runtime isolates the
        rows at fault)."""
        if self._closed:
            raise SchedulerError(f"the {self.dialect} store is closed")
        try:
            await self._executor.call(self._commit_sync, epoch, batch)
        except SchedulerError as exc:
            if not isinstance(exc, Fenced):
                raise
            self._stop_watch()
            self._lost_reason = self._lost_reason or f"fenced: {exc}"
            self.epoch = None
            self._deposed()
            raise
        except self._commit_errors() as exc:
            if self._refuses(exc):
                raise StoreRejected(f"the {self.dialect} database refused the data: "
                                    f"{self._describe(exc)}") from exc
            unavailable = StoreUnavailable(f"the {self.dialect} store is unavailable: {self._describe(exc)}")
            unavailable.uncertain = bool(getattr(exc, "cronoq_uncertain", False))
            raise unavailable from exc

    def _commit_errors(self) -> tuple[type[BaseException], ...]:
        """What a failed commit may raise: the database's errors, and a value
        the driver cannot bind."""
        return (*self._db_errors, TypeError, ValueError, OverflowError)

    # A commit whose connection fails while the server commits may have been
    # written (PostgreSQL); SQLite's local commit either happened or did not.
    _commit_outcome_may_be_lost = False

    def _deposed(self) -> None:
        """Let go of the connections a leader holds (any thread)."""
        self._drop_writer_later()

    # Why nothing may be written any more whatever the epoch (SQLite: the file was deleted).
    _gone: str | None = None

    def _check_file(self) -> None:
        """After a fenced write committed, before it is acknowledged: raise
        ``Fenced`` if it did not reach the database the store opened (SQLite:
        the path names another file, or none)."""

    @contextmanager
    def _fenced_write(self, epoch: int, begun: Any = None, pipelined: bool = False) -> Iterator[Any]:
        """A write transaction that first checks ``epoch`` (``Fenced`` if a
        newer leader exists) and yields its raw cursor; committed when the
        block ends, rolled back if it raises. On the writer connection, or on
        ``begun``: a raw connection whose transaction is already open (its
        caller rolls it back). ``_check_file`` runs after the commit.
        ``pipelined``: the block's statements are only sent (none of their
        results is read), so where the driver can (``_pipeline``) they go out
        with the commit, in one round trip."""
        if self._gone is not None:
            raise Fenced(self._gone)
        self._ensure()
        conn = self._writer() if begun is None else begun
        try:
            with self._pipeline(conn) if pipelined else nullcontext():
                cursor = conn.cursor()
                try:
                    if begun is None:
                        self._tx_begin(cursor)
                    cursor.execute(self._sql["fence"])
                    self._check_fence(cursor.fetchone(), epoch)
                    yield cursor
                finally:
                    cursor.close()
                try:
                    conn.commit()
                except Exception as exc:
                    if self._commit_outcome_may_be_lost:
                        exc.cronoq_uncertain = True   # type: ignore[attr-defined]
                    raise
            self._check_file()
        except BaseException:
            if begun is None:
                self._abandon_writer(conn)
            raise

    def _pipeline(self, conn: Any) -> AbstractContextManager[Any]:
        """Where the driver has one (PostgreSQL), its pipeline mode on ``conn``:
        statements are sent without waiting for each answer."""
        return nullcontext()

    def _pipelines(self, batch: Batch) -> bool:
        """Whether the commit of ``batch`` can be pipelined (see ``_pipeline``)."""
        return False

    def _commit_sync(self, epoch: int, batch: Batch) -> None:
        self._commit_with(None, epoch, batch)

    def _commit_with(self, begun: Any, epoch: int, batch: Batch) -> None:
        """The commit, on the writer connection, or on ``begun``: a raw
        connection whose write transaction is already open."""
        self._ensure()
        inserts: dict[int, list[Any]] = {}
        for t in batch.tasks:   # in INSERT_COLUMNS order
            inserts[t.id] = [t.id, clean_text(t.pool), clean_text(t.kind), t.priority, clean_text(t.key),
                             _record_text(t.record), t.payload, "ready", 0, None, t.submitted_ns,
                             t.submitted_ns, None, None]
        updates: dict[int, list[Any]] = {}
        for s in batch.statuses:
            finished = s.at_ns if s.status in TERMINAL else None
            message = clean_text(s.message)
            row = inserts.get(s.id)
            if row is not None:   # submitted in this batch: write its latest state at once
                row[7] = s.status
                row[8] = s.attempt
                row[9] = message
                row[11] = s.at_ns
                row[12] = finished
            else:
                updates[s.id] = [s.status, s.attempt, message, s.at_ns, finished, s.id]
        with_output: list[list[Any]] = []
        outputs: list[tuple[bytes, int]] = []
        for task_id, data in batch.outputs:
            row = inserts.get(task_id)
            if row is not None:
                row[13] = data
                continue
            row = updates.pop(task_id, None)
            if row is not None:
                row.insert(5, data)
                with_output.append(row)
            else:
                outputs.append((data, task_id))
        sql = self._sql
        with self._fenced_write(epoch, begun, self._pipelines(batch)) as cursor:
            if inserts:
                self._insert_rows(cursor, list(inserts.values()))
            if updates:
                cursor.executemany(sql["status"], list(updates.values()))
            if with_output:
                cursor.executemany(sql["status_output"], with_output)
            if outputs:
                cursor.executemany(sql["output"], outputs)
            if batch.schedules:
                latest = {s.name: s for s in batch.schedules}
                cursor.executemany(sql["schedule"], [
                    (clean_text(s.name), _record_text(s.record), s.payload) for s in latest.values()])
            if batch.removed_schedules:
                cursor.executemany(sql["unschedule"], [(clean_text(n),) for n in batch.removed_schedules])
            if batch.withdrawn:   # last: a row of a withdrawn task written above goes too
                withdrawn = [(task_id,) for task_id in batch.withdrawn]
                cursor.executemany(sql["withdraw"], withdrawn)
                cursor.executemany(sql["withdraw_checkpoints"], withdrawn)
            # batch.high_water is the largest id inserted here: the rows carry it, and
            # pruning folds the ids it deletes into the meta row (see _prune_sync).
        if self.keep_finished_ns and time.monotonic() - self._last_prune >= self.prune_every:
            self._last_prune = time.monotonic()
            try:
                self._executor.submit(self._prune_quietly)   # after this commit is acknowledged
            except RuntimeError:   # the store is closing
                pass

    def _prune_quietly(self) -> None:
        try:
            self._prune_sync(time.time_ns())
        except SQLAlchemyError as exc:   # try again later
            log.warning("%s store: pruning finished tasks failed: %s", self.dialect, self._describe(exc))

    # ----------------------------------------------------------- pruning

    async def prune(self, now_ns: int | None = None) -> int:
        """Delete finished tasks older than ``keep_finished``; returns how many."""
        return await self._call(self._prune_sync, time.time_ns() if now_ns is None else now_ns)

    def _prune_sync(self, now_ns: int) -> int:
        self._ensure()
        self._last_prune = time.monotonic()
        if not self.keep_finished_ns:
            return 0
        tasks = self._t.tasks
        cutoff = now_ns - self.keep_finished_ns
        total = 0
        meta = self._t.meta
        while True:   # in slices, so a large backlog never holds the write lock for long
            with self._begin() as conn:
                ids = [row[0] for row in conn.execute(
                    select(tasks.c.id).where(tasks.c.finished_ns < cutoff).limit(5000))]
                if ids:
                    # The high-water mark of issued ids is max(meta.high_water, max(tasks.id)):
                    # keep it when the largest ids go.
                    top = conn.execute(select(func.max(tasks.c.id))).scalar() or 0
                    conn.execute(update(meta).where(meta.c.id == 1, meta.c.high_water < top)
                                 .values(high_water=top))
                    conn.execute(delete(tasks).where(tasks.c.id.in_(ids)))
                    checkpoints = self._t.checkpoints
                    conn.execute(delete(checkpoints).where(checkpoints.c.task_id.in_(ids)))
            total += len(ids)
            if len(ids) < 5000:
                break
        if total:
            log.info("%s store: pruned %d finished tasks", self.dialect, total, extra={"action": "prune"})
        return total

    # ----------------------------------------------------------- recovery

    async def recover(self, now_ns: int, retention_ns: int) -> Recovered:
        return await self._call(self._recover_sync, now_ns, max(retention_ns, self.retention_ns))

    # The task columns recovery reads, in StoredTask's field order.
    RECOVER_COLUMNS = ("id", "pool", "record", "payload", "status", "attempt", "message", "submitted_ns",
                       "finished_ns")

    def _recover_sync(self, now_ns: int, retention_ns: int) -> Recovered:
        """Schedules and the id high-water mark; the tasks follow as a stream
        (``_RowStream``) the runtime consumes while it restores them."""
        self._ensure()
        t = self._t
        with self._begin_read() as conn:
            schedules = [StoredSchedule(row[0], _parse_record(row[1]), row[2])
                         for row in conn.execute(select(t.schedules.c.name, t.schedules.c.record,
                                                        t.schedules.c.payload).order_by(t.schedules.c.name))]
            high_water = max(conn.execute(select(t.meta.c.high_water).where(t.meta.c.id == 1)).scalar_one(),
                             conn.execute(select(func.max(t.tasks.c.id))).scalar() or 0)
        return Recovered(_RowStream(self, self._task_slices(now_ns, retention_ns)), schedules, high_water)

    def _task_slices(self, now_ns: int, retention_ns: int) -> Generator[list[StoredTask], None, None]:
        """Live tasks (in id order), recently ended ones, then the ended
        parents of live tasks, however old; in slices, read with the raw
        driver cursor. A generator driven on the worker thread, one slice per
        step, inside one read transaction."""
        t = self._t
        c = t.tasks.c
        q = self._ensure().dialect.identifier_preparer
        p = self._placeholder
        select_rows = (f"SELECT {', '.join(q.quote(c[name].name) for name in self.RECOVER_COLUMNS)} "
                       f"FROM {q.format_table(t.tasks)} WHERE ")
        finished, ident, key = (q.quote(c[name].name) for name in ("finished_ns", "id", "key"))
        cutoff = now_ns - retention_ns
        keys: set[str] = set()
        refs: set[object] = set()
        parse = _record_parser()

        def load(cursor: Any, sql: str, params: tuple[object, ...]) -> Iterator[list[StoredTask]]:
            cursor.execute(sql, params)
            while True:
                rows = cursor.fetchmany(_SLICE)
                if not rows:
                    return
                out: list[StoredTask] = []
                append = out.append
                for row in rows:
                    record = parse(row[2])
                    if record is not None and len(record) > 3:   # beyond v, kind and priority
                        k = record.get("key")
                        if k is not None:
                            keys.add(k)
                        edges = record.get("edges")
                        if edges and row[8] is None:
                            for edge in edges:
                                if isinstance(edge, (list, tuple)) and edge:
                                    refs.add(edge[0])
                    append(StoredTask(row[0], row[1], record, row[3], row[4], row[5], row[6], row[7], row[8]))
                del rows
                yield out

        with self._begin_read() as conn:
            cursor = conn.connection.cursor()
            try:
                yield from load(cursor, f"{select_rows}{finished} IS NULL ORDER BY {ident}", ())   # live
                yield from load(cursor, f"{select_rows}{finished} > {p} ORDER BY {ident}", (cutoff,))
                # Ended parents of live tasks, however old (their outcome decides the child).
                old = f"{finished} IS NOT NULL AND {finished} <= {p}"
                parents: dict[int, StoredTask] = {}
                want = sorted(ref for ref in refs if isinstance(ref, int) and not isinstance(ref, bool))
                for i in range(0, len(want), _CHUNK):
                    chunk = want[i:i + _CHUNK]
                    for rows in load(cursor, f"{select_rows}{old} AND {ident} IN ({', '.join([p] * len(chunk))})",
                                     (cutoff, *chunk)):
                        parents.update((row.id, row) for row in rows)
                want_keys = sorted({clean_text(ref) for ref in refs if isinstance(ref, str) and ref not in keys})
                for i in range(0, len(want_keys), _CHUNK):
                    key_chunk = want_keys[i:i + _CHUNK]
                    in_keys = ", ".join([p] * len(key_chunk))
                    for rows in load(cursor, f"{select_rows}{old} AND {key} IN ({in_keys})", (cutoff, *key_chunk)):
                        parents.update((row.id, row) for row in rows)
                if parents:
                    yield list(parents.values())
            finally:
                cursor.close()

    # ----------------------------------------------------------- outputs

    async def load_output(self, task_id: int) -> bytes | None:
        return await self._call(self._load_output_sync, task_id)

    def _load_output_sync(self, task_id: int) -> bytes | None:
        self._ensure()
        tasks = self._t.tasks
        with self._begin_read() as conn:
            data = conn.execute(select(tasks.c.output).where(tasks.c.id == task_id)).scalar_one_or_none()
        return None if data is None else bytes(data)

    # ----------------------------------------------------------- checkpoints

    async def save_checkpoint(self, epoch: int, task_id: int, stage: str, data: bytes, attempt: int,
                              saved_ns: int) -> None:
        """Upsert the checkpoint of ``stage`` in a transaction fenced by ``epoch``."""
        if self._closed:
            raise SchedulerError(f"the {self.dialect} store is closed")
        try:
            await self._executor.call(self._save_checkpoint_sync, epoch, task_id, stage, data, attempt,
                                      saved_ns)
        except SchedulerError:
            raise
        except self._commit_errors() as exc:
            if self._refuses(exc):
                raise StoreRejected(f"the {self.dialect} database refused the checkpoint: "
                                    f"{self._describe(exc)}") from exc
            raise StoreUnavailable(f"the {self.dialect} store is unavailable: {self._describe(exc)}") from exc

    def _save_checkpoint_sync(self, epoch: int, task_id: int, stage: str, data: bytes, attempt: int,
                              saved_ns: int) -> None:
        sql = self._sql
        with self._fenced_write(epoch) as cursor:   # fenced the same way as commits
            cursor.execute(sql["task_exists"], (task_id,))
            if cursor.fetchone() is None:   # pruned or withdrawn: no checkpoint outlives its task
                raise StoreRejected(f"the {self.dialect} store has no task {task_id} to checkpoint")
            cursor.execute(sql["checkpoint"], (task_id, clean_text(stage), data, attempt, saved_ns))

    async def load_checkpoints(self, task_id: int | None = None) -> list[StoredCheckpoint]:
        return await self._call(self._load_checkpoints_sync, task_id)

    def _load_checkpoints_sync(self, task_id: int | None) -> list[StoredCheckpoint]:
        self._ensure()
        c = self._t.checkpoints.c
        query = select(c.task_id, c.stage, c.data, c.attempt, c.saved_ns)
        if task_id is not None:
            query = query.where(c.task_id == task_id)
        else:   # those of live tasks
            tasks = self._t.tasks
            query = query.join(tasks, tasks.c.id == c.task_id).where(tasks.c.finished_ns.is_(None))
        with self._begin_read() as conn:
            rows = conn.execute(query.order_by(c.task_id, c.saved_ns)).all()
        return [StoredCheckpoint(row[0], row[1], bytes(row[2]), row[3], row[4]) for row in rows]

    async def delete_checkpoints(self, epoch: int, task_id: int) -> int:
        return await self._call(self._delete_checkpoints_sync, epoch, task_id)

    def _delete_checkpoints_sync(self, epoch: int, task_id: int) -> int:
        with self._fenced_write(epoch) as cursor:
            cursor.execute(self._sql["withdraw_checkpoints"], (task_id,))
            deleted = max(0, cursor.rowcount)
        return int(deleted)

    # ----------------------------------------------------------- task records (listings)

    async def list_finished(self, *, pools: list[str] | None = None, statuses: list[str] | None = None,
                            after: int = 0, limit: int = 100, newest_first: bool = False,
                            before: int = 0) -> list[TaskRecord]:
        """Finished tasks with ids above ``after``, in id order, at most
        ``limit``; only those of ``pools`` and ``statuses`` when given. With
        ``newest_first``, in descending id order, below ``before`` unless 0."""
        return await self._call(self._list_finished_sync, pools, statuses, after, limit, newest_first, before)

    async def find_task(self, ref: int | str) -> TaskRecord | None:
        """The stored task with this id, or the newest with this key; None if none."""
        return await self._call(self._find_task_sync, ref)

    def _record_columns(self) -> list[Any]:
        c = self._t.tasks.c
        return [c.id, c.pool, c.kind, c.key, c.priority, c.status, c.attempt, c.message, c.submitted_ns,
                c.finished_ns, c.output.isnot(None), c.record]

    def _list_finished_sync(self, pools: list[str] | None, statuses: list[str] | None, after: int,
                            limit: int, newest_first: bool = False, before: int = 0) -> list[TaskRecord]:
        self._ensure()
        c = self._t.tasks.c
        query = select(*self._record_columns()).where(c.finished_ns.isnot(None), c.id > after)
        if before:
            query = query.where(c.id < before)
        if pools is not None:
            query = query.where(c.pool.in_([clean_text(p) for p in pools]))
        if statuses is not None:
            query = query.where(c.status.in_(list(statuses)))
        with self._begin_read() as conn:
            rows = conn.execute(query.order_by(c.id.desc() if newest_first else c.id).limit(limit)).all()
        return [self._task_record(row) for row in rows]

    def _find_task_sync(self, ref: int | str) -> TaskRecord | None:
        self._ensure()
        c = self._t.tasks.c
        query = select(*self._record_columns())
        if isinstance(ref, str):
            query = query.where(c.key == clean_text(ref)).order_by(c.id.desc()).limit(1)
        else:
            query = query.where(c.id == ref)
        with self._begin_read() as conn:
            row = conn.execute(query).first()
        return None if row is None else self._task_record(row)

    @staticmethod
    def _task_record(row: Any) -> TaskRecord:
        return TaskRecord(id=row[0], pool=row[1], kind=row[2], key=row[3], priority=row[4], status=row[5],
                          attempt=row[6], message=row[7], submitted_ns=row[8], finished_ns=row[9],
                          has_output=bool(row[10]), tenant=_tenant_of(row[11]),
                          max_attempts=_max_attempts_of(row[11]))

    # ----------------------------------------------------------- closing

    def checked_out(self) -> int:
        """Connections of this store's pool in use right now (0 when idle)."""
        engine = self.engine
        pool = getattr(engine, "pool", None)
        checkedout = getattr(pool, "checkedout", None)
        return checkedout() if checkedout is not None else 0

    async def close(self) -> None:
        """Step down if leading, then release the connections and the worker thread."""
        if self._closed:
            return
        try:
            await self.release_leadership()
        except SchedulerError as exc:
            log.warning("%s store: could not release leadership on close: %s", self.dialect, exc)
        self._closed = True
        self._stop_watch()
        await self._executor.call(self._dispose)
        self._executor.shutdown()

    def _dispose(self) -> None:
        self._drop_writer()
        if self.engine is not None:
            self.engine.dispose()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    # ----------------------------------------------------------- processes

    def after_fork(self) -> None:
        """In the child of a fork (called by a fork handler): this copy shares
        nothing with the parent's store any more. It gets an identity of its
        own (the parent's lease and membership are not the child's), new
        connections (the parent's stay the parent's: they are forgotten,
        never closed) and a new worker thread; it neither leads nor follows
        until a scheduler starts it."""
        self.identity = _identity()
        self.epoch = None
        self._executor = Worker(f"cronoq-{self.dialect}")
        self._wconn = None
        self._watch = None
        self._lost_callback = None
        self._lost_reason = None
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.dispose(close=False)

    async def cluster_transport(self) -> ClusterTransport:
        """The SQL of the processes sharing this store (``cronoq.store.cluster``),
        on a connection of its own (connects and migrates first)."""
        await self._call(self._ensure)
        engine = self.engine
        assert engine is not None
        q = engine.dialect.identifier_preparer
        t = self._t
        tables = {table.name: q.format_table(table) for table in (t.members, t.inbox, t.attempts, t.meta, t.tasks)}
        return ClusterTransport(dialect=self.dialect, identity=self.identity, host=socket.gethostname(),
                                pid=os.getpid(), connect=self._raw_connection, quote_table=tables.__getitem__,
                                placeholder=self._placeholder, errors=self._db_errors,
                                listen=self._listen_connection(), channel=self._channel(),
                                generation=self._file_generation())

    def _raw_connection(self) -> Any:
        """A raw connection of the store's engine as it is now (SQLite makes
        another when the file at its path changed)."""
        engine = self.engine
        if engine is None:
            raise ConnectionError(f"the {self.dialect} store is not connected")
        return engine.raw_connection()

    def _file_generation(self) -> Callable[[], int] | None:
        """A count that changes whenever the store opens another database
        file (SQLite), so the cluster's connections follow; None elsewhere."""
        return None

    def _listen_connection(self) -> Callable[[], Any] | None:
        """A factory of connections that may ``LISTEN`` (None: the database cannot notify)."""
        return None

    def _channel(self) -> str | None:
        return None

    def __repr__(self) -> str:
        state = "closed" if self._closed else (f"leading (epoch {self.epoch})" if self.epoch else "idle")
        return f"<cronoq.{type(self).__name__} {self._where()} {state}>"

    def _where(self) -> str:
        return ""
