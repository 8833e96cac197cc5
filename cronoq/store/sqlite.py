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
from .base import Fenced, StoreUnavailable, seconds
from .migrate import upgrade
from .schema import tables
from .sql import NS, SqlStore

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
                 commit_timeout: float = 30.0) -> None:
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
                         keep_finished=keep_finished, commit_timeout=commit_timeout)
        self.path = os.path.abspath(path)
        self.full_sync = bool(full_sync)
        self.busy_timeout = min(self.commit_timeout, 5.0)
        self._read: Engine | None = None   # the engine's options for reading
        self._renewing: threading.Event | None = None   # set to stop the renewing thread

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

        engine = create_engine("sqlite+pysqlite://", creator=connect, poolclass=QueuePool,
                               pool_size=2, max_overflow=2)
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
            try:
                holder = self._renew_sync(epoch)
            except Exception as exc:   # unavailable: try again at the next period
                if not logged:
                    log.error("sqlite store: cannot renew the lease: %s", self._describe(exc),
                              extra={"action": "store_outage"})
                    logged = True
                continue
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
