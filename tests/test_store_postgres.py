"""What only the PostgreSQL store does: the advisory-lock session (killed,
unresponsive), a server that goes away and comes back, independent schemas,
URLs, TCP keepalives, and importing cronoq without psycopg."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid

import pytest

import cronoq
from pgserver import need_psycopg, start_or_skip
from storekit import POSTGRES_FAST, Work, child_env, eventually, pool, postgres_backend  # noqa: F401


@pytest.mark.asyncio
async def test_terminating_the_lock_session_makes_the_leader_step_down(postgres_backend):
    a = cronoq.Scheduler([pool(Work(), capacity=0)], store=postgres_backend.store())
    await a.start()
    kept = await a.enqueue({"name": "kept"}, key="kept")
    b = cronoq.Scheduler([pool(Work(), capacity=0)], store=postgres_backend.store())
    starting = asyncio.create_task(b.start())
    await asyncio.sleep(0.2)
    assert not starting.done()
    pid = await asyncio.to_thread(a.store.lock_session_pid)
    assert postgres_backend.sql("SELECT pg_terminate_backend(?)", (pid,)) == [(True,)]
    await eventually(lambda: not a.running, timeout=3, what="the leader to step down")
    assert "lock session" in a.lost_reason
    await asyncio.wait_for(starting, 3)
    assert b.epoch == a.epoch + 1
    with pytest.raises(cronoq.SchedulerError):
        await a.enqueue({"name": "lost"})
    assert (await b.info("kept")).id == kept
    await b.shutdown()


@pytest.mark.asyncio
async def test_an_unresponsive_lock_session_makes_the_leader_step_down(postgres_backend):
    store = postgres_backend.store(session_timeout=0.8, keepalive=0.1)
    a = cronoq.Scheduler([pool(Work(), capacity=0)], store=store)
    await a.start()
    loop = asyncio.get_running_loop()
    hung = loop.time()
    store._lock_executor.submit(time.sleep, 2.0)   # the lock session stops answering
    await eventually(lambda: not a.running, timeout=4, what="the leader to step down")
    took = loop.time() - hung
    assert 0.6 < took < 1.8, f"stepped down after {took:.2f} s; session_timeout is 0.8 s"
    assert "did not answer" in a.lost_reason
    # Once the session is closed, another instance leads.
    b = cronoq.Scheduler([pool(Work(), capacity=0)], store=postgres_backend.store())
    await asyncio.wait_for(b.start(), 5)
    await b.shutdown()


@pytest.mark.asyncio
async def test_the_lock_session_sets_tcp_keepalives_from_session_timeout(postgres_backend):
    store = postgres_backend.store(session_timeout=9.0)
    sched = cronoq.Scheduler([pool(Work(), capacity=0)], store=store)
    await sched.start()
    try:
        def show():
            conn = store._lock_conn
            return [conn.exec_driver_sql(f"SHOW {name}").scalar()
                    for name in ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
                                 "tcp_user_timeout")]
        values = store._lock_executor.submit(show).result(5)
        assert values[:3] == ["3", "1", "3"] and values[3] in ("9000", "9s")
    finally:
        await sched.shutdown()


@pytest.mark.asyncio
async def test_schemas_are_independent_clusters(pg_server):
    stores = [cronoq.PostgresStore(pg_server.url, schema=f"c_{uuid.uuid4().hex[:10]}", **POSTGRES_FAST)
              for _ in range(2)]
    scheds = [cronoq.Scheduler([pool(Work(), capacity=0)], store=store) for store in stores]
    try:
        await asyncio.wait_for(asyncio.gather(*(s.start() for s in scheds)), 5)   # both lead at once
        assert [s.epoch for s in scheds] == [1, 1]
        first = await scheds[0].enqueue({"x": 1}, key="same-key")
        second = await scheds[1].enqueue({"x": 2}, key="same-key")
        assert first == second   # same epoch, same first id: nothing shared
        assert stores[0].lock_key != stores[1].lock_key
    finally:
        for s in scheds:
            await s.shutdown()
        for store in stores:
            assert store.checked_out() == 0
            await store.close()


@pytest.mark.asyncio
async def test_a_server_that_goes_away_and_comes_back(tmp_path):
    server = start_or_skip()   # its own server: this test stops it
    try:
        store = cronoq.PostgresStore(server.url, **POSTGRES_FAST)
        a = cronoq.Scheduler([pool(Work(), capacity=0)], store=store)
        await a.start()
        accepted = [await a.enqueue({"n": i}, key=f"k{i}") for i in range(5)]
        await asyncio.to_thread(server.stop_server, "fast")
        await eventually(lambda: not a.running, timeout=5, what="the leader to step down")
        with pytest.raises(cronoq.SchedulerError):
            await a.enqueue({"n": 99})
        await store.close()
        # A store that cannot reach the server fails start() clearly instead of hanging.
        down = cronoq.PostgresStore(server.url, **POSTGRES_FAST)
        with pytest.raises(cronoq.SchedulerError, match="unavailable"):
            await cronoq.Scheduler([pool(Work())], store=down).start()
        await down.close()
        await asyncio.to_thread(server.restart)
        again = cronoq.PostgresStore(server.url, **POSTGRES_FAST)
        work = Work()
        b = cronoq.Scheduler([pool(work)], store=again)
        await asyncio.wait_for(b.start(), 10)
        try:
            for i, task_id in enumerate(accepted):
                handle = await b.handle(f"k{i}")
                assert handle.id == task_id
                await handle
            assert len(work.started) == 5
        finally:
            await b.shutdown()
        assert again.checked_out() == 0
        await again.close()
    finally:
        server.stop()


def test_urls_and_schema_names_are_checked():
    need_psycopg()
    for url in ("mysql://x@localhost/db", "sqlite:///x.db", "not a url"):
        with pytest.raises(ValueError):
            cronoq.PostgresStore(url)
    for schema in ("", "x" * 64, "a\x00b", None):
        with pytest.raises(ValueError):
            cronoq.PostgresStore("postgresql://localhost/db", schema=schema)
    with pytest.raises(ValueError):
        cronoq.PostgresStore("postgresql://localhost/db", session_timeout=0)
    store = cronoq.PostgresStore("postgres://user:secret@localhost:5432/db", schema="Mixed Case")
    assert store.url.drivername == "postgresql+psycopg"
    assert "secret" not in repr(store)


def test_cronoq_imports_without_psycopg():
    script = (
        "import sys; sys.modules['psycopg'] = None\n"
        "import cronoq\n"
        "cronoq.SqliteStore\n"
        "try:\n"
        "    cronoq.PostgresStore('postgresql://localhost/db')\n"
        "except ImportError as exc:\n"
        "    print('ImportError:', exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=child_env(),
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "pip install 'cronoq[postgres]'" in result.stdout
