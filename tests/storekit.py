"""Helpers of the store tests: one ``Backend`` per database under test (a
SQLite file, or a fresh schema on the throwaway PostgreSQL server), stores
with short timeouts, faults, and a recording executor."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
import uuid
from typing import Any

import pytest_asyncio

import cronoq
from cronoq.store.base import ID_EPOCH_BITS, Batch, StatusRow, TaskRow

SQLITE_FAST = dict(lease_ttl=1.0, lease_renew=0.2, lock_poll=0.05, commit_timeout=2.0)
POSTGRES_FAST = dict(lock_poll=0.05, keepalive=0.2, session_timeout=1.5, commit_timeout=2.0)


class Backend:
    """One database (SQLite file or PostgreSQL schema) and the stores opened on it."""

    def __init__(self, kind: str, *, path: str | None = None, server=None, schema: str | None = None) -> None:
        self.kind = kind
        self.path = path
        self.server = server
        self.schema = schema
        self.stores: list = []

    def __repr__(self) -> str:
        return f"<Backend {self.kind}>"

    # -- stores

    def store(self, **options: Any):
        if self.kind == "sqlite":
            store = cronoq.SqliteStore(self.path, **{**SQLITE_FAST, **options})
        else:
            store = cronoq.PostgresStore(self.server.url, schema=self.schema, **{**POSTGRES_FAST, **options})
        self.stores.append(store)
        return store

    # -- looking at (and tampering with) the database directly

    def table(self, name: str) -> str:
        return name if self.kind == "sqlite" else f'"{self.schema}".{name}'

    @contextlib.contextmanager
    def connect(self):
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=10)
        else:
            import psycopg
            conn = psycopg.connect(self.server.url.replace("+psycopg", ""), autocommit=True)
        try:
            yield conn
        finally:
            conn.close()

    def sql(self, statement: str, params: tuple = ()) -> list[tuple]:
        """Run one statement (``?`` placeholders) in its own transaction."""
        if self.kind != "sqlite":
            statement = statement.replace("?", "%s")
        with self.connect() as conn:
            cursor = conn.execute(statement, params)
            try:
                return list(cursor.fetchall())
            except Exception:   # no result set
                return []

    def rows(self, where: str = "1 = 1", params: tuple = ()) -> list[tuple]:
        return self.sql(f"SELECT id, key, status, attempt, message FROM {self.table('cronoq_tasks')} "
                        f"WHERE {where} ORDER BY id", params)

    # -- faults

    async def crash(self, store, *, expire: bool = True) -> None:
        """The store's process dies: nothing more is written, leadership is not
        released (a SQLite lease is expired at once if ``expire``, as if its ttl
        had passed; a PostgreSQL lock session ends with the process)."""
        store._stop_watch()
        store.epoch = None
        await store.close()
        if expire and self.kind == "sqlite":
            self.sql(f"UPDATE {self.table('cronoq_meta')} SET lease_expires_ns = 0")

    async def depose(self, store) -> None:
        """Take leadership from ``store`` without it noticing (as if it had
        been paused): its renewal / keepalive stops, its SQLite lease is
        expired, its PostgreSQL lock session terminated."""
        store._stop_watch()
        if self.kind == "sqlite":
            self.sql(f"UPDATE {self.table('cronoq_meta')} SET lease_expires_ns = 0")
        else:
            pid = await asyncio.to_thread(store.lock_session_pid)
            self.sql("SELECT pg_terminate_backend(?)", (pid,))

    @contextlib.contextmanager
    def writes_blocked(self):
        """Another session holds the write lock: commits cannot get in."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=10)
            conn.execute("BEGIN EXCLUSIVE")
        else:
            import psycopg
            conn = psycopg.connect(self.server.url.replace("+psycopg", ""))
            conn.execute(f"LOCK TABLE {self.table('cronoq_meta')} IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            conn.rollback()
            conn.close()

    # -- teardown

    async def close(self) -> None:
        """Fail if a store left a connection checked out; close them all."""
        leaks = []
        for store in self.stores:
            deadline = time.monotonic() + 3.0
            while store.checked_out() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if store.checked_out():
                leaks.append(f"{store!r}: {store.checked_out()} connection(s) checked out")
        for store in self.stores:
            await store.close()
        assert not leaks, "; ".join(leaks)


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def backend(request, tmp_path):
    """Each store test runs against a SQLite file and a PostgreSQL schema."""
    if request.param == "sqlite":
        b = Backend("sqlite", path=str(tmp_path / "cronoq.db"))
    else:
        server = request.getfixturevalue("pg_server")
        b = Backend("postgres", server=server, schema=f"t_{uuid.uuid4().hex[:12]}")
    try:
        yield b
    finally:
        await b.close()


@pytest_asyncio.fixture
async def sqlite_backend(tmp_path):
    b = Backend("sqlite", path=str(tmp_path / "cronoq.db"))
    try:
        yield b
    finally:
        await b.close()


@pytest_asyncio.fixture
async def postgres_backend(pg_server):
    b = Backend("postgres", server=pg_server, schema=f"t_{uuid.uuid4().hex[:12]}")
    try:
        yield b
    finally:
        await b.close()


class Work:
    """An executor driven by its payload: ``{"op": "ok" | "block" | "fail" |
    "retry" | "echo", ...}``; records the order of the attempts it ran."""

    def __init__(self) -> None:
        self.started: list[tuple[Any, int]] = []
        self.release = asyncio.Event()
        self.running = asyncio.Event()

    async def __call__(self, ctx, payload):
        op = payload.get("op", "ok") if isinstance(payload, dict) else "ok"
        self.started.append((payload.get("name") if isinstance(payload, dict) else payload, ctx.attempt))
        if op == "block":
            self.running.set()
            await self.release.wait()
        elif op == "fail":
            raise cronoq.Permanent(payload.get("message", "failed on purpose"))
        elif op == "retry":
            raise cronoq.Retryable(payload.get("message", "try again"))
        elif op == "echo":
            return payload.get("value")
        return {"done": payload.get("name") if isinstance(payload, dict) else payload}


def pool(work, name: str = "default", capacity: int = 4, **options) -> cronoq.Pool:
    return cronoq.Pool(name, work, min=capacity, max=max(capacity, 1), initial=capacity, autoscale=False,
                       **options)


async def eventually(predicate, timeout: float = 5.0, interval: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


def child_env() -> dict[str, str]:
    """The environment of a child Python that imports this cronoq."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def submit_beside_a_completion(epoch: int, n: int) -> Batch:
    """The ``n``-th submit's commit: its task dispatched at once, the task before it ended."""
    now = time.time_ns()
    task_id = n + 1 + (epoch << ID_EPOCH_BITS)
    batch = Batch(tasks=[TaskRow(task_id, "default", "task", 2, None, {"v": 1}, b"1", now)],
                  statuses=[StatusRow(task_id, "running", 1, now, None)])
    if n:
        batch.statuses.append(StatusRow(task_id - 1, "succeeded", 1, now, None))
        batch.outputs.append((task_id - 1, b"null"))
    batch.high_water = task_id
    return batch


def record_commit_threads(store) -> list[int]:
    """The thread ident of every commit ``store`` makes, in order."""
    threads: list[int] = []
    original = store._commit_with

    def commit_with(begun, epoch, batch):
        original(begun, epoch, batch)
        threads.append(threading.get_ident())

    store._commit_with = commit_with
    return threads
