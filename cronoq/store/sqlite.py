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

A file deleted, moved or replaced while open keeps taking SQLite's writes
(the open file lives on, nameless), while a process that opens the path gets
another database. So every fenced write (commits, checkpoints) and every
lease renewal checks, once committed and before it counts, that the path
still names the file opened (device and inode): if not, the write fails,
the store stops leading and writes nothing more there. It folds the old
file's WAL into it, takes its -wal and -shm off the path (a database opened
there later must not read them), and saves a copy of a deleted file next to
the path: the tasks committed before are only in it. A store never creates
a file at its path again once it opened one there (``create``): it waits for
a database to be put there, and then takes the lease as a standby does.

Commits run on the store's worker thread, except a small one made while the
event loop has nothing else ready to run (``inline_commits``, on by
default): the loop would only wait for the worker, so it commits itself and
saves the two thread hand-offs, about a third of a single durable submit.
Such a commit never waits for a lock (a busy database sends it to the
worker), never checkpoints the WAL (a thread of its own does, in the
background, on a connection of its own, so a checkpoint never holds up a
commit on the loop), and one slower than ``INLINE_STALL``, or an average
above ``INLINE_LIMIT``, sends the commits of the next ``INLINE_PAUSE``
seconds to the worker.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import sqlite3
import stat
import threading
import time
import urllib.parse
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Callable

from sqlalchemy import create_engine, event, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool

from .. import realtime
from ..realtime import real_time_ns
from .base import Batch, ClusterStore, Fenced, StoreUnavailable, seconds
from .migrate import upgrade
from .schema import tables
from .sql import NS, SqlStore
from .worker import Worker, fork_gate

__all__ = ["SqliteStore"]

log = logging.getLogger("cronoq.store")


