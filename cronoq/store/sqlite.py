"""``cronoq.SqliteStore``: durable state in a local SQLite file.

Leadership is a lease row in the file (holder identity, expiry on the wall
clock). A process that finds the lease free or expired takes it and
increments the fencing epoch; the others check every ``lock_poll``. The
leader renews the lease every ``lease_renew``; it lasts ``lease_ttl``. A
clean shutdown releases it, so a standby takes over at once. Every commit
checks the epoch and the holder inside its write transaction (``BEGIN
IMMEDIATE``: SQLite lets one writer in at a time), so a leader that was
paused past its lease and replaced fails with ``Fenced`` and stops.

The file is created readable and writable by its owner only (on Unix) before
SQLite opens it, and runs in WAL mode; with ``full_sync`` (the default) every
commit is synced to disk. Keep it on a local filesystem.

Commits run on the store's worker thread, except a small one made while the
event loop has nothing else ready to run (``inline_commits``, on by
default): the loop would only wait for the worker, so it commits itself and
saves the two thread hand-offs, about a third of a single durable submit.
Such a commit never waits for a lock (a busy database sends it to the
worker), never checkpoints the WAL (the worker does, in the background),
and one slower than ``INLINE_STALL``, or an average above ``INLINE_LIMIT``,
sends the commits of the next ``INLINE_PAUSE`` seconds to the worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import urllib.parse
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import create_engine, event, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool

from .. import realtime
from ..realtime import real_time_ns
from .base import Batch, Fenced, StoreUnavailable, seconds
from .migrate import upgrade
from .schema import tables
from .sql import NS, SqlStore, fork_gate

__all__ = ["SqliteStore"]

log = logging.getLogger("cronoq.store")


class SqliteStore(SqlStore):
    """Durable state in a local SQLite file; see the module documentation.

    ``keep_finished`` (seconds, default 7 days): finished tasks older than this
    are pruned. ``commit_timeout`` (default 30 s): a commit slower than this
    counts as unavailable for the callers waiting on it.
    """

    dialect = "sqlite"

    def __init__(self, path: str | bytes | os.PathLike[str] | os.PathLike[bytes], *, lease_ttl: float = 10.0,
                 lease_renew: float = 2.0, lock_poll: float = 0.5, retention: float = 3600.0,
                 full_sync: bool = True, keep_finished: float = 7 * 86400.0,
                 commit_timeout: float = 30.0, cluster: bool = True, cluster_poll: float = 0.01,
                 member_ttl: float = 10.0, request_timeout: float | None = None,
                 inline_commits: bool = True) -> None:
        try:
            given = os.fspath(path)
        except TypeError:
            raise ValueError(f"path must be a file path, got {type(path).__name__}") from None
        path = given if isinstance(given, str) else os.fsdecode(given)
        if not path or path == ":memory:" or path.startswith("file:") or "\x00" in path:
            raise ValueError(f"path must name a file on a local filesystem, got {path!r}")
        self.lease_ttl = seconds(lease_ttl, "lease_ttl")
        self.lease_renew = seconds(lease_renew, "lease_renew")
        if self.lease_renew >= self.lease_ttl:
            raise ValueError(f"lease_renew ({lease_renew!r}) must be shorter than lease_ttl ({lease_ttl!r})")
        super().__init__(tables=tables(None), lock_poll=lock_poll, retention=retention,
                         keep_finished=keep_finished, commit_timeout=commit_timeout, cluster=cluster,
                         cluster_poll=cluster_poll, member_ttl=member_ttl, request_timeout=request_timeout)
        self.path = os.path.abspath(path)
        self.full_sync = bool(full_sync)
        self.busy_timeout = min(self.commit_timeout, 5.0)
        self._read: Engine | None = None   # the engine's options for reading
        self._renewing: threading.Event | None = None   # set to stop the renewing thread
        self.inline_commits = bool(inline_commits)
        self.inline_committed = 0          # commits made on the event loop's thread
        self._inline: sqlite3.Connection | None = None   # their connection (opened by the worker)
        self._uri = ""                     # the file's URI (set when the engine is made)
        self._inline_retry_at = 0.0
        self._inline_paused_until = 0.0
        self._inline_mean = 0.0            # moving average of their durations (seconds)
        self._inline_rows = 0              # written since the last checkpoint

    def _where(self) -> str:
        return repr(self.path)

    # ----------------------------------------------------------- connecting

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error,)

    def _create_engine(self) -> Engine:
        if not os.path.exists(self.path):
            try:   # owner-only, before SQLite creates it with the default mode
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
            except FileExistsError:
                pass
            except OSError as exc:   # a directory that is not there (yet): an outage, like the others
                raise StoreUnavailable(f"cannot create the SQLite store {self.path!r}: {exc}") from exc
        # mode=rw: SQLite never creates the file itself, so a file that vanishes while
        # the store runs makes calls fail instead of starting an empty database.
        uri = f"file:{urllib.parse.quote(self.path)}?mode=rw"
        timeout = self.busy_timeout

        def connect() -> sqlite3.Connection:
            return sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=timeout)

        self._uri = uri

        engine = create_engine("sqlite+pysqlite://", creator=connect, poolclass=QueuePool,
                               pool_size=3, max_overflow=3)
        synchronous = "FULL" if self.full_sync else "NORMAL"
        busy_ms = int(self.busy_timeout * 1000)

        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
            dbapi_connection.isolation_level = None   # we issue BEGIN ourselves
            cursor = dbapi_connection.cursor()
            try:
                # Switching to WAL needs the database to itself, and SQLite may
                # answer "locked" at once (without its busy handler) while
                # another process connects: try again until the busy timeout.
                give_up = realtime.real_monotonic() + self.busy_timeout
                while True:
                    try:
                        cursor.execute("PRAGMA journal_mode=WAL")
                        break
                    except sqlite3.OperationalError as exc:
                        if "locked" not in str(exc) or realtime.real_monotonic() > give_up:
                            raise
                        threading.Event().wait(0.01)
                cursor.execute(f"PRAGMA synchronous={synchronous}")
                cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
            finally:
                cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            conn.exec_driver_sql(f"BEGIN {conn.get_execution_options().get('cronoq_begin', 'IMMEDIATE')}")

        return engine

    def _migrate(self, engine: Engine) -> None:
        with engine.connect() as conn:
            conn.execution_options(cronoq_begin="EXCLUSIVE")
            with conn.begin():
                upgrade(conn, None)

    def after_fork(self) -> None:
        super().after_fork()
        self._read = None
        self._renewing = None
        self._inline = None   # the parent's: forgotten, never closed

    # ----------------------------------------------------------- commits on the loop's thread

    INLINE_LIMIT = 0.002     # commits on the loop slower than this on average (seconds),
    INLINE_STALL = 0.02      # or one slower than this,
    INLINE_PAUSE = 1.0       # send the commits of the next second to the worker
    INLINE_ROWS = 16         # larger batches always go to the worker
    INLINE_BYTES = 64 * 1024
    CHECKPOINT_ROWS = 400    # rows written on the loop between two checkpoints (by the worker)

    def commit_now(self, epoch: int, batch: Batch) -> bool:
        """Commit ``batch`` on the calling thread, at once, if that is quick:
        a small batch, the worker idle, no other connection writing, recent
        commits fast. False if nothing was done (``commit`` then does it);
        raises as ``_commit_sync`` does, with nothing written. The runtime
        calls it when its loop has nothing else to run."""
        if not self.inline_commits or self._closed:
            return False
        if self._inline is None:   # opened by the worker after a commit of its own
            return False
        rows = len(batch.tasks) + len(batch.statuses) + len(batch.outputs)
        if rows > self.INLINE_ROWS or batch.schedules or batch.removed_schedules:
            return False
        if sum(len(t.payload) + len(t.record) for t in batch.tasks) + \
                sum(len(data) for _, data in batch.outputs) > self.INLINE_BYTES:
            return False
        if realtime.real_monotonic() < self._inline_paused_until:
            return False
        return self._executor.run_here(self._commit_inline, epoch, batch, rows)

    def _commit_sync(self, epoch: int, batch: Batch) -> None:
        super()._commit_sync(epoch, batch)
        if self._inline is None and self.inline_commits and not self._closed \
                and realtime.real_monotonic() >= self._inline_retry_at:
            self._open_inline()

    def _open_inline(self) -> None:
        """The connection of the loop's commits (on the worker thread): it
        never waits for a lock and never checkpoints."""
        try:
            conn = sqlite3.connect(self._uri, uri=True, check_same_thread=False, timeout=0,
                                   isolation_level=None)
            try:
                conn.execute(f"PRAGMA synchronous={'FULL' if self.full_sync else 'NORMAL'}")
                conn.execute("PRAGMA wal_autocheckpoint=0")
            except BaseException:
                conn.close()
                raise
        except Exception as exc:   # the worker commits meanwhile; tried again later
            log.debug("sqlite store: no connection for commits on the loop: %s", self._describe(exc))
            self._inline_retry_at = realtime.real_monotonic() + 5.0
            return
        self._inline = conn

    def _commit_inline(self, epoch: int, batch: Batch, rows: int) -> bool:
        """On the loop's thread, the worker held off (``Worker.run_here``)."""
        conn = self._inline
        if conn is None:
            return False
        started = realtime.real_monotonic()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                return False   # another connection writes: the worker waits for it
            self._drop_inline()
            raise
        try:
            self._commit_with(conn, epoch, batch)
        except BaseException:
            try:
                conn.rollback()
            except Exception:
                self._drop_inline()
            raise
        self.inline_committed += 1
        now = realtime.real_monotonic()
        took = now - started
        self._inline_mean += (took - self._inline_mean) / 8
        if took > self.INLINE_STALL or self._inline_mean > self.INLINE_LIMIT:
            self._inline_paused_until = now + self.INLINE_PAUSE
            self._inline_mean = 0.0
        self._inline_rows += rows
        if self._inline_rows >= self.CHECKPOINT_ROWS:
            self._inline_rows = 0
            try:
                self._executor.submit(self._checkpoint_quietly)
            except RuntimeError:   # the store is closing
                pass
        return True

    def _checkpoint_quietly(self) -> None:
        """Fold the WAL into the database without waiting for anyone (PASSIVE),
        so the commits on the loop, which skip it, keep a short WAL."""
        conn = self._inline
        if conn is None:
            return
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:   # busy or unavailable: the next one catches up
            log.debug("sqlite store: checkpoint skipped: %s", exc)

    def _drop_inline(self) -> None:
        conn, self._inline = self._inline, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def _drop_writer(self) -> None:
        super()._drop_writer()
        self._drop_inline()

    def _begin_read(self) -> AbstractContextManager[Connection]:
        read = self._read
        if read is None:
            read = self._read = self._ensure().execution_options(cronoq_begin="DEFERRED")
        return read.begin()

    # ----------------------------------------------------------- leadership

    def _tx_begin(self, cursor: Any) -> None:
        cursor.execute("BEGIN IMMEDIATE")

    def _check_fence(self, row: Any, epoch: int) -> None:
        if row[0] != epoch or row[1] != self.identity:
            raise Fenced(f"epoch {epoch} was replaced by epoch {row[0]} (lease holder {row[1]!r})")

    async def acquire_leadership(self) -> int:
        """Wait until the lease is free or expired, take it, and return the new epoch."""
        if self.epoch is not None:
            return self.epoch
        await self._call(self._ensure)   # an unreachable store fails here, clearly
        self._lost_reason = None
        logged = False
        try:
            while True:
                try:
                    result = await self._call(self._try_acquire_sync)
                except StoreUnavailable as exc:
                    if not logged:
                        log.warning("sqlite store: waiting for the lease: %s", exc,
                                    extra={"action": "store_outage"})
                        logged = True
                    result = None
                if isinstance(result, int):
                    self.epoch = result
                    self._start_renewing(result)
                    return result
                await realtime.sleep(self.lock_poll)
        except asyncio.CancelledError:   # given up (shutdown): free a lease an attempt may have taken
            if not self._closed:
                self._executor.submit(self._release_sync, None)
            raise

    async def try_leadership(self) -> int | None:
        """One attempt to take the lease: the new epoch, or None if another holds it."""
        if self.epoch is not None:
            return self.epoch
        self._lost_reason = None
        result = await self._call(self._try_acquire_sync)
        if isinstance(result, int):
            self.epoch = result
            self._start_renewing(result)
        return result

    def _try_acquire_sync(self) -> int | None:
        self._ensure()
        meta = self._t.meta
        now = real_time_ns()   # leases are real time: a frozen test clock must not keep one alive
        with self._begin() as conn:
            epoch: int
            epoch, holder, expires = conn.execute(
                select(meta.c.epoch, meta.c.holder, meta.c.lease_expires_ns).where(meta.c.id == 1)).one()
            if holder is not None and holder != self.identity and (expires or 0) > now:
                return None
            epoch += 1
            conn.execute(update(meta).where(meta.c.id == 1).values(
                epoch=epoch, holder=self.identity, lease_expires_ns=now + round(self.lease_ttl * NS)))
        log.info("sqlite store: lease taken (epoch %d) on %s", epoch, self.path,
                 extra={"action": "leader", "epoch": epoch})
        return epoch

    def _start_renewing(self, epoch: int) -> None:
        """Renew the lease from a thread of its own, with its own connection:
        neither a long recovery on the store's worker thread nor a busy event
        loop (decoding a large backlog) may let it expire."""
        stop = threading.Event()
        self._renewing = stop
        loop = asyncio.get_running_loop()
        thread = threading.Thread(target=self._renew_thread, args=(epoch, stop, loop),
                                  name="cronoq-sqlite-lease", daemon=True)
        thread.start()

    def _stop_watch(self) -> None:
        super()._stop_watch()
        stop, self._renewing = self._renewing, None
        if stop is not None:
            stop.set()

    def _renew_thread(self, epoch: int, stop: threading.Event, loop: asyncio.AbstractEventLoop) -> None:
        logged = False
        while not stop.wait(self.lease_renew):
            if self.epoch != epoch or self._closed:
                return
            fork_gate.enter()
            try:
                holder = self._renew_sync(epoch)
            except Exception as exc:   # unavailable: try again at the next period
                if not logged:
                    log.error("sqlite store: cannot renew the lease: %s", self._describe(exc),
                              extra={"action": "store_outage"})
                    logged = True
                continue
            finally:
                fork_gate.leave()
            if logged:
                logged = False
                log.warning("sqlite store: the lease is renewed again", extra={"action": "store_recovered"})
            if holder is not None:
                reason = f"the lease was taken over by {holder[0]!r} (epoch {holder[1]})"
                try:
                    loop.call_soon_threadsafe(self._lost_in, epoch, reason)
                except RuntimeError:   # the loop is closed: nobody to tell
                    pass
                return

    def _lost_in(self, epoch: int, reason: str) -> None:
        if self.epoch == epoch:
            self._signal_lost(reason)

    def _renew_sync(self, epoch: int) -> tuple[str | None, int] | None:
        """None when renewed, else the (holder, epoch) that replaced us."""
        meta = self._t.meta
        with self._begin() as conn:
            current, holder = conn.execute(select(meta.c.epoch, meta.c.holder).where(meta.c.id == 1)).one()
            if current != epoch or holder != self.identity:
                return holder, current
            conn.execute(update(meta).where(meta.c.id == 1).values(
                lease_expires_ns=real_time_ns() + round(self.lease_ttl * NS)))
        return None

    async def release_leadership(self) -> None:
        """Free the lease so a standby takes over at once."""
        epoch, self.epoch = self.epoch, None
        self._stop_watch()
        if epoch is None or self._closed:
            return
        await self._call(self._release_sync, epoch)

    def _release_sync(self, epoch: int | None) -> None:
        """Free the lease if this store holds it (in ``epoch``, if given)."""
        self._drop_writer()
        meta = self._t.meta
        mine = [meta.c.id == 1, meta.c.holder == self.identity]
        if epoch is not None:
            mine.append(meta.c.epoch == epoch)
        with self._begin() as conn:
            conn.execute(update(meta).where(*mine).values(holder=None, lease_expires_ns=None))
