"""The WAL checkpoints behind the commits made on the event loop's thread
(SQLite): how often they run while work executes beside the submits, and
that one under way never sends the loop's commits to the store's worker.

Each commit here is the one a submit makes while a pool of one executes the
task before it: the new task's row, its dispatch, and the end and output of
the previous task (what ``DurableLog`` groups into one commit)."""

from __future__ import annotations

import threading

import pytest

from cronoq.store.sqlite import SqliteStore
from storekit import sqlite_backend, submit_beside_a_completion  # noqa: F401  (a fixture)


async def leading(backend) -> tuple[SqliteStore, int]:
    """A store that leads, with the loop's connection open (a first commit on the worker opens it)."""
    store = backend.store(cluster=False, full_sync=False)
    # However slow the machine's disk, these commits stay on the loop (they count
    # checkpoints, not time).
    store.INLINE_STALL = store.INLINE_LIMIT = 3600.0
    epoch = await store.acquire_leadership()
    await store.commit(epoch, submit_beside_a_completion(epoch, 0))
    assert store._inline is not None
    await store._executor.call(lambda: None)   # after what that commit queued (pruning)
    return store, epoch


@pytest.fixture
def checkpoints(monkeypatch):
    """Every checkpoint of the loop's commits that runs, counted (``count``);
    ``hold()`` makes the next ones wait until ``release()``."""
    class Checkpoints:
        count = 0
        started = threading.Event()
        held = threading.Event()
        go = threading.Event()

        def hold(self) -> None:
            self.held.set()

        def release(self) -> None:
            self.go.set()

    book = Checkpoints()
    original = SqliteStore._checkpoint_quietly

    def counted(self, *args):
        book.count += 1
        book.started.set()
        if book.held.is_set():
            book.go.wait(10)
        return original(self, *args)

    monkeypatch.setattr(SqliteStore, "_checkpoint_quietly", counted)
    return book


@pytest.mark.asyncio
async def test_completions_committed_beside_submits_do_not_make_checkpoints_more_frequent(sqlite_backend,
                                                                                            checkpoints):
    store, epoch = await leading(sqlite_backend)
    try:
        for n in range(1, 801):
            batch = submit_beside_a_completion(epoch, n)
            while not store.commit_now(epoch, batch):   # the worker was busy: once it is idle
                await store._executor.call(lambda: None)
    finally:
        await store.close()
    # The same WAL growth as 800 lone submits: two checkpoints (one per 400
    # commits), not one for every 400 rows of statuses and outputs (eight).
    assert checkpoints.count == 2


@pytest.mark.asyncio
async def test_a_checkpoint_under_way_does_not_send_the_loops_commits_to_the_worker(sqlite_backend,
                                                                                    checkpoints):
    store, epoch = await leading(sqlite_backend)
    checkpoints.hold()
    n = 1
    try:
        while not checkpoints.started.is_set():   # commits until one asks for a checkpoint, which waits
            assert store.commit_now(epoch, submit_beside_a_completion(epoch, n))
            n += 1
            assert n < 1000, "no checkpoint was asked for"
        assert checkpoints.started.wait(10)
        for _ in range(3):   # the checkpoint is under way: the loop still commits itself
            assert store.commit_now(epoch, submit_beside_a_completion(epoch, n))
            n += 1
    finally:
        checkpoints.release()
        await store.close()
    rows = sqlite_backend.sql("SELECT COUNT(*) FROM cronoq_tasks")[0][0]
    assert rows == n   # every commit on disk (the first one's task included)
