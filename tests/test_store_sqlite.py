"""What only the SQLite store does: the file and its permissions, WAL and
sync settings, the lease (renewal, expiry, takeover noticed by the deposed
leader), argument checks; and the synchronous facade and the demo on it."""

from __future__ import annotations

import asyncio
import os
import stat
import sqlite3
import sys
import time

import pytest

import cronoq
from storekit import Work, eventually, pool, sqlite_backend  # noqa: F401  (a fixture)

@pytest.mark.skipif(sys.platform == "win32", reason="Unix permissions")
@pytest.mark.asyncio
async def test_the_file_is_created_owner_only(sqlite_backend):
    old = os.umask(0o022)
    try:
        sched = cronoq.Scheduler([pool(Work(), capacity=0)], store=sqlite_backend.store())
        await sched.start()
        await sched.enqueue({"x": 1})
        for suffix in ("", "-wal", "-shm"):
            mode = stat.S_IMODE(os.stat(sqlite_backend.path + suffix).st_mode)
            assert mode == 0o600, f"{suffix or 'the file'}: {oct(mode)}"
        await sched.shutdown()
    finally:
        os.umask(old)


@pytest.mark.parametrize("full_sync, expected", [(True, 2), (False, 1)])
@pytest.mark.asyncio
async def test_wal_and_synchronous_settings(sqlite_backend, full_sync, expected):
    store = sqlite_backend.store(full_sync=full_sync)
    await store.prune()   # connects
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == expected


@pytest.mark.asyncio
async def test_the_leader_renews_its_lease_and_a_standby_keeps_waiting(sqlite_backend):
    a = cronoq.Scheduler([pool(Work(), capacity=0)], store=sqlite_backend.store(cluster=False))
    await a.start()
    b = cronoq.Scheduler([pool(Work(), capacity=0)], store=sqlite_backend.store(cluster=False))
    starting = asyncio.create_task(b.start())
    await asyncio.sleep(2.0)   # twice the 1 s lease
    assert not starting.done()
    assert a.running and a.lost_reason is None
    holder, expires = sqlite_backend.sql("SELECT holder, lease_expires_ns FROM cronoq_meta")[0]
    assert holder == a.store.identity and expires > time.time_ns()
    await a.shutdown()
    await asyncio.wait_for(starting, 2)
    await b.shutdown()
    assert sqlite_backend.sql("SELECT holder, lease_expires_ns FROM cronoq_meta") == [(None, None)]


@pytest.mark.asyncio
async def test_a_hung_leader_loses_its_lease_and_notices_when_it_wakes(sqlite_backend):
    a_store = sqlite_backend.store(cluster=False)
    a = cronoq.Scheduler([pool(Work(), capacity=0)], store=a_store)
    await a.start()
    await a.enqueue({"name": "kept"}, key="kept")
    b = cronoq.Scheduler([pool(Work(), capacity=0)], store=sqlite_backend.store(cluster=False))
    starting = asyncio.create_task(b.start())
    loop = asyncio.get_running_loop()
    hung = loop.time()
    # a's process hangs: its database thread, and the thread that renews its lease.
    renew = a_store._renew_sync

    def hung_renew(epoch):
        time.sleep(2.5)
        return renew(epoch)

    a_store._renew_sync = hung_renew
    a_store._executor.submit(time.sleep, 2.5)
    await asyncio.wait_for(starting, 5)
    took = loop.time() - hung
    assert 0.6 < took < 2.3, f"the standby took over after {took:.2f} s; the lease lasts 1 s"
    await eventually(lambda: not a.running, timeout=5, what="the deposed leader to stop")
    assert "taken over" in a.lost_reason or "fenced" in a.lost_reason
    with pytest.raises(cronoq.SchedulerError):
        await a.enqueue({"name": "lost"})
    assert (await b.info("kept")).status == "ready"
    await b.shutdown()


@pytest.mark.asyncio
async def test_a_file_that_becomes_unavailable_fails_calls_and_is_not_recreated(sqlite_backend):
    store = sqlite_backend.store(commit_timeout=0.5)
    sched = cronoq.Scheduler([pool(Work(), capacity=0)], store=store)
    await sched.start()
    accepted = [await sched.enqueue({"n": i}, key=f"k{i}") for i in range(3)]

    def reconnect_later() -> None:   # close every connection, as after a broken one
        store._drop_writer()
        store.engine.dispose()

    await store._executor.call(reconnect_later)
    path = sqlite_backend.path
    os.rename(path, path + ".away")
    try:
        with pytest.raises(cronoq.SchedulerError, match="unable to open"):
            await sched.enqueue({"n": 99}, key="during")
        assert not os.path.exists(path), "the store must not create a new, empty database"
    finally:
        os.rename(path + ".away", path)
    retry = await sched.submit({"n": 99}, key="during")   # the retried commit got through
    accepted.append(retry.id)
    await sched.shutdown()
    assert [row[0] for row in sqlite_backend.rows()] == accepted


