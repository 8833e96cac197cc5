"""A SQLite file deleted, moved or replaced while the store has it open: the
writes after that are refused (commits, checkpoints, lease renewals), the
leader steps down and says why, a standby never leads on the old file nor
creates an empty one, and what was acknowledged is kept (a copy of a
deleted file, the WAL folded into a moved one)."""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import shutil
import sqlite3
import time

import pytest

import cronoq
from cronoq.store.base import Batch, Fenced, StoreUnavailable, TaskRow
from cronoq.store.cluster import Outgoing, Wants
from storekit import Work, eventually, pool, sqlite_backend  # noqa: F401  (a fixture)

pytestmark = pytest.mark.asyncio

GONE = "was deleted or replaced while open"


def delete(path: str, *, side_files: bool = True) -> None:
    for suffix in ("", "-wal", "-shm") if side_files else ("",):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)


def replace(path: str) -> None:
    """Put another SQLite database at ``path`` in one rename (the old file loses its name)."""
    other = path + ".other"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE unrelated (x)")
    conn.commit()
    conn.close()
    os.rename(other, path)


def copies(path: str) -> list[str]:
    return sorted(glob.glob(glob.escape(path) + ".rescued-*"))


def side_files_gone(path: str) -> bool:
    return not any(os.path.exists(path + s) for s in ("-wal", "-shm"))