class SqliteStore(SqlStore):
    """Durable state in a local SQLite file; see the module documentation.

    ``keep_finished`` (seconds, default 7 days): finished tasks older than this
    are pruned. ``commit_timeout`` (default 30 s): a commit slower than this
    counts as unavailable for the callers waiting on it. ``create`` (default
    True): create the file if it is missing when the store first opens it;
    with False, or once the store opened a file there, a missing file is
    waited for (``acquire_leadership``), never created.
    """

    dialect = "sqlite"

    def __init__(self, path: str | bytes | os.PathLike[str] | os.PathLike[bytes], *, lease_ttl: float = 10.0,
                 lease_renew: float = 2.0, lock_poll: float = 0.5, retention: float = 3600.0,
                 full_sync: bool = True, keep_finished: float = 7 * 86400.0,
                 commit_timeout: float = 30.0, cluster: bool = True, cluster_poll: float = 0.01,
                 member_ttl: float = 10.0, request_timeout: float | None = None,
                 inline_commits: bool = True, create: bool = True) -> None:
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
        self._inline_pages = 0             # WAL pages written on the loop since the last checkpoint (about)
        self._checkpointer = Worker("cronoq-sqlite-checkpoint")
        self._checkpoint_conn: tuple[int, sqlite3.Connection] | None = None   # (file opened, its connection)
        self.checkpoints = 0               # checkpoints of the loop's commits made
        self._may_create = bool(create)    # False once a file was opened at the path
        self._file: tuple[int, int] | None = None   # (st_dev, st_ino) of the file opened
        self._side_files: dict[str, tuple[int, int]] = {}   # its -wal and -shm, as opened
        self._opened = 0                   # files opened (a new one: the cluster's connections follow)
        self._abandoned = 0                # the last of them given up (see _abandon_file)
        self._orphan_saved = False         # and nothing of it is only in its -wal any more
        self._stale_logged = False

    def _where(self) -> str:
        return repr(self.path)

    # ----------------------------------------------------------- connecting

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error,)

    def _create_file(self) -> None:
        """Create the missing file (owner-only, before SQLite creates it with the default mode)."""
        if not self._may_create:
            why = ("it had one open there, which was deleted or moved" if self._file is not None
                   else "it was made with create=False")
            raise StoreUnavailable(f"the SQLite store file {self.path!r} is missing, and this store does not "
                                   f"create it ({why}): waiting until a database is at that path")
        stale = [self.path + suffix for suffix in ("-wal", "-shm") if os.path.exists(self.path + suffix)]
        if stale and not os.path.exists(self.path):   # SQLite makes the database before its -wal
            raise StoreUnavailable(
                f"cannot create the SQLite store {self.path!r}: {' and '.join(stale)} of a database deleted "
                f"there while open are still present (a process may still use them), and a new database "
                f"would read them; stop every process using {self.path!r}, then remove them")
        try:
            os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
        except FileExistsError:
            pass
        except OSError as exc:   # a directory that is not there (yet): an outage, like the others
            raise StoreUnavailable(f"cannot create the SQLite store {self.path!r}: {exc}") from exc

    def _create_engine(self) -> Engine:
        if not os.path.exists(self.path):
            self._create_file()
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise StoreUnavailable(f"cannot open the SQLite store {self.path!r}: {exc}") from exc
        file_id = (st.st_dev, st.st_ino)
        self._file = file_id
        self._may_create = False
        self._side_files = {}
        self._opened += 1
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
            moved = self._moved(file_id)   # every connection of this engine is to the same file
            if moved is not None:
                dbapi_connection.close()
                if file_id == self._file:
                    self._lose_file(moved)
                raise sqlite3.OperationalError(moved)
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
            for suffix in ("-wal", "-shm"):   # there while a connection is open
                try:
                    st = os.stat(self.path + suffix)
                except OSError:
                    continue
                self._side_files[suffix] = (st.st_dev, st.st_ino)

    def after_fork(self) -> None:
        super().after_fork()
        self._read = None
        self._renewing = None
        self._inline = None   # the parent's: forgotten, never closed
        self._checkpointer = Worker("cronoq-sqlite-checkpoint")
        self._checkpoint_conn = None
        self._gone = None     # the child opens the path again

    # ----------------------------------------------------------- the file at the path

    def _moved(self, file_id: tuple[int, int] | None) -> str | None:
        """Why the path no longer names the file ``file_id``; None if it does."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                return (f"the database file {self.path!r} cannot be checked ({exc.strerror}): "
                        f"it may have been deleted or replaced while open")
        else:
            if (st.st_dev, st.st_ino) == file_id:
                return None
        return f"the database file {self.path!r} was deleted or replaced while open"

    def _check_file(self) -> None:
        """A fenced write is committed: ``Fenced`` unless it went to the file at the path."""
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._file:
                return
        except OSError:
            pass
        reason = self._moved(self._file)
        if reason is not None:
            self._lose_file(reason)
            raise Fenced(reason)

    def _lose_file(self, reason: str) -> None:
        """The path no longer names the open file: nothing more is written
        to it, and the worker gives it up (``_abandon_file``). Any thread."""
        if self._gone is not None:
            return
        self._gone = reason
        if self.epoch is not None:
            log.error("sqlite store: %s: this process acknowledges nothing more and stops leading; the tasks "
                      "committed before are not in a file at that path any more", reason,
                      extra={"action": "store_file_lost", "path": self.path})
        else:
            log.error("sqlite store: %s: nothing more is written to it", reason,
                      extra={"action": "store_file_lost", "path": self.path})
        try:
            self._executor.submit(self._abandon_file, self._opened)
        except RuntimeError:   # the store is closing
            pass

    def _abandon_file(self, opened: int) -> bool:
        """On the worker, for the ``opened``-th file, no longer at the path:
        fold its WAL into it (a moved file then holds everything), save a
        copy of a file left without a name (unless another process leading
        on it does), then take its -wal and -shm off the path (a database put
        there must not read them). True once that is done; False while the
        leader of the file has yet to save it."""
        if opened != self._opened or self.engine is None:
            return True
        if self._abandoned == opened and not self._stale_side_files():
            return True
        proxied = None
        try:
            if self._wconn is not None:
                raw = self._wconn.dbapi_connection
            else:
                proxied = self.engine.raw_connection()   # one the pool kept; a new one is refused
                raw = proxied.dbapi_connection
        except Exception as exc:
            if self._abandoned != opened:
                self._abandoned = opened
                log.error("sqlite store: no connection to the file that was at %r is left (%s): what was "
                          "committed to it cannot be saved", self.path, self._describe(exc),
                          extra={"action": "store_file_lost", "path": self.path})
            return not self._stale_side_files()
        try:
            return self._give_up_file(raw, opened)
        finally:
            if proxied is not None:
                proxied.close()

    # The lease a process that saved a deleted file leaves in it: held for good, so
    # that the others that had it open do not save it again.
    SAVED = 2**63 - 1

    def _give_up_file(self, conn: Any, opened: int) -> bool:
        folded = self._fold(conn)
        if self._abandoned != opened:
            name, links = _open_file(self._file)
            copy = None
            if links is None or links == 0:
                meta = self._t.meta.name
                try:
                    holder, expires = conn.execute(
                        f"SELECT holder, lease_expires_ns FROM {meta} WHERE id = 1").fetchone()
                except sqlite3.Error:
                    holder, expires = None, None
                if expires != self.SAVED and holder not in (None, self.identity) and (expires or 0) > real_time_ns():
                    return False   # its leader saves it when it notices (soon: it renews its lease)
                if expires != self.SAVED:
                    copy = self._save_copy(conn)
                    if copy is not None and links == 0:
                        try:
                            conn.execute(f"UPDATE {meta} SET holder = ?, lease_expires_ns = ? WHERE id = 1",
                                         (self.identity, self.SAVED))
                        except sqlite3.Error as exc:   # the others may save it too
                            log.warning("sqlite store: cannot mark the deleted file saved: %s", exc)
            else:
                log.error("sqlite store: the file that was at %r is still there under another name%s", self.path,
                          f" ({name})" if name else "", extra={"action": "store_file_lost", "path": self.path})
            self._abandoned = opened
            self._orphan_saved = folded or links == 0 or (links is None and copy is not None)
        if folded or self._orphan_saved:   # nothing of it is only in its -wal
            for side in self._stale_side_files():
                try:
                    os.unlink(side)
                except OSError:
                    pass
        stale = self._stale_side_files()
        if stale and not self._stale_logged:
            self._stale_logged = True
            log.error("sqlite store: %s of the database that was at %r %s still there: a database opened at "
                      "that path would read them; remove them once no process uses the old file",
                      " and ".join(stale), self.path, "are" if len(stale) > 1 else "is",
                      extra={"action": "store_file_lost", "path": self.path})
        return not stale

    def _stale_side_files(self) -> list[str]:
        """The -wal and -shm of the file opened, if they are still at the path."""
        stale = []
        for suffix, side in self._side_files.items():
            try:
                st = os.stat(self.path + suffix)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == side:
                stale.append(self.path + suffix)
        return stale

    def _fold(self, conn: Any) -> bool:
        """Checkpoint all of the WAL into the database file; True if done.
        Another process doing the same makes it busy for a moment: tried
        again, for up to ``busy_timeout``."""
        give_up = realtime.real_monotonic() + self.busy_timeout
        while True:
            try:
                if conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0:
                    return True
            except sqlite3.Error as exc:
                log.warning("sqlite store: the file that was at %r cannot be checkpointed: %s", self.path, exc)
                return False
            if realtime.real_monotonic() > give_up:
                return False
            threading.Event().wait(0.05)

    def _save_copy(self, conn: Any) -> str | None:
        """A copy of the open database beside the path (SQLite's online
        backup); its name, logged. None if it cannot be made."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = f"{self.path}.rescued-{stamp}-{os.getpid()}"
        partial = f"{self.path}.rescuing-{stamp}-{os.getpid()}"   # renamed once complete
        try:
            os.close(os.open(partial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            dest = sqlite3.connect(partial)
            try:
                conn.backup(dest)
            finally:
                dest.close()
            os.rename(partial, target)
        except (OSError, sqlite3.Error) as exc:
            log.error("sqlite store: the file that was at %r is deleted and no copy of it could be saved "
                      "(%s): the tasks committed to it are lost", self.path, exc,
                      extra={"action": "store_file_lost", "path": self.path})
            return None
        log.error("sqlite store: the tasks committed to %r before it was deleted are saved in %r: to keep them, "
                  "stop every process using %r, then move that copy to it", self.path, target, self.path,
                  extra={"action": "store_file_rescued", "path": self.path, "copy": target})
        return target

    def _reopen(self) -> None:
        """Leave the file that is gone and open the one at the path (on the worker)."""
        self._drop_writer()
        self._read = None
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.dispose()
        self._gone = None
        self._orphan_saved = self._stale_logged = False
        self._ensure()

    def _file_generation(self) -> Callable[[], int] | None:
        return lambda: self._opened

    # ----------------------------------------------------------- commits on the loop's thread

    INLINE_LIMIT = 0.002     # commits on the loop slower than this on average (seconds),
    INLINE_STALL = 0.02      # or one slower than this,
    INLINE_PAUSE = 1.0       # send the commits of the next second to the worker
    INLINE_ROWS = 16         # larger batches always go to the worker
    INLINE_BYTES = 64 * 1024
    # WAL pages written on the loop between two checkpoints, counted as one per
    # commit (a commit appends each page it changes once, and a submit with the
    # completions of earlier tasks changes about as many as a submit alone: the
    # newest rows share their pages) plus one per page of payloads and outputs.
    CHECKPOINT_PAGES = 400
    PAGE = 4096

    def commit_now(self, epoch: int, batch: Batch) -> bool:
        """Commit ``batch`` on the calling thread, at once, if that is quick:
        a small batch, the worker idle, no other connection writing, recent
        commits fast. False if nothing was done (``commit`` then does it);
        raises as ``_commit_sync`` does, with nothing written. The runtime
        calls it when its loop has nothing else to run."""
        if not self.inline_commits or self._closed or self._gone is not None:
            return False
        if self._inline is None:   # opened by the worker after a commit of its own
            return False
        rows = len(batch.tasks) + len(batch.statuses) + len(batch.outputs)
        if rows > self.INLINE_ROWS or batch.schedules or batch.removed_schedules:
            return False
        size = sum(len(t.payload) + len(t.record) for t in batch.tasks) + \
            sum(len(data) for _, data in batch.outputs)
        if size > self.INLINE_BYTES:
            return False
        if realtime.real_monotonic() < self._inline_paused_until:
            return False
        return self._executor.run_here(self._commit_inline, epoch, batch, size)

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
                moved = self._moved(self._file)
                if moved is not None:
                    self._lose_file(moved)
                    raise sqlite3.OperationalError(moved)
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

    def _commit_inline(self, epoch: int, batch: Batch, size: int) -> bool:
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
        self._inline_pages += 1 + size // self.PAGE
        if self._inline_pages >= self.CHECKPOINT_PAGES:
            self._inline_pages = 0
            try:
                self._checkpointer.submit(self._checkpoint_quietly, self._opened)
            except RuntimeError:   # the store is closing
                pass
        return True

    def _checkpoint_quietly(self, opened: int) -> None:
        """Fold the WAL into the database without waiting for anyone (PASSIVE),
        so the commits on the loop, which skip it, keep a short WAL. On the
        checkpoint thread, with its own connection: the worker stays free,
        so a commit on the loop meanwhile does not wait for it."""
        held = self._checkpoint_conn
        if held is not None and (held[0] != opened or self._closed or self._gone is not None):
            self._close_checkpointer()   # a file given up: its connection goes
            held = None
        if self._closed or self._gone is not None or opened != self._opened:
            return
        try:
            if held is None:
                conn = sqlite3.connect(self._uri, uri=True, check_same_thread=False, timeout=0,
                                       isolation_level=None)
                held = self._checkpoint_conn = (opened, conn)
                conn.execute(f"PRAGMA synchronous={'FULL' if self.full_sync else 'NORMAL'}")
                conn.execute("PRAGMA wal_autocheckpoint=0")
            moved = self._moved(self._file)
            if moved is not None:   # the worker gives the file up (see _lose_file)
                self._close_checkpointer()
                return
            held[1].execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self.checkpoints += 1
        except sqlite3.Error as exc:   # busy or unavailable: the next one catches up
            log.debug("sqlite store: checkpoint skipped: %s", exc)
            self._close_checkpointer()

    def _close_checkpointer(self) -> None:
        """On the checkpoint thread: close its connection."""
        held, self._checkpoint_conn = self._checkpoint_conn, None
        if held is not None:
            try:
                held[1].close()
            except Exception:
                pass

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

    async def close(self) -> None:
        await super().close()
        checkpointer = self._checkpointer
        if checkpointer.started:   # after any checkpoint under way, its connection goes
            try:
                await asyncio.wrap_future(checkpointer.submit(self._close_checkpointer))
            except RuntimeError:   # already shut down
                pass
        checkpointer.shutdown()

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
        if self._may_create or os.path.exists(self.path):   # else a missing file is waited for, below
            await self._call(self._ensure)   # an unreachable store fails here, clearly
        self._lost_reason = None
        logged = ""   # the reason last logged: each new one is logged once
        try:
            while True:
                try:
                    result = await self._call(self._try_acquire_sync)
                except StoreUnavailable as exc:
                    if str(exc) != logged:
                        log.warning("sqlite store: waiting for the lease: %s", exc,
                                    extra={"action": "store_outage"})
                        logged = str(exc)
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
        if self._gone is None:
            moved = self._moved(self._file)
            if moved is not None:
                self._lose_file(moved)
        if self._gone is not None:   # never the lease of a file that is gone: the one at the path
            if not self._abandon_file(self._opened):
                raise StoreUnavailable(f"the database that was at {self.path!r} is not saved yet (by its leader), "
                                       f"or its -wal and -shm files are still there: waiting")
            self._reopen()
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
        moved = self._moved(self._file)
        if moved is not None:   # taken on a file that is gone meanwhile: no lease at all
            self._lose_file(moved)
            return None
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
                lost = self._renew_sync(epoch)
            except Exception as exc:   # unavailable: try again at the next period
                if self._gone is None:
                    # A new connection to a deleted path fails to open at all (mode=rw): that is
                    # the file gone, not an outage to wait out.
                    moved = self._moved(self._file)
                    if moved is not None:
                        self._lose_file(moved)
                if self._gone is not None:   # it found the file gone (on a new connection)
                    try:
                        loop.call_soon_threadsafe(self._lost_in, epoch, self._gone)
                    except RuntimeError:
                        pass
                    return
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
            if lost is not None:
                try:
                    loop.call_soon_threadsafe(self._lost_in, epoch, lost)
                except RuntimeError:   # the loop is closed: nobody to tell
                    pass
                return

    def _lost_in(self, epoch: int, reason: str) -> None:
        if self.epoch == epoch:
            self._signal_lost(reason)

    def _renew_sync(self, epoch: int) -> str | None:
        """None when renewed, else why the lease is lost."""
        if self._gone is not None:
            return self._gone
        meta = self._t.meta
        with self._begin() as conn:
            current, holder = conn.execute(select(meta.c.epoch, meta.c.holder).where(meta.c.id == 1)).one()
            if current != epoch or holder != self.identity:
                return f"the lease was taken over by {holder!r} (epoch {current})"
            conn.execute(update(meta).where(meta.c.id == 1).values(
                lease_expires_ns=real_time_ns() + round(self.lease_ttl * NS)))
        moved = self._moved(self._file)
        if moved is not None:   # renewed in a file that is gone: a lease nobody else sees
            self._lose_file(moved)
            return moved
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
        if self._gone is None and self.engine is not None:
            moved = self._moved(self._file)
            if moved is not None:   # a leader stopping before it noticed: it saves the file all the same
                self._lose_file(moved)
        if self._gone is not None:   # its file is gone: nothing there to free, but it is given up first
            self._abandon_file(self._opened)
            return
        meta = self._t.meta
        mine = [meta.c.id == 1, meta.c.holder == self.identity]
        if epoch is not None:
            mine.append(meta.c.epoch == epoch)
        with self._begin() as conn:
            conn.execute(update(meta).where(*mine).values(holder=None, lease_expires_ns=None))


def _open_file(file_id: tuple[int, int] | None) -> tuple[str | None, int | None]:
    """Where the file ``file_id`` this process has open is now and how many
    names it has (0: deleted), from ``/proc/self/fd``; (None, None) where
    that is unknown (not Linux)."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None, None
    for fd in fds:
        try:
            st = os.fstat(int(fd))
        except (OSError, ValueError):
            continue
        if (st.st_dev, st.st_ino) == file_id and stat.S_ISREG(st.st_mode):
            try:
                name: str | None = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                name = None
            return name, st.st_nlink
    return None, None


if TYPE_CHECKING:
    def _satisfies_the_cluster_protocol(store: SqliteStore) -> ClusterStore:
        return store   # mypy checks that SqliteStore has every member the runtime's cluster uses