@pytest.mark.asyncio
async def test_invalid_options_are_refused(tmp_path):
    for options in ({"lease_ttl": 1.0, "lease_renew": 1.0}, {"lock_poll": 0}, {"lease_ttl": -1},
                    {"retention": float("nan")}, {"commit_timeout": "soon"}):
        with pytest.raises(ValueError):
            cronoq.SqliteStore(tmp_path / "x.db", **options)
    for path in (":memory:", "", "file:x.db?mode=memory"):
        with pytest.raises(ValueError):
            cronoq.SqliteStore(path)
    assert cronoq.SqliteStore(tmp_path / "x.db").path == str(tmp_path / "x.db")


@pytest.mark.asyncio
async def test_a_missing_directory_fails_start_clearly(tmp_path):
    store = cronoq.SqliteStore(tmp_path / "missing" / "x.db")
    sched = cronoq.Scheduler([pool(Work())], store=store)
    with pytest.raises(cronoq.SchedulerError, match="cannot create the SQLite store"):
        await sched.start()
    await store.close()


@pytest.mark.asyncio
async def test_a_second_run_of_a_scheduler_on_the_same_store_object(sqlite_backend):
    store = sqlite_backend.store()
    first = cronoq.Scheduler([pool(Work(), capacity=0)], store=store)
    await first.start()
    task_id = await first.enqueue({"name": "again"}, key="again")
    await first.shutdown()
    assert store.checked_out() == 0
    second = cronoq.Scheduler([pool(Work())], store=store)
    await second.start()
    assert second.epoch == first.epoch + 1
    assert (await (await second.handle("again"))) == {"done": "again"}
    assert (await second.info("again")).id == task_id
    await second.shutdown()


def test_blocking_scheduler_on_a_sqlite_store(tmp_path):
    path = str(tmp_path / "blocking.db")

    def run(ctx, payload):
        return {"twice": payload["n"] * 2}

    with cronoq.BlockingScheduler([cronoq.Pool("default", run, min=1, max=2)],
                                  store=cronoq.SqliteStore(path, lock_poll=0.05)) as sched:
        handle = sched.submit({"n": 21}, key="answer")
        assert handle.result(timeout=10) == {"twice": 42}
    with cronoq.BlockingScheduler([cronoq.Pool("default", run)],
                                  store=cronoq.SqliteStore(path, lock_poll=0.05)) as sched:
        assert sched.handle("answer").result(timeout=10) == {"twice": 42}
    rows = sqlite3.connect(path).execute("SELECT key, status FROM cronoq_tasks").fetchall()
    assert rows == [("answer", "succeeded")]


def test_the_demo_keeps_its_state_in_the_store_it_is_given(tmp_path, capsys):
    from cronoq.cli import main

    path = str(tmp_path / "demo.db")
    assert main(["demo", "--seconds", "0.3", "--speed", "0.2", "--no-live", "--store", path]) == 0
    out = capsys.readouterr().out
    assert f"  {path}" in out.splitlines()   # on a line of its own, however long: it can be copied
    conn = sqlite3.connect(path)
    try:
        statuses = dict(conn.execute("SELECT status, count(*) FROM cronoq_tasks GROUP BY status"))
        outputs = conn.execute("SELECT count(*) FROM cronoq_tasks WHERE output IS NOT NULL").fetchone()[0]
    finally:
        conn.close()
    assert statuses.get("succeeded", 0) >= 5 and statuses.get("failed") == 1   # the pipeline's load step
    assert outputs == statuses["succeeded"]   # every result was JSON and got stored


def test_the_demo_refuses_a_store_it_cannot_create_by_name(tmp_path, capsys):
    from cronoq.cli import main

    missing = tmp_path / "no-such-directory" / "demo.db"
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--seconds", "0.3", "--no-live", "--store", str(missing)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"the directory {missing.parent} does not exist" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["demo", "--seconds", "0.3", "--no-live", "--store", str(tmp_path)])
    assert "a directory, not a SQLite file" in capsys.readouterr().err


