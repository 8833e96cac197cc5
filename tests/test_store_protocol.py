"""The store contract (``cronoq.store.Store``): every store has every member
the runtime reads (no defaults needed), and every call that needs the
database raises ``StoreUnavailable`` when it cannot be reached, never a
driver's or SQLAlchemy's own error."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import sqlite3
import time
from typing import Any, AsyncIterator, Awaitable

import pytest
import pytest_asyncio

import cronoq
from cronoq.store import InMemoryStore, MemoryDatabase, Store, StoreUnavailable
from cronoq.store.base import ID_EPOCH_BITS, STORE_MEMBERS, Batch, StatusRow, TaskRow
from pgserver import need_psycopg, start_or_skip
from storekit import POSTGRES_FAST, SQLITE_FAST

NS = 1_000_000_000
NOW = time.time_ns()   # finished tasks must be recent: the stores prune old ones


def protocol_members() -> set[str]:
    return {name for name in vars(Store) if not name.startswith("_")}


def task_row(epoch: int, n: int, at_ns: int = NOW) -> TaskRow:
    task_id = (epoch << ID_EPOCH_BITS) + n
    return TaskRow(task_id, "default", "default", 2, f"k{n}",
                   {"v": 1, "kind": "default", "priority": 2, "key": f"k{n}"}, b'{"n": %d}' % n, at_ns)


# ---------------------------------------------------------------- members


def test_store_members_names_every_member_of_the_protocol():
    assert len(STORE_MEMBERS) == len(set(STORE_MEMBERS))
    assert set(STORE_MEMBERS) == protocol_members()
    assert {"retention_ns", "commit_timeout", "close"} <= set(STORE_MEMBERS)


def make_store(kind: str, tmp_path, **options: Any) -> Any:
    if kind == "memory":
        return InMemoryStore(**options)
    if kind == "sqlite":
        return cronoq.SqliteStore(tmp_path / "members.db", **options)
    need_psycopg()
    return cronoq.PostgresStore("postgresql://cronoq@127.0.0.1:1/cronoq", **options)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_every_store_has_every_member_with_the_options_it_was_given(kind, tmp_path):
    store = make_store(kind, tmp_path, retention=5.0, commit_timeout=2.5)
    try:
        assert isinstance(store, Store)
        for name in STORE_MEMBERS:
            declared = inspect.getattr_static(Store, name)
            assert hasattr(store, name), f"{type(store).__name__} lacks {name}"
            if isinstance(declared, property):
                continue
            is_async = inspect.iscoroutinefunction(getattr(store, name))
            assert is_async == inspect.iscoroutinefunction(declared), name
        assert store.retention_ns == 5 * NS and isinstance(store.retention_ns, int)
        assert store.commit_timeout == 2.5 and isinstance(store.commit_timeout, float)
    finally:
        await store.close()
        await store.close()   # closing twice does nothing


def test_the_in_memory_store_defaults_and_checks_its_options():
    store = InMemoryStore()
    assert store.retention_ns == 0 and store.commit_timeout == 30.0
    for options in ({"commit_timeout": 0}, {"retention": -1}, {"retention": float("nan")},
                    {"commit_timeout": "soon"}, {"lock_poll": 0}):
        with pytest.raises(ValueError):
            InMemoryStore(**options)


def test_an_object_without_the_newer_members_is_not_a_store():
    class OldStore:   # the methods alone: no retention_ns, commit_timeout or close
        async def acquire_leadership(self) -> int: return 1
        async def recover(self, now_ns: int, retention_ns: int) -> Any: return None
        async def commit(self, epoch: int, batch: Batch) -> None: return None
        async def load_output(self, task_id: int) -> bytes | None: return None
        async def release_leadership(self) -> None: return None
        def on_lost(self, callback: Any) -> None: return None

    assert not isinstance(OldStore(), Store)


@pytest.mark.asyncio
async def test_the_in_memory_store_keeps_ended_tasks_for_its_own_retention():
    database = MemoryDatabase()
    writer = InMemoryStore(database)
    epoch = await writer.acquire_leadership()
    row = task_row(epoch, 1)
    await writer.commit(epoch, Batch(tasks=[row], statuses=[StatusRow(row.id, "succeeded", 1, NOW, None)],
                                     high_water=row.id))
    await writer.release_leadership()
    later = NOW + 30 * NS   # ended 30 s before the recovery
    keeping = InMemoryStore(database, retention=60.0)
    await keeping.acquire_leadership()
    assert [t.id for t in (await keeping.recover(later, 0)).tasks] == [row.id]
    await keeping.release_leadership()
    forgetting = InMemoryStore(database, retention=10.0)
    await forgetting.acquire_leadership()
    assert list((await forgetting.recover(later, 0)).tasks) == []
    await forgetting.close()


# ---------------------------------------------------------------- outages


class Outage:
    """One store kind's database, and a way to make it unreachable."""

    def __init__(self, kind: str, tmp_path) -> None:
        self.kind = kind
        self.database = MemoryDatabase()
        self.path = str(tmp_path / "outage.db")
        self.server: Any = None
        self.stores: list[Any] = []

    def store(self) -> Any:
        if self.kind == "memory":
            store: Any = InMemoryStore(self.database)
        elif self.kind == "sqlite":
            store = cronoq.SqliteStore(self.path, **SQLITE_FAST)
        else:
            # The keepalive must not notice the outage first: the calls under test have to.
            store = cronoq.PostgresStore(self.server.url, **{**POSTGRES_FAST, "keepalive": 60.0,
                                                              "session_timeout": 120.0})
        self.stores.append(store)
        return store

    async def begin(self, leader: Any) -> None:
        if self.kind == "memory":
            self.database.available = False
        elif self.kind == "sqlite":
            def reconnect_later() -> None:   # every connection closed, as after a broken one
                leader._drop_writer()
                leader.engine.dispose()

            await leader._executor.call(reconnect_later)
            os.rename(self.path, self.path + ".away")
        else:
            self.server.stop_server("fast")

    def end(self) -> None:
        if self.kind == "memory":
            self.database.available = True
        elif self.kind == "sqlite":
            if os.path.exists(self.path + ".away"):
                os.replace(self.path + ".away", self.path)
        elif not self.server.running:
            self.server.restart()