def keys_in(path: str) -> set[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {row[0] for row in conn.execute("SELECT key FROM cronoq_tasks")}
    finally:
        conn.close()


def errors_about(caplog, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR and text in r.getMessage()]


@pytest.mark.parametrize("inline_commits", [True, False], ids=["commit-on-the-loop", "commit-on-the-worker"])
@pytest.mark.parametrize("side_files", [True, False], ids=["with-wal-and-shm", "database-only"])
async def test_a_commit_after_the_file_is_deleted_is_refused_and_the_leader_steps_down(
        sqlite_backend, caplog, inline_commits, side_files):
    caplog.set_level(logging.INFO, logger="cronoq")
    path = sqlite_backend.path
    sched = cronoq.Scheduler([pool(Work(), capacity=0)],
                             store=sqlite_backend.store(cluster=False, inline_commits=inline_commits))
    await sched.start()
    for i in range(3):
        await sched.enqueue({"n": i}, key=f"kept-{i}")
    delete(path, side_files=side_files)
    with pytest.raises(cronoq.SchedulerError, match=GONE):
        await sched.enqueue({"n": 99}, key="after")
    assert not sched.running and GONE in sched.lost_reason and path in sched.lost_reason
    assert errors_about(caplog, f"the database file {path!r} {GONE}")
    with pytest.raises(cronoq.SchedulerError):
        await sched.enqueue({"n": 100}, key="later")
    # The deleted file is saved beside the path, and the path stays empty: no new
    # database, and no -wal or -shm of the old one that a new database would read.
    saved = await eventually(lambda: copies(path), what="the copy of the deleted file")
    assert {f"kept-{i}" for i in range(3)} <= keys_in(saved[0])
    assert "later" not in keys_in(saved[0])
    await eventually(lambda: errors_about(caplog, f"saved in {saved[0]!r}"), what="the copy's name in the log")
    await eventually(lambda: side_files_gone(path), what="the old -wal and -shm to leave the path")
    assert not os.path.exists(path)
    await sched.shutdown()
    assert not os.path.exists(path)


async def test_a_moved_file_keeps_everything_and_is_not_copied(sqlite_backend, caplog):
    caplog.set_level(logging.INFO, logger="cronoq")
    path = sqlite_backend.path
    sched = cronoq.Scheduler([pool(Work(), capacity=0)], store=sqlite_backend.store(cluster=False))
    await sched.start()
    for i in range(3):
        await sched.enqueue({"n": i}, key=f"kept-{i}")
    os.rename(path, path + ".moved")
    with pytest.raises(cronoq.SchedulerError, match=GONE):
        await sched.enqueue({"n": 99}, key="after")
    await eventually(lambda: errors_about(caplog, f"under another name ({path}.moved)"),
                     what="the store to say where the file went")
    await sched.shutdown()
    # Its WAL was folded into it: the moved file alone holds every acknowledged task.
    assert not os.path.exists(path + ".moved-wal")
    assert {f"kept-{i}" for i in range(3)} <= keys_in(path + ".moved")
    assert copies(path) == [] and not os.path.exists(path)


async def test_an_idle_leader_steps_down_at_its_lease_renewal_when_the_file_is_replaced(sqlite_backend, caplog):
    caplog.set_level(logging.INFO, logger="cronoq")
    path = sqlite_backend.path
    sched = cronoq.Scheduler([pool(Work(), capacity=0)], store=sqlite_backend.store(cluster=False))
    await sched.start()
    await sched.enqueue({"n": 1}, key="kept")
    replace(path)
    await eventually(lambda: not sched.running, what="the leader to step down")
    assert GONE in sched.lost_reason
    saved = await eventually(lambda: copies(path), what="the copy of the replaced file")
    assert keys_in(saved[0]) == {"kept"}
    await eventually(lambda: side_files_gone(path), what="the old -wal and -shm to leave the path")
    await sched.shutdown()
    # The file put there was neither written nor given the old file's -wal.
    assert side_files_gone(path)
    conn = sqlite3.connect(path)
    assert [row[0] for row in conn.execute("SELECT name FROM sqlite_master")] == ["unrelated"]
    conn.close()


async def test_a_leader_whose_next_connection_finds_the_file_gone_steps_down(sqlite_backend, caplog):
    caplog.set_level(logging.INFO, logger="cronoq")
    store = sqlite_backend.store(cluster=False, lease_ttl=30.0, lease_renew=10.0)   # no renewal meanwhile
    sched = cronoq.Scheduler([pool(Work(), capacity=0)], store=store)
    await sched.start()
    await sched.enqueue({"n": 1}, key="kept")

    def reconnect_later() -> None:   # close every connection: the next commit opens a new one
        store._drop_writer()
        store.engine.dispose()

    await store._executor.call(reconnect_later)
    replace(sqlite_backend.path)
    with pytest.raises(cronoq.SchedulerError, match=GONE):
        await sched.enqueue({"n": 2}, key="after")
    await eventually(lambda: not sched.running, what="the leader to step down")
    assert GONE in sched.lost_reason
    await eventually(lambda: errors_about(caplog, "cannot be saved"), what="the store to say no copy was made")
    await sched.shutdown()


async def test_an_idle_leader_whose_renewal_cannot_even_open_the_deleted_file_steps_down(sqlite_backend, caplog):
    # A renewal on a new connection to a deleted path fails to open it at all (mode=rw: SQLite
    # does not create it). That failure is the file being gone, not an outage to wait out:
    # the leader kept "leading" a file nobody else could see (found by a flaky server test).
    caplog.set_level(logging.INFO, logger="cronoq")
    store = sqlite_backend.store(cluster=False, lease_ttl=30.0, lease_renew=0.1)
    sched = cronoq.Scheduler([pool(Work(), capacity=0)], store=store)
    await sched.start()
    await sched.enqueue({"n": 1}, key="kept")

    def reconnect_later() -> None:   # close every connection: the next renewal opens a new one
        store._drop_writer()
        store.engine.dispose()

    await store._executor.call(reconnect_later)
    delete(sqlite_backend.path)
    await eventually(lambda: not sched.running, timeout=10, what="the leader to step down")
    assert GONE in sched.lost_reason
    assert not errors_about(caplog, "cannot renew the lease")   # not mistaken for an outage
    await sched.shutdown()


async def test_a_leader_shut_down_before_it_noticed_still_saves_the_deleted_file(sqlite_backend, caplog):
    caplog.set_level(logging.INFO, logger="cronoq")
    path = sqlite_backend.path
    store = sqlite_backend.store(cluster=False, lease_ttl=30.0, lease_renew=10.0)   # no renewal meanwhile
    sched = cronoq.Scheduler([pool(Work(), capacity=0)], store=store)
    await sched.start()
    await sched.enqueue({"n": 1}, key="kept")
    delete(path)
    await sched.shutdown()
    assert errors_about(caplog, GONE)
    saved = copies(path)
    assert len(saved) == 1 and keys_in(saved[0]) == {"kept"}
    assert not any(os.path.exists(path + s) for s in ("", "-wal", "-shm"))


@pytest.mark.parametrize("call", ["save_checkpoint", "delete_checkpoints"])
async def test_a_checkpoint_write_after_the_file_is_deleted_is_fenced(sqlite_backend, call):
    store = sqlite_backend.store(cluster=False)
    epoch = await store.acquire_leadership()
    now = time.time_ns()
    task = TaskRow(1 + (epoch << cronoq.store.base.ID_EPOCH_BITS), "default", "task", 0, "k", {"v": 1}, b"{}", now)
    await store.commit(epoch, Batch(tasks=[task]))
    await store.save_checkpoint(epoch, task.id, "first", b"data", 1, now)
    delete(sqlite_backend.path)
    with pytest.raises(Fenced, match=GONE):
        if call == "save_checkpoint":
            await store.save_checkpoint(epoch, task.id, "second", b"data", 1, now)
        else:
            await store.delete_checkpoints(epoch, task.id)
    with pytest.raises(Fenced, match=GONE):   # and everything after it
        await store.commit(epoch, Batch(tasks=[task]))
    await store.close()


async def test_a_standby_never_leads_on_a_deleted_file_nor_creates_one_and_leads_on_it_once_put_back(
        sqlite_backend, caplog):
    caplog.set_level(logging.INFO, logger="cronoq")
    path = sqlite_backend.path
    a = cronoq.Scheduler([pool(Work(), capacity=0)], store=sqlite_backend.store(cluster=False))
    await a.start()
    acknowledged = {f"kept-{i}": await a.enqueue({"n": i}, key=f"kept-{i}") for i in range(3)}
    b = cronoq.Scheduler([pool(Work(), capacity=0)], store=sqlite_backend.store(cluster=False))
    starting = asyncio.create_task(b.start())
    await eventually(lambda: b.store.engine is not None, what="the standby to open the file")
    # The leader's process dies, and its file is deleted before its lease ran out: only
    # the standby still has it open. It must not take the lease there once it expires.
    a._leadership.lost("simulated crash")
    a.store._stop_watch()
    a.store.epoch = None
    delete(path)
    await a.store.close()
    await eventually(lambda: errors_about(caplog, "saved in"), timeout=10, what="the standby to save the file")
    await eventually(lambda: any("does not create it" in r.getMessage() for r in caplog.records),
                     timeout=10, what="the standby to wait for a file at the path")
    assert not starting.done() and b.store.epoch is None
    assert not os.path.exists(path)
    saved = copies(path)
    assert len(saved) == 1
    conn = sqlite3.connect(saved[0])
    assert conn.execute("SELECT lease_expires_ns FROM cronoq_meta").fetchone()[0] != b.store.SAVED
    conn.close()
    # The operator puts the copy back: the standby leads, with every acknowledged task.
    os.rename(saved[0], path)
    await asyncio.wait_for(starting, 10)
    for key, task_id in acknowledged.items():
        assert (await b.info(key)).id == task_id
    await b.shutdown()


async def test_a_fresh_store_refuses_to_create_a_database_beside_the_wal_of_a_deleted_one(tmp_path):
    path = str(tmp_path / "state.db")
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("PRAGMA journal_mode=WAL")
    old.execute("PRAGMA wal_autocheckpoint=0")
    old.execute("CREATE TABLE cronoq_tasks (id INTEGER PRIMARY KEY, key TEXT)")
    old.execute("INSERT INTO cronoq_tasks VALUES (1, 'old')")
    for suffix in ("-wal", "-shm"):   # what a process still running on the deleted file leaves at the path
        shutil.copy(path + suffix, str(tmp_path / f"kept{suffix}"))
    old.close()
    delete(path)
    for suffix in ("-wal", "-shm"):
        os.rename(str(tmp_path / f"kept{suffix}"), path + suffix)
    store = cronoq.SqliteStore(path, cluster=False)
    with pytest.raises(StoreUnavailable, match="-wal"):
        await store.acquire_leadership()
    assert not os.path.exists(path)
    await store.close()


async def test_the_cluster_connections_follow_the_store_to_the_file_now_at_its_path(sqlite_backend):
    path = sqlite_backend.path
    store = sqlite_backend.store()
    transport = await store.cluster_transport()
    sqlite_backend.sql("INSERT INTO cronoq_members (id, pid, host, pools, state, started_ns, heartbeat_ns) "
                       "VALUES ('ghost', 1, 'h', '[]', 'idle', 1, 1)")
    got = await asyncio.to_thread(transport.cycle, Outgoing(beat=("[]", "idle")), Wants(members=True, force=True))
    assert {m.id for m in got.members} == {"ghost", store.identity}
    delete(path)
    other = sqlite_backend.store(cluster=False)   # a new process makes a new database at the path
    await other.prune()
    assert await store.try_leadership() is not None   # the store opens the file now at the path
    got = await asyncio.to_thread(transport.cycle, Outgoing(beat=("[]", "idle")), Wants(members=True, force=True))
    assert {m.id for m in got.members} == {store.identity}
    await asyncio.to_thread(transport.close)
    await store.close()


async def test_a_member_reads_and_withdraws_only_its_own_inbox_rows(sqlite_backend):
    one = await sqlite_backend.store().cluster_transport()
    two = await sqlite_backend.store().cluster_transport()
    got = await asyncio.to_thread(one.cycle, Outgoing(requests=[(1, "info", "{}", None), (2, "info", "{}", None)]),
                                  Wants())
    answered, unanswered = got.seqs[1], got.seqs[2]
    sqlite_backend.sql("UPDATE cronoq_inbox SET answer = '\"one\"', answered_ns = 1 WHERE seq = ?", (answered,))
    # Seqs of another database (a replaced file) may be another member's rows here.
    got = await asyncio.to_thread(two.cycle, Outgoing(), Wants(answers=[answered], force=True))
    assert got.answers == {}
    assert await asyncio.to_thread(two.withdraw, [unanswered]) == []
    await asyncio.to_thread(two.cycle, Outgoing(forget=[answered]), Wants())
    assert len(sqlite_backend.sql("SELECT seq FROM cronoq_inbox")) == 2
    got = await asyncio.to_thread(one.cycle, Outgoing(), Wants(answers=[answered], force=True))
    assert got.answers == {answered: '"one"'}
    assert await asyncio.to_thread(one.withdraw, [unanswered]) == [unanswered]
    for transport in (one, two):
        await asyncio.to_thread(transport.close)
