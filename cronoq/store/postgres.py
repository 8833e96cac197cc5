"""``cronoq.PostgresStore``: durable state in PostgreSQL (psycopg 3 through SQLAlchemy).

Leadership is a session-level advisory lock (its key derived from the schema
name) held by a dedicated connection: every instance tries
``pg_try_advisory_lock`` every ``lock_poll``; the holder increments the epoch
and serves. The leader checks its lock session every ``keepalive`` and steps
down when the session fails, or does not answer for ``session_timeout``; TCP
keepalives on both ends use the same timeout, so the server drops the lock of
a vanished leader promptly. Every commit locks the meta row (``SELECT ...
FOR UPDATE``) and checks the epoch, so a deposed leader's commit fails with
``Fenced``.

Tables live in ``schema`` (``public`` by default): instances with the same
schema form one cluster; different schemas are independent.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import urllib.parse
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from sqlalchemy import create_engine, func, select, text, update
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

from .. import realtime
from ..core.errors import SchedulerError
from .base import Batch, ClusterStore, Fenced, StoreUnavailable, seconds
from .cluster import channel_name
from .migrate import upgrade
from .schema import tables
from .sql import SqlStore
from .worker import Worker

_T = TypeVar("_T")

__all__ = ["PostgresStore"]

log = logging.getLogger("cronoq.store")

_DRIVERS = {"postgres", "postgresql", "postgresql+psycopg"}


def _quote_userinfo(url: str) -> str:
    """``url`` with every "@" but the one before the host percent-encoded (in
    the password, the user and the query), so a password holding an "@" is
    parsed as a password, never as part of the host."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = rest.find("?")
    base, query = (rest, "") if end < 0 else (rest[:end], rest[end:].replace("@", "%40"))
    at = base.rfind("@")
    if at >= 0:
        base = base[:at].replace("@", "%40") + base[at:]
    return f"{scheme}{sep}{base}{query}"


def _password_from_query(url: URL) -> URL:
    """A password given as ``?password=`` moved into the URL's password field,
    where every rendering of the URL masks it (psycopg gets it either way)."""
    password = url.query.get("password")
    if password is None:
        return url
    if not isinstance(password, str):   # given more than once: the last one counts, as in the driver
        password = password[-1]
    return url.difference_update_query(["password"]).set(password=password)