@pytest_asyncio.fixture(params=["memory", "sqlite", "postgres"])
async def outage(request, tmp_path) -> AsyncIterator[Outage]:
    o = Outage(request.param, tmp_path)
    if o.kind == "postgres":
        o.server = start_or_skip()   # its own server: this test stops it
    try:
        yield o
    finally:
        o.end()
        for store in o.stores:
            await store.close()
        if o.server is not None:
            o.server.stop()


async def unavailable(call: Awaitable[Any], what: str) -> StoreUnavailable:
    try:
        await call
    except StoreUnavailable as exc:
        return exc
    except Exception as exc:
        pytest.fail(f"{what} raised {type(exc).__module__}.{type(exc).__name__} in an outage, "
                    f"not StoreUnavailable: {exc}")
    pytest.fail(f"{what} succeeded in an outage")


@pytest.mark.asyncio
async def test_every_call_that_needs_the_database_raises_store_unavailable(outage):
    leader = outage.store()
    epoch = await leader.acquire_leadership()
    first = task_row(epoch, 1)
    await leader.commit(epoch, Batch(tasks=[first], statuses=[StatusRow(first.id, "succeeded", 1, NOW, None)],
                                     outputs=[(first.id, b'"out"')], high_water=first.id))
    assert await leader.load_output(first.id) == b'"out"'
    await outage.begin(leader)
    second = task_row(epoch, 2)
    await unavailable(leader.commit(epoch, Batch(tasks=[second], high_water=second.id)), "commit")
    await unavailable(leader.recover(NOW, 3600 * NS), "recover")
    await unavailable(leader.load_output(first.id), "load_output")
    if outage.kind != "memory":
        await unavailable(leader.prune(), "prune")
    if outage.kind == "postgres":
        await unavailable(asyncio.to_thread(leader.lock_session_pid), "lock_session_pid")
        newcomer = outage.store()   # never connected: it fails to start, clearly
        await unavailable(newcomer.acquire_leadership(), "acquire_leadership")
    with contextlib.suppress(StoreUnavailable):   # stepping down may fail, but only as unavailable
        await leader.release_leadership()
    await leader.close()   # closing never needs the database
    outage.end()
    again = outage.store()   # what was committed before the outage is all there
    epoch = await again.acquire_leadership()
    recovered = await again.recover(NOW, 3600 * NS)
    assert [t.id for t in recovered.tasks] == [first.id]
    await again.release_leadership()


@pytest.mark.asyncio
async def test_a_sqlite_store_in_a_missing_directory_is_unavailable(tmp_path):
    store = cronoq.SqliteStore(tmp_path / "not-mounted-yet" / "cronoq.db", **SQLITE_FAST)
    try:
        exc = await unavailable(store.acquire_leadership(), "acquire_leadership")
        assert "cannot create the SQLite store" in str(exc)
        (tmp_path / "not-mounted-yet").mkdir()   # the directory appears: the same store works
        assert await store.acquire_leadership() >= 1
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_a_driver_error_while_recovered_rows_are_read_is_unavailable(tmp_path, monkeypatch):
    store = cronoq.SqliteStore(tmp_path / "stream.db", **SQLITE_FAST)
    try:
        epoch = await store.acquire_leadership()
        rows = [task_row(epoch, n) for n in range(1, 4)]
        await store.commit(epoch, Batch(tasks=rows, high_water=rows[-1].id))
        real = store._task_slices

        def failing(now_ns: int, retention_ns: int) -> Any:
            slices = real(now_ns, retention_ns)
            yield next(slices)
            slices.close()
            raise sqlite3.OperationalError("disk I/O error")   # the raw driver error

        monkeypatch.setattr(store, "_task_slices", failing)
        recovered = await store.recover(NOW, 0)
        seen = []
        with pytest.raises(StoreUnavailable, match="disk I/O error"):
            for task in recovered.tasks:
                seen.append(task.id)
        assert seen == [row.id for row in rows]
        await store.release_leadership()
    finally:
        await store.close()