@pytest.mark.asyncio
async def test_the_lease_is_renewed_while_a_long_recovery_runs(sqlite_backend, monkeypatch):
    """Recovering a large backlog keeps the store's worker thread (reading)
    and then the event loop (decoding) busy for longer than the lease: a
    standby must not take over meanwhile, or leadership would go back and
    forth for ever."""
    from cronoq.core.engine import Core

    busy = 2.5   # seconds, against a lease of 1 s
    store = sqlite_backend.store(cluster=False, lease_ttl=1.0, lease_renew=0.2)
    read = store._recover_sync

    def slow_read(*args):
        time.sleep(busy)
        return read(*args)

    store._recover_sync = slow_read
    restore = Core.restore

    def slow_restore(self, *args, **options):
        time.sleep(busy)   # the event loop itself is blocked
        return restore(self, *args, **options)

    monkeypatch.setattr(Core, "restore", slow_restore)
    work = Work()
    leader = cronoq.Scheduler([pool(work)], store=store)
    leading = asyncio.ensure_future(leader.start())
    await eventually(lambda: store.epoch is not None, what="the first scheduler to take the lease")
    standby_store = sqlite_backend.store(cluster=False)
    standby = cronoq.Scheduler([pool(Work())], store=standby_store)
    waiting = asyncio.ensure_future(standby.start())
    await leading
    monkeypatch.undo()
    try:
        handle = await leader.submit({"name": "after recovery"})   # fenced if the lease was lost
        assert await handle == {"done": "after recovery"}
        assert leader.running and standby_store.epoch is None and not waiting.done()
    finally:
        await leader.shutdown()
    await asyncio.wait_for(waiting, 10)   # released on shutdown: the standby leads now
    await standby.shutdown()


FORK_DURING_A_TRANSACTION = r"""
import asyncio, os, signal, sys, threading, time
import cronoq
from sqlalchemy import update

path = sys.argv[1]
store = cronoq.SqliteStore(path, commit_timeout=2.0)
inside = threading.Event()

def long_transaction():
    meta = store._t.meta
    with store._begin() as conn:
        conn.execute(update(meta).where(meta.c.id == 1).values(holder=None))
        inside.set()
        time.sleep(0.5)

done = store._executor.submit(long_transaction)
inside.wait(10)
pid = os.fork()        # while the store's thread is inside the transaction
if pid == 0:
    signal.alarm(60)   # a hang ends the child
    child = cronoq.SqliteStore(path, commit_timeout=2.0)
    try:
        asyncio.run(asyncio.wait_for(child.acquire_leadership(), 30))
        os._exit(0)
    except BaseException as exc:
        print("child:", repr(exc)[:300], flush=True)
        os._exit(3)
done.result(10)
_, status = os.waitpid(pid, 0)
print("child exit:", os.waitstatus_to_exitcode(status))
"""


def test_a_fork_during_a_transaction_of_the_parent_leaves_the_child_a_usable_database(tmp_path):
    """gunicorn --preload with a scheduler started at import forks while the
    master's store threads write: the fork waits for the transaction to end,
    else the child inherits SQLite's lock bookkeeping and its own connections
    find the database locked forever."""
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", FORK_DURING_A_TRANSACTION, str(tmp_path / "tasks.db")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["child exit: 0"], proc.stdout + proc.stderr


@pytest.mark.asyncio
async def test_an_idle_leader_does_not_read_the_store_while_nothing_changes(sqlite_backend):
    """SQLite cannot notify, so the cluster polls every cluster_poll; while no
    other connection writes, a poll costs a look at PRAGMA data_version on
    the loop, not a trip to the cluster's worker thread."""
    store = sqlite_backend.store()
    sched = cronoq.Scheduler([pool(Work(), capacity=0)], store=store)
    await sched.start()
    await sched.enqueue("x")
    cluster = sched._leadership.cluster
    transport = cluster.transport
    calls = 0
    original = transport.cycle

    def counted(out, want):
        nonlocal calls
        calls += 1
        return original(out, want)

    transport.cycle = counted
    cycles = 0
    original_nap = cluster._nap

    async def counted_nap(interval):
        nonlocal cycles
        cycles += 1
        await original_nap(interval)

    cluster._nap = counted_nap
    for _ in range(2000):
        if cycles >= 40:
            break
        await asyncio.sleep(0.005)
    assert cycles >= 40
    idle_calls = calls
    # A heartbeat and the leader's look at the members, about once a second, go through.
    assert idle_calls < cycles / 4, (idle_calls, cycles)
    # A write by another connection is read at the next poll.
    sqlite_backend.sql("UPDATE cronoq_meta SET lease_expires_ns = lease_expires_ns + 1")
    seen = cycles
    for _ in range(2000):
        if cycles >= seen + 3:
            break
        await asyncio.sleep(0.005)
    assert calls > idle_calls
    await sched.shutdown()
