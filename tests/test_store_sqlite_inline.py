"""Commits on the event loop's thread (SQLite): a small commit made while the
loop has nothing else to run is written by the loop itself, without the two
thread hand-offs; everything else still goes to the store's worker thread.
Each test checks what is on disk when the call returns, and on which thread
the commit ran."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import threading

import pytest

import cronoq
from storekit import Work, pool, record_commit_threads, sqlite_backend  # noqa: F401  (a fixture)


async def started(store) -> cronoq.Scheduler:
    sched = cronoq.Scheduler([pool(Work(), capacity=0)], store=store)
    await sched.start()
    await sched.enqueue("warm")   # opens the loop's connection on the worker
    for _ in range(100):
        if store._inline is not None:
            break
        await asyncio.sleep(0.01)
    return sched


@pytest.mark.asyncio
async def test_a_lone_submit_is_committed_by_the_loop_and_on_disk_when_it_returns(sqlite_backend):
    store = sqlite_backend.store()
    sched = await started(store)
    threads = record_commit_threads(store)
    loop_thread = threading.get_ident()
    for i in range(20):
        task_id = await sched.enqueue(i, key=f"k{i}")
        # Another connection sees the row as soon as the call returns.
        assert sqlite_backend.sql("SELECT id FROM cronoq_tasks WHERE key = ?", (f"k{i}",)) == [(task_id,)]
    # Most on the loop; one made while a timer of the store was due goes to the worker.
    assert loop_thread in threads and store.inline_committed > 0
    await sched.shutdown()


@pytest.mark.asyncio
async def test_the_loops_connection_syncs_as_the_store_says(sqlite_backend):
    for full_sync, expected in ((True, 2), (False, 1)):
        store = sqlite_backend.store(full_sync=full_sync)
        sched = await started(store)
        assert store._inline.execute("PRAGMA synchronous").fetchone()[0] == expected
        assert store._inline.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        await sched.shutdown()
        assert store._inline is None   # closed with the store's other connections


@pytest.mark.asyncio
async def test_concurrent_submitters_still_share_their_commits_on_the_worker(sqlite_backend):
    store = sqlite_backend.store()
    sched = await started(store)
    threads = record_commit_threads(store)
    ids = await asyncio.gather(*(sched.enqueue(i) for i in range(50)))
    assert len(set(ids)) == 50
    assert sqlite_backend.sql("SELECT COUNT(*) FROM cronoq_tasks")[0][0] == 51
    # Fifty callers ready at once: the loop was never idle, so the batch went
    # to the worker and was written in far fewer commits than calls.
    assert len(threads) < 10
    assert threading.get_ident() not in threads
    await sched.shutdown()


@pytest.mark.asyncio
async def test_a_database_locked_by_another_connection_never_holds_the_loop(sqlite_backend):
    store = sqlite_backend.store()
    sched = await started(store)
    threads = record_commit_threads(store)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    other = sqlite3.connect(sqlite_backend.path, isolation_level=None, timeout=10)
    other.execute("BEGIN IMMEDIATE")   # holds the write lock
    ticking = asyncio.create_task(ticker())
    try:
        submit = asyncio.create_task(sched.enqueue("blocked", key="blocked"))
        await asyncio.sleep(0)
        seen = ticks
        while ticks < seen + 20:   # the loop keeps running while the commit waits
            await asyncio.sleep(0.001)
        assert not submit.done()
        other.execute("COMMIT")
        task_id = await asyncio.wait_for(submit, 10)
    finally:
        ticking.cancel()
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()
    assert sqlite_backend.sql("SELECT id FROM cronoq_tasks WHERE key = 'blocked'") == [(task_id,)]
    assert threading.get_ident() not in threads   # the worker waited for the lock, not the loop
    await sched.shutdown()


@pytest.mark.asyncio
async def test_a_slow_commit_on_the_loop_sends_the_next_ones_to_the_worker(sqlite_backend):
    store = sqlite_backend.store()
    store.INLINE_STALL = 0.0   # every commit on the loop counts as slow
    store.INLINE_PAUSE = 600.0
    sched = await started(store)
    threads = record_commit_threads(store)
    for i in range(10):
        await sched.enqueue(i)
    loop_thread = threading.get_ident()
    assert threads.count(loop_thread) == 1   # the first; then the pause
    assert len(threads) == 10
    assert sqlite_backend.sql("SELECT COUNT(*) FROM cronoq_tasks")[0][0] == 11
    await sched.shutdown()


@pytest.mark.asyncio
async def test_large_batches_and_a_store_that_opts_out_commit_on_the_worker(sqlite_backend):
    store = sqlite_backend.store()
    sched = await started(store)
    threads = record_commit_threads(store)
    await sched.enqueue_batch([cronoq.Task(i) for i in range(store.INLINE_ROWS + 1)])
    await sched.enqueue("x" * (store.INLINE_BYTES + 1))
    assert len(threads) == 2 and threading.get_ident() not in threads
    await sched.shutdown()

    store = sqlite_backend.store(inline_commits=False)
    sched = await started(store)
    threads = record_commit_threads(store)
    for i in range(5):
        await sched.enqueue(i)
    assert store._inline is None and store.inline_committed == 0
    assert len(threads) == 5 and threading.get_ident() not in threads
    await sched.shutdown()


@pytest.mark.asyncio
async def test_a_failing_commit_on_the_loop_is_retried_and_reported_by_the_commit_loop(sqlite_backend):
    store = sqlite_backend.store()
    sched = await started(store)
    calls: list[tuple[bool, list[int]]] = []
    original = store._commit_with

    def fail_once_on_the_loop(begun, epoch, batch):
        on_loop = begun is not None
        calls.append((on_loop, [t.id for t in batch.tasks]))
        if on_loop and sum(1 for here, _ in calls if here) == 1:
            raise sqlite3.OperationalError("disk I/O error")
        original(begun, epoch, batch)

    store._commit_with = fail_once_on_the_loop
    ids = []
    while not any(here for here, _ in calls):
        ids.append(await sched.enqueue(len(ids)))
        assert len(ids) < 100
    # The loop's attempt failed and wrote nothing; the next attempt wrote the same batch.
    first = next(n for n, (here, _) in enumerate(calls) if here)
    assert calls[first + 1][1] == calls[first][1] and ids[-1] in calls[first][1]
    on_disk = {row[0] for row in sqlite_backend.sql("SELECT id FROM cronoq_tasks")}
    assert set(ids) <= on_disk
    await sched.shutdown()


@pytest.mark.asyncio
async def test_a_caller_that_commits_itself_still_lets_the_loop_run(sqlite_backend):
    store = sqlite_backend.store()
    # Commits slowed by a loaded machine must not pause the loop's commits: they are the path under test.
    store.INLINE_LIMIT = store.INLINE_STALL = 10.0
    sched = await started(store)
    loop = asyncio.get_running_loop()

    async def submit_until(flag: asyncio.Event) -> int:
        n = 0
        while not flag.is_set():   # a submitter that never suspends on its own
            await sched.enqueue(n)
            n += 1
            assert n < 5_000, "the loop never ran anything else"
        return n

    # A callback that becomes ready: the next commit is left to the worker.
    ready = asyncio.Event()
    loop.call_soon(ready.set)
    assert await submit_until(ready) <= 1
    # I/O that arrives while the caller commits: seen within about a millisecond.
    # A round in which a timer of the runtime fell due, or the worker was still
    # busy, sends its commits to the worker and proves nothing: another round.
    rsock, wsock = socket.socketpair()
    committed_inline = False
    try:
        for _ in range(50):
            await store._executor.call(lambda: None)   # the worker idle: commits can be inline
            readable = asyncio.Event()
            loop.add_reader(rsock, readable.set)
            before = store.inline_committed
            wsock.send(b"x")
            await submit_until(readable)
            loop.remove_reader(rsock)
            rsock.recv(1)
            committed_inline = store.inline_committed > before
            if committed_inline:
                break
    finally:
        rsock.close()
        wsock.close()
    assert committed_inline, "no round committed on the loop"
    await sched.shutdown()


def test_a_threads_submit_is_committed_by_the_loop_not_the_store_thread(tmp_path):
    store = cronoq.SqliteStore(str(tmp_path / "cronoq.db"))
    with cronoq.BlockingScheduler([pool(Work(), capacity=0)], store=store) as sched:
        sched.enqueue("warm")
        threads = record_commit_threads(store)
        for i in range(20):
            sched.enqueue(i, key=f"k{i}")
        worker = store._executor._thread.ident
        # The caller waits; the loop, which has nothing else to do, commits.
        assert set(threads) - {worker, threading.get_ident()}
        assert threading.get_ident() not in threads
    conn = sqlite3.connect(str(tmp_path / "cronoq.db"))
    try:
        assert conn.execute("SELECT COUNT(*) FROM cronoq_tasks WHERE key LIKE 'k%'").fetchone()[0] == 20
    finally:
        conn.close()