def _lock_key(purpose: str, schema: str) -> int:
    """A stable signed 64-bit advisory lock key for this schema."""
    digest = hashlib.sha256(f"cronoq:{purpose}:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PostgresStore(SqlStore):
    """Durable state in PostgreSQL with an advisory-lock leader; see the module documentation.

    ``url``: ``postgresql://user:password@host:port/database`` (the psycopg 3
    driver is used; ``postgresql+psycopg://`` is accepted as well).
    ``keep_finished`` (seconds, default 7 days): finished tasks older than this
    are pruned. ``commit_timeout`` (default 30 s): a commit slower than this
    counts as unavailable.
    """

    dialect = "postgresql"

    def __init__(self, url: Any, *, schema: str = "public", lock_poll: float = 0.5,
                 keepalive: float = 1.0, session_timeout: float = 10.0, retention: float = 3600.0,
                 keep_finished: float = 7 * 86400.0, commit_timeout: float = 30.0, cluster: bool = True,
                 cluster_poll: float = 0.05, member_ttl: float = 10.0,
                 request_timeout: float | None = None) -> None:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise ImportError("cronoq.PostgresStore needs psycopg 3: "
                              "pip install 'cronoq[postgres]'") from None
        try:
            parsed = make_url(_quote_userinfo(url) if isinstance(url, str) else url)
        except (ArgumentError, TypeError, ValueError):
            raise ValueError("url must be a PostgreSQL URL: postgresql://user:password@host:port/database "
                             "(the URL given does not parse; it is not repeated here as it may hold a "
                             "password)") from None
        parsed = _password_from_query(parsed)
        if parsed.drivername not in _DRIVERS:
            raise ValueError(f"url must be a postgresql:// URL (psycopg 3 is used), "
                             f"got {parsed.drivername}://")
        if not isinstance(schema, str) or not schema or "\x00" in schema or len(schema) > 63:
            raise ValueError(f"schema must be a PostgreSQL schema name (1 to 63 characters), got {schema!r}")
        self.keepalive = seconds(keepalive, "keepalive")
        self.session_timeout = seconds(session_timeout, "session_timeout")
        super().__init__(tables=tables(schema), lock_poll=lock_poll, retention=retention,
                         keep_finished=keep_finished, commit_timeout=commit_timeout, cluster=cluster,
                         cluster_poll=cluster_poll, member_ttl=member_ttl, request_timeout=request_timeout)
        self.url = parsed.set(drivername="postgresql+psycopg")
        password = parsed.password
        # Masked in any error text this store produces (the driver's messages included).
        self._secrets = tuple({str(password), urllib.parse.quote(str(password), safe="")}) if password else ()
        self.schema = schema
        self.lock_key = _lock_key("leader", schema)
        self.migrate_key = _lock_key("migrate", schema)
        self._lock_engine: Engine | None = None
        self._lock_conn: Connection | None = None
        # The lock session has its own thread: a slow commit must not delay the keepalive.
        self._lock_executor = Worker("cronoq-postgresql-lock")

    def _where(self) -> str:
        return f"{self.url.render_as_string(hide_password=True)} schema={self.schema!r}"

    # ----------------------------------------------------------- connecting

    def _connect_args(self, *, lock_session: bool) -> dict[str, Any]:
        timeout = self.session_timeout
        args: dict[str, Any] = {
            "connect_timeout": max(1, math.ceil(timeout)),
            "application_name": "cronoq-leader-lock" if lock_session else "cronoq",
            # Client-side TCP keepalives: a dead peer is noticed within about session_timeout.
            "keepalives": 1,
            "keepalives_idle": max(1, int(timeout / 3)),
            "keepalives_interval": max(1, int(timeout / 6)),
            "keepalives_count": 3,
            "tcp_user_timeout": int(timeout * 1000),
        }
        if not lock_session:
            # A commit waiting for the meta row (another instance's commit, or a
            # new leader's epoch bump) gives up and is retried rather than hang.
            args["options"] = f"-c lock_timeout={int(min(self.commit_timeout, 5.0) * 1000)}"
        return args

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        import psycopg
        return (psycopg.Error,)

    def _create_engine(self) -> Engine:
        return create_engine(self.url, pool_size=3, max_overflow=3,
                             connect_args=self._connect_args(lock_session=False))

    def _migrate(self, engine: Engine) -> None:
        with engine.begin() as conn:
            conn.execute(select(func.pg_advisory_xact_lock(self.migrate_key)))
            exists = conn.execute(text("SELECT 1 FROM pg_namespace WHERE nspname = :name"),
                                  {"name": self.schema}).first()
            if exists is None:
                conn.exec_driver_sql(f"CREATE SCHEMA {conn.dialect.identifier_preparer.quote(self.schema)}")
            upgrade(conn, self.schema)

    _placeholder = "%s"
    _commit_outcome_may_be_lost = True
    _fence_suffix = " FOR UPDATE"   # commits serialize on the meta row; a new leader's bump waits

    # Column types of the binary COPY of new task rows (in INSERT_COLUMNS order).
    _COPY_TYPES = {"id": "int8", "priority": "int4", "attempt": "int4", "submitted_ns": "int8",
                   "updated_ns": "int8", "finished_ns": "int8", "payload": "bytea", "output": "bytea"}

    def _prepare(self, engine: Engine) -> None:
        super()._prepare(engine)
        q = engine.dialect.identifier_preparer
        tasks = self._t.tasks
        self._sql["copy"] = (
            f"COPY {q.format_table(tasks)} "
            f"({', '.join(q.quote(tasks.c[name].name) for name in self.INSERT_COLUMNS)}) "
            f"FROM STDIN (FORMAT BINARY)")
        self._copy_types = [self._COPY_TYPES.get(name, "text") for name in self.INSERT_COLUMNS]
        self._no_copy = False
        import psycopg
        self._no_pipeline = not psycopg.Pipeline.is_supported()   # libpq before 14

    def _insert_rows(self, cursor: Any, rows: list[list[Any]]) -> None:
        if len(rows) < self.COPY_ROWS or self._no_copy:
            cursor.executemany(self._sql["insert"], rows)   # ON CONFLICT DO NOTHING
            return
        # Many rows: COPY is several times faster than any INSERT.
        with cursor.copy(self._sql["copy"]) as copy:
            copy.set_types(self._copy_types)
            for row in rows:
                copy.write_row(row)

    def _pipeline(self, conn: Any) -> AbstractContextManager[Any]:
        # BEGIN and the fence go out together; the writes and COMMIT then go in
        # one round trip (a write that fails makes the server skip the COMMIT,
        # and psycopg raises its error): two round trips instead of one per
        # statement, which a single submit beside running work (its insert,
        # the previous task's end) made five.
        pipeline: AbstractContextManager[Any] = conn.dbapi_connection.pipeline()
        return pipeline

    def _pipelines(self, batch: Batch) -> bool:
        if self._no_pipeline:
            return False
        # Not with COPY (many new rows, see _insert_rows), which a pipeline cannot carry.
        return len(batch.tasks) < self.COPY_ROWS or self._no_copy

    COPY_ROWS = 16

    def _commit_sync(self, epoch: int, batch: Batch) -> None:
        from psycopg.errors import UniqueViolation
        try:
            super()._commit_sync(epoch, batch)
        except UniqueViolation:
            # A retried batch whose first attempt did commit (its answer was lost):
            # COPY cannot skip the rows already there, INSERT ... ON CONFLICT can.
            self._no_copy = True
            try:
                super()._commit_sync(epoch, batch)
            finally:
                self._no_copy = False

    # ----------------------------------------------------------- fencing

    def _check_fence(self, row: Any, epoch: int) -> None:
        if row[0] != epoch:
            raise Fenced(f"epoch {epoch} was replaced by epoch {row[0]}")

    def _deposed(self) -> None:
        super()._deposed()
        self._close_lock_later()

    # ----------------------------------------------------------- the lock session

    async def _lock_call(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._closed:
            raise SchedulerError("the postgresql store is closed")
        try:
            return await self._lock_executor.call(fn, *args)
        except SchedulerError:
            raise
        except self._db_errors as exc:
            raise StoreUnavailable(f"the postgresql store is unavailable: {self._describe(exc)}") from exc

    def _lock_session(self) -> Connection:
        conn = self._lock_conn
        if conn is None:
            engine = self._lock_engine
            if engine is None:
                engine = self._lock_engine = create_engine(
                    self.url, poolclass=NullPool, isolation_level="AUTOCOMMIT",
                    connect_args=self._connect_args(lock_session=True))
            conn = engine.connect()
            try:
                # Server-side keepalives: the server drops the lock of a vanished leader promptly.
                timeout = self.session_timeout
                conn.exec_driver_sql(
                    f"SET tcp_keepalives_idle = {max(1, int(timeout / 3))}; "
                    f"SET tcp_keepalives_interval = {max(1, int(timeout / 6))}; "
                    f"SET tcp_keepalives_count = 3; "
                    f"SET tcp_user_timeout = {int(timeout * 1000)}")
            except BaseException:
                conn.close()
                raise
            self._lock_conn = conn
        return conn

    def _close_lock(self) -> None:
        conn, self._lock_conn = self._lock_conn, None
        if conn is not None:
            try:
                conn.close()   # NullPool: the session ends, and its advisory lock with it
            except Exception:
                pass

    def _close_lock_later(self) -> None:
        try:
            self._lock_executor.submit(self._close_lock)
        except RuntimeError:
            pass

    def _try_lock_sync(self) -> bool:
        conn = self._lock_session()
        try:
            return bool(conn.execute(select(func.pg_try_advisory_lock(self.lock_key))).scalar())
        except BaseException:
            self._close_lock()
            raise

    def _ping_sync(self) -> None:
        conn = self._lock_conn
        if conn is None:
            raise StoreUnavailable("the lock session is closed")
        conn.exec_driver_sql("SELECT 1").scalar()

    def _bump_sync(self) -> int:
        meta = self._t.meta
        with self._ensure().begin() as conn:
            epoch: int = conn.execute(update(meta).where(meta.c.id == 1)
                                      .values(epoch=meta.c.epoch + 1, holder=self.identity)
                                      .returning(meta.c.epoch)).scalar_one()
        return epoch

    # ----------------------------------------------------------- leadership

    async def try_leadership(self) -> int | None:
        """One attempt at the advisory lock: the new epoch, or None if another holds it."""
        if self.epoch is not None:
            return self.epoch
        await self._call(self._ensure)
        self._lost_reason = None
        try:
            got = await self._lock_call(self._try_lock_sync)
            if not got:
                self._close_lock_later()
                return None
            try:
                epoch = await self._call(self._bump_sync)
            except BaseException:
                self._close_lock_later()
                raise
        except asyncio.CancelledError:
            self._close_lock_later()
            raise
        self.epoch = epoch
        log.info("postgresql store: advisory lock taken (epoch %d), schema %s", epoch, self.schema,
                 extra={"action": "leader", "epoch": epoch})
        self._watch = asyncio.get_running_loop().create_task(self._keepalive_loop(epoch))
        return epoch

    async def acquire_leadership(self) -> int:
        """Wait until the advisory lock is ours, then return the new epoch."""
        if self.epoch is not None:
            return self.epoch
        await self._call(self._ensure)   # an unreachable database fails here, clearly
        self._lost_reason = None
        logged = False
        try:
            while True:
                try:
                    got = await self._lock_call(self._try_lock_sync)
                    if got:
                        try:
                            epoch = await self._call(self._bump_sync)
                        except BaseException:
                            self._close_lock_later()
                            raise
                        self.epoch = epoch
                        log.info("postgresql store: advisory lock taken (epoch %d), schema %s", epoch,
                                 self.schema, extra={"action": "leader", "epoch": epoch})
                        self._watch = asyncio.get_running_loop().create_task(self._keepalive_loop(epoch))
                        return epoch
                except StoreUnavailable as exc:
                    if not logged:
                        log.warning("postgresql store: waiting for the lock: %s", exc,
                                    extra={"action": "store_outage"})
                        logged = True
                await realtime.sleep(self.lock_poll)
        except asyncio.CancelledError:   # given up (shutdown): end the polling session (and any lock)
            self._close_lock_later()
            raise

    async def _keepalive_loop(self, epoch: int) -> None:
        # Real time throughout: a test that freezes the clock must not stop the keepalive.
        last_ok = realtime.real_monotonic()
        while self.epoch == epoch:
            await realtime.sleep(self.keepalive)
            if self.epoch != epoch:
                return
            remaining = self.session_timeout - (realtime.real_monotonic() - last_ok)
            future = self._lock_executor.call(self._ping_sync)
            try:
                await realtime.wait_for(future, max(remaining, 0.001))
            except asyncio.TimeoutError:
                if self.epoch == epoch:
                    self._signal_lost(f"the lock session did not answer for {self.session_timeout:g} s")
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:   # the session is gone, and the lock with it
                if self.epoch == epoch:
                    self._signal_lost(f"the lock session failed: {self._describe(exc)}")
                return
            last_ok = realtime.real_monotonic()

    def lock_session_pid(self) -> int | None:
        """The server process id of the lock session (for operators and tests)."""
        conn = self._lock_conn
        if conn is None:
            return None

        def pid() -> int | None:
            value: int | None = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            return value

        try:
            return self._lock_executor.submit(pid).result()
        except self._db_errors as exc:
            raise StoreUnavailable(f"the postgresql store is unavailable: {self._describe(exc)}") from exc

    async def release_leadership(self) -> None:
        """Unlock and end the lock session so a standby takes over at once."""
        epoch, self.epoch = self.epoch, None
        self._stop_watch()
        if self._closed:
            return
        if epoch is not None:
            try:
                await self._call(self._drop_writer)
            except SchedulerError:
                pass
        await self._lock_call(self._unlock_sync)

    def _unlock_sync(self) -> None:
        conn = self._lock_conn
        if conn is None:
            return
        try:
            conn.execute(select(func.pg_advisory_unlock_all()))
        except Exception:
            pass
        self._close_lock()

    # ----------------------------------------------------------- processes

    def after_fork(self) -> None:
        super().after_fork()
        self._lock_conn = None
        lock_engine, self._lock_engine = self._lock_engine, None
        if lock_engine is not None:
            lock_engine.dispose(close=False)
        self._lock_executor = Worker("cronoq-postgresql-lock")

    def _listen_connection(self) -> Callable[[], Any] | None:
        import psycopg

        conninfo = self.url.set(drivername="postgresql").render_as_string(hide_password=False)
        args = self._connect_args(lock_session=True)
        args["application_name"] = "cronoq-listen"

        def connect() -> Any:
            return psycopg.connect(conninfo, autocommit=True, **args)

        return connect

    def _channel(self) -> str | None:
        return channel_name(self.schema)

    # ----------------------------------------------------------- closing

    def checked_out(self) -> int:
        return super().checked_out() + (self._lock_conn is not None)

    async def close(self) -> None:
        if self._closed:
            return
        await super().close()
        await self._lock_executor.call(self._dispose_lock)
        self._lock_executor.shutdown()

    def _dispose_lock(self) -> None:
        self._close_lock()
        if self._lock_engine is not None:
            self._lock_engine.dispose()


if TYPE_CHECKING:
    def _satisfies_the_cluster_protocol(store: PostgresStore) -> ClusterStore:
        return store   # mypy checks that PostgresStore has every member the runtime's cluster uses
